# fleet — common tasks. `make demo` runs a local fleet; `make test` runs the test suite.
PYTHON ?= python3
PIP := $(PYTHON) -m pip
STAMP := .build
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install demo up test test-unit e2e-hosts lint typecheck all images image-python images-test bench clean

$(STAMP)/installed: pyproject.toml config/setup-host.sh
	bash config/setup-host.sh
	$(PIP) install -q -e '.[dev,torch]'
	@mkdir -p $(STAMP) && touch $@

install: $(STAMP)/installed  ## system packages, dockerd, fleet and its dev tools

images-test: install  ## images the tests run jobs in: tiny busybox, and localhost/fleet/torch
	@docker image inspect localhost/fleet/busybox:latest >/dev/null 2>&1 || bash images/busybox/build.sh
	@docker image inspect localhost/fleet/rootfs-bookworm:latest >/dev/null 2>&1 || bash images/rootfs/build.sh
	@docker image inspect localhost/fleet/torch:latest >/dev/null 2>&1 || bash images/torch/build.sh

image-python: install  ## localhost/fleet/python, the default job image (debootstrap rootfs + SDK)
	@docker image inspect localhost/fleet/rootfs-bookworm:latest >/dev/null 2>&1 || bash images/rootfs/build.sh
	docker build -q -t localhost/fleet/python:latest -f images/python/Dockerfile . >/dev/null
	@echo "built localhost/fleet/python"

images: images-test image-python  ## every image, rebuilt, without any registry
	bash images/torch/build.sh

demo: install  ## start a local fleet, run example jobs to completion, stop
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory image-python; fi
	fleet up --demo

up: install  ## a local fleet in the foreground (Ctrl-C stops it)
	fleet up

test: install images-test  ## the whole suite (real Redis, real Docker, simulated GPUs)
	$(PYTHON) -m pytest

test-unit: install
	$(PYTHON) -m pytest tests/unit

e2e-hosts: install  ## a fleet over four hosts (network namespaces, as root): the wheel, TLS, a gang, a drain, a cut link
	$(PYTHON) -m pytest tests/integration/test_hosts.py

lint: install
	$(PYTHON) -m ruff check fleet tests workers bench
	$(PYTHON) -m ruff format --check fleet tests workers bench

typecheck: install
	$(PYTHON) -m mypy

all: lint typecheck test

bench: install images-test  ## dispatch, recovery, launch cost, memory under retention, scale (small; see bench/scale.py), job arrays, CLI time, fair share and preemption, queue positions, webhooks, a live resize, fleet sim and the elastic policy, Slurm if installed; results go to BENCHMARKS.md by hand
	$(PYTHON) -m bench.dispatch
	$(PYTHON) -m bench.recovery
	$(PYTHON) -m bench.supervisor
	$(PYTHON) -m bench.retention
	$(PYTHON) -m bench.scale
	$(PYTHON) -m bench.arrays
	$(PYTHON) -m bench.cli
	$(PYTHON) -m bench.fairness
	$(PYTHON) -m bench.positions
	$(PYTHON) -m bench.webhooks
	$(PYTHON) -m bench.elastic  # a live resize through the real path
	$(PYTHON) -m bench.sim  # the simulator and the elastic policy: allocator cost, the paper's workloads, Philly
	bash bench/slurm.sh  # Slurm beside fleet; skips when Slurm is not installed (--install installs it)

clean:
	rm -rf $(STAMP) .pytest_cache .mypy_cache .ruff_cache *.egg-info
