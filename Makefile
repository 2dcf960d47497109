# The two commands of the README: `make run` and `make test`.
# `make test` runs the Python suite (on TEST_WORKERS pytest-xdist workers), then the
# TypeScript SDK's (sdk/typescript: `npm ci` from its committed lockfile, compile, Node's
# test runner against rsd from .venv, two test files at a time). The cluster tests run
# real etcd members: Debian's etcd-server is installed first when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
LISTEN ?= 127.0.0.1:7420
DATA   ?= var
# The suite's tests mostly wait (on rsd processes, on the wire): two workers overlap that
# waiting on a 2-core machine; each test has its own data directory, ports and servers.
TEST_WORKERS ?= 2
# The etcd server the cluster tests run (Debian's etcd-server: see its rule below).
ETCD   := /usr/bin/etcd

.PHONY: run test test-ts lint bench bench-ts clean FORCE
TS     := sdk/typescript

# The editable install is strict: a tree of links to the package files under build/, on
# sys.path by a plain path entry, which type checkers follow. (setuptools' default for this
# layout is an import hook, and mypy run on a user's code from another folder then cannot
# find rsclient: tests/test_mypy_finds_the_installed_rsclient.py; `compat` is deprecated.)
# A link tree sees every edit of a file but not a file added or removed: the list of the
# package files is kept in $(FILES), rewritten only when it changes, and the stamp follows
# it. The stamp also follows this file, where the recipe is (an older venv is redone).
EDITABLE := --config-settings editable_mode=strict
FILES    := $(VENV)/.installed-files
SOURCES  := $(shell find rsproto rsd rsclient rsctl -name __pycache__ -prune -o -type f -print | LC_ALL=C sort)

$(FILES): FORCE
	@mkdir -p $(VENV)
	@printf '%s\n' $(SOURCES) | cmp -s - $@ || printf '%s\n' $(SOURCES) > $@

$(STAMP): pyproject.toml Makefile $(FILES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/rsd --listen $(LISTEN) --data-dir $(DATA)

test: $(STAMP) $(ETCD)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal
	$(MAKE) test-ts

# etcd for the cluster tests (tests/support/etcd.py starts members of its own on free
# loopback ports): Debian's etcd-server, installed as root when $(ETCD) is missing.
# The package enables an etcd.service on port 2379, which no test uses; while it installs,
# a policy-rc.d that refuses every start (only if the host has none: a container's own is
# left as it is) keeps that service from starting now.
$(ETCD):
	@test "$$(id -u)" = 0 || { echo "etcd is missing: run make test as root," \
	  "or apt-get install etcd-server"; exit 1; }
	set -e; policy=/usr/sbin/policy-rc.d; \
	if [ ! -e $$policy ]; then \
	  printf '#!/bin/sh\nexit 101\n' > $$policy; chmod 755 $$policy; \
	  trap "rm -f $$policy" EXIT; \
	fi; \
	apt-get update -q; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends etcd-server

test-ts: $(STAMP)
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error && npm run build && npm test

lint: $(STAMP)
	$(BIN)/ruff check .

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[test,bench]'
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
	rm -rf $(VENV) build .pytest_cache .ruff_cache $(TS)/node_modules $(TS)/dist
