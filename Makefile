# mmlab: `make demo` sets up a fresh machine and runs the tour; `make test` runs the tests.
SHELL := /bin/bash
# pipefail: a failing mmlab in `mmlab ... | tee` fails the recipe.  (tee to a
# file, never to /dev/stderr: that reopens a redirected log and truncates it.)
.SHELLFLAGS := -eo pipefail -c
VENV := .venv
PY := $(VENV)/bin/python
MMLAB := $(VENV)/bin/mmlab
# Debian packages mmlab uses: the C build (static glibc), perf for attribution,
# QEMU/busybox/cpio for guest kernels, stress-ng as the peer stressor, util-linux
# for mkswap/swapon, chromium to check that the HTML report renders; flex, bison,
# bc, libelf-dev and libssl-dev to build kernels from source (mmlab kernels build);
# libglib2.0-dev and dpkg-dev (dpkg-source) to build mmlab's QEMU TCG plugin against
# Debian's qemu source (guest instruction counts); postgresql and redis-server
# for a lab of many machines (the shared store and the broker; the tests and
# `make bench-fleet` start private instances of both).  The census: clang to
# compile its BPF task_vma iterator, libbpf-dev (with libelf-dev, zlib1g-dev
# and libzstd-dev, libbpf's own dependencies) to link its loader statically
# so it also runs in a guest's initramfs (bpftrace 0.17, Debian 12's, cannot
# be used: it refuses iter probes where tracefs's function list is not
# readable, as on this lab's host; see docs/census.md); openjdk-17-jdk-headless
# (javac), nodejs and postgresql for the census recipes of real programs, which
# a guest runs from this machine's root through QEMU's own virtiofsd (in
# qemu-system-common, which qemu-system-x86 pulls in).  kexec-tools: the kexec
# a bare-metal machine's agent and its kernels under test switch kernels with
# (packed into their initramfs with its libraries; docs/fleet.md).
DEB_PACKAGES := gcc make libc6-dev linux-perf qemu-system-x86 busybox-static cpio \
	stress-ng util-linux git chromium flex bison bc libelf-dev libssl-dev libglib2.0-dev \
	dpkg-dev postgresql redis-server clang libbpf-dev zlib1g-dev libzstd-dev \
	openjdk-17-jdk-headless nodejs zstd kexec-tools

.PHONY: setup system venv build demo lint test test-slow bench bench-fleet bench-check clean

setup: system venv build

system:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,fleet]'
	touch $@

build:
	$(MAKE) -s -C workloads

demo: setup
	$(MMLAB) probe
	$(MMLAB) workloads
	$(MMLAB) run pageout-refault --samples 3 --thp hugepage
	$(MMLAB) run pageout-refault --samples 3 --thp nohugepage
	$(MMLAB) run mremap-churn --samples 3 --workers 2 --seconds 1
	$(MMLAB) run populate-unmap --samples 3 --workers 2 --seconds 0.5
	$(MMLAB) run unmap-young --samples 3 --backing shmem
	$(MMLAB) run unmap-young --samples 3 --backing shmem --sequential
	$(MMLAB) run ksm-rmap --samples 3 --vmas 1000 --allow-host-changes
	$(MMLAB) run ksm-rmap --samples 3 --vmas 4000 --allow-host-changes
	@mkdir -p build
	$(MMLAB) experiment run experiments/pageout-thp-modes.toml | tee build/demo-thp.out
	$(MMLAB) report $$(tail -1 build/demo-thp.out)
	$(MMLAB) experiment run experiments/aa-pageout.toml

# The gates before the tests; both tools read their settings from pyproject.toml.
lint: setup
	$(VENV)/bin/ruff check src
	$(VENV)/bin/mypy

# Two workers: a TCG guest keeps one core busy and the test waits, so one
# worker left the other core idle.  Tests that change host settings share one
# worker (conftest.py), and the machine lock orders them against the rest.
test: setup lint
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=25

test-slow: setup
	$(PY) -m pytest -q -m slow

bench: setup
	$(PY) -m mmlab.bench

# 10,000 sleeping trials over 50 local workers: the fleet's own overhead.
bench-fleet: setup
	$(PY) -m mmlab.bench.fleet

# A one-file patch checked against the kept 6.12 base over the broad mm suite:
# the check's speed and where its time goes (docs/check.md#time).
bench-check: setup
	$(PY) -m mmlab.bench.check_speed

clean:
	rm -rf build $(VENV)
