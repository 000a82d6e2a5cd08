"""Interactive work through the real CLI on the process runtime: ``fleet run`` (srun), Ctrl-C on the
commands that wait for a job, and ``fleet shell`` inside a running job."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import psutil
import pytest
import redis
from websockets.sync.client import connect

from fleet import Client, JobState
from fleet.agent.cgroups import detect
from tests.conftest import Api, FleetProcs
from tests.support import until, wait_for

pytestmark = pytest.mark.integration

NODE = "t-interactive"
Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def env(procs: FleetProcs, client: Client) -> dict[str, str]:
    """A node with 2 GPUs and the environment of a ``fleet`` command run there (its agent's config)."""
    procs.one_node(client, NODE, gpus=2)
    return procs.cli_env(
        FLEET_AGENT__NODE_NAME=NODE,
        FLEET_AGENT__STATE_DIR=str(procs.root / NODE),
        FLEET_AGENT__CGROUP_PARENT=procs.cgroup_parent,
    )


@pytest.fixture
def fleet(env: dict[str, str]) -> Cli:
    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "fleet", *args]
        return subprocess.run(argv, env={**env, **extra}, capture_output=True, text=True, timeout=90)

    return run


def spawn(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "fleet", *args]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def interrupt(proc: subprocess.Popen[str]) -> tuple[int, str]:
    """Ctrl-C: SIGINT to the command; its exit code and stderr."""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def read_line(stream: IO[str] | None) -> str:
    assert stream is not None
    return stream.readline().strip()


def talking_to_api(proc: subprocess.Popen[str], api_url: str) -> bool:
    """Whether the command holds a connection to the API: it is past its imports, waiting on it."""
    port = int(api_url.rsplit(":", 1)[1])
    process = psutil.Process(proc.pid)
    connections = getattr(process, "net_connections", process.connections)("tcp")
    return any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED for c in connections)


def test_fleet_run_prints_the_output_and_exits_with_the_jobs_code(fleet: Cli, client: Client) -> None:
    ran = fleet(
        "run", "--name", "three", "--max-attempts", "2", "--", "sh", "-c", "echo hi; echo oops >&2; exit 3"
    )
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout == "hi\noops\n" * 2  # attempt after attempt, each line once
    assert "fleet: job three-" in ran.stderr and "FAILED" in ran.stderr and "Traceback" not in ran.stderr
    (job,) = client.listing()
    assert (job.state, job.exit_code) == (JobState.FAILED, 3)
    ok = fleet("run", "--max-attempts", "1", "--", "sh", "-c", "echo fine")
    assert (ok.returncode, ok.stdout) == (0, "fine\n"), ok.stderr


def test_fleet_run_says_why_it_waits_and_ctrl_c_cancels_the_job(
    env: dict[str, str], client: Client, fleet: Cli
) -> None:
    blocker = client.submit({"command": ["sleep", "600"], "gpus": 2, "name": "blocker"})
    wait_for(lambda: client.get(blocker.id).state == JobState.RUNNING, what="the blocker runs")
    queued = spawn(env, "run", "--gpus", "1", "--name", "later", "--", "sh", "-c", "echo later; sleep 600")
    said = read_line(queued.stderr)
    assert said.startswith("fleet: job later-") and "Ctrl-C cancels it" in said
    waiting = read_line(queued.stderr)
    assert "QUEUED:" in waiting, waiting  # the scheduler's reason, as `fleet show` gives it
    client.cancel(blocker.id)
    assert read_line(queued.stdout) == "later"  # it ran once the GPUs were free, its output streamed
    job_id = said.split()[2]
    code, err = interrupt(queued)
    assert code == 130 and f"cancelled job {job_id}" in err and "Traceback" not in err
    wait_for(lambda: client.get(job_id).state == JobState.CANCELLED, what="Ctrl-C cancelled the job")


def test_ctrl_c_on_the_commands_that_wait_leaves_the_job_running(
    env: dict[str, str], client: Client, api_server: str
) -> None:
    waited = spawn(env, "submit", "--wait", "--", "sh", "-c", "echo started; sleep 600")
    job_id = read_line(waited.stdout)
    wait_for(lambda: client.get(job_id).state == JobState.RUNNING, what="the job runs")
    hint = f"it goes on (cancel it: fleet cancel {job_id})\n"
    code, err = interrupt(waited)
    assert (code, err) == (130, f"fleet: stopped waiting for job {job_id}; {hint}")
    following = spawn(env, "logs", "-f", job_id)
    assert read_line(following.stdout) == "started"
    code, err = interrupt(following)
    assert (code, err) == (
        130,
        f"fleet: stopped following job {job_id}; it goes on (cancel it: fleet cancel {job_id})\n",
    )
    again = spawn(env, "wait", job_id)
    until(lambda: talking_to_api(again, api_server), "fleet wait waits on the API")
    code, err = interrupt(again)
    assert (code, err) == (
        130,
        f"fleet: stopped waiting for job {job_id}; it goes on (cancel it: fleet cancel {job_id})\n",
    )
    assert client.get(job_id).state == JobState.RUNNING  # none of them touched the job


def test_fleet_shell_runs_as_the_job_in_its_directory_and_cgroup_from_anywhere(
    procs: FleetProcs, client: Client, api: Api
) -> None:
    procs.one_node(client, NODE, gpus=1)
    job = client.submit({"command": ["sh", "-c", "id -u; pwd; echo started; sleep 600"], "name": "held"})
    lines = until(lambda: (got := [x.line for x in client.logs(job.id)])[2:] and got, "the job started")
    uid, cwd = lines[0], lines[1]
    remote = api.env(api.token_for("ann", "default"))  # the API's URL and a user's token: nothing else

    def shell(*args: str, stdin: str = "", env: dict[str, str] = remote) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "fleet", "shell", job.id, *args]
        return subprocess.run(argv, env=env, input=stdin, capture_output=True, text=True, timeout=90)

    shelled = shell("--", "sh", "-c", 'id -u; pwd; echo "$FLEET_JOB_ID"; cat /proc/self/cgroup')
    assert shelled.returncode == 0, shelled.stderr
    out = shelled.stdout.splitlines()
    assert out[:3] == [uid, cwd, job.id]  # the job's user, never the agent's (root here)
    assert os.geteuid() != 0 or uid != "0"
    assert Path(cwd).name == "work" and Path(cwd).parent.name == f"{job.id}.1"
    if detect().kind != "none":  # where the agent can use cgroups, the shell is in the job's
        assert any(line.endswith(f"/{NODE}/{job.id}.1") for line in out[3:]), out
    failed = shell("--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert (failed.returncode, failed.stdout, failed.stderr) == (7, "out\n", "err\n")
    typed = shell("--", "sh", stdin="echo hi\nexit 3\n")  # a script's stdin is the command's
    assert (typed.returncode, typed.stdout) == (3, "hi\n"), typed.stderr
    missing = shell("--", "no-such-command-here")
    assert missing.returncode == 127 and "no-such-command-here" in missing.stderr
    on_terminal(job.id, remote)
    unknown = shell("--", "id", env=api.env("not-a-token"))
    assert unknown.returncode == 8 and "token unknown" in unknown.stderr, unknown.stderr
    assert bad_request(api.url, remote["FLEET_TOKEN"], job.id) == {
        "error": "SpecError",
        "detail": "shell request: command: Input should be a valid array",
        "exit_code": 2,
    }
    outsider = api.token_for("eve", "other")
    hidden = shell("--", "id", env=api.env(outsider))  # another tenant's job is no job, as for show
    shown = subprocess.run(
        [sys.executable, "-m", "fleet", "show", job.id], env=api.env(outsider), capture_output=True, text=True
    )
    assert (hidden.returncode, hidden.stdout, hidden.stderr) == (3, "", shown.stderr), hidden.stderr
    inside = spawn(remote, "shell", job.id, "--", "sh", "-c", "echo in; exec sleep 600")
    assert read_line(inside.stdout) == "in"
    client.cancel(job.id)
    wait_for(lambda: client.get(job.id).state == JobState.CANCELLED, what="the job ends")
    _, err = inside.communicate(timeout=60)  # the shell ends with the job
    assert inside.returncode != 0 and "Traceback" not in err, err
    ended = shell()
    assert ended.returncode == 1 and f"job {job.id} is CANCELLED" in ended.stderr


def test_fleet_shell_rank_enters_that_member_of_a_multi_node_job(
    procs: FleetProcs, client: Client, api: Api
) -> None:
    # Given a job of two members, one on each of two nodes
    procs.controller()
    nodes = ["t-interactive-r0", "t-interactive-r1"]
    for node in nodes:
        procs.agent(node, gpus=1, FLEET_AGENT__ADDRESS="127.0.0.1")
    procs.wait_nodes(client, 2)
    script = "echo started; sleep 600"
    job = client.submit({"command": ["sh", "-c", script], "name": "pair", "nodes": 2, "gpus": 2})
    wait_for(lambda: client.get(job.id).members_running == 2, what="both members run")

    def shell(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [
            sys.executable,
            "-m",
            "fleet",
            "shell",
            job.id,
            *args,
            "--",
            "sh",
            "-c",
            'echo "$FLEET_NODE_RANK"',
        ]
        return subprocess.run(argv, env=api.env(), capture_output=True, text=True, timeout=90)

    # When the user enters each member, and one the job does not have
    first, second, missing = shell(), shell("--rank", "1"), shell("--rank", "2")
    # Then each shell runs beside that member (its rank in the job's environment)
    assert (first.returncode, first.stdout) == (0, "0\n"), first.stderr
    assert (second.returncode, second.stdout) == (0, "1\n"), second.stderr
    # and a rank the job does not have is bad input, naming those it has
    assert missing.returncode == 2 and f"rank 2: job {job.id} has ranks 0-1" in missing.stderr, missing.stderr
    client.cancel(job.id)


def test_fleet_shell_sessions_are_capped_per_node_and_end_when_idle(
    procs: FleetProcs, client: Client, api: Api
) -> None:
    node = "t-interactive-caps"
    # (its agent started as by nohup, SIGHUP ignored: the shells' commands still get it, as a login
    # shell's would, or the idle session's `sleep` below ignored its hang-up and was killed, 137)
    default = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        caps = {"FLEET_AGENT__SHELL_MAX_SESSIONS": "1", "FLEET_AGENT__SHELL_IDLE_S": "2"}
        procs.one_node(client, node, gpus=1, **caps)
    finally:
        signal.signal(signal.SIGHUP, default)
    job = client.submit({"command": ["sh", "-c", "echo started; sleep 600"], "name": "capped"})
    until(lambda: client.logs(job.id), "the job started")

    def shell(*command: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "fleet", "shell", job.id, "--", *command]
        return subprocess.run(argv, env=api.env(), capture_output=True, text=True, timeout=90)

    busy = spawn(api.env(), "shell", job.id, "--", "sh", "-c", "while :; do echo busy; sleep 0.5; done")
    assert read_line(busy.stdout) == "busy"  # output keeps it from being idle
    refused = shell("true")
    assert refused.returncode == 1 and "runs 1 shells already" in refused.stderr, refused.stderr
    code, err = interrupt(busy)  # the caller hangs up: the agent ends the session, freeing its place
    assert code == 130 and "Traceback" not in err, err

    def idle() -> subprocess.CompletedProcess[str] | None:
        ran = shell("sleep", "600")
        return None if "shells already" in ran.stderr else ran

    ended = until(idle, "a session once the hung-up one ended")
    assert ended.returncode == 129, ended.stderr  # hung up (SIGHUP), saying why
    assert "fleet shell: no input nor output for 2 s (agent.shell_idle_s): ended" in ended.stderr


def running(*argv: str) -> bool:
    """Whether a process with exactly this command line runs on this host."""
    return any(p.info["cmdline"] == list(argv) for p in psutil.process_iter(["cmdline"]))


def test_a_shell_that_does_not_read_its_input_slows_only_itself_and_ends_on_hang_up(
    procs: FleetProcs, client: Client, api: Api, redis_url: str, tmp_path: Path
) -> None:
    procs.one_node(client, "t-interactive-full", gpus=1)
    job = client.submit({"command": ["sh", "-c", "echo started; sleep 600"], "name": "stuffed"})
    until(lambda: client.logs(job.id), "the job started")
    # Given a shell whose command never reads its stdin, sent 1 MiB (16 times a pipe's 64 KiB)
    (tmp_path / "input").write_bytes(b"x" * (1 << 20))
    with (tmp_path / "input").open("rb") as stdin:
        argv = [sys.executable, "-m", "fleet", "shell", job.id, "--", "sh", "-c", "echo in; exec sleep 3517"]
        stuffed = subprocess.Popen(argv, env=api.env(), stdin=stdin, stdout=subprocess.PIPE, text=True)
    assert read_line(stuffed.stdout) == "in"
    relay = redis.Redis.from_url(redis_url)
    (key,) = until(lambda: list(relay.scan_iter("fleet:shell:*:in")), "the session's input stream")
    until(
        lambda: sum(len(f.get(b"d", b"")) for _, f in relay.xrange(key)) == 1 << 20,
        "all the input reached the node's relay",
    )
    # When another session runs beside it, and then its caller hangs up
    beside = subprocess.run(
        [sys.executable, "-m", "fleet", "shell", job.id, "--", "echo", "beside"],
        env=api.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    code, _ = interrupt(stuffed)
    # Then the other session ran, and the stuck one's command ends with the hang-up
    assert (beside.returncode, beside.stdout) == (0, "beside\n"), beside.stderr
    assert code == 130
    wait_for(lambda: not running("sleep", "3517"), timeout=30, what="the hung-up command to end")
    assert client.get(job.id).state == JobState.RUNNING
    client.cancel(job.id)


def bad_request(api_url: str, token: str, job_id: str) -> dict[str, object]:
    """What the API answers a shell request whose command is not a list."""
    address = api_url.replace("http://", "ws://") + f"/v1/jobs/{job_id}/shell"
    with connect(address, additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        ws.send(json.dumps({"command": "id"}))
        said: dict[str, object] = json.loads(ws.recv(timeout=30))
    return said


def on_terminal(job_id: str, env: dict[str, str]) -> None:
    """``fleet shell JOB -- sh`` on a terminal: the command gets one of the caller's size, keys go
    through as typed, the exit code comes back and the caller's terminal is as it was after."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 101, 0, 0))
    before = termios.tcgetattr(slave)
    argv = [sys.executable, "-m", "fleet", "shell", job_id, "--", "sh"]
    proc = subprocess.Popen(argv, env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    seen = bytearray()

    def drain() -> None:
        with contextlib.suppress(OSError):  # EIO once the last holder of the terminal closed it
            while data := os.read(master, 4096):
                seen.extend(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    until(
        lambda: not termios.tcgetattr(slave)[3] & termios.ICANON, "fleet shell put the terminal in raw mode"
    )
    # typed once the shell shows its prompt, as a person does (docker exec sizes its terminal only
    # once the command started: a line typed ahead may run before that)
    until(lambda: b"$ " in seen, "the shell's prompt")
    os.write(master, b"stty size; test -t 0 && echo on-a-tty; exit 4\r")
    assert proc.wait(timeout=60) == 4, bytes(seen)
    assert termios.tcgetattr(slave) == before  # raw mode undone
    os.close(slave)
    reader.join(timeout=10)
    os.close(master)
    lines = bytes(seen).decode(errors="replace").splitlines()
    assert any(line.endswith("33 101") for line in lines) and "on-a-tty" in lines, lines  # after a prompt


def test_fleet_shell_execs_into_the_jobs_container(
    docker_procs: FleetProcs, client: Client, api: Api
) -> None:
    node = "t-interactive-dock"
    docker_procs.controller()
    docker_procs.agent(node, gpus=1)
    docker_procs.wait_nodes(client, 1)
    job = client.submit({"command": ["sh", "-c", "id -u; echo started; sleep 600"], "name": "boxed"})
    lines = until(lambda: (got := [x.line for x in client.logs(job.id)])[1:] and got, "the job started")
    argv = [
        sys.executable,
        "-m",
        "fleet",
        "shell",
        job.id,
        "--",
        "sh",
        "-c",
        'id -u; echo "$FLEET_JOB_ID"; exit 5',
    ]
    shelled = subprocess.run(argv, env=api.env(), capture_output=True, text=True, timeout=90)
    assert shelled.returncode == 5, shelled.stderr
    assert shelled.stdout.splitlines() == [lines[0], job.id]  # the job's user, in its container
    typed = subprocess.run(
        [*argv[:5], "--", "sh"], env=api.env(), input="echo hi\nexit 3\n", capture_output=True, text=True
    )
    assert (typed.returncode, typed.stdout) == (3, "hi\n"), typed.stderr
    on_terminal(job.id, api.env())  # docker exec -it, on the agent's terminal for the session
    # a caller who hangs up ends the exec'd command too (Docker would leave it running)
    hung = spawn(api.env(), "shell", job.id, "--", "sh", "-c", "echo in; exec sleep 3518")
    assert read_line(hung.stdout) == "in"
    assert interrupt(hung)[0] == 130
    wait_for(lambda: not running("sleep", "3518"), timeout=30, what="the hung-up exec to end")
    client.cancel(job.id)
