# The README names `make run` and `make test`; .ci/run calls `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install system-deps run test test-fast lint fmt typecheck openapi bench clean

install: $(STAMP)

# redis-server (the embedded default store and the tests' server) comes from Debian's package.
system-deps:
	@if ! command -v redis-server >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing redis-server (apt-get)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "redis-server is missing: run 'sudo apt-get install redis-server' (or your system's package)"; exit 1; \
	  fi; \
	fi

$(STAMP): pyproject.toml | system-deps
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

run: install
	$(BIN)/charon serve

# Charon against OpenStack Zaqar 23.0.1 (its own virtualenv under .bench/, made on first use): bench/README.md
bench: install
	$(BIN)/python -m bench.compare

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: install
	$(BIN)/mypy

test: install lint typecheck
	$(BIN)/pytest

test-fast: install
	$(BIN)/pytest -m "not slow"

openapi: install
	$(BIN)/charon openapi > openapi.yaml

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
