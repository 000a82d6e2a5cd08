# fleet — common tasks. `make demo` runs a local fleet; `make test` runs the test suite.
# Everything runs in the project's own virtual environment, made from the system's Python
# (Debian's /usr/bin/python3 where there is one: the Python users have). Nothing is installed
# into a system Python, which Debian and Ubuntu refuse anyway (PEP 668).
SYSTEM_PYTHON ?= $(shell test -x /usr/bin/python3 && echo /usr/bin/python3 || command -v python3)
VENV ?= .venv
PYTHON := $(VENV)/bin/python
PIP := $(PYTHON) -m pip
STAMP := .build
# pytest-xdist workers for `make test`: most tests wait on services' timings rather than compute,
# so more workers than cores pay (measured on a 2-core machine: 3 workers kept the CPUs 83 % busy
# and the main run took 10:34-11:14; 4 keep them 93 % busy, 9:43)
TEST_WORKERS ?= 4
# their temp root, short: a worker's tests sit a level deeper (popen-gwN), and a test fleet's node
# supervisor listens on a Unix socket in the test's directory (at most 107 bytes of path)
TEST_TMP ?= /tmp/fleet-test
# make bench-pollux: which workloads, load and policies (add optimus: 3-17 min a workload, the slow one)
WORKLOADS ?= 1-8
LOAD ?= 1x
POLICIES ?= fleet,tiresias,pollux
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: install demo up bytecode test coverage test-installed test-unit chaos-failover dist e2e-hosts lint typecheck all images image-python image-torch images-test bench bench-pollux clean

$(STAMP)/installed: pyproject.toml config/setup-host.sh
	bash config/setup-host.sh
	test -x $(PYTHON) || $(SYSTEM_PYTHON) -m venv $(VENV)
	$(PIP) install -q -e '.[dev,torch]'
	@mkdir -p $(STAMP) && touch $@

install: $(STAMP)/installed  ## system packages, dockerd, and fleet with its dev tools in .venv

images-test: install  ## images the tests run jobs in: tiny busybox, localhost/fleet/torch and /python
	@docker image inspect localhost/fleet/busybox:latest >/dev/null 2>&1 || bash images/busybox/build.sh
	@docker image inspect localhost/fleet/rootfs-bookworm:latest >/dev/null 2>&1 || bash images/rootfs/build.sh
	@$(MAKE) --no-print-directory image-torch image-python

image-torch: install  ## localhost/fleet/torch, the image of the README's training example (built once)
	@docker image inspect localhost/fleet/torch:latest >/dev/null 2>&1 || PYTHON=$(PYTHON) bash images/torch/build.sh

image-python: install  ## localhost/fleet/python, the default job image (debootstrap rootfs + SDK)
	@docker image inspect localhost/fleet/rootfs-bookworm:latest >/dev/null 2>&1 || bash images/rootfs/build.sh
	PYTHON=$(PYTHON) bash images/cloudpickle.sh
	docker build -q -t localhost/fleet/python:latest -f images/python/Dockerfile . >/dev/null
	@echo "built localhost/fleet/python"

images: images-test image-python  ## every image, rebuilt, without any registry
	PYTHON=$(PYTHON) bash images/torch/build.sh

demo: install  ## start a local fleet, run example jobs to completion, stop
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory image-python image-torch; fi
	$(VENV)/bin/fleet up --demo

up: install  ## a local fleet in the foreground (Ctrl-C stops it)
	$(VENV)/bin/fleet up

# the services, CLIs and jobs the tests start import fleet from this checkout: compiled once here, none
# compiles it again as it starts (each would where PYTHONDONTWRITEBYTECODE is set: about 0.1 s of CPU
# for a controller and an agent, and the suite starts hundreds)
bytecode: install
	$(PYTHON) -m compileall -q fleet workers bench tests

test: install images-test bytecode  ## the whole suite (real Redis, real Docker, simulated GPUs), then the built wheel
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not alone" --basetemp=$(TEST_TMP) --durations=25
	$(PYTHON) -m pytest -m alone
	$(MAKE) --no-print-directory test-installed

coverage: install images-test bytecode  ## line and branch coverage of fleet/ over the suite, its services' processes included
	$(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not alone" --basetemp=$(TEST_TMP) --cov --cov-report=term
	$(PYTHON) -m pytest -m alone --cov --cov-append --cov-report=term

test-installed: install  ## build the wheel and sdist, install each into a fresh venv, run the smoke tests there
	bash tests/installed.sh $(SYSTEM_PYTHON)

test-unit: install
	$(PYTHON) -m pytest tests/unit

chaos-failover: install  ## the failover test, long: 3 rounds (a SIGKILLed and a partitioned Redis primary each) under load
	FLEET_FAILOVER_ROUNDS=$${FLEET_FAILOVER_ROUNDS:-3} FLEET_FAILOVER_JOB_S=$${FLEET_FAILOVER_JOB_S:-5-30} \
	FLEET_FAILOVER_GAP_S=$${FLEET_FAILOVER_GAP_S:-10-20} $(PYTHON) -m pytest tests/chaos/test_failover.py -s

e2e-hosts: install  ## a fleet over four hosts (network namespaces, as root): the wheel, TLS, a gang, a drain, a cut link
	$(PYTHON) -m pytest tests/integration/test_hosts.py

lint: install
	$(PYTHON) -m ruff check fleet tests workers bench
	$(PYTHON) -m ruff format --check fleet tests workers bench

typecheck: install
	$(PYTHON) -m mypy

all: lint typecheck test

bench: install images-test  ## dispatch, recovery, launch cost, memory under retention, scale (small; see bench/scale.py), job arrays, CLI time, a large workdir's submit, fair share and preemption, queue positions, webhooks, the API path (submits/s, jobs/s), functions (f.map, a call's round trip), a live resize, fleet sim and the elastic policy, Slurm if installed; results go to BENCHMARKS.md by hand
	$(PYTHON) -m bench.dispatch
	$(PYTHON) -m bench.recovery
	$(PYTHON) -m bench.supervisor
	$(PYTHON) -m bench.retention
	$(PYTHON) -m bench.scale
	$(PYTHON) -m bench.arrays
	$(PYTHON) -m bench.cli
	$(PYTHON) -m bench.workdir  # fleet submit --workdir of a 30,000-file, 60 MB tree: cold, unchanged, one file changed
	$(PYTHON) -m bench.fairness
	$(PYTHON) -m bench.positions
	$(PYTHON) -m bench.webhooks
	$(PYTHON) -m bench.api  # submits/s and trivial jobs/s through the real API, sbatch beside it when installed
	$(PYTHON) -m bench.functions  # f.map and one call's round trip against plain jobs, submitit on Slurm beside them when installed
	$(PYTHON) -m bench.elastic  # a live resize through the real path
	$(PYTHON) -m bench.sim  # the simulator and the elastic policy: allocator cost, the paper's workloads, Philly
	bash bench/slurm.sh  # Slurm beside fleet; skips when Slurm is not installed (--install installs it)

bench-pollux: install  ## fleet's elastic policy in Pollux's own simulator, beside Tiresias, Optimus and Pollux (published): WORKLOADS=1-8 LOAD=1x|2x POLICIES=...
	$(PYTHON) -m bench.pollux --workloads $(WORKLOADS) --load $(LOAD) --policies $(POLICIES)

dist: install  ## the sdist and the wheel (built from the sdist), in dist/
	$(PYTHON) -m build --outdir dist .

clean:
	rm -rf $(STAMP) $(VENV) dist .pytest_cache .mypy_cache .ruff_cache *.egg-info
