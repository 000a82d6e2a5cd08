"""``fleet doctor`` as an operator runs it: a real process per node against a real redis-server, the
nodes' checkpoint roots real directories (two nodes sharing one, a third with its own), Redis with
the shipped ACL users for the agent's login, the machine's own NVML (none here) and Docker daemon."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
import redis

from tests.conftest import need
from tests.integration.test_acl import AclRedis

pytestmark = pytest.mark.integration


@pytest.fixture
def roots() -> Iterator[Path]:
    """A folder for checkpoint roots that any user can reach (the job user must enter them)."""
    path = Path(tempfile.mkdtemp(prefix="fleet-test-doctor-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def doctor(node: str, root: Path, redis_url: str, *args: str, **env: str) -> tuple[int, str]:
    """Run ``fleet doctor`` as node ``node``: its exit code and what it printed."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    clean.update(
        FLEET_REDIS_URL=redis_url,
        FLEET_CHECKPOINT_ROOT=str(root),
        FLEET_AGENT__STATE_DIR=str(root.parent / f"state-{node}"),
        **env,
    )
    done = subprocess.run(
        [sys.executable, "-m", "fleet", "doctor", "--node-name", node, "--runtime", "process", *args],
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert not done.stderr, done.stderr
    return done.returncode, done.stdout


def checks(output: str) -> dict[str, dict[str, Any]]:
    found = json.loads(output)
    return {c["name"]: c for c in found["checks"]}


def _nvml_library() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        return False
    except pynvml.NVMLError:
        return True
    pynvml.nvmlShutdown()
    return True


def test_nodes_on_one_storage_recognise_each_other_and_one_on_another_fails(
    redis_url: str, roots: Path
) -> None:
    shared, elsewhere = roots / "nfs", roots / "local"
    shared.mkdir()
    elsewhere.mkdir()
    (roots / "mnt").symlink_to(shared)  # node b mounts the same storage at another path

    code, out = doctor("a", shared, redis_url)
    assert code == 0, out
    lines = {line[6:21].strip(): line for line in out.splitlines()[:-1]}
    assert lines["shared storage"].startswith("ok    shared storage   no other node has left a marker yet")
    assert lines["checkpoint root"].startswith(f"ok    checkpoint root  {shared} on ")
    if not _nvml_library():  # a machine without the NVIDIA driver: a warning that says what to do
        assert lines["nvml"].startswith("WARN  nvml             no NVML library (libnvidia-ml.so)")
        assert "fix: install the NVIDIA driver" in lines["nvml"]
    assert out.splitlines()[-1].endswith("0 failed, 2 skipped")  # docker, network guard: not used
    assert lines["cgroups"].startswith(("ok    cgroups", "WARN  cgroups"))  # the machine's cgroups

    code, out = doctor("b", roots / "mnt", redis_url, "-o", "json")
    assert code == 0, out
    assert checks(out)["shared storage"] == {
        "name": "shared storage",
        "status": "ok",
        "detail": "same storage as node a",
        "fix": "",
    }

    code, out = doctor("c", elsewhere, redis_url)
    assert code == 1, out
    [line] = [line for line in out.splitlines() if "shared storage" in line]
    assert line.startswith("FAIL  shared storage   node a's marker is not here")
    assert f"node b's marker is not here (its checkpoint_root: {roots / 'mnt'})" in line
    assert "checkpoint_root is not shared storage" in line
    assert "fix: mount the same shared storage (e.g. NFS) on every node" in line
    assert out.splitlines()[-1].endswith("1 failed, 2 skipped")

    # a and b, run again, see each other; c's marker is not on their storage
    code, out = doctor("a", shared, redis_url, "-o", "json")
    assert code == 1 and json.loads(out)["exit_code"] == 1
    found = checks(out)["shared storage"]
    assert found["status"] == "fail" and "node c's marker is not here" in found["detail"]
    assert "(same storage as node b)" in found["detail"]


def test_a_missing_checkpoint_root_fails_and_skips_the_shared_check(redis_url: str, roots: Path) -> None:
    code, out = doctor("a", roots / "not-mounted", redis_url, "-o", "json")
    found = checks(out)
    assert code == 1
    assert (
        found["checkpoint root"]["status"] == "fail"
        and "does not exist" in found["checkpoint root"]["detail"]
    )
    assert found["shared storage"]["status"] == "skip"
    assert not (roots / "not-mounted").exists()


@pytest.fixture
def acl_redis() -> Iterator[AclRedis]:
    need(shutil.which("redis-server") is not None, "redis-server not installed (make install)")
    server = AclRedis()
    yield server
    server.close()


def test_the_agents_acl_user_passes_and_a_wrong_password_says_what_to_do(
    acl_redis: AclRedis, roots: Path
) -> None:
    agent = acl_redis.client("fleet-agent")
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.time()  # so the clock is read the other way
    agent.close()
    login = {
        "FLEET_REDIS_USERNAME": "fleet-agent",
        "FLEET_REDIS_PASSWORD_FILE": str(acl_redis.password_file("fleet-agent")),
    }

    code, out = doctor("a", roots, acl_redis.url, "-o", "json", **login)
    found = checks(out)
    assert code == 0, out
    assert found["redis"]["status"] == "ok" and "as user fleet-agent" in found["redis"]["detail"]
    assert found["clock"]["status"] == "ok" and found["clock"]["detail"].startswith("this node's clock is")
    assert found["shared storage"]["status"] == "ok"
    # what the doctor left in Redis: its marker, under fleet's prefix, with a TTL; the clock probe is gone
    assert acl_redis.admin.keys("*") == ["fleet:doctor:markers"]
    assert 0 < acl_redis.admin.ttl("fleet:doctor:markers") <= 7 * 86400
    marker = json.loads(acl_redis.admin.hget("fleet:doctor:markers", "a") or "{}")
    assert (roots / ".fleet-doctor" / "a").read_text() == json.dumps(marker)

    wrong = roots / "wrong.password"
    wrong.write_text("not-the-password\n")
    code, out = doctor("a", roots, acl_redis.url, **{**login, "FLEET_REDIS_PASSWORD_FILE": str(wrong)})
    assert code == 1
    [line] = [line for line in out.splitlines() if line.startswith("FAIL  redis")]
    assert "refused user fleet-agent" in line and "fleet install agent --redis-password-file FILE" in line
    assert "p@ss" not in out  # no password in what it prints
    assert any(line.startswith("skip  clock") for line in out.splitlines())


def test_the_docker_runtime_is_checked_when_the_agent_would_use_it(
    redis_url: str, roots: Path, docker_ready: bool
) -> None:
    need(docker_ready, "docker daemon not available")
    code, out = doctor("a", roots, redis_url, "--runtime", "docker", "-o", "json")
    found = checks(out)
    runtime = found["runtime"]
    assert (runtime["status"], runtime["detail"]) == ("ok", "docker (agent.runtime = docker)")
    assert found["docker"]["status"] == "ok" and found["docker"]["detail"].startswith("Docker ")
    assert found["cgroups"]["status"] in ("ok", "warn")  # the machine's cgroup version
    if not _nvml_library():  # no GPU: no container is run, and nothing here fails
        assert found["docker --gpus"]["status"] == "skip"
        assert code == 0, out


def test_markers_are_forgotten_after_a_week_and_a_name_that_is_no_node_is_never_a_path(
    redis: redis.Redis, roots: Path
) -> None:
    from fleet.keys import Keys
    from fleet.ops.doctor.storage import MARKER_TTL_S, new_marker, shared_check

    now, key = 1_800_000_000.0, "fleet:doctor:markers"
    (roots / "secret").write_text("x")
    redis.hset(
        key,
        mapping={
            "old": new_marker("old", Path("/elsewhere"), now - MARKER_TTL_S - 1),
            "../secret": json.dumps({"node": "../secret", "at": now, "nonce": "n", "root": str(roots)}),
        },
    )
    (roots / ".fleet-doctor").mkdir()
    marker = new_marker("a", roots, now)
    (roots / ".fleet-doctor" / "a").write_text(marker)
    check = shared_check(redis, Keys("fleet"), roots, "a", marker, now)
    assert check.status == "ok" and check.detail.startswith("no other node has left a marker yet")
    assert sorted(redis.hkeys(key)) == ["../secret", "a"]  # the week-old marker is gone
