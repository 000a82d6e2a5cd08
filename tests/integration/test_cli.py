"""The CLI as operations scripts use it: real subprocesses, exit codes, ``-o json``."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from urllib.parse import urlsplit

import pytest

from fleet import Client, JobState
from tests.conftest import FleetProcs
from tests.support import stop

pytestmark = pytest.mark.integration


@pytest.fixture
def runtime() -> str:
    return "process"


@pytest.fixture
def fleet_cli(procs: FleetProcs, client: Client):  # type: ignore[no-untyped-def]
    # the leader publishes the tenants' queues (`fleet top`) every usage interval: 10 s by default
    procs.env["FLEET_CONTROLLER__USAGE_INTERVAL_S"] = "1"
    procs.one_node(client, "t-cli", gpus=2)

    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "fleet", *args],
            env=run.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    run.env = procs.cli_env()  # type: ignore[attr-defined]
    return run


def test_submit_wait_show_logs(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    submitted = fleet_cli("submit", "--gpus", "1", "--env", "WHO=cli", "--", "sh", "-c", "echo hi $WHO")
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.startswith("sh-")
    waited = fleet_cli("wait", job_id, "--timeout", "60")
    assert waited.returncode == 0 and f"{job_id} SUCCEEDED" in waited.stdout
    assert fleet_cli("logs", job_id).stdout == "hi cli\n"
    assert fleet_cli("logs", job_id, "--attempt", "1").stdout == "hi cli\n"
    for follow in ([], ["-f"]):  # an attempt the job never had is not an empty output
        absent = fleet_cli("logs", job_id, "--attempt", "99", *follow)
        assert (absent.returncode, absent.stdout) == (3, ""), absent.stderr
        assert (
            absent.stderr
            == f"fleet: job {job_id} has one attempt, 1: no attempt 99 (see `fleet show {job_id}`)\n"
        )
    shown = json.loads(fleet_cli("show", job_id, "-o", "json").stdout)
    assert shown["state"] == "SUCCEEDED" and shown["node"] == "t-cli" and len(shown["gpus"]) == 1
    assert [e["state"] for e in shown["history"]] == [
        "QUEUED",
        "SCHEDULED",
        "STARTING",
        "RUNNING",
        "SUCCEEDED",
    ]
    listed = json.loads(fleet_cli("jobs", "--state", "succeeded", "-o", "json").stdout)
    assert [j["id"] for j in listed] == [job_id]
    human = fleet_cli("show", job_id).stdout
    assert "State:      SUCCEEDED" in human and "History:" in human


def test_exit_codes_scripts_rely_on(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    failing = fleet_cli("submit", "--max-attempts", "1", "--wait", "--", "sh", "-c", "exit 7")
    assert failing.returncode == 1 and "FAILED: exited with code 7" in failing.stdout
    sleeper = fleet_cli("submit", "--", "sleep", "60").stdout.strip()
    timed_out = fleet_cli("wait", sleeper, "--timeout", "0.5")
    assert timed_out.returncode == 4 and "still" in timed_out.stderr
    assert fleet_cli("cancel", sleeper).returncode == 0
    assert fleet_cli("wait", sleeper, "--timeout", "30").returncode == 6
    assert fleet_cli("show", "no-such-job").returncode == 3
    bad = fleet_cli("submit", "--gpus", "-1", "--", "true")
    assert bad.returncode == 2 and "gpus:" in bad.stderr
    unreachable = fleet_cli("--api-url", "http://127.0.0.1:1", "jobs")
    assert unreachable.returncode == 5 and "fleet API at http://127.0.0.1:1 unreachable" in unreachable.stderr


def test_cordoned_node_receives_nothing_until_uncordoned(fleet_cli, client: Client) -> None:  # type: ignore[no-untyped-def]
    cordoned = json.loads(fleet_cli("cordon", "t-cli", "--reason", "disk swap", "-o", "json").stdout)
    assert cordoned["state"] == "CORDONED" and cordoned["reason"] == "disk swap"
    assert fleet_cli("cordon", "t-cli", "--reason", "disk swap").returncode == 0  # idempotent
    job_id = fleet_cli("submit", "--gpus", "1", "--", "true").stdout.strip()
    deadline = time.monotonic() + 10
    while "cordoned" not in client.get(job_id).reason and time.monotonic() < deadline:
        time.sleep(0.1)
    job = client.get(job_id)
    assert job.state == JobState.QUEUED and job.reason == "needs 1 GPU; t-cli: cordoned: disk swap"
    assert fleet_cli("uncordon", "t-cli").returncode == 0
    assert fleet_cli("wait", job_id, "--timeout", "30").returncode == 0


def test_nodes_lists_gpus_with_their_holders(fleet_cli, client: Client, procs: FleetProcs) -> None:  # type: ignore[no-untyped-def]
    job_id = fleet_cli("submit", "--gpus", "2", "--", "sleep", "60").stdout.strip()
    deadline = time.monotonic() + 20
    while client.get(job_id).state != JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)
    nodes = json.loads(fleet_cli("nodes", "-o", "json").stdout)
    assert [(n["name"], n["state"], n["alive"]) for n in nodes] == [("t-cli", "READY", True)]
    attempt = f"{job_id}:1"
    assert sorted(nodes[0]["claims"].values()) == [attempt, attempt]
    table = fleet_cli("nodes").stdout
    assert "t-cli" in table and f"claimed by {attempt}" in table and "0/2" in table
    # And, to an operator, which Redis is primary: one with no replicas says so
    port = urlsplit(procs.redis_url).port
    assert f"\nredis: primary 127.0.0.1:{port}, no replicas\n" in table
    redis = json.loads(fleet_cli("nodes", "--redis", "-o", "json").stdout)
    assert (redis["primary"], redis["replicas"], redis["failovers"], redis["error"]) == (
        f"127.0.0.1:{port}",
        [],
        0,
        "",
    )
    fleet_cli("cancel", job_id)


def test_logs_follow_streams_until_the_attempt_ends(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    script = "for i in 1 2 3 4 5; do echo line $i; sleep 0.3; done"
    job_id = fleet_cli("submit", "--", "sh", "-c", script).stdout.strip()
    followed = fleet_cli("logs", job_id, "-f", timeout=60)
    assert followed.returncode == 0
    assert followed.stdout.splitlines() == [f"line {i}" for i in range(1, 6)]


def test_services_take_a_log_level_in_any_case(procs: FleetProcs, client: Client) -> None:
    # Given a controller started with --log-level WARNING and an agent with --log-level warning
    procs.start("controller", ["controller", "--log-level", "WARNING"])
    procs.start(
        "t-quiet",
        ["agent", "--node-name", "t-quiet", "--log-level", "warning"],
        FLEET_AGENT__STATE_DIR=str(procs.root / "t-quiet"),
    )

    # When a job runs through them
    procs.wait_nodes(client, 1)
    job = client.submit({"name": "quiet", "command": ["true"]}).wait(timeout=60)

    # Then it succeeds, and neither service logged below WARNING
    assert job.state == JobState.SUCCEEDED
    logs = procs.logs()
    assert " INFO " not in logs and "Traceback" not in logs, logs


@pytest.mark.parametrize("service", ["controller", "agent"])
def test_an_unknown_log_level_is_a_usage_error(service: str) -> None:
    # Given a log level that logging does not have (and a Redis nothing answers on, should it start)
    nowhere = "redis://127.0.0.1:1/0"
    argv = [sys.executable, "-m", "fleet", "--redis-url", nowhere, service, "--log-level", "loud"]

    # When the service is started with it
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)

    # Then it is refused like any bad option: exit 2, the allowed levels named, no traceback
    assert done.returncode == 2, done.stderr
    assert "--log-level: unknown level 'loud'" in done.stderr
    assert "debug, info, warning, error, critical" in done.stderr and "Traceback" not in done.stderr


def test_bad_input_gets_one_line_with_the_fix_never_a_traceback(fleet_cli, tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad_yaml = tmp_path / "job.yaml"
    bad_yaml.write_text("name: x\ncommand: [\n")
    cases = {
        ("submit", "-f", str(tmp_path / "missing.yaml")): (2, "missing.yaml: cannot read it (No such file"),
        ("submit", "-f", str(bad_yaml)): (
            2,
            "job.yaml: expected the node content, but found '<stream end>' at line",
        ),
        ("--api-url", "http://[::1", "jobs"): (2, "fleet API URL 'http://[::1': Invalid IPv6 URL"),
        ("--api-url", "http://host:port", "jobs"): (2, "fleet API URL 'http://host:port'"),
        ("submit", "--memory", "16", "gigs"): (2, "'gigs' follows the options: give the command after --"),
        ("submit", "--memory", "16", "--", "true"): (2, "memory: 16 bytes is less than a job can run in"),
        ("submit", "--timeout", "soon", "--", "true"): (2, "timeout: 'soon' is not a duration"),
        # no guessing: an abbreviation is refused, the option meant is named
        ("submit", "--prio", "5", "--", "true"): (2, "no such option: --prio (did you mean --priority?)"),
        ("jobs", "--state", "done"): (2, "--state: 'done': expected one of QUEUED, SCHEDULED"),
        ("jobs", "--watch", "0"): (2, "--watch: 0: expected seconds above 0"),
        ("wait",): (2, "missing argument 'ID' (see `fleet wait --help`)"),
        ("jobs", "--api-url", "http://x:1"): (
            2,
            "--api-url is fleet's own option: give it before the command",
        ),
    }
    for argv, (code, message) in cases.items():
        done = fleet_cli(*argv)
        assert (done.returncode, "Traceback" in done.stderr) == (code, False), (argv, done.stderr)
        assert message in done.stderr and done.stderr.startswith("fleet: "), (argv, done.stderr)
        assert len(done.stderr.splitlines()) == 1, done.stderr
    assert fleet_cli("jobs", "-o", "json").stdout.strip() == "[]"  # and nothing was submitted


def test_output_piped_into_head_ends_quietly(fleet_cli, client: Client) -> None:  # type: ignore[no-untyped-def]
    for i in range(150):
        spec = {"name": f"q{i}", "command": ["true"], "gpus": 64, "allow_unplaceable": True}
        client.submit(spec)  # stays queued
    for argv in (
        ["jobs"],
        ["jobs", "-o", "json"],
        ["nodes"],
        ["jobs", "--watch", "0.2"],
        ["top", "-n", "0.2"],
    ):
        done = subprocess.run(
            f"{sys.executable} -m fleet {' '.join(argv)} | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}}",
            shell=True,
            executable="/bin/bash",
            capture_output=True,
            text=True,
            timeout=60,
            env=fleet_cli.env,
        )
        assert (done.stdout.strip(), done.stderr) == ("0", ""), argv


def test_submit_wait_follow_prints_the_id_then_the_output_of_every_attempt(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    script = 'echo "attempt $FLEET_ATTEMPT"; [ "$FLEET_ATTEMPT" -ge 2 ]'
    done = fleet_cli("submit", "--wait", "--follow", "--max-attempts", "2", "--", "sh", "-c", script)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert lines[0].startswith("sh-") and lines[1:3] == ["attempt 1", "attempt 2"]
    assert lines[3].startswith(f"{lines[0]} SUCCEEDED")


def test_logs_carry_their_times_and_json_has_iso_timestamps(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    job_id = fleet_cli("submit", "--wait", "--", "sh", "-c", "echo first; echo second").stdout.split()[0]
    stamped = fleet_cli("logs", job_id, "--timestamps").stdout.splitlines()
    assert [line.split(" ", 1)[1] for line in stamped] == ["first", "second"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line.split()[0]) for line in stamped)
    records = [json.loads(line) for line in fleet_cli("logs", job_id, "-o", "json").stdout.splitlines()]
    assert [(r["attempt"], r["line"]) for r in records] == [(1, "first"), (1, "second")]
    shown = json.loads(fleet_cli("show", job_id, "-o", "json").stdout)
    assert shown["created_at_iso"].endswith("Z") and abs(shown["created_at"] - time.time()) < 120


def in_terminal(
    argv: list[str], env: dict[str, str], columns: int = 100, ctrl_c_on: str = "", seen: int = 1
) -> str:
    """What ``fleet ARGV`` writes to a terminal ``columns`` wide (a pseudo-terminal: isatty is true);
    with ``ctrl_c_on``, interrupted (SIGINT, as Ctrl-C) once that text was on the screen ``seen``
    times (not after a fixed time: on a busy machine the program may not have drawn anything yet)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleet", *argv],
        stdin=subprocess.DEVNULL,
        stdout=slave,
        stderr=slave,
        env={k: v for k, v in env.items() if k != "COLUMNS"},
    )
    os.close(slave)
    out = b""
    interrupt_on, deadline = ctrl_c_on.encode(), time.monotonic() + 60
    try:
        while True:
            if interrupt_on and out.count(interrupt_on) >= seen:
                proc.send_signal(signal.SIGINT)
                interrupt_on = b""
            assert time.monotonic() < deadline, out
            if not select.select([master], [], [], 0.1)[0]:
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the program closed its end
                break
            if not chunk:
                break
            out += chunk
        assert proc.wait(timeout=60) == 0, out
    finally:  # a failed assertion leaves no process (nor its warning) to the tests after it
        os.close(master)
        stop(proc)
    return out.decode()


def colours(text: str) -> set[str]:
    """The SGR colour codes in ``text`` (30-37, 90-97 and 38;... foregrounds)."""
    codes = set()
    for params in re.findall(r"\x1b\[([0-9;]*)m", text):
        codes |= {p for p in params.split(";") if p and (30 <= int(p) <= 38 or 90 <= int(p) <= 97)}
    return codes


def test_a_terminal_gets_colour_fitted_tables_and_scripts_get_plain_text(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    # Given a running job and a failed one, with a long reason
    running = fleet_cli("submit", "--gpus", "1", "--", "sleep", "60").stdout.strip()
    failed = fleet_cli("submit", "--max-attempts", "1", "--wait", "--", "sh", "-c", "exit 3").stdout.split()[
        0
    ]

    # When `fleet jobs` writes to a terminal 70 columns wide
    screen = in_terminal(["jobs"], fleet_cli.env, columns=70)

    # Then states are coloured and every line fits, the ids whole
    plain = re.sub(r"\x1b\[[0-9;]*m", "", screen)
    assert colours(screen) and max(len(line) for line in plain.splitlines()) <= 70, plain
    assert running in plain and failed in plain and "FAILED" in plain
    # And with NO_COLOR there is no colour; piped there is no escape code at all, and every column
    assert not colours(in_terminal(["jobs"], {**fleet_cli.env, "NO_COLOR": "1"}, columns=70))
    piped = fleet_cli("jobs").stdout
    assert "\x1b" not in piped and piped.split("\n")[0].split() == [
        "ID",
        "STATE",
        "USER",
        "TENANT",
        "GPUS",
        "NODE",
        "ATTEMPT",
        "START",
        "ELAPSED",
        "EXIT",
        "PROGRESS",
        "REASON",
    ]
    assert "\x1b" not in fleet_cli("show", failed).stdout and "\x1b" not in fleet_cli("nodes").stdout
    shown = in_terminal(["show", failed], fleet_cli.env)
    assert "State:" in shown and "FAILED" in shown and colours(shown)
    fleet_cli("cancel", running)


def test_watch_on_a_terminal_redraws_in_place_until_ctrl_c(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    job_id = fleet_cli("submit", "--gpus", "64", "--allow-unplaceable", "--", "true").stdout.strip()
    # When `fleet jobs --watch` runs on a terminal for a while, then Ctrl-C
    redrawn = "\x1b[1A\x1b[2K"  # cursor up, erase line
    screen = in_terminal(["jobs", "--watch", "0.3"], fleet_cli.env, ctrl_c_on=redrawn)  # asserts exit 0
    # Then the table was drawn, then drawn again over itself (cursor up, erase line), no traceback
    assert job_id in screen and "Ctrl-C stops" in screen and "Traceback" not in screen
    assert redrawn in screen, screen


def test_watch_when_piped_prints_a_snapshot_each_interval(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    # Given a queued job
    job_id = fleet_cli("submit", "--gpus", "64", "--allow-unplaceable", "--", "true").stdout.strip()
    for argv, marker in (
        (["jobs", "--watch", "0.2"], "ID "),
        (["nodes", "--watch", "0.2"], "NODE "),
        (["jobs", "-o", "json", "--watch", "0.2"], "["),
    ):
        # When it is watched through a pipe
        proc = subprocess.Popen(
            [sys.executable, "-m", "fleet", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=fleet_cli.env,
        )
        assert proc.stdout is not None
        snapshots = []
        try:
            for line in proc.stdout:
                if line.startswith(marker):
                    snapshots.append(line)
                if len(snapshots) == 3:
                    break
            # Then each interval brings a new snapshot, and Ctrl-C ends it as a success
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            stop(proc)
        assert (len(snapshots), proc.returncode, err) == (3, 0, ""), argv
        if argv[1] == "-o":
            assert [j["id"] for j in json.loads(snapshots[0])] == [job_id]  # one JSON document a line


def test_top_once_shows_gpus_running_jobs_and_queues(fleet_cli, client: Client) -> None:  # type: ignore[no-untyped-def]
    # Given a running job and one that waits
    running = fleet_cli("submit", "--gpus", "1", "--", "sleep", "60").stdout.strip()
    waiting = fleet_cli("submit", "--gpus", "64", "--allow-unplaceable", "--", "true").stdout.strip()
    deadline = time.monotonic() + 20
    while client.get(running).state != JobState.RUNNING and time.monotonic() < deadline:
        time.sleep(0.1)

    # When fleet top prints one frame (once the leader has published the tenants' queues)
    done = fleet_cli("top", "--once")
    while "1 queued" not in done.stdout and time.monotonic() < deadline + 20:
        time.sleep(0.5)
        done = fleet_cli("top", "--once")

    # Then it shows each GPU (claimed by which attempt, or free), the running job, and the queue
    assert done.returncode == 0, done.stderr
    frame = done.stdout
    assert "GPUs 1 free of 2" in frame and "1 running, 1 queued" in frame, frame
    gpus = frame.split("\nGPUs:\n")[1].split("\n\n")[0].splitlines()
    assert gpus[0].split() == ["NODE", "STATE", "IDX", "MODEL", "MEMORY", "UTIL", "STATUS"]
    assert f"claimed by {running}:1" in frame and gpus[2].endswith("free"), frame
    assert running in frame.split("\nRunning:\n")[1] and waiting not in frame
    queues = frame.split("\nQueues:\n")[1].splitlines()
    assert queues[1].split()[:3] == ["default", "1", "1"], frame
    as_json = json.loads(fleet_cli("top", "--once", "-o", "json").stdout)
    assert [j["id"] for j in as_json["running"]] == [running] and as_json["nodes"][0]["name"] == "t-cli"
    assert "\x1b" not in frame
    # And on a terminal it takes the screen (as top does) until Ctrl-C, then gives it back
    # (once it has drawn twice: it is redrawing, the screen taken)
    screen = in_terminal(["top", "-n", "0.3"], fleet_cli.env, ctrl_c_on="Ctrl-C stops", seen=2)
    assert "\x1b[?1049h" in screen and screen.rstrip().endswith("\x1b[?1049l") and running in screen
    fleet_cli("cancel", running)


def test_a_cordoned_nodes_gpus_show_as_not_placeable(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    fleet_cli("cordon", "t-cli", "--reason", "repair")
    table = fleet_cli("nodes").stdout
    assert "0/2" in table and table.count("not placeable: node CORDONED") == 2, table
    assert fleet_cli("nodes", "t-cli").stdout.count("not placeable: node CORDONED") == 2
    fleet_cli("uncordon", "t-cli")


def test_tab_completes_job_ids_and_node_names_from_the_api(fleet_cli) -> None:  # type: ignore[no-untyped-def]
    job_id = fleet_cli("submit", "--", "true").stdout.strip()

    def complete(words: str) -> list[str]:
        env = {
            **fleet_cli.env,
            "_FLEET_COMPLETE": "bash_complete",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1)),
        }
        done = subprocess.run(
            [sys.executable, "-m", "fleet"], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0 and done.stderr == "", done.stderr
        return done.stdout.split()

    assert complete("fleet cordon t-") == ["plain,t-cli"]
    assert complete("fleet drain t-cli t") == ["plain,t-cli"]
    assert complete(f"fleet show {job_id[:4]}") == [f"plain,{job_id}"]
    # no API: no completions, and no error in the middle of the user's command line
    assert complete("fleet --api-url http://127.0.0.1:1 show tr") == []
