"""`spark-submit app/submit.py [charon insights options]`: `charon insights` as a cluster runs it, the master
from spark-submit. A launcher only, which nothing imports: it runs app/insights.py's main(), the one command
line of `charon insights`, so both take the same options and settings.
"""

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a file: the repository importable, and this directory not (its modules are app.*).
    here = Path(__file__).resolve().parent
    sys.path[:] = [str(here.parent)] + [p for p in sys.path if Path(p or ".").resolve() != here]
    from app.insights import main

    sys.exit(main())
