# The two commands of the README: `make run` and `make test`.
# `make test` first starts the TypeScript SDK's compile in the background (sdk/typescript:
# `npm ci` from its committed lockfile, then tsc; it needs no rsd: see ts-build-background),
# installs, runs ruff; then mypy, one collection of the suite (for the bytecode it
# leaves), the manual's strict build (`make docs`) and the TypeScript SDK's tests (Node's
# test runner against rsd from .venv, eight test files at a time: each mostly waits on its
# rsd) side by side; then the Python suite (on TEST_WORKERS pytest-xdist workers) beside the
# pure-Python rule tests (output kept per target, shown as each ends). The TypeScript
# tests went beside mypy rather than beside the Python suite: the suite, the longest job
# and mostly CPU, then has the two cores nearly to itself (a fresh clone's .ci/run:
# 286-299 s with them beside the suite, 267 s beside mypy; the suite itself 186-197 s ->
# 145 s). The cluster tests run real etcd members: Debian's etcd-server is installed
# first when it is missing; the partition tests put each node in a network namespace of
# its own: Debian's iproute2 and nftables likewise. The container image is built in the
# background from the start, at the lowest priority, and tested in the suite (see
# test-image-background).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BENCH_STAMP := $(VENV)/.installed-bench
LISTEN ?= 127.0.0.1:7420
# `make run`'s HTTP listener: the dashboard at /, metrics at /metrics (loopback only: no
# tokens file is needed there, and rsd refuses a non-loopback one without it).
HTTP   ?= 127.0.0.1:7421
DATA   ?= var
# The suite's tests mostly wait (on rsd processes, on the wire, on etcd): six workers
# overlap that waiting on a 2-core machine (measured on a quiet one, pytest's figure, on
# 2026-12-06 with the sharding fault tests: 179 s on four, 150 s on six), and each test
# has its own data directory, ports and servers.
TEST_WORKERS ?= 6
# The tests' Python processes keep the bytecode they compile, in build/pycache (not beside
# the sources), also where the environment says not to write it (PYTHONDONTWRITEBYTECODE,
# as on the CI machines): each pytest-xdist worker otherwise compiled and assertion-
# rewrote every test module and every module they import anew, 9 s of CPU per worker and
# eight workers a run; the rsd processes the TypeScript tests start keep it likewise
# (tests/support/process.py does the same for the rsd starts of the Python tests).
TEST_BYTECODE := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/build/pycache
# The etcd server the cluster tests run (Debian's etcd-server: see its rule below).
ETCD   := /usr/bin/etcd
# The browser the dashboard's tests drive (Debian's chromium-headless-shell: see its rule
# below, and tests/support/browser.py for why not the whole browser).
CHROMIUM := /usr/bin/chromium-headless-shell
# What the partition tests cut the network with (Debian's iproute2 and nftables: see
# their rule below).
NETNS_TOOLS := /sbin/ip /usr/sbin/nft
# The hot modules (pyproject's [tool.rsd.mypyc]: the core) are compiled by mypyc where a C
# compiler is (setup.py; no compiler, or a failure: the pure-Python build). RSD_COMPILE=0:
# not compiled at all. `make test` runs the suite on the build installed, then the core's
# rule tests (in-process, fake clock) on the pure-Python sources.
RSD_COMPILE ?= 1
export RSD_COMPILE
# Named as pytest's python_files patterns over tests/, not as files: given each file as an
# argument, pytest (9.2) collects tests/ again for each, all of its ~300 files each time
# (6.8 s of one core to collect, against 2.5 s so, in each worker).
PURE_TESTS := test_core_*.py test_the_build_runs_what_it_compiled.py \
              test_every_record_kind_is_declared_once_and_round_trips.py
# Where a C compiler is, the compiled build is what `make test` must find (a module mypyc
# refused would otherwise pass unnoticed as Python).
EXPECT_COMPILED := $(if $(filter 0,$(RSD_COMPILE)),0,$(if $(shell command -v cc),1))

.PHONY: run run-cluster test test-python test-pure test-ts ts-build ts-build-background test-collect typecheck lint docs bench bench-ts screenshots clean FORCE \
        image image-base test-image test-image-base test-image-check test-image-background
TS     := sdk/typescript

# The editable install is strict: a tree of links to the package files under build/, on
# sys.path by a plain path entry, which type checkers follow. (setuptools' default for this
# layout is an import hook, and mypy run on a user's code from another folder then cannot
# find rsclient: tests/test_mypy_finds_the_installed_rsclient.py; `compat` is deprecated.)
# A link tree sees every edit of a file but not a file added or removed: the list of the
# package files is kept in $(FILES), rewritten only when it changes, and the stamp follows
# it. The stamp also follows this file, where the recipe is (an older venv is redone).
# The compiled modules are built in place just before the install (each .so beside its
# .py, where it wins at import; the install's own build finds them made): the next `make
# run` or `make test` after an edit of a module they are built from ($(HOT)) installs
# again, which recompiles only the C files mypyc rewrote; $(MODE) redoes the install when
# RSD_COMPILE changes. $(HOT) names [tool.rsd.mypyc]'s compile patterns (pyproject.toml)
# and the modules they read at build time: keep the two in step.
EDITABLE := --config-settings editable_mode=strict
FILES    := $(VENV)/.installed-files
MODE     := $(VENV)/.installed-mode
SOURCES  := $(shell find rsproto rsd rsclient rsctl -name __pycache__ -prune -o -type f ! -name '*.so' -print | LC_ALL=C sort)
HOT      := $(if $(filter 0,$(RSD_COMPILE)),,$(wildcard rsd/core/*.py rsd/core/*/*.py rsd/wire/batches.py rsproto/*.py rsd/policy.py))

$(FILES): FORCE
	@mkdir -p $(VENV)
	@printf '%s\n' $(SOURCES) | cmp -s - $@ || printf '%s\n' $(SOURCES) > $@

$(MODE): FORCE
	@mkdir -p $(VENV)
	@echo "RSD_COMPILE=$(RSD_COMPILE)" | cmp -s - $@ || echo "RSD_COMPILE=$(RSD_COMPILE)" > $@

# The install says what it does: the first one (no venv yet) shows pip's progress, and the
# core is compiled in sight before pip installs (`setup.py build_ext`, which says how far
# it is every 5 s; pip hides a build's output), two C files at a time on two cores; pip's
# own build then finds the objects and the linked modules made and copies them (setup.py).
# That build uses the venv's setuptools and mypyc (--no-build-isolation): the pins of
# pyproject's [build-system] requires, installed first (no build environment made anew
# at each install, and mypyc runs once for pip's build, not also for its metadata). pip
# installs without compiling every module of every package to bytecode (--no-compile: 15 s
# for pip's own under load, 7 s for mypy's); Python compiles each when first imported.
# The venv is made without pip, and pip put in by the system's own (`pip --python`, pip
# 22.3 and later) without compiling it: `venv`'s ensurepip installed its bundled pip,
# compiled to bytecode, only for the next line to replace it (8.7 s, against 0.3 s and
# 3 s); a Python without pip, or an older one, makes the venv as before.
# The packages themselves are installed by uv (PyPI's `uv`, put in the venv by pip beside
# pip itself, which stays for `make bench` and for users): the same versions resolved
# from the same index, with 6 s of CPU and 4 s of wall for the dependencies' 83 packages
# into a fresh venv with an empty cache, where pip took 27 s and 29 s (pip resolves and
# unpacks in Python, one package after another; uv in Rust, in parallel), which the
# core's compile beside it had to share. uv, like pip, compiles no bytecode unless asked,
# and is given the venv's interpreter (not the venv it may find by itself). uv reads its
# own settings, not pip's: a mirror pip is pointed at is given to uv as UV_DEFAULT_INDEX
# (docs/development.md).
PIP_QUIET := $(if $(wildcard $(BIN)/python),--quiet)
UV_INSTALL := $(BIN)/uv pip install --python $(BIN)/python $(PIP_QUIET)
COMPILING := : the dependencies while the core is compiled to C by mypyc (the first time under a minute on 2 idle cores)
BUILD_REQUIRES := import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\\n')
# What rsd and its test and docs extras need, installed while the core compiles (the
# download and unpacking wait on the network and the disk, the compile on the CPU):
# the editable install after them finds every one in place.
PROJECT_REQUIRES := import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
  print(*p['dependencies'], *p['optional-dependencies']['test'], *p['optional-dependencies']['docs'], sep='\\n')

$(STAMP): pyproject.toml setup.py Makefile $(FILES) $(MODE) $(HOT)
	@echo "rsd: installing into $(VENV)$(if $(HOT),$(COMPILING))"
	test -x $(BIN)/python || { $(PYTHON) -m venv --without-pip $(VENV) && $(PYTHON) -m pip \
	  --python $(BIN)/python install $(PIP_QUIET) --no-compile pip; } || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install $(PIP_QUIET) --no-compile --upgrade pip uv
	$(BIN)/python -c "$(BUILD_REQUIRES)" > $(VENV)/build-requires.txt
	$(UV_INSTALL) -r $(VENV)/build-requires.txt
	$(BIN)/python -c "$(PROJECT_REQUIRES)" > $(VENV)/requires.txt
	$(UV_INSTALL) -r $(VENV)/requires.txt & \
	  requires=$$!; $(if $(HOT),$(BIN)/python setup.py --quiet build_ext --inplace || \
	  { wait $$requires; exit 1; };) wait $$requires
	$(UV_INSTALL) --no-build-isolation $(EDITABLE) -e '.[test,docs]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/rsd --listen $(LISTEN) --data-dir $(DATA) --http-listen $(HTTP)

# A sharded cluster on this machine's cores: one local etcd member, SHARDS shards of one
# node each (ports 7420 up), the slots spread evenly; Ctrl-C stops it all (rsd/localcluster.py).
SHARDS ?= 2
CLUSTER_DIR ?= run-cluster
run-cluster: $(STAMP) $(ETCD)
	$(BIN)/python -m rsd.localcluster --shards $(SHARDS) --dir $(CLUSTER_DIR)

test: ts-build-background $(STAMP) $(ETCD) $(CHROMIUM) $(NETNS_TOOLS)
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory test-image-background
	$(MAKE) --output-sync=target -j4 typecheck test-collect docs test-ts TS_BUILT=$(TS_STATUS)
	$(MAKE) --output-sync=target -j2 test-python \
	  $(if $(filter 1,$(EXPECT_COMPILED)),test-pure) \
	  RSD_TEST_IMAGE_STATUS=$(if $(filter 0,$(IMAGE_IN_TEST)),,$(CURDIR)/$(IMAGE_STATUS))

# The Python suite on the build installed. RSD_TEST_IMAGE_STATUS (set by `make test`):
# where the image's build, started in the background, writes its exit code; the image's
# test waits for it. Unset (`make test-python` alone): the image's test is left out.
test-python: $(STAMP)
	RSD_EXPECT_COMPILED=$(EXPECT_COMPILED) $(TEST_BYTECODE) \
	  $(if $(RSD_TEST_IMAGE_STATUS),RSD_TEST_IMAGE_STATUS=$(RSD_TEST_IMAGE_STATUS)) \
	  $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal \
	  $(if $(RSD_TEST_IMAGE_STATUS),,-m "not image")

typecheck: $(STAMP)
	$(BIN)/mypy

# The suite's collection once, beside mypy (each takes one core for about 9 s), for the
# bytecode it leaves: each pytest-xdist worker then collects in 2 s instead of 9 (see
# TEST_BYTECODE). The list of tests goes to a file, shown only if collection fails.
test-collect: $(STAMP)
	mkdir -p build
	$(TEST_BYTECODE) $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider \
	  > build/collected.txt || { cat build/collected.txt; exit 1; }

# The manual (docs/, mkdocs.yml) as a site in build/docs, built --strict: a broken link,
# an anchor that names no heading or a page missing from the nav fails. (NO_MKDOCS_2_WARNING:
# mkdocs-material's notice about MkDocs 2 at each build; pyproject pins MkDocs below 2.)
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The pure-Python rule tests beside a compiled build (not the rules shown at scale, on
# 100,000 objects: the compiled run shows them, 8 s of the pure run's CPU;
# their code paths are the other tests'): build/pure is a tree of links to the
# package files without the compiled modules, on sys.path before the checkout (where they
# are; PYTHONSAFEPATH: not first, as `python -m` would put it). One process, beside the
# suite (which keeps both cores busy): on two pytest-xdist workers the run took half as
# much CPU again, 24.4 and 20.6 s against 15.9 and 13.0 s in one (alternated, quiet
# machine): a second collection, and xdist's reports of each of the 2,186 tests, sent to
# and read by a controller.
PURE := build/pure
test-pure: $(STAMP)
	rm -rf $(PURE) && mkdir -p $(PURE)
	cp -rs $(CURDIR)/rsproto $(CURDIR)/rsd $(CURDIR)/rsclient $(CURDIR)/rsctl $(PURE)/
	find $(PURE) -name '*.so' -delete
	PYTHONSAFEPATH=1 PYTHONPATH=$(PURE):$(CURDIR) RSD_EXPECT_COMPILED=0 $(TEST_BYTECODE) \
	  $(BIN)/python -m pytest -p no:cacheprovider -m "not at_scale" \
	  -o python_files="$(PURE_TESTS)" tests

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

# ip and nft for the partition tests (tests/support/netns.py: a network namespace per
# node on a bridge of the test's own, nft rules inside those namespaces for the cuts;
# the tests skip, saying why, where namespaces cannot be made): Debian's iproute2 and
# nftables, installed as root when either is missing. nftables ships a service that
# loads /etc/nftables.conf (which flushes the host's ruleset); the same policy-rc.d as
# etcd's keeps it from starting now.
$(NETNS_TOOLS) &:
	@test "$$(id -u)" = 0 || { echo "ip or nft is missing: run make test as root," \
	  "or apt-get install iproute2 nftables"; exit 1; }
	set -e; policy=/usr/sbin/policy-rc.d; \
	if [ ! -e $$policy ]; then \
	  printf '#!/bin/sh\nexit 101\n' > $$policy; chmod 755 $$policy; \
	  trap "rm -f $$policy" EXIT; \
	fi; \
	apt-get update -q; \
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends iproute2 nftables

# Chromium for the dashboard's browser tests (tests/test_dashboard_in_a_browser.py, through
# Playwright for Python pointed at it): Debian's headless shell, installed as root when it
# is missing.
$(CHROMIUM):
	@test "$$(id -u)" = 0 || { echo "chromium-headless-shell is missing: run make test" \
	  "as root, or apt-get install chromium-headless-shell"; exit 1; }
	apt-get update -q
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
	  chromium-headless-shell

# The dashboard's screenshots in docs/ (docs/screenshots.py: an rsd of its own, filled as
# the browser tests fill theirs, photographed by Chromium through Playwright).
screenshots: $(STAMP) $(CHROMIUM)
	$(BIN)/python docs/screenshots.py

# The container image (Containerfile; README, "Container image"), built by Debian's buildah
# with no container runtime (these machines can start no container): its RUN steps run in
# a chroot. Its base, $(IMAGE_BASE), is made from Debian's packages by debootstrap
# (deploy/image/base.sh: no registry is reachable here) the first time, then kept in
# buildah's storage as a pulled base would be. Docker's format: OCI's has no HEALTHCHECK.
# pip in the build reaches PyPI with the host's certificates (a secret, not kept).
IMAGE      ?= localhost/rsd:latest
IMAGE_BASE ?= localhost/rsd-base:bookworm
BUILDAH    := /usr/bin/buildah
DEBOOTSTRAP := /usr/sbin/debootstrap
CA_CERTIFICATES := /etc/ssl/certs/ca-certificates.crt
CA_SECRET  := --secret id=ca-certificates,src=$(CA_CERTIFICATES)
IMAGE_VERSION = $(shell $(PYTHON) -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
IMAGE_BUILD = buildah build --isolation chroot --format docker --pull-never \
  --build-arg VERSION=$(IMAGE_VERSION) \
  $(if $(wildcard $(CA_CERTIFICATES)),$(CA_SECRET)) \
  --file Containerfile

image: image-base
	$(IMAGE_BUILD) --build-arg BASE=$(IMAGE_BASE) --tag $(IMAGE) .

image-base: $(BUILDAH) $(DEBOOTSTRAP)
	buildah inspect --type image $(IMAGE_BASE) > /dev/null 2>&1 || sh deploy/image/base.sh $(IMAGE_BASE)

# The image its test starts rsd from (tests/test_the_image_serves_from_its_own_root_as_its_
# user.py), tagged $(TEST_IMAGE) and removed by that test: the Containerfile built as `make
# image` builds it, with two build arguments. PREBUILT=1: the wheel of this checkout's own
# install (the build backend's PEP 517 hook, as pip calls it, packs the modules `make`
# compiled; `make image` compiles them again, 160 s of CPU). BASE=$(TEST_IMAGE_BASE): a
# Debian base made from this host's own installed packages of the same release
# (deploy/image/base-from-host.sh), which has what the rootfs stage would install
# (Debian's Python, binutils, the certificate authorities): that stage installs nothing
# with apt; rsd's dependencies come from PyPI as in `make image`. Kept in buildah's
# storage once made, as $(IMAGE_BASE) is.
# What it costs on a fresh machine (buildah purged, /var/lib/containers removed; three
# runs on 2026-12-07, load 3 to 6 from other work): buildah's install 7 to 10 s and 4.6 to
# 6.8 s of CPU (the package lists already fetched, for etcd), the base 2.4 to 3.7 s and
# 2.7 to 4.0 s of CPU, the wheel and the image 13 to 20 s and 13 to 16 s of CPU (the
# wheel 1.4 of them: pip wheel took 3.1), the test 2 to 5 s and 2.1 to 3.5 s of CPU: 26
# to 29 s of CPU in all, which `make test` gives it from what its other jobs leave (see
# test-image-background). With debootstrap's base it was about 77 s of CPU: the build
# then ended minutes after the suite. What remains: pip fetching and unpacking rsd's
# dependencies in the rootfs stage (4 to 5 s of CPU), buildah copying the 90 MB root file
# system into the image and committing it (3.5 s), dpkg unpacking buildah's Go programs.
TEST_IMAGE := localhost/rsd:test
TEST_IMAGE_BASE := localhost/rsd-base:host
IMAGE_DIR  := build/image

# `make test` starts the image's build (`make test-image`) in the background before its
# other jobs, at the lowest CPU priority and the lowest disk priority of the best-effort
# class (not the idle class: the suite's fsyncs never stop, and the build must end), and
# goes on: the build takes what CPU the others leave (the TypeScript tests and the suite
# mostly wait on their servers), writes its exit code to $(IMAGE_STATUS) and its output
# beside it, and the image's test, in the suite, waits for that code. Only as root (buildah
# builds and mounts as root; the test skips otherwise). IMAGE_IN_TEST=0: `make test` leaves
# the image out (then `make test-image-check`).
IMAGE_IN_TEST ?= 1
IMAGE_STATUS := $(IMAGE_DIR)/status
test-image-background:
	@mkdir -p $(IMAGE_DIR) && rm -f $(IMAGE_STATUS) $(IMAGE_STATUS).log $(IMAGE_STATUS).part
ifneq ($(IMAGE_IN_TEST),0)
	@if [ "$$(id -u)" = 0 ]; then \
	  echo "rsd: the container image builds in the background ($(IMAGE_STATUS).log)"; \
	  ( date +'%T began'; nice -n 19 ionice -c 2 -n 7 $(MAKE) --no-print-directory \
	      test-image; code=$$?; date +"%T ended: $$code"; \
	    echo $$code > $(IMAGE_STATUS).part && mv $(IMAGE_STATUS).part $(IMAGE_STATUS) \
	  ) < /dev/null > $(IMAGE_STATUS).log 2>&1 & \
	fi
endif

# The image built and its test run (the test builds it with `make test-image`).
test-image-check: $(STAMP)
	$(BIN)/python -m pytest -p no:cacheprovider -m image \
	  tests/test_the_image_serves_from_its_own_root_as_its_user.py

test-image: $(STAMP) test-image-base
	buildah rmi $(TEST_IMAGE) > /dev/null 2>&1 || true
	rm -f $(IMAGE_DIR)/rsd-*.whl
	$(BIN)/python -c "from setuptools import build_meta; build_meta.build_wheel('$(IMAGE_DIR)')" > /dev/null
	$(IMAGE_BUILD) --build-arg BASE=$(TEST_IMAGE_BASE) --build-arg PREBUILT=1 --tag $(TEST_IMAGE) .

test-image-base: $(BUILDAH)
	buildah inspect --type image $(TEST_IMAGE_BASE) > /dev/null 2>&1 || \
	  sh deploy/image/base-from-host.sh $(TEST_IMAGE_BASE)

# buildah and debootstrap, Debian's, installed as root when missing (buildah without its
# recommended runtimes: it runs the build's steps itself, in a chroot). The package lists
# are fetched only when they do not have it (`make test` fetched them for etcd just before).
$(BUILDAH) $(DEBOOTSTRAP):
	@test "$$(id -u)" = 0 || { echo "$(notdir $@) is missing: run make as root," \
	  "or apt-get install $(notdir $@)"; exit 1; }
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(notdir $@) \
	  || { apt-get update -q && DEBIAN_FRONTEND=noninteractive \
	       apt-get install -y -q --no-install-recommends $(notdir $@); }

# The TypeScript SDK compiled: `npm ci` from its committed lockfile, then tsc. dist/ is
# made anew (tsc compiles every file each time anyway): a test file renamed or removed
# would otherwise leave its old compiled copy, which `npm test` (dist/test/*.test.js)
# still runs. The compiler is TypeScript 7 (the lockfile's; Go, not JavaScript): 1.7 s of
# CPU for the SDK, its tests and benchmarks, where 5.9 took 11.2 s, and the same
# JavaScript and declarations to the byte (only the source maps differ).
ts-build:
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error && rm -rf dist && npm run build

# `make test` starts the compile in the background before anything else and goes on:
# it needs no rsd, and the install's first minute leaves a core idle (pip fetching and
# unpacking, mypyc's type check on one thread), where `npm ci` (mostly the registry's
# answers) and tsc fit; in line, after the install, the two were 15 to 20 s of the wait
# before the TypeScript tests (with TypeScript 5). Its exit code goes to $(TS_STATUS),
# its output beside it; test-ts waits for that code (TS_BUILT, set by `make test`).
TS_STATUS := build/ts/status
ts-build-background:
	@mkdir -p $(dir $(TS_STATUS)) && rm -f $(TS_STATUS) $(TS_STATUS).log $(TS_STATUS).part
	@echo "rsd: the TypeScript SDK compiles in the background ($(TS_STATUS).log)"
	@( $(MAKE) --no-print-directory ts-build; \
	   echo $$? > $(TS_STATUS).part && mv $(TS_STATUS).part $(TS_STATUS) \
	 ) < /dev/null > $(TS_STATUS).log 2>&1 &

# The TypeScript tests (the tests of a sharded cluster start an etcd member of their own:
# test/support.ts), on the compile of `make test`'s background (TS_BUILT: its status file,
# waited for, its output shown) or, alone, on one made first. `npm test` runs Node's test
# runner under tests/support/nodeforkserver.py, which forks the tests' rsd servers: 47
# and 48 s of CPU for the run against 65 and 61 s spawning each (the console script's
# imports, 0.4 s a start).
test-ts: $(STAMP) $(ETCD)
ifdef TS_BUILT
	@while [ ! -e $(TS_BUILT) ]; do sleep 0.2; done; cat $(TS_BUILT).log; \
	  test "$$(cat $(TS_BUILT))" = 0 || { echo "the TypeScript SDK did not compile"; exit 1; }
else
	$(MAKE) --no-print-directory ts-build
endif
	cd $(TS) && $(TEST_BYTECODE) npm test

lint: $(STAMP)
	$(BIN)/ruff check .

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet --no-build-isolation $(EDITABLE) -e '.[test,bench]'
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
	rm -rf $(VENV) build .pytest_cache .ruff_cache $(TS)/node_modules $(TS)/dist *__mypyc.*.so
	find rsproto rsd rsclient rsctl -name '*.so' -delete
