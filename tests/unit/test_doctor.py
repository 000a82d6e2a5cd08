"""``fleet doctor``'s checks, each on its passing and failing paths: NVML through a patched pynvml
raising its real error classes and codes, Docker through a stand-in for docker-py's client, the
cgroup and /proc files as files, the clock from given readings, real sockets for the ports."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest
from docker.errors import APIError, DockerException, ImageNotFound

from fleet.config import Settings
from fleet.config_sections import AgentSettings
from fleet.ops.doctor.connection import clock_check, redis_check
from fleet.ops.doctor.gpus import gpu_checks
from fleet.ops.doctor.host import address_check, cgroup_check, port_check
from fleet.ops.doctor.report import FAIL, OK, SKIP, WARN, Check, exit_code
from fleet.ops.doctor.run import with_installed_credentials
from fleet.ops.doctor.runtime import runtime_checks
from fleet.ops.doctor.storage import MARKER_DIR, checkpoint_check, job_identity, mount_of, new_marker
from fleet.ops.install import install, installed_credentials
from fleet.ops.local import free_port
from tests.unit.test_nvml import FakeNvml

GiB = 1 << 30


class VersionedNvml(FakeNvml):
    """The two GPUs of FakeNvml, with the driver's versions."""

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        super().install(monkeypatch)
        for name in (
            "nvmlSystemGetDriverVersion",
            "nvmlSystemGetNVMLVersion",
            "nvmlSystemGetCudaDriverVersion",
        ):
            monkeypatch.setattr(pynvml, name, getattr(self, name))

    def nvmlSystemGetDriverVersion(self) -> str:
        return "550.54.15"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "12.550.54.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12040


def _init_fails(monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    def fail() -> None:
        raise pynvml.NVMLError(code)  # pynvml picks the code's own subclass, as the library does

    monkeypatch.setattr(pynvml, "nvmlInit", fail)


def _by_name(checks: list[Check]) -> dict[str, Check]:
    return {c.name: c for c in checks}


# -- NVML ------------------------------------------------------------------------------------


def test_no_nvml_library_warns_with_the_fix_and_fails_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    _init_fails(monkeypatch, pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    checks, gpus = gpu_checks(AgentSettings(gpus="auto", simulated_gpus=3))
    [nvml] = checks
    assert (nvml.status, gpus) == (WARN, 0)
    assert "no NVML library" in nvml.detail and "3 simulated GPUs" in nvml.detail
    assert "install the NVIDIA driver" in nvml.fix and "agent.gpus = 'simulated'" in nvml.fix
    assert exit_code(checks) == 0


def test_no_nvml_library_fails_when_the_agent_must_use_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    _init_fails(monkeypatch, pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
    [nvml], _ = gpu_checks(AgentSettings(gpus="nvml"))
    assert nvml.status == FAIL and "the agent won't start" in nvml.detail
    assert "install the NVIDIA driver" in nvml.fix


@pytest.mark.parametrize(
    ("code", "fix"),
    [
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "modprobe nvidia"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "run as root"),
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reboot the node"),
    ],
)
def test_an_installed_driver_that_does_not_answer_fails_with_its_fix(
    monkeypatch: pytest.MonkeyPatch, code: int, fix: str
) -> None:
    """The library is there, so GPUs were meant to be: the agent's quiet fallback to simulated GPUs
    would hide a broken node."""
    _init_fails(monkeypatch, code)
    [nvml], gpus = gpu_checks(AgentSettings(gpus="auto", simulated_gpus=2))
    assert (nvml.status, gpus) == (FAIL, 0)
    assert str(pynvml.NVMLError(code)) in nvml.detail and "2 simulated GPUs instead" in nvml.detail
    assert fix in nvml.fix


def test_versions_and_a_line_per_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    VersionedNvml().install(monkeypatch)
    checks, gpus = gpu_checks(AgentSettings(gpus="auto"))
    found = _by_name(checks)
    assert gpus == 2
    assert found["nvml"].status == OK
    assert found["nvml"].detail == "driver 550.54.15, nvml 12.550.54.15, cuda 12.4; 2 GPUs"
    assert found["gpu 0"].status == OK and "NVIDIA H100 80GB HBM3, 80 GiB" in found["gpu 0"].detail
    # FakeNvml's second GPU runs pid 4242, a process fleet did not start
    assert found["gpu 1"].status == WARN and "foreign pid 4242" in found["gpu 1"].detail
    assert exit_code(checks) == 0


def test_a_lost_gpu_fails_its_line_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    VersionedNvml(lost=1).install(monkeypatch)
    checks, gpus = gpu_checks(AgentSettings(gpus="nvml"))
    found = _by_name(checks)
    assert gpus == 1  # only the GPU that answered counts (for the --gpus container)
    assert found["gpu 0"].status == OK
    assert found["gpu 1"].status == FAIL and found["gpu 1"].detail == "unknown-1: lost: GPU is lost"
    assert "Xid" in found["gpu 1"].fix and "fleet drain" in found["gpu 1"].fix
    assert exit_code(checks) == 1


def test_a_gpu_that_answers_its_handle_but_not_a_query_keeps_its_uuid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    nvml = VersionedNvml()
    nvml.install(monkeypatch)

    def memory(h: int) -> Any:
        if h == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_RESET_REQUIRED)
        return FakeNvml.nvmlDeviceGetMemoryInfo(nvml, h)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", memory)
    found = _by_name(gpu_checks(AgentSettings())[0])
    assert found["gpu 0"].status == FAIL
    assert found["gpu 0"].detail == "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd: error: GPU requires restart"
    assert "nvidia-smi -r" in found["gpu 0"].fix


def test_counting_gpus_failing_fails_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    VersionedNvml().install(monkeypatch)

    def count() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", count)
    [nvml], _ = gpu_checks(AgentSettings())
    assert nvml.status == FAIL and "NVML could not count GPUs: Unknown Error" in nvml.detail
    assert "nvidia-smi" in nvml.fix


def test_nvml_without_gpus_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    VersionedNvml().install(monkeypatch)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 0)
    [nvml], gpus = gpu_checks(AgentSettings(gpus="auto", simulated_gpus=4))
    assert (nvml.status, gpus) == (WARN, 0) and "NVML finds no GPU: the agent will offer 4" in nvml.detail


def test_simulated_gpus_skip_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    _init_fails(monkeypatch, pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)  # never asked
    [nvml], gpus = gpu_checks(AgentSettings(gpus="simulated", simulated_gpus=2))
    assert (nvml.status, gpus) == (SKIP, 0) and "2 simulated GPUs" in nvml.detail


# -- runtime, Docker -----------------------------------------------------------------------------


class FakeContainer:
    def __init__(self, code: int, output: str) -> None:
        self.code, self.output, self.removed = code, output, False

    def wait(self, timeout: int) -> dict[str, int]:
        return {"StatusCode": self.code}

    def logs(self) -> bytes:
        return self.output.encode()

    def remove(self, force: bool) -> None:
        self.removed = True


class FakeDocker:
    """What the checks ask of docker-py's client; ``run`` is a container, or the error to raise."""

    def __init__(
        self,
        runtimes: tuple[str, ...] = ("runc",),
        run: FakeContainer | Exception | None = None,
        answers: bool = True,
        images: tuple[str, ...] = ("img",),
    ) -> None:
        self.runtimes, self.run_result, self.answers, self.present = runtimes, run, answers, set(images)
        self.runs: list[dict[str, Any]] = []
        self.pulled: list[str] = []
        self.images, self.containers = self, self

    def ping(self) -> bool:
        if not self.answers:
            raise DockerException("Error while fetching server API version: connection refused")
        return True

    def version(self) -> dict[str, str]:
        return {"Version": "27.3.1", "ApiVersion": "1.47"}

    def info(self) -> dict[str, Any]:
        return {"CgroupVersion": "2", "Runtimes": {name: {} for name in self.runtimes}}

    def get(self, image: str) -> object:
        if image not in self.present:
            raise ImageNotFound(f"No such image: {image}")
        return object()

    def pull(self, image: str) -> None:
        self.pulled.append(image)
        self.present.add(image)

    def run(self, image: str, command: list[str], **options: Any) -> FakeContainer:
        self.runs.append({"image": image, "command": command, **options})
        if isinstance(self.run_result, Exception):
            raise self.run_result
        assert self.run_result is not None
        return self.run_result


def _agent(tmp_path: Path, **changes: Any) -> AgentSettings:
    return AgentSettings(state_dir=tmp_path / "state", **changes)


def test_the_process_runtime_skips_docker(tmp_path: Path) -> None:
    checks, runtime = runtime_checks(_agent(tmp_path, runtime="process"), 2, "img", FakeDocker(answers=False))
    found = _by_name(checks)
    assert runtime == "process" and found["runtime"].status == OK and found["docker"].status == SKIP


def test_a_docker_daemon_that_does_not_answer_fails(tmp_path: Path) -> None:
    checks, runtime = runtime_checks(_agent(tmp_path, runtime="docker"), 0, "img", FakeDocker(answers=False))
    [docker] = checks
    assert runtime is None and docker.status == FAIL and "connection refused" in docker.detail
    assert "systemctl start docker" in docker.fix


def test_docker_without_gpus_runs_no_gpu_container(tmp_path: Path) -> None:
    client = FakeDocker()
    found = _by_name(runtime_checks(_agent(tmp_path, runtime="docker"), 0, "img", client)[0])
    assert found["docker"].status == OK and "Docker 27.3.1 (API 1.47), cgroup v2" in found["docker"].detail
    assert found["docker --gpus"].status == SKIP and client.runs == []


def test_with_gpus_a_container_asks_for_all_of_them_and_sees_them(tmp_path: Path) -> None:
    container = FakeContainer(0, "GPU 0: NVIDIA H100 (UUID: GPU-a)\nGPU 1: NVIDIA H100 (UUID: GPU-b)\n")
    client = FakeDocker(runtimes=("nvidia", "runc"), run=container)
    found = _by_name(runtime_checks(_agent(tmp_path, runtime="docker"), 2, "img", client)[0])
    assert found["nvidia runtime"].status == OK
    assert found["docker --gpus"].status == OK and "sees 2 GPUs" in found["docker --gpus"].detail
    [run] = client.runs
    assert run["command"] == ["nvidia-smi", "-L"]
    assert [(r.count, r.capabilities) for r in run["device_requests"]] == [(-1, [["gpu"]])]
    assert container.removed


def test_a_gpu_container_that_cannot_start_fails_with_the_toolkit_fix(tmp_path: Path) -> None:
    refused = APIError('could not select device driver "" with capabilities: [[gpu]]')
    found = _by_name(runtime_checks(_agent(tmp_path, runtime="docker"), 1, "img", FakeDocker(run=refused))[0])
    assert (
        found["nvidia runtime"].status == WARN
        and "nvidia-ctk runtime configure" in found["nvidia runtime"].fix
    )
    gpus = found["docker --gpus"]
    assert gpus.status == FAIL and "could not select device driver" in gpus.detail
    assert "NVIDIA Container Toolkit" in gpus.fix


def test_a_gpu_container_that_sees_fewer_gpus_warns_and_one_that_fails_fails(tmp_path: Path) -> None:
    cfg = _agent(tmp_path, runtime="docker")
    fewer = FakeDocker(runtimes=("nvidia",), run=FakeContainer(0, "GPU 0: NVIDIA H100 (UUID: GPU-a)\n"))
    assert _by_name(runtime_checks(cfg, 2, "img", fewer)[0])["docker --gpus"].status == WARN
    broken = FakeDocker(runtimes=("nvidia",), run=FakeContainer(9, "NVIDIA-SMI has failed\n"))
    gpus = _by_name(runtime_checks(cfg, 2, "img", broken)[0])["docker --gpus"]
    assert gpus.status == FAIL and "exited 9: NVIDIA-SMI has failed" in gpus.detail


def test_the_gpu_containers_image_is_pulled_as_the_agent_would(tmp_path: Path) -> None:
    ran = FakeContainer(0, "GPU 0: x\n")
    client = FakeDocker(runtimes=("nvidia",), run=ran, images=())
    runtime_checks(_agent(tmp_path, runtime="docker"), 1, "img", client)
    assert client.pulled == ["img"]
    never = FakeDocker(runtimes=("nvidia",), run=ran, images=())
    checks = runtime_checks(_agent(tmp_path, runtime="docker", docker_pull="never"), 1, "img", never)[0]
    assert _by_name(checks)["docker --gpus"].status == WARN and never.pulled == [] and never.runs == []


def test_a_runtime_other_than_the_recorded_one_fails(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "runtime").write_text("docker\n")
    [runtime], name = runtime_checks(_agent(tmp_path, runtime="process"), 0, "img", FakeDocker())
    assert name is None and runtime.status == FAIL and "ran under the docker runtime" in runtime.detail


# -- cgroups -------------------------------------------------------------------------------------


def test_cgroup_v2_with_the_controllers_docker_limits_through(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    check = cgroup_check("docker", tmp_path)
    assert check.status == OK and check.detail == "cgroup v2: cpu cpuset hugetlb io memory misc pids rdma"


def test_cgroup_v2_missing_controllers_warns_naming_the_limits(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset io\n")
    check = cgroup_check("docker", tmp_path)
    assert check.status == WARN
    assert "without memory (memory), cpu (cpus), pids (pids_limit)" in check.detail


def test_cgroup_v1_warns(tmp_path: Path) -> None:
    check = cgroup_check("docker", tmp_path)
    assert check.status == WARN and "cgroup v1" in check.detail
    assert "systemd.unified_cgroup_hierarchy=1" in check.fix


def _mounts(tmp_path: Path, *lines: str) -> Path:
    (tmp_path / "mounts").write_text("".join(f"{line}\n" for line in lines))
    return tmp_path / "mounts"


def test_the_process_runtime_with_cgroup_v2_contains_its_jobs(tmp_path: Path) -> None:
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    table = _mounts(tmp_path, f"cgroup2 {tmp_path} cgroup2 rw 0 0")
    check = cgroup_check("process", tmp_path, table, euid=0)
    assert check.status == OK and check.detail.startswith(
        f"cgroup v2 at {tmp_path}: each attempt in a cgroup"
    )


def test_the_process_runtime_on_a_hybrid_host_without_a_pids_hierarchy_warns(tmp_path: Path) -> None:
    for name in ("unified", "memory", "cpu"):
        (tmp_path / name).mkdir()
    table = _mounts(
        tmp_path,
        f"cgroup2 {tmp_path}/unified cgroup2 rw 0 0",
        f"cgroup {tmp_path}/memory cgroup rw,memory 0 0",
        f"cgroup {tmp_path}/cpu cgroup rw,cpu 0 0",
    )
    check = cgroup_check("process", tmp_path, table, euid=0)
    assert check.status == WARN and check.detail.endswith("without pids: those limits are not enforced")


def test_the_process_runtime_without_cgroups_warns_that_jobs_escape(tmp_path: Path) -> None:
    table = _mounts(tmp_path, f"cgroup2 {tmp_path} cgroup2 rw 0 0")
    check = cgroup_check("process", tmp_path, table, euid=1000)
    assert check.status == WARN and check.detail.startswith("no cgroups: the agent is not root: ")
    assert "a child in a session of its own escapes" in check.detail and "run the agent as root" in check.fix


# -- the clock -----------------------------------------------------------------------------------


def test_clock_skew_within_half_a_second_is_ok() -> None:
    check = clock_check(1000.000, 1000.2, 1000.002, fence_margin_s=2.0)
    assert check.status == OK and check.detail == "this node's clock is 0.199 s behind Redis' (±0.001 s)"


def test_clock_skew_warns_above_half_a_second_and_fails_above_the_fence_margin() -> None:
    warned = clock_check(1000.0, 999.0, 1000.0, fence_margin_s=2.0)
    assert warned.status == WARN and "1.000 s ahead of Redis'" in warned.detail and "chrony" in warned.fix
    failed = clock_check(1000.0, 1003.0, 1000.0, fence_margin_s=2.0)
    assert failed.status == FAIL and "over agent.fence_margin_s (2 s)" in failed.detail
    assert clock_check(1000.0, 1003.0, 1000.0, fence_margin_s=5.0).status == WARN


def test_skew_a_slow_round_trip_explains_is_not_counted() -> None:
    # Redis answered somewhere within 4 s: a reading 1.5 s off the middle proves nothing
    assert clock_check(1000.0, 1000.5, 1004.0, fence_margin_s=2.0).status == OK


# -- checkpoint_root -----------------------------------------------------------------------------


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory every user may reach (pytest's own tmp_path sits under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="fleet-test-doctor-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_writable_checkpoint_root_takes_the_marker(shared_dir: Path) -> None:
    marker = new_marker("gpu-01", shared_dir, 1000.0)
    check = checkpoint_check(shared_dir, "gpu-01", marker, (65534, 65534))
    assert check.status == OK and check.detail.startswith(f"{shared_dir} on ")
    assert (shared_dir / MARKER_DIR / "gpu-01").read_text() == marker
    assert os.listdir(shared_dir / MARKER_DIR) == ["gpu-01"]  # no temporary or probe left behind
    if os.geteuid() == 0:
        assert "jobs' directories can be given to 65534:65534" in check.detail


def test_a_missing_checkpoint_root_fails_and_is_not_created(shared_dir: Path) -> None:
    root = shared_dir / "nfs"
    check = checkpoint_check(root, "gpu-01", "{}", (65534, 65534))
    assert (
        check.status == FAIL and "does not exist" in check.detail and "mount the shared storage" in check.fix
    )
    assert not root.exists()  # a local directory would hide a missing mount


def test_a_checkpoint_root_the_job_user_cannot_reach_fails(shared_dir: Path) -> None:
    private = shared_dir / "private"
    (private / "ckpt").mkdir(parents=True)
    private.chmod(0o700)
    check = checkpoint_check(private / "ckpt", "gpu-01", "{}", (65534, 65534), euid=0)
    assert (
        check.status == FAIL
        and f"uid 65534 (agent.job_user) cannot enter {private} (mode 0700)" in check.detail
    )
    assert check.fix == f"chmod o+x {private}"


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        ({}, "uid 1000000000 (agent.job_uid_range) cannot enter"),
        ({"job_uid_range": "2000-2999"}, "uid 2000 (agent.job_uid_range) cannot enter"),
        ({"job_user": "1234:1234"}, "uid 1234 (agent.job_user) cannot enter"),
    ],
)
def test_the_checkpoint_root_is_checked_for_the_uids_jobs_run_as(
    shared_dir: Path, agent: dict[str, str], expected: str
) -> None:
    # Given a checkpoint root under a directory only its owner may enter
    private = shared_dir / "private"
    (private / "ckpt").mkdir(parents=True)
    private.chmod(0o700)
    # When the node runs jobs as per-tenant uids (the default) or as one fixed user
    user, setting = job_identity(AgentSettings(**agent))
    check = checkpoint_check(private / "ckpt", "gpu-01", "{}", user, setting, euid=0)
    # Then the check fails for that uid, naming the setting it comes from
    assert check.status == FAIL and f"{expected} {private} (mode 0700)" in check.detail


def test_the_mount_holding_the_root_is_named(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"/dev/vda1 / ext4 rw 0 0\nfiler:/export/ckpt {tmp_path}/ck\\040pt nfs4 rw 0 0\n")
    assert mount_of(tmp_path / "ck pt" / "sub", mounts) == "nfs4 filer:/export/ckpt"
    assert mount_of(tmp_path / "ckpt", mounts) == "ext4 /dev/vda1"


# -- ports and address of multi-node jobs --------------------------------------------------------


def test_gang_ports_in_use_warn_and_all_taken_fails(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("32768\t60999\n")
    assert port_check(29400, 3, ranges, lambda p: True).status == OK
    some = port_check(29400, 3, ranges, lambda p: p != 29401)
    assert some.status == WARN and "1 in use (29401)" in some.detail
    assert port_check(29400, 3, ranges, lambda p: False).status == FAIL


def test_a_port_something_listens_on_cannot_be_bound(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("", free_port()))
        listener.listen()
        port = listener.getsockname()[1]
        check = port_check(port, 1, tmp_path / "none")
    assert check.status == FAIL and f"none of ports {port} can be bound" in check.detail
    assert "rendezvous_port_base" in check.fix


def test_gang_ports_among_the_ephemeral_ones_warn(tmp_path: Path) -> None:
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("20000 60999\n")
    check = port_check(29400, 500, ranges, lambda p: True)
    assert check.status == WARN and "ephemeral ports 20000-60999" in check.detail
    assert "net.ipv4.ip_local_reserved_ports=29400-29899" in check.fix


def test_the_gang_address() -> None:
    assert address_check(AgentSettings(address="10.1.2.3")).status == OK
    loopback = address_check(AgentSettings(address="127.0.0.1", node_name="gpu-01"))
    assert loopback.status == WARN and "cannot reach a rank 0 here" in loopback.detail
    assert "set agent.address" in loopback.fix
    assert address_check(AgentSettings(address="no-such-host.invalid")).status == FAIL


# -- Redis: the agent's credentials --------------------------------------------------------------


def test_the_installed_agents_credentials_are_used_when_none_are_given(tmp_path: Path) -> None:
    install("agent", tmp_path, "redis://redis.internal:6379/0", "s3cret", None)
    secret = tmp_path / "etc" / "fleet" / "redis-agent.password"
    assert installed_credentials("agent", tmp_path) == ("fleet-agent", secret)
    settings, note = with_installed_credentials(Settings(), tmp_path)
    assert (settings.redis_username, settings.redis_password_for(), note) == (
        "fleet-agent",
        "s3cret",
        " (the installed agent unit's)",
    )
    given = Settings(redis_username="fleet-other")
    assert with_installed_credentials(given, tmp_path) == (given, "")
    assert installed_credentials("agent", tmp_path / "elsewhere") == (None, None)


def test_the_installed_agents_sentinel_password_is_used_with_sentinels(tmp_path: Path) -> None:
    # Given an agent installed with its Redis and the sentinels' passwords
    install("agent", tmp_path, None, "s3cret", None, "s3ntinel")
    # When doctor reads settings naming sentinels and no sentinel password
    settings, _ = with_installed_credentials(Settings(redis_sentinels=["10.0.0.1:26379"]), tmp_path)
    # Then it logs in to them with the unit's, as the agent does
    assert settings.sentinel_credentials() == {"password": "s3ntinel"}
    # And without sentinels it leaves the setting alone
    assert with_installed_credentials(Settings(), tmp_path)[0].redis_sentinel_password_file is None


def test_an_unreadable_password_file_fails_redis_with_the_fix(tmp_path: Path) -> None:
    settings = Settings(redis_username="fleet-agent", redis_password_file=tmp_path / "missing")
    check, client = redis_check(settings)
    assert client is None and check.status == FAIL and "cannot read" in check.detail
    assert "fleet install agent --redis-password-file" in check.fix


def test_an_unreachable_redis_fails(tmp_path: Path) -> None:
    check, client = redis_check(Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0"))
    assert client is None and check.status == FAIL and "cannot reach Redis" in check.detail
    assert "start Redis" in check.fix


def test_sentinels_that_name_no_primary_fail_redis_naming_the_sentinel_settings() -> None:
    settings = Settings(redis_sentinels=[f"127.0.0.1:{free_port()}"])
    check, client = redis_check(settings)
    assert client is None and check.status == FAIL and "no sentinel names a primary 'fleet'" in check.detail
    assert "check redis_sentinels and redis_master" in check.fix


def test_a_line_per_check_and_the_exit_code() -> None:
    failed = Check("shared storage", FAIL, "node b's marker is not here", "mount it")
    assert failed.line() == "FAIL  shared storage   node b's marker is not here; fix: mount it"
    assert Check("cgroups", SKIP, "not used", "ignored").line() == "skip  cgroups          not used"
    assert exit_code([Check("a", OK, ""), Check("b", WARN, "", "x"), Check("c", SKIP, "")]) == 0
    assert exit_code([Check("a", OK, ""), failed]) == 1
