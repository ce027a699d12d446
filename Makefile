# Thin wrapper around CMake and the guest image script. The two set-up commands are
# `make run` and `make test`; everything they need is installed and built on the way.
BUILD   ?= build
IMAGES  ?= $(CURDIR)/var/images
JOBS    ?= $(shell nproc)
# Debian's interpreter: the python3 first on PATH may be another one without our packages.
PYTHON  ?= /usr/bin/python3
AGENT   := $(BUILD)/bin/pandastack-agent
GUEST   := guest/build-image.sh

.PHONY: all deps configure build build-asan guest guest-base guest-kernel guest-initramfs test test-long test-asan test-chaos test-integrity test-soak unit integration run bench bench-overhead bench-cluster bench-churn fuzz clean distclean

all: build

deps:
	@scripts/deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)

guest-kernel: deps
	$(GUEST) kernel $(IMAGES)/kernel

guest-initramfs: build guest-kernel
	$(GUEST) initramfs $(IMAGES)/initramfs $(IMAGES)/kernel $(AGENT)

# The base template alone (what the unit of most tests is; `make guest` builds every template).
guest-base: guest-initramfs
	$(GUEST) rootfs $(IMAGES)/base guest/templates/base.recipe

# All shipped templates.
guest: guest-base
	$(GUEST) rootfs $(IMAGES)/agent guest/templates/agent.recipe
	$(GUEST) rootfs $(IMAGES)/code-interpreter guest/templates/code-interpreter.recipe
	$(GUEST) rootfs $(IMAGES)/postgres guest/templates/postgres.recipe

unit: build
	cd $(BUILD) && ctest --output-on-failure -L unit

integration: build guest
	cd $(BUILD) && PANDASTACK_IMAGES=$(IMAGES) ctest --output-on-failure -L integration

# The README's test command (budget: 20 minutes): every suite but those labelled `long` (full
# template builds, the cluster), each case under the watchdog. The unit cases run two at a time;
# a suite that boots VMs runs alone (RUN_SERIAL). Every shipped template: the tests create from
# each of them.
test: build guest
	cd $(BUILD) && PANDASTACK_IMAGES=$(IMAGES) $(CURDIR)/scripts/ctest.sh --output-on-failure -j 2 -LE long

# Everything: `make test`'s suites, the `long` ones, 50 chaos rounds, 100 integrity cycles and the
# 10-minute soak (about 50 minutes here).
test-long: build guest
	cd $(BUILD) && PANDASTACK_IMAGES=$(IMAGES) PANDASTACK_LONG=1 $(CURDIR)/scripts/ctest.sh --output-on-failure -j 2
	$(MAKE) test-chaos test-integrity test-soak

# The unit, API, RPC and security suites again, every host binary built with AddressSanitizer +
# UndefinedBehaviorSanitizer in its own build folder (the guest images are the normal build's).
# Any report fails the test that caused it.
ASAN_BUILD ?= build-asan
build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPANDASTACK_SANITIZE=ON
	cmake --build $(ASAN_BUILD) -j $(JOBS)

test-asan: build-asan guest
	cd $(ASAN_BUILD) && PANDASTACK_IMAGES=$(IMAGES) \
	  ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:detect_stack_use_after_return=0:quarantine_size_mb=64 \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  $(CURDIR)/scripts/ctest.sh --output-on-failure -j 2 -L 'unit|asan'

# The daemon in the foreground: REST on 127.0.0.1:7070, data under ./var, prints the URL and the
# admin API key (created on first start, kept in var/api-key). Ctrl-C stops it gracefully. Every
# shipped template is built first (cached: only the first run takes minutes).
LISTEN ?= 127.0.0.1:7070
run: build guest
	$(BUILD)/bin/pandastackd --data $(CURDIR)/var --images $(IMAGES) --listen $(LISTEN)

bench: build guest-base
	$(BUILD)/bin/pandastack-bench driver boot --n 5 --images $(IMAGES) --json
	$(BUILD)/bin/pandastack-bench driver exec --n 200 --images $(IMAGES) --json

# Chaos: rounds of 20 clients doing random lifecycle operations (QEMUs killed from the host among
# them), the daemon SIGKILLed at a random moment and restarted, everything checked after each
# (tests/crash/chaos_test.py). ROUNDS=50; `make test` runs 3 (ctest chaos).
test-chaos: build guest
	PANDASTACK_IMAGES=$(IMAGES) $(PYTHON) tests/crash/chaos_test.py --daemon $(BUILD)/bin/pandastackd \
	  --cli $(BUILD)/bin/pandastack --rounds $(or $(ROUNDS),50)

# 100 hibernate/wake cycles and 100 fork generations with 64 MiB files hashed each time (~15 min
# under TCG); prints a JSON summary line.
CYCLES ?= 100
test-integrity: build guest-base
	PANDASTACK_IMAGES=$(IMAGES) $(PYTHON) tests/reliability/integrity_test.py \
	  --daemon $(BUILD)/bin/pandastackd --cycles $(CYCLES)

# Soak: a daemon of its own under `pandastack-bench api soak` (mixed exec, files, streams) for
# SECONDS (600) with SANDBOXES (20) and CLIENTS (16); fails on an error or a daemon that grows
# (tests/reliability/soak_test.py). Run it with no other daemon on the host.
test-soak: build guest-base
	PANDASTACK_IMAGES=$(IMAGES) $(PYTHON) tests/reliability/soak_test.py \
	  --daemon $(BUILD)/bin/pandastackd --bench $(BUILD)/bin/pandastack-bench \
	  --seconds $(or $(SECONDS),600) --sandboxes $(or $(SANDBOXES),20) --clients $(or $(CLIENTS),16)

# Churn: N (10000) sandboxes created and killed one after another by a daemon of its own, which is
# restarted after N/10 and after N: create p50, RSS and start-up time at both, and their ratios
# (tests/reliability/churn_bench.py). Run it with no other daemon on the host.
bench-churn: build guest-base
	PANDASTACK_IMAGES=$(IMAGES) $(PYTHON) tests/reliability/churn_bench.py \
	  --daemon $(BUILD)/bin/pandastackd --bench $(BUILD)/bin/pandastack-bench --n $(or $(N),10000)

# Every libFuzzer target (tests/fuzz) for FUZZ_SECONDS each (default 30), in build-fuzz with clang.
fuzz: deps
	FUZZ_SECONDS=$(or $(FUZZ_SECONDS),30) scripts/fuzz.sh

# The daemon's own cost on the reply path: REST exec/create/fork against the driver's, in one run.
bench-overhead: build guest-base
	BUILD=$(BUILD) IMAGES=$(IMAGES) scripts/bench-overhead.sh

# The cluster's figures, in one run (three daemons and an etcd of their own): routing through a
# host that does not own the sandbox (N rounds), cross-host fork against same-host fork, and
# migration (N/10 rounds, at least 10).
bench-cluster: build guest-base
	$(PYTHON) tests/cluster/bench_cluster.py $(or $(N),200)

clean:
	rm -rf $(BUILD)

distclean: clean
	rm -rf var
