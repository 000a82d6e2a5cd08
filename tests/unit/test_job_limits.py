"""The CPUs and memory a job that names none is limited to (both runtimes): the node's defaults for
CPU-only jobs, the share of the node its GPUs are for GPU jobs."""

from __future__ import annotations

from fleet.agent.launcher import job_limits
from fleet.config_sections import AgentSettings

GiB = 1 << 30
#: a node of 64 CPUs, 512 GiB and 8 GPUs
NODE = (64.0, 512 * GiB, 8)


def test_a_cpu_only_job_gets_one_cpu_and_the_memory_that_goes_with_it() -> None:
    assert job_limits(None, None, 0, AgentSettings(), NODE) == (1.0, 8 * GiB)
    assert job_limits(4.0, None, 0, AgentSettings(), NODE) == (4.0, 32 * GiB)  # memory per CPU


def test_the_operators_defaults_apply_to_cpu_only_jobs() -> None:
    cfg = AgentSettings(default_cpus=2.0, default_memory="6g")
    assert job_limits(None, None, 0, cfg, NODE) == (2.0, 6 * GiB)


def test_a_gpu_job_gets_its_gpus_share_of_the_node() -> None:
    assert job_limits(None, None, 2, AgentSettings(), NODE) == (16.0, 128 * GiB)
    cfg = AgentSettings(default_cpus_per_gpu=6.0, default_memory_per_gpu="40g")
    assert job_limits(None, None, 2, cfg, NODE) == (12.0, 80 * GiB)


def test_what_the_spec_names_wins_and_nothing_exceeds_the_node() -> None:
    assert job_limits(3.0, 5 * GiB, 2, AgentSettings(), NODE) == (3.0, 5 * GiB)
    cfg = AgentSettings(default_cpus=128.0, default_memory="1t")
    assert job_limits(None, None, 0, cfg, NODE) == (64.0, 512 * GiB)
