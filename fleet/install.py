"""``fleet install agent|controller``: write the config and systemd unit, then enable and start it.

With ``--root DIR`` everything goes under DIR and systemctl is not called (packaging, tests).
The Redis password never goes into fleet.toml: it is written to a root-only ``fleet.env``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from fleet.errors import ConfigError

SERVICES = ("agent", "controller")


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


def _split_password(url: str) -> tuple[str, str | None]:
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment)), parts.password


def install(service: str, root: Path = Path("/"), redis_url: str | None = None) -> Installed:
    if service not in SERVICES:
        raise ConfigError(f"service: {service!r} is not one of {', '.join(SERVICES)}")
    etc = root / "etc" / "fleet"
    etc.mkdir(parents=True, exist_ok=True)
    config = etc / "fleet.toml"
    env: Path | None = None
    if not config.exists():
        text = _template("fleet.toml")
        if redis_url:
            url, password = _split_password(redis_url)
            text = text.replace('redis_url = "redis://127.0.0.1:6379/0"', f'redis_url = "{url}"')
            if password is not None:
                env = etc / "fleet.env"
                env.touch(mode=0o600)
                env.write_text(f"FLEET_REDIS_PASSWORD={password}\n")
        config.write_text(text)
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
