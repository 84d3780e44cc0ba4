import sys

sys.argv = sys.argv[:1]  # else oslo.config parses gunicorn's arguments and the worker exits with code 2
from keystone.wsgi.api import application  # noqa: E402,F401
