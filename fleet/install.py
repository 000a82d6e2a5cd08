"""``fleet install agent|controller``: write the config and systemd unit, then enable and start it.

With ``--root DIR`` everything goes under DIR and systemctl is not called (packaging, tests).
The Redis password never goes into fleet.toml nor onto a command line: it is read from a file
(or standard input) and written to a root-only ``fleet.env``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fleet.errors import ConfigError

SERVICES = ("agent", "controller")
#: the Redis ACL users of config/users.acl that log in, each with a password of its own
ACL_USERS = ("fleet-admin", "fleet-controller", "fleet-agent", "fleet-api")


@dataclass(frozen=True)
class Installed:
    unit: Path
    config: Path
    env: Path | None
    started: bool


def _template(name: str) -> str:
    repo = Path(__file__).resolve().parents[1] / "config"
    for base in (repo, Path(sys.prefix) / "share" / "fleet"):
        path = base / "systemd" / name if name.endswith(".service") else base / name
        if path.is_file():
            return path.read_text()
    raise ConfigError(
        f"cannot find the {name} template under config/ or {sys.prefix}/share/fleet (reinstall fleet)"
    )


def fleet_executable() -> str:
    return shutil.which("fleet") or f"{sys.executable} -m fleet"


def check_url(url: str) -> str:
    """``url`` if it holds no password: a command line is visible to every user through ``ps``."""
    if urlsplit(url).password is not None:
        raise ConfigError(
            "--redis-url: it holds a password, and a command line is visible to every user (ps); "
            "give the URL without it and the password with --redis-password-file FILE (or - for stdin)"
        )
    return url


def read_password(source: str) -> str:
    """The password from a file, or from standard input when ``source`` is ``-``."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as exc:
        raise ConfigError(f"--redis-password-file: cannot read {source}: {exc.strerror}") from None
    password = text.rstrip("\r\n")
    if not password or "\n" in password or "\x00" in password:
        raise ConfigError("--redis-password-file: expected one line holding the password")
    return password


def render_acl(template: str, passwords: Mapping[str, str]) -> str:
    """``template`` (config/users.acl, where no user has a password) with each user of ``passwords``
    given its password as a SHA-256 (``#<hex>``): the file Redis reads holds no password."""
    left, lines = dict(passwords), []
    for line in template.splitlines():
        words = line.split(" ")
        if words[0] == "user" and words[1] in left and "resetpass" in words:
            digest = hashlib.sha256(left.pop(words[1]).encode()).hexdigest()
            words.insert(words.index("resetpass") + 1, f"#{digest}")
        lines.append(" ".join(words))
    if left:
        raise ConfigError(
            f"users.acl has no line 'user NAME ... resetpass ...' for {', '.join(sorted(left))}"
        )
    return "\n".join(lines) + "\n"


def _env_line(name: str, value: str) -> str:
    """A systemd EnvironmentFile line; double quotes keep spaces, '#' and '$' literal."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{name}="{escaped}"\n'


def install(
    service: str, root: Path = Path("/"), redis_url: str | None = None, password: str | None = None
) -> Installed:
    if service not in SERVICES:
        raise ConfigError(f"service: {service!r} is not one of {', '.join(SERVICES)}")
    if redis_url:
        check_url(redis_url)
    etc = root / "etc" / "fleet"
    etc.mkdir(parents=True, exist_ok=True)
    config = etc / "fleet.toml"
    env: Path | None = None
    if not config.exists():
        text = _template("fleet.toml")
        if redis_url:
            text = text.replace('redis_url = "redis://127.0.0.1:6379/0"', f"redis_url = {redis_url!r}")
        config.write_text(text)
    if password is not None:
        env = etc / "fleet.env"
        fd = os.open(env, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            os.fchmod(fd, 0o600)
            f.write(_env_line("FLEET_REDIS_PASSWORD", password))
    unit_name = f"fleet-{service}.service"
    unit = root / "etc" / "systemd" / "system" / unit_name
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(_template(unit_name).replace("@FLEET@", fleet_executable()))
    started = False
    if root == Path("/") and shutil.which("systemctl"):
        subprocess.run(["systemctl", "daemon-reload"], check=True)
        subprocess.run(["systemctl", "enable", "--now", unit_name], check=True)
        started = True
    return Installed(unit=unit, config=config, env=env, started=started)


def uninstall(service: str, root: Path = Path("/")) -> Path:
    """Stop, disable and remove the unit; the config in /etc/fleet is kept."""
    unit_name = f"fleet-{service}.service"
    unit = root / "etc" / "systemd" / "system" / unit_name
    systemd = root == Path("/") and shutil.which("systemctl") is not None
    if systemd:
        subprocess.run(["systemctl", "disable", "--now", unit_name], check=False)
    unit.unlink(missing_ok=True)
    if systemd:
        subprocess.run(["systemctl", "daemon-reload"], check=False)
    return unit
