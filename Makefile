# The README names `make run` and `make test`; .ci/run calls `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
# `make run` installs only what serving needs (the project without extras); `make test` everything.
SERVE_STAMP := $(VENV)/.serving
# Keystone (the identity service the tests' `keystone` fixture runs, tests/keystone.py) lives in a virtualenv of
# its own: its pinned dependencies (SQLAlchemy, oslo.*, ...) must not move ours. Only the tests use it.
KS_VENV    := .venv-keystone
KS_STAMP   := $(KS_VENV)/.installed
KEYSTONE   ?= keystone==30.0.0
# Zaqar's own API tests (tests/tempest.py, `make tempest`): tempest and zaqar-tempest-plugin, pinned, in a
# virtualenv of their own for the same reason.
TEMPEST_VENV  := .venv-tempest
TEMPEST_STAMP := $(TEMPEST_VENV)/.installed
TEMPEST       ?= tempest==47.0.0 zaqar-tempest-plugin==4.3.0
# ... and the functional tests the zaqar package ships (tests/acceptance/test_zaqar_functional.py), with what
# they import and the package does not require
ZAQAR_VENV    := .venv-zaqar
ZAQAR_STAMP   := $(ZAQAR_VENV)/.installed
ZAQAR         ?= zaqar==23.0.1 oslotest ddt pymongo redis

.PHONY: install system-deps redis-server java insights run test test-fast tempest lint fmt typecheck openapi docs insights-report-png console-screenshots bench clean

install: $(STAMP) $(KS_STAMP) $(TEMPEST_STAMP) $(ZAQAR_STAMP)

# $(call apt-package,PACKAGE,CHECK,ALTERNATIVE): when the shell command CHECK fails, install Debian's PACKAGE
# with apt-get as root; otherwise say how, and ALTERNATIVE, and fail.
define apt-package
	@if ! $(2) >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing $(1) (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(1) >/dev/null; \
	  else \
	    echo "$(1) is missing: run 'sudo apt-get install $(1)' ($(3))"; exit 1; \
	  fi; \
	fi
endef

# redis-server: the embedded default store and the tests' server; the only system package serving needs
# (and not even that when CHARON_STORAGE_URI names a store of your own).
redis-server:
	$(call apt-package,redis-server,{ [ -n "$$CHARON_STORAGE_URI" ] || command -v redis-server; },or your system's package)

# Java 17+ for Spark 4 (charon insights and its tests): openjdk-17-jre-headless via apt when root; otherwise a
# clear note (the service itself runs without it; `charon insights` says the same when it starts).
java:
	@v=$$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1); \
	if [ -z "$$v" ] || [ "$$v" -lt 17 ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing openjdk-17-jre-headless (apt-get): Spark 4 needs Java 17 or newer"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; \
	  else \
	    echo "NOTE: Java 17 or newer is missing (found: $${v:-none}); charon insights and its tests need it:"; \
	    echo "      sudo apt-get install openjdk-17-jre-headless (or any JDK/JRE 17+ on PATH or in JAVA_HOME)"; \
	  fi; \
	fi

# What the tests need beside Java: redis-server (whatever CHARON_STORAGE_URI says), promtool (Debian's prometheus) checks and unit-tests
# deploy/prometheus/alerts.yml; docker-compose (1.29, no daemon needed) validates docker-compose.yml's profiles;
# curl and jq run the docs' examples; chromium and chromium-driver run the console's browser tests
# (tests/console/: selenium drives Debian's Chromium, no browser is downloaded).
system-deps: java
	$(call apt-package,redis-server,command -v redis-server,the tests start their own redis-server)
	$(call apt-package,prometheus,command -v promtool,or put Prometheus' promtool on PATH)
	$(call apt-package,docker-compose,command -v docker-compose,or any Compose implementation with `config`)
	$(call apt-package,curl,command -v curl,the docs' examples run with it: tests/docs/test_examples.py)
	$(call apt-package,jq,command -v jq,the docs' examples capture ids with it)
	$(call apt-package,chromium chromium-driver,command -v chromedriver,the console's tests drive a headless Chromium)

$(SERVE_STAMP): pyproject.toml | redis-server
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e .
	touch $(SERVE_STAMP)

$(STAMP): pyproject.toml | system-deps
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP) $(SERVE_STAMP)

# Made once (its own stamp); gunicorn serves keystone.wsgi.api in it.
$(KS_STAMP):
	$(PY) -m venv $(KS_VENV)
	$(KS_VENV)/bin/pip install -q --upgrade pip
	$(KS_VENV)/bin/pip install -q '$(KEYSTONE)' gunicorn
	touch $(KS_STAMP)

$(TEMPEST_STAMP):
	$(PY) -m venv $(TEMPEST_VENV)
	$(TEMPEST_VENV)/bin/pip install -q --upgrade pip
	$(TEMPEST_VENV)/bin/pip install -q $(TEMPEST)
	touch $(TEMPEST_STAMP)

$(ZAQAR_STAMP):
	$(PY) -m venv $(ZAQAR_VENV)
	$(ZAQAR_VENV)/bin/pip install -q --upgrade pip
	$(ZAQAR_VENV)/bin/pip install -q $(ZAQAR)
	touch $(ZAQAR_STAMP)

# Zaqar's v2 API tests (zaqar-tempest-plugin) against `charon serve` in Keystone mode: tests/tempest.py.
# `make test` runs them too (tests/acceptance/test_tempest.py).
tempest: install
	$(BIN)/python -m tests.tempest

# The service alone: Charon's virtualenv (serving's packages only), not Keystone's.
run: $(SERVE_STAMP)
	$(BIN)/charon serve

# `charon insights` and `charon export`: the [insights] extra (PySpark, pyarrow, pandas) and Java 17.
insights: $(SERVE_STAMP) java
	$(BIN)/pip install -q -e '.[insights]'

# Charon against OpenStack Zaqar 23.0.1 (its own virtualenv under .bench/, made on first use) and a private
# RabbitMQ (Debian's rabbitmq-server, installed via apt-get when root): bench/README.md
bench: install
	$(call apt-package,rabbitmq-server,ls /usr/lib/rabbitmq/lib/rabbitmq_server-*/sbin/rabbitmq-server,or make bench BENCH_ARGS='--peers zaqar')
	$(BIN)/python -m bench.compare $(BENCH_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: install
	$(BIN)/mypy

# The tests in parallel (pytest-xdist), a worker a core: each worker starts its own servers on its own ports;
# a file goes to one worker, and every Spark test to one (tests/conftest.py).
# `make test TEST_WORKERS=0` runs them in one process.
TEST_WORKERS ?= auto
test: install lint typecheck
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile

# The quick loop while changing code: the unit tests, and the contract suite and the API on Redis alone, no live
# process, Keystone or Spark (tests/conftest.py: markers and --store). `make test` runs everything.
test-fast: install
	$(BIN)/pytest tests/unit tests/contract tests/api -m "not slow and not keystone and not spark" --store redis

openapi: install
	$(BIN)/charon openapi > openapi.yaml

# The docs site (mkdocs.yml, docs/) into site/; docs/configuration.md is generated from app/settings.py first.
# Needs only serving's install and the docs extra, not the tests' tools.
docs: $(SERVE_STAMP)
	$(BIN)/pip install -q -e '.[docs]'
	$(BIN)/python -m app.settings_doc > docs/configuration.md
	$(BIN)/python -m app.metadata_doc docs/dead-letter-queues.md
	$(BIN)/mkdocs build --strict

# docs/insights-report.png: the top of docs/example/report.html (what `charon insights` writes), as headless
# Chromium (Debian's chromium, via apt-get when root) draws it. Remake it when the report's look changes.
insights-report-png:
	$(call apt-package,chromium,command -v chromium,or any Chromium on PATH as chromium)
	chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1240,1500 \
	  --screenshot=$(CURDIR)/docs/insights-report.png file://$(CURDIR)/docs/example/report.html

# docs/images/console-*.png: the console's main views, drawn by its browser tests as they check them
# (tests/console/browser.py shot). Remake them when the console's look changes.
console-screenshots: install
	CONSOLE_SCREENSHOTS=$(CURDIR)/docs/images $(BIN)/pytest tests/console/test_console.py -p no:xdist -q

clean:
	rm -rf $(VENV) $(KS_VENV) $(TEMPEST_VENV) $(ZAQAR_VENV) .pytest_cache .mypy_cache .ruff_cache site
