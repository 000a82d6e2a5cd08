"""The runtime checks: which runtime the agent opens and, for Docker, the daemon, its NVIDIA runtime
and a ``--gpus`` container (Docker is imported by the checks that use it)."""

from __future__ import annotations

from typing import Any

from fleet.config_sections import AgentSettings
from fleet.errors import ConfigError
from fleet.ops.doctor.report import FAIL, OK, SKIP, WARN, Check


def runtime_checks(
    cfg: AgentSettings, gpus: int, image: str, client: Any = None
) -> tuple[list[Check], str | None]:
    """Which runtime the agent opens and, for Docker, that the daemon answers, its NVIDIA runtime
    and a ``--gpus`` container when there are GPUs; with the runtime's name (None: none opens)."""
    from fleet.agent.runtime import RECORD, choose, docker_installed, recorded_runtime

    recorded = recorded_runtime(cfg.state_dir)
    try:
        name = choose(cfg.runtime, recorded, docker_installed())
    except ConfigError as exc:
        return [Check("runtime", FAIL, str(exc), f"stop this node's jobs, delete state_dir/{RECORD}")], None
    why = f"agent.runtime = {cfg.runtime}" + (f", recorded in state_dir/{RECORD}" if recorded else "")
    if name == "process":
        checks = [Check("runtime", OK, f"process ({why}): jobs run as plain processes, each in a cgroup")]
        return [*checks, Check("docker", SKIP, "not used by the process runtime")], name
    import docker
    from docker.errors import DockerException

    try:
        client = client or docker.from_env(timeout=30)
        client.ping()
        version, info = client.version(), client.info()
    except DockerException as exc:
        start = (
            "start dockerd (systemctl start docker), or set agent.runtime = 'process' on a node "
            "without Docker"
        )
        return [Check("docker", FAIL, f"Docker daemon not reachable ({why}): {exc}", start)], None
    runtimes = sorted(info.get("Runtimes") or {})
    found = (
        f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')}), "
        f"cgroup v{info.get('CgroupVersion', '?')}, runtimes {', '.join(runtimes) or 'none'}"
    )
    checks = [Check("runtime", OK, f"docker ({why})"), Check("docker", OK, found)]
    if not gpus:
        return [*checks, Check("docker --gpus", SKIP, "no GPU here: no --gpus container to try")], name
    toolkit = (
        "install the NVIDIA Container Toolkit, run nvidia-ctk runtime configure --runtime=docker "
        "and restart dockerd"
    )
    if "nvidia" not in runtimes:
        checks.append(Check("nvidia runtime", WARN, "Docker has no nvidia runtime registered", toolkit))
    else:
        checks.append(Check("nvidia runtime", OK, "registered with Docker"))
    return [*checks, gpu_container_check(client, image, gpus, cfg.docker_pull, toolkit)], name


def gpu_container_check(client: Any, image: str, gpus: int, pull: str, toolkit: str) -> Check:
    """``docker run --gpus all IMAGE nvidia-smi -L``, as the agent asks for GPUs: it lists them all."""
    from docker.errors import DockerException, ImageNotFound
    from docker.types import DeviceRequest

    name = "docker --gpus"
    try:
        try:
            client.images.get(image)
        except ImageNotFound:
            if pull == "never":
                return Check(
                    name,
                    WARN,
                    f"{image} is not here and agent.docker_pull = never",
                    f"docker pull {image} (or set default_image)",
                )
            client.images.pull(image)
        container = client.containers.run(
            image,
            ["nvidia-smi", "-L"],
            detach=True,
            labels={"fleet.doctor": "gpus"},
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])],
            environment={"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "utility"},
        )
        try:
            code = int(container.wait(timeout=120).get("StatusCode", -1))
            output = container.logs().decode(errors="replace")
        finally:
            container.remove(force=True)
    except DockerException as exc:
        return Check(name, FAIL, f"a container with --gpus all ({image}) did not run: {exc}", toolkit)
    listed = [line for line in output.splitlines() if line.startswith("GPU ")]
    if code != 0:
        tail = output.strip().splitlines()[-1:] or ["no output"]
        return Check(name, FAIL, f"nvidia-smi -L in {image} exited {code}: {tail[0]}", toolkit)
    if len(listed) < gpus:
        return Check(
            name,
            WARN,
            f"a container sees {len(listed)} of the {gpus} GPUs NVML finds",
            "check NVIDIA_VISIBLE_DEVICES in /etc/nvidia-container-runtime/config.toml",
        )
    return Check(name, OK, f"a container with --gpus all sees {len(listed)} GPUs ({image})")
