"""The README's local fleet, run as it is written, after the set-up it names (`make install` and the
images `make demo` / `make test` build): its shell blocks in order in one shell, `fleet up` left
running in the background as a second shell would hold it, the line it printed pasted where the
README says to, then the headline example (ship a directory, train, follow, list) and the Python
section's opening function example."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fleet.agent import netguard
from fleet.agent.runtime import docker_installed

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
#: the line `fleet up` prints for the user to paste into another shell
EXPORT = re.compile(r"^\s*(export FLEET_API_URL=\S+ FLEET_TOKEN=\S+)$", re.M)


def commands(block: str) -> list[str]:
    """A shell block's commands, each without its trailing comment."""
    lines = (re.sub(r"\s+#\s.*$", "", line).strip() for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def shell_blocks() -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "form",
    # `fleet up` on Docker where it is installed: one daemon, one guard, shared with the Docker tests
    [pytest.param(2, id="fleet-up", marks=pytest.mark.docker), pytest.param(3, id="fleet-up-process")],
)
def test_the_readmes_local_fleet_and_its_headline_example_work_in_order(tmp_path: Path, form: int) -> None:
    if not (ROOT / ".venv" / "bin" / "activate").exists():
        pytest.skip("the README's set-up (make install) made no .venv here")
    blocks = shell_blocks()
    up = next(commands(b) for b in blocks if "fleet up" in b and "make install" in b)
    example = next(commands(b) for b in blocks if b.lstrip().startswith("export FLEET_API_URL="))
    # The local fleet block: the set-up (done), the venv, `fleet up`, and its form with options
    assert up[0] == "make install" and up[1] == ". .venv/bin/activate" and up[2] == "fleet up", up
    assert up[form].startswith("fleet up"), up
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(TMPDIR=str(tmp_path), XDG_CACHE_HOME=str(tmp_path / "cache"))
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        server = subprocess.Popen(
            ["bash", "-c", f"set -e; {up[1]}; exec {up[form]}"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        printed = _wait_for_export(server, log)
        # When the example block runs with that line pasted in place of its first
        script = "\n".join(["set -e", printed, ". .venv/bin/activate", *example[1:]])
        done = subprocess.run(
            ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=420
        )
        # Then the job trained to the end, its output followed, and `fleet jobs` lists it SUCCEEDED
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:] + log.read_text()[-3000:]
        assert re.search(r"^final loss [0-9.]+ weights \w+$", done.stdout, re.M), done.stdout[-4000:]
        ended = re.search(r"^(python3-\w+) SUCCEEDED: exited with code 0$", done.stdout, re.M)
        assert ended, done.stdout[-4000:]
        listed = [line.split() for line in done.stdout.splitlines() if line.startswith(ended.group(1))]
        assert listed and listed[-1][1] == "SUCCEEDED", done.stdout[-4000:]
        # And the Python section's function example, run as it says, computes on the fleet
        function = subprocess.run(
            ["bash", "-c", "\n".join(["set -e", printed, ". .venv/bin/activate", *FUNCTION_EXAMPLE])],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        said = function.stdout + function.stderr + log.read_text()[-3000:]
        assert function.returncode == 0 and function.stdout.startswith("(285, None)\n"), said
        assert re.search(r"^squares-\w+ \(332833500, 'GPU-[\w-]+'\)$", function.stdout, re.M), said
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # as Ctrl-C: fleet up stops all it started
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    # And a Docker agent's network guard (iptables chains, the fleet-jobs network, which outlive a
    # node's agent) comes off with fleet up, no other agent of this host using it
    said = log.read_text(errors="replace")
    if form == 2 and docker_installed():  # its agent ran Docker jobs (runtime auto)
        assert guard_left() == [], said[-3000:]
        if os.geteuid() == 0:
            assert "fleet up: removed fleet's iptables rules" in said, said[-3000:]


#: how the README says to run its function example, from a clone
FUNCTION_EXAMPLE = ["cd workers/examples", "python3 squares.py"]


def test_the_readmes_function_example_is_the_example_file() -> None:
    readme = (ROOT / "README.md").read_text()
    code = (ROOT / "workers" / "examples" / "squares.py").read_text().split('"""', 2)[2].lstrip()
    assert f"```python\n{code}```" in readme
    assert f"`{' && '.join(FUNCTION_EXAMPLE)}`" in readme


def guard_left() -> list[str]:
    """What of the network guard is on this host: fleet's chains, and its Docker network."""
    import docker

    left = [
        f"{netguard.TOOLS[family]} {chain}"
        for family in (netguard.families() if os.geteuid() == 0 else [])
        for chain in (netguard.CHAIN_INPUT, netguard.CHAIN_FORWARD, netguard.CHAIN_OUTPUT)
        if subprocess.run([netguard.TOOLS[family], "-S", chain], capture_output=True).returncode == 0
    ]
    client = docker.from_env(timeout=10)
    try:
        left += [n.name for n in client.networks.list(names=[netguard.NETWORK]) if n.name == netguard.NETWORK]
    finally:
        client.close()
    return left


def _wait_for_export(server: subprocess.Popen[bytes], log: Path, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = log.read_text(errors="replace")
        if "fleet is up" in text and (found := EXPORT.search(text)):
            return found.group(1)
        assert server.poll() is None, f"fleet up exited early:\n{text[-4000:]}"
        time.sleep(0.2)
    raise AssertionError(f"fleet up did not come up in {timeout}s:\n{log.read_text()[-4000:]}")
