# redis-lock: `make run` builds the module and starts redis-server with it; `make test` runs
# every test. Both install redis-server and libclang-dev with apt-get when they are missing;
# `make test-valkey` runs the same tests on Valkey 8 (installed from bookworm-backports).

PORT ?= 6379
CARGO ?= cargo
MODULE := target/release/libredis_lock.so
TEST_MODULE := target/debug/libredis_lock.so

.PHONY: all deps deps-valkey build run test test-valkey test-server lint fmt clean bench bench-quick fuzz

all: build

deps:
	@scripts/ensure-deps.sh

deps-valkey:
	@scripts/ensure-deps.sh valkey

build: deps
	$(CARGO) build --release

# Foreground server on 127.0.0.1:$(PORT) with the module, configured by module.conf.example;
# its data (dump.rdb, appendonlydir) goes to target/run, not the checkout. The module path is
# absolute because redis-server changes into --dir before it loads modules.
RUN_DIR := $(CURDIR)/target/run

run: build
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

test-valkey: deps deps-valkey
	$(MAKE) test-server SERVER=valkey-server

test-server:
	@echo "== tests on $$($(SERVER) --version)"
	$(CARGO) test -p redis-lock-core -p redis-lock-testkit
	$(CARGO) build --features test-hooks
	REDIS_LOCK_SERVER=$(SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(TEST_MODULE) $(CARGO) test --features test-hooks
	REDIS_LOCK_SERVER=$(SERVER) REDIS_LOCK_MODULE=$(CURDIR)/$(TEST_MODULE) $(CARGO) test -p redis-lock-client

# Benchmarks: the module against SET NX + polling and a Lua fair lock, in one run, on a server
# the tool starts itself. With two or more CPUs the server runs on CPU 0 and the clients on 1.
BENCH_PIN := $(shell [ "$$(nproc)" -ge 2 ] && command -v taskset >/dev/null && echo "taskset -c 1")

bench: deps
	$(CARGO) build --release
	$(CARGO) build --release -p redis-lock-bench
	$(BENCH_PIN) target/release/lock-bench --out docs/benchmarks.md

# Same measurements, fewer samples (under 2 minutes); writes target/bench-quick/benchmarks.md.
bench-quick: deps
	$(CARGO) build --release
	$(CARGO) build --release -p redis-lock-bench
	$(BENCH_PIN) target/release/lock-bench --quick --out target/bench-quick/benchmarks.md

# cargo-fuzz (libFuzzer) targets in fuzz/: the lock core against its reference model, and the
# argument parser. FUZZ_SECONDS per target. Installs cargo-fuzz when missing; runs on the
# stable toolchain without a sanitizer (--sanitizer none), with libFuzzer's coverage guidance.
FUZZ_SECONDS ?= 60

fuzz:
	@cargo fuzz --version >/dev/null 2>&1 || $(CARGO) install cargo-fuzz --locked
	cd fuzz && $(CARGO) fuzz run --sanitizer none lock_model -- -max_total_time=$(FUZZ_SECONDS)
	cd fuzz && $(CARGO) fuzz run --sanitizer none parse_args -- -max_total_time=$(FUZZ_SECONDS)

lint: deps
	python3 scripts/import-graph.py
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --all-targets --features test-hooks -- -D warnings

fmt:
	$(CARGO) fmt

clean:
	$(CARGO) clean
