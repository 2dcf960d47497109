# The two commands of the README: `make run` and `make test`.
# `make test` runs the Python suite, then the TypeScript SDK's (sdk/typescript: `npm ci`
# from its committed lockfile, compile, Node's test runner against rsd from .venv).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
LISTEN ?= 127.0.0.1:7420
DATA   ?= var

.PHONY: run test test-ts lint bench bench-ts clean
TS     := sdk/typescript

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/rsd --listen $(LISTEN) --data-dir $(DATA)

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest
	$(MAKE) test-ts

test-ts: $(STAMP)
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error && npm run build && npm test

lint: $(STAMP)
	$(BIN)/ruff check .

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(BENCH_STAMP)

# rsd beside Redis and beanstalkd (installed from Debian's packages when missing); the
# table, bench-results.json and bench-results.png. BENCH_ARGS="--quick" for a short look.
BENCH_ARGS ?=
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench --json bench-results.json $(BENCH_ARGS)

bench-ts: $(STAMP)
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error && npm run build
	$(BIN)/python -m bench.typescript

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache $(TS)/node_modules $(TS)/dist
