"""Hosts on one machine, for tests of a fleet spread over several: each host a network namespace
of its own with its own address, cabled to a switch (a bridge in a namespace of its own) on a
private subnet that exists only inside these namespaces. Nothing is routed anywhere else.

Needs root and iproute2 (``ip netns``). Names carry the test's pid, so two runs never collide;
``Network.close`` kills every process left in the namespaces and deletes them (and with them
every veth), whatever the test did.

Also here: the fleet a host runs comes from a wheel (``build_wheel``, ``install_wheel``), and its
services are started from the systemd units ``fleet install`` rendered (``Unit``), as systemd would
start them: ExecStart, EnvironmentFile, the drop-in's Environment and LoadCredential, and
``NOTIFY_SOCKET``, whose READY=1 says the service is up. The units' hardening, watchdog and restart
policy are not applied: no systemd runs here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SUBNET = "10.231.0"
ROOT = Path(__file__).resolve().parents[1]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def can_make_hosts() -> str | None:
    """Why hosts cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) not installed"
    probe = f"fleet-{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as exc:
        return f"ip netns add failed: {exc.stderr.decode().strip()}"
    _ip("netns", "del", probe)
    return None


@dataclass
class Host:
    name: str
    ns: str
    address: str
    #: the switch's end of this host's cable (what ``Network.cut`` unplugs)
    port: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]

    # every command runs in /, as systemd starts services: not in this checkout, whose fleet
    # package would shadow the wheel's for `python -c`
    def run(
        self, argv: list[str], env: dict[str, str] | None = None, timeout: float = 120, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            self.argv(argv), env=env, capture_output=True, text=True, timeout=timeout, cwd="/"
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"{self.name}: {shlex.join(argv)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done

    def start(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                self.argv(argv),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd="/",
            )
        self.procs.append(proc)
        return proc


class Network:
    """Hosts on a switch: ``add`` them, ``cut`` and ``restore`` their links, ``close`` it all."""

    def __init__(self) -> None:
        self.tag = f"fleet-{os.getpid()}"
        self.switch = f"{self.tag}-switch"
        self.hosts: dict[str, Host] = {}
        _ip("netns", "add", self.switch)
        self._namespaces = [self.switch]
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")

    def add(self, name: str) -> Host:
        index = len(self.hosts) + 1
        ns, port = f"{self.tag}-{name}", f"port{index}"
        _ip("netns", "add", ns)
        self._namespaces.append(ns)
        # the cable: one end in the switch, the other in the host (nothing in this machine's own namespace)
        _ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        address = f"{SUBNET}.{index}"
        _ip("-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        self.hosts[name] = host = Host(name, ns, address, port)
        return host

    def cut(self, host: Host) -> None:
        """Unplug the host's cable at the switch: its packets are dropped, as on a dead link."""
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def restore(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def close(self) -> None:
        """Kill every process in the namespaces (services, supervisors, jobs), then delete them."""
        started = [proc for host in self.hosts.values() for proc in host.procs]
        for proc in started:
            if proc.poll() is None:
                proc.terminate()
        _reap(started)
        for _ in range(3):  # a process may fork while its siblings die
            for pid in (pid for ns in self._namespaces for pid in _pids(ns)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        _reap(started)
        for ns in reversed(self._namespaces):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)


def _pids(ns: str) -> list[int]:
    done = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
    return [int(p) for p in done.stdout.split()]


def build_wheel(dest: Path) -> Path:
    """The wheel of this source tree, built from a copy of it (the tree gets no build/ or egg-info)."""
    source = dest / "source"
    skip = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")
    shutil.copytree(ROOT, source, ignore=skip)
    # with this interpreter's setuptools where it has one (no download), else pip fetches it
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(dest), str(source)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    shutil.rmtree(source)
    (wheel,) = dest.glob("fleet-*.whl")
    return wheel


def install_wheel(wheel: Path, venv: Path) -> Path:
    """A virtual environment of this Python with the wheel installed: fleet as an operator's
    ``pip install fleet-*.whl`` puts it, scripts, package data and share/fleet included.

    The wheel goes in with ``--no-deps``, and the environment sees the test interpreter's
    site-packages for fleet's dependencies (a .pth file): installing them from the package index
    would take minutes and the network on every run. Only the dependencies are shared; fleet
    itself is the wheel's, imported from the venv's own site-packages first."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # every site directory of the test's interpreter: a venv's, or a system Python's (Debian's
    # /usr/local/lib/.../dist-packages where pip installs, and /usr/lib/python3/dist-packages)
    shared = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")]
    (Path(site) / "fleet-test-dependencies.pth").write_text("".join(f"{p}\n" for p in shared))
    return venv / "bin"


@dataclass
class Unit:
    """A systemd unit ``fleet install --root ROOT`` wrote, started as systemd would start it."""

    root: Path
    service: str

    def _lines(self) -> list[tuple[str, str]]:
        name = f"fleet-{self.service}.service"
        unit = self.root / "etc" / "systemd" / "system" / name
        dropins = sorted((unit.parent / f"{name}.d").glob("*.conf"))
        texts = [unit.read_text()] + [p.read_text() for p in dropins]
        return [
            (key.strip(), value.strip())
            for text in texts
            for key, sep, value in (line.partition("=") for line in text.splitlines())
            if sep and not key.startswith("#")
        ]

    def _path(self, path: str) -> Path:
        """A path of the unit, under ROOT."""
        return self.root / path.lstrip("/")

    def command(self, credentials: Path) -> tuple[list[str], dict[str, str]]:
        """ExecStart's argv and the environment systemd would give it: EnvironmentFile, Environment,
        and each LoadCredential copied to ``credentials`` ($CREDENTIALS_DIRECTORY, %d)."""
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
        argv: list[str] = []
        credentials.mkdir(mode=0o700, parents=True, exist_ok=True)
        for key, value in self._lines():
            if key == "ExecStart":
                argv = [str(self._path(a)) if a.startswith("/etc/") else a for a in shlex.split(value)]
            elif key == "EnvironmentFile":
                path = self._path(value.lstrip("-"))
                if path.exists():
                    for line in path.read_text().splitlines():
                        name, sep, val = line.partition("=")
                        if sep and not name.startswith("#"):
                            env[name.strip()] = val.strip()
            elif key == "LoadCredential":
                name, _, source = value.partition(":")
                shutil.copyfile(self._path(source), credentials / name)
                (credentials / name).chmod(0o600)
            elif key == "Environment":
                name, _, val = value.partition("=")
                env[name] = val.replace("%d", str(credentials))
        env["CREDENTIALS_DIRECTORY"] = str(credentials)
        return argv, env

    def start(self, host: Host, state: Path, timeout: float = 60) -> subprocess.Popen[bytes]:
        """Start it on ``host``; for a Type=notify unit, return once it sent READY=1."""
        argv, env = self.command(state / f"credentials-{self.service}")
        notify = dict(self._lines()).get("Type") == "notify"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = state / f"notify-{self.service}"
        path.unlink(missing_ok=True)
        try:
            if notify:
                sock.bind(str(path))  # a path, not an abstract name: those are per network namespace
                env["NOTIFY_SOCKET"] = str(path)
            proc = host.start(argv, env, state / f"{self.service}.log")
            deadline = time.monotonic() + timeout
            while notify:
                sock.settimeout(max(0.1, min(1.0, deadline - time.monotonic())))
                with contextlib.suppress(TimeoutError):
                    if b"READY=1" in sock.recv(4096):
                        break
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"{host.name}: fleet-{self.service} never said READY=1 "
                        f"(exit code {proc.poll()}):\n{self.log(state)}"
                    )
        finally:
            # closed once ready: the service's later pings are refused (it ignores that) rather
            # than filling a socket nobody reads
            sock.close()
            path.unlink(missing_ok=True)
        return proc

    def log(self, state: Path) -> str:
        path = state / f"{self.service}.log"
        return path.read_text()[-4000:] if path.exists() else ""
