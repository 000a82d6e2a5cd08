"""Which release a service runs, as recorded, and what a fleet of several releases says."""

from __future__ import annotations

import tomllib
from pathlib import Path

import fleet
from fleet.state.records import parse_node
from fleet.versions import OLDEST, mixed


def test_the_package_and_its_metadata_name_one_release() -> None:
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert pyproject["project"]["version"] == fleet.__version__


def test_one_release_everywhere_is_not_mixed() -> None:
    assert mixed({"the API": "0.2.0", "the controller": "0.2.0", "gpu-01": "0.2.0"}) == ""
    assert mixed({}) == ""


def test_a_fleet_part_way_through_an_upgrade_names_each_release_newest_first() -> None:
    services = {"the API": "0.2.0", "the controller": "0.10.0", "gpu-01": "", "gpu-02": "0.2.0"}
    assert mixed(services) == (
        f"mixed versions: 0.10.0 (the controller); 0.2.0 (the API, gpu-02); {OLDEST} (gpu-01)"
    )


def test_a_long_list_of_nodes_is_cut_short() -> None:
    nodes = {f"gpu-{i:02}": "" for i in range(8)}
    assert mixed({"the API": "0.2.0", **nodes}) == (
        f"mixed versions: 0.2.0 (the API); {OLDEST} (gpu-00, gpu-01, gpu-02, gpu-03, gpu-04 and 3 more)"
    )


def test_a_node_record_of_0_1_0_reads_with_no_version() -> None:
    # Given the record 0.1.0's heartbeat wrote (no version fields)
    raw = {
        "name": "n1",
        "heartbeat_at": "100.5",
        "gpus": "[]",
        "cpus": "8",
        "memory": "1024",
        "state": "READY",
    }
    assert parse_node("n1", raw, True, {}, []).version == ""
    # And one whose last heartbeat came from 0.1.0 after a newer agent's (a rollback): its version
    # is not believed
    newer = {**raw, "version": "0.2.0", "version_at": "100.5"}
    assert parse_node("n1", newer, True, {}, []).version == "0.2.0"
    assert parse_node("n1", {**newer, "heartbeat_at": "101.0"}, True, {}, []).version == ""
