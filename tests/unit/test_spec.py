"""Bad job specs are rejected at submit with an error naming the field and what is allowed."""

from __future__ import annotations

import pytest

from fleet.cli.main import main
from fleet.errors import SpecError
from fleet.models import JobSpec
from fleet.models.base import check_job_id
from fleet.registries import check_image, registry_of


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"gpus": -1}, "gpus: Input should be greater than or equal to 0 (got -1)"),
        ({"command": []}, "command: List should have at least 1 item"),
        ({"command": [""]}, "command: the program (first element) must not be empty"),
        (
            {"gpu": 2},
            "gpu: unknown field; allowed fields: after, allow_unplaceable, batch_size, call, command,",
        ),
        (
            {"memory": "lots"},
            "memory: 'lots' is not a size: use bytes or a number with k, m, g or t (e.g. 8g)",
        ),
        ({"env": {"FLEET_JOB_ID": "x"}}, "env: 'FLEET_JOB_ID': FLEET_* variables are set by fleet itself"),
        ({"name": "has space"}, "name: must be 1 to 63 letters, digits"),
        ({"mounts": [{"source": "data", "target": "/d"}]}, "mounts.0.source: must be an absolute path"),
        ({"command": ["echo", "a\x00b"]}, "command.1: must not contain NUL bytes"),
        ({"env": {"A": "x\x00"}}, "env.A: must not contain NUL bytes"),
        ({"command": ["x"] * 5000}, "command: List should have at most 4096 items"),
        ({"command": ["x" * 40000]}, "command.0: String should have at most 32768 characters"),
        ({"env": {f"V{i}": "x" * 30000 for i in range(5)}}, "more than 131072; ship large inputs as files"),
        (
            {"labels": {"team:x": "a"}},
            "labels.team:x.[key]: must be 1 to 63 letters, digits, '_', '.', '/' or '-'",
        ),
        ({"labels": {"team": "a\x00"}}, "labels.team: must not contain NUL bytes"),
        ({"labels": {"team": "x" * 300}}, "labels.team: String should have at most 256 characters"),
        ({"labels": {f"k{i}": "v" for i in range(65)}}, "labels: Dictionary should have at most 64 items"),
        ({"env": {"K" * 300: "v"}}, "String should have at most 256 characters"),
        ({"name": "x" * 64}, "name: must be 1 to 63 letters, digits"),
        ({"name": "a\x00b"}, "name: must be 1 to 63 letters, digits"),
        ({"gpu_model": "a\x00"}, "gpu_model: must not contain NUL bytes"),
        ({"user": "root"}, "user: must be a numeric uid, or uid:gid"),
        ({"image": "fleet python"}, "image: must be an image reference"),
        # a YAML true is no count (pydantic alone reads it as 1)
        ({"gpus": True}, "gpus: expected a number, got true (true and false are not counts)"),
        ({"max_attempts": True}, "max_attempts: expected a number, got true"),
        ({"priority": False}, "priority: expected a number, got false"),
        ({"cpus": True}, "cpus: expected a number, got true"),
    ],
)
def test_bad_spec_names_the_field(data: dict[str, object], message: str) -> None:
    with pytest.raises(SpecError) as err:
        JobSpec.parse({"name": "j", "command": ["true"], **data})
    assert message in str(err.value)


def test_sizes_use_binary_units_like_docker() -> None:
    spec = JobSpec.parse(
        {"name": "j", "command": ["true"], "memory": "1.5g", "shm_size": "512m", "min_gpu_memory": "40GiB"}
    )
    assert (spec.memory, spec.shm_size, spec.min_gpu_memory) == (3 << 29, 512 << 20, 40 << 30)


def test_cli_rejects_a_bad_spec_with_exit_2_before_touching_redis(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["--redis-url", "redis://127.0.0.1:1/0", "submit", "--gpus", "-2", "--", "python", "train.py"]
    )
    assert code == 2
    assert "gpus: Input should be greater than or equal to 0 (got -2)" in capsys.readouterr().err


def test_cli_builds_the_spec_from_file_and_flags(tmp_path: pytest.TempPathFactory) -> None:
    from fleet.cli.submit import spec_from_options, submit

    path = tmp_path / "job.yaml"  # type: ignore[operator]
    path.write_text("name: train\ngpus: 2\nenv: {A: '1'}\ncommand: [python, train.py]\n")
    argv = ["-f", str(path), "--gpus", "4", "--env", "B=2", "--mount", "/data:/data", "--", "python", "t.py"]
    ctx = submit.make_context("submit", argv)
    spec = spec_from_options(ctx.params, ctx.meta["fleet.command"])
    assert (spec.name, spec.gpus, spec.env, spec.command) == (
        "train",
        4,
        {"A": "1", "B": "2"},
        ["python", "t.py"],
    )
    assert spec.mounts[0].read_only is True


@pytest.mark.parametrize(
    ("fields", "gpus", "nodes", "per_node"),
    [
        ({"gpus": 16}, 16, None, None),  # the scheduler splits it (see test_gangs)
        ({"nodes": 2, "gpus_per_node": 4}, 8, 2, 4),  # gpus follows
        ({"nodes": 2, "gpus_per_node": 4, "gpus": 8}, 8, 2, 4),
        ({"nodes": 4, "gpus": 8}, 8, 4, None),
        ({"nodes": 2}, 0, 2, None),  # a CPU-only multi-node job
    ],
)
def test_a_multi_node_spec_holds_the_whole_jobs_gpus(
    fields: dict[str, int], gpus: int, nodes: int | None, per_node: int | None
) -> None:
    spec = JobSpec.parse({"name": "ddp", "command": ["torchrun"], **fields})
    assert (spec.gpus, spec.nodes, spec.gpus_per_node) == (gpus, nodes, per_node)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nodes": 3, "gpus": 8}, "nodes: 8 GPUs do not split evenly into 3"),
        ({"gpus_per_node": 3, "gpus": 8}, "gpus_per_node: 8 GPUs do not split evenly into 3"),
        ({"nodes": 2, "gpus_per_node": 4, "gpus": 6}, "gpus: 6 is not nodes x gpus_per_node = 8"),
        ({"gpus_per_node": 4}, "gpus_per_node: give gpus"),
        ({"nodes": 0}, "nodes: Input should be greater than or equal to 1"),
    ],
)
def test_a_multi_node_spec_that_does_not_add_up_is_refused_naming_the_fix(
    fields: dict[str, int], message: str
) -> None:
    with pytest.raises(SpecError, match=message):
        JobSpec.parse({"name": "ddp", "command": ["torchrun"], **fields})


@pytest.mark.parametrize("job_id", ["trail\n", "ok\n", "a\nb"])
def test_a_job_id_with_a_newline_is_refused(job_id: str) -> None:
    # an id becomes a Redis key and a checkpoint directory: `$` let "trail\n" through
    with pytest.raises(SpecError, match="job id"):
        check_job_id(job_id)


def test_an_env_key_with_a_trailing_newline_is_refused() -> None:
    with pytest.raises(SpecError, match="env: 'KEY\\\\n' is not a valid variable name"):
        JobSpec.parse({"name": "x", "command": ["true"], "env": {"KEY\n": "1"}})


@pytest.mark.parametrize(
    ("image", "registry"),
    [
        ("busybox", "docker.io"),
        ("pytorch/pytorch:2.3", "docker.io"),
        ("nvcr.io/nvidia/pytorch:24.01", "nvcr.io"),
        ("localhost/fleet/python", "localhost"),
        ("registry.corp:5000/ml/train", "registry.corp:5000"),
    ],
)
def test_an_images_registry_is_read_as_docker_reads_it(image: str, registry: str) -> None:
    assert registry_of(image) == registry


def test_an_image_from_a_registry_the_operator_does_not_list_is_refused() -> None:
    check_image("nvcr.io/nvidia/pytorch:24.01", ["nvcr.io"])
    check_image("evil.example.com/x", ["*"])
    check_image("registry.corp:5000/ml/train", ["registry.corp"])  # a host alone: any port
    with pytest.raises(SpecError, match=r"registry\.corp:5001"):
        check_image("registry.corp:5001/ml/train", ["registry.corp:5000"])
    with pytest.raises(
        SpecError, match=r"image: 'evil.example.com/miner' comes from registry 'evil.example.com'"
    ):
        check_image("evil.example.com/miner", ["localhost", "docker.io"])


@pytest.mark.parametrize(
    "extra", [{"nodes": 2, "gpus": 2}, {"gpus": {"min": 1, "max": 4}, "batch_size": 64, "profile": "learn"}]
)
def test_forwarded_stdin_is_refused_for_a_job_on_several_nodes(extra: dict[str, object]) -> None:
    with pytest.raises(SpecError, match=r"stdin: only a job on one node reads forwarded input; drop stdin"):
        JobSpec.parse({"name": "j", "command": ["cat"], "stdin": True, **extra})


def test_stdin_is_off_unless_asked_and_must_be_a_boolean() -> None:
    assert JobSpec.parse({"name": "j", "command": ["cat"]}).stdin is False
    assert JobSpec.parse({"name": "j", "command": ["cat"], "stdin": True}).stdin is True
    with pytest.raises(SpecError, match="stdin: "):
        JobSpec.parse({"name": "j", "command": ["cat"], "stdin": "sometimes"})
