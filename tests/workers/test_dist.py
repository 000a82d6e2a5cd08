"""fleet_worker.dist without a process group: ranks from the gang environment, no torch needed."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

import fleet_worker as fw

GANG = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "FLEET_NUM_NODES", "FLEET_NODE_RANK", "FLEET_NUM_GPUS")


@pytest.fixture(autouse=True)
def clean_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in GANG:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEET_CHECKPOINT_DIR", str(tmp_path))
    monkeypatch.delenv("FLEET_RESUME_FROM", raising=False)


def test_outside_a_gang_the_job_is_rank_0_of_1() -> None:
    assert (fw.dist.rank(), fw.dist.local_rank(), fw.dist.world_size(), fw.dist.is_rank0()) == (0, 0, 1, True)
    assert (fw.num_nodes(), fw.node_rank(), fw.num_gpus()) == (1, 0, 0)


def test_torchrun_ranks_win_over_the_members(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given member 1 of 2 whose torchrun started 4 workers per node; this is its local worker 2
    for name, value in {
        "FLEET_NUM_NODES": "2",
        "FLEET_NODE_RANK": "1",
        "RANK": "6",
        "LOCAL_RANK": "2",
        "WORLD_SIZE": "8",
    }.items():
        monkeypatch.setenv(name, value)
    assert (fw.dist.rank(), fw.dist.local_rank(), fw.dist.world_size(), fw.dist.is_rank0()) == (
        6,
        2,
        8,
        False,
    )
    assert (fw.num_nodes(), fw.node_rank()) == (2, 1)


def test_a_plain_launch_is_ranked_by_its_node(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given one process per node started without torchrun: no RANK, WORLD_SIZE = FLEET_NUM_NODES
    for name, value in {"FLEET_NUM_NODES": "3", "FLEET_NODE_RANK": "2", "WORLD_SIZE": "3"}.items():
        monkeypatch.setenv(name, value)
    assert (fw.dist.rank(), fw.dist.world_size(), fw.dist.is_rank0()) == (2, 3, False)


def test_without_a_process_group_the_helpers_act_for_one_process() -> None:
    stop = threading.Event()
    assert fw.dist.stop_agreed(stop) is False
    stop.set()
    assert fw.dist.stop_agreed(stop) is True
    path = fw.dist.save({"w": 1}, 3)
    assert path.name == "step-0000000003.ckpt"
    assert fw.dist.load_latest() == ({"w": 1}, 3)


def test_the_sdk_imports_without_torch() -> None:
    # torch is installed here, so check that importing the SDK (dist included) does not load it
    code = "import sys, fleet_worker; fleet_worker.dist.rank(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
