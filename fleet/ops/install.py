"""``fleet install agent|controller``: write the config and systemd unit, then enable and start it;
``fleet install redis``: write Redis' config and its users, each with a password generated here.

With ``--root DIR`` everything goes under DIR and systemctl is not called (packaging, tests).
A Redis password never goes into fleet.toml, onto a command line or into the environment: a service's
is read from a file (or standard input) and written to a root-only ``redis-<service>.password``,
which its unit hands to the service alone (systemd ``LoadCredential=``), with the service's Redis
user (``fleet-<service>``, config/users.acl) as ``FLEET_REDIS_USERNAME``.

The agent and the API share the storage group (``storage_group``, ``fleet``): the agent gives kept
outputs and checkpoint directories to it, the API's unit (a ``DynamicUser``) runs in it, so it reads
them for ``fleet download`` and nothing else of root's. Installing either makes the group on this
host where it is missing.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from fleet.agent.supervision import stop_supervisor
from fleet.errors import ConfigError

SERVICES = ("agent", "api", "controller")
#: the Redis ACL users of config/users.acl that log in, each with a password of its own
#: (fleet-replica: a replica's login to its primary; fleet-sentinel: the sentinels' to each Redis)
ACL_USERS = ("fleet-admin", "fleet-controller", "fleet-agent", "fleet-api", "fleet-replica", "fleet-sentinel")


@dataclass(frozen=True)
class Installed:
    unit: Path
    config: Path
    secret: Path | None
    started: bool
    #: the storage group the service reads (api) or gives kept outputs to (agent); "" for none
    group: str = ""
    #: the group was made here, now
    made_group: bool = False


#: a drop-in of the service's unit: its Redis user, and its password file readable by it alone
_CREDENTIALS = """[Service]
LoadCredential=redis-password:/etc/fleet/redis-{service}.password
Environment=FLEET_REDIS_USERNAME={username}
Environment=FLEET_REDIS_PASSWORD_FILE=%d/redis-password
"""
#: the drop-in's lines for the sentinels' own password (``fleet install redis --sentinel`` made it)
_SENTINEL_CREDENTIALS = """LoadCredential=redis-sentinel-password:/etc/fleet/redis-sentinel-{service}.password
Environment=FLEET_REDIS_SENTINEL_PASSWORD_FILE=%d/redis-sentinel-password
"""


def template(name: str) -> str:
    repo = Path(__file__).resolve().parents[2] / "config"
    for base in (repo, Path(sys.prefix) / "share" / "fleet"):
        path = base / "systemd" / name if name.endswith(".service") else base / name
        if path.is_file():
            return path.read_text()
    raise ConfigError(
        f"cannot find the {name} template under config/ or {sys.prefix}/share/fleet (reinstall fleet)"
    )


def fleet_executable() -> str:
    """The ``fleet`` script of the environment running this (a venv's ``bin/fleet``), so the unit
    runs the install it was written by, whatever PATH says."""
    beside = Path(sys.executable).parent / "fleet"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("fleet") or f"{sys.executable} -m fleet"


def check_url(url: str) -> str:
    """``url`` if it holds no password: a command line is visible to every user through ``ps``."""
    if urlsplit(url).password is not None:
        raise ConfigError(
            "--redis-url: it holds a password, and a command line is visible to every user (ps); "
            "give the URL without it and the password with --redis-password-file FILE (or - for stdin)"
        )
    return url


def read_password(source: str, option: str = "--redis-password-file") -> str:
    """The password from a file, or from standard input when ``source`` is ``-``."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text()
    except OSError as exc:
        raise ConfigError(f"{option}: cannot read {source}: {exc.strerror}") from None
    password = text.rstrip("\r\n")
    if not password or "\n" in password or "\x00" in password:
        raise ConfigError(f"{option}: expected one line holding the password")
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


def write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner alone (0600), never through a symlink."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, 0o600)
        f.write(text)


def install_redis(root: Path = Path("/")) -> tuple[Path, Path | None, Path]:
    """Write ``/etc/fleet/redis.conf``, ``users.acl`` with a generated password per user, each
    password into ``/etc/fleet/redis-passwords/<user>.password`` (0600) for the operator to hand
    to the services, and the ``fleet-redis`` systemd unit; at ``/``, hand users.acl to the user
    Redis runs as, then enable and start the unit. An existing users.acl is kept (its users'
    passwords are in use). Returns the ACL file, the folder of new passwords (None when none were
    made) and the unit."""
    etc = root / "etc" / "fleet"
    etc.mkdir(parents=True, exist_ok=True)
    conf = etc / "redis.conf"
    if not conf.exists():
        conf.write_text(template("redis.conf"))
    acl, folder = redis_users(etc)
    unit = redis_unit(root, "fleet-redis.service", Path("/etc/fleet/redis.conf"))
    if root == Path("/"):
        shutil.chown(acl, redis_user(), redis_user())
    start_units(root, unit.name)
    return acl, folder, unit


def redis_users(etc: Path) -> tuple[Path, Path | None]:
    """``etc/users.acl`` with a generated password per user, each also in ``etc/redis-passwords``
    (0600), unless users.acl exists (its users' passwords are in use). The ACL file, and the folder
    of new passwords (None when none were made)."""
    acl = etc / "users.acl"
    if acl.exists():
        return acl, None
    passwords = {user: secrets.token_urlsafe(32) for user in ACL_USERS}
    folder = etc / "redis-passwords"
    folder.mkdir(mode=0o700, exist_ok=True)
    for user, password in passwords.items():
        write_private(folder / f"{user}.password", password + "\n")
    write_private(acl, render_acl(template("users.acl"), passwords))
    return acl, folder


def redis_unit(root: Path, name: str, conf: Path, writable: Path | None = None) -> Path:
    """Write the unit ``name`` (fleet-redis or fleet-redis-sentinel) running redis-server with
    ``conf`` as the user Redis runs as; ``writable``: the folder Redis may rewrite its config in."""
    unit = root / "etc" / "systemd" / "system" / name
    unit.parent.mkdir(parents=True, exist_ok=True)
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    text = template(name).replace("@REDIS_SERVER@", server).replace("@REDIS_USER@", redis_user())
    text = text.replace("@REDIS_CONF@", str(conf))
    if writable is None:  # and the comment above that line
        text = re.sub(
            r"(?m)^#[^\n]*\n(?=ReadWritePaths=@REDIS_CONF_DIR@)|^ReadWritePaths=@REDIS_CONF_DIR@\n", "", text
        )
    unit.write_text(text.replace("@REDIS_CONF_DIR@", str(writable)))
    return unit


def start_units(root: Path, *names: str) -> bool:
    """At ``/`` with systemd: enable and start the units ``names``, in order; whether it did."""
    if root != Path("/") or not shutil.which("systemctl"):
        return False
    subprocess.run(["systemctl", "daemon-reload"], check=True)
    for name in names:
        subprocess.run(["systemctl", "enable", "--now", name], check=True)
    return True


def redis_user() -> str:
    """The user Redis runs as: ``redis`` where the distribution's package made it, else root."""
    return REDIS_USER if _user_exists(REDIS_USER) else "root"


#: the user Debian's and Ubuntu's redis-server packages make (root where there is none)
REDIS_USER = "redis"


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def install(
    service: str,
    root: Path = Path("/"),
    redis_url: str | None = None,
    password: str | None = None,
    username: str | None = None,
    sentinel_password: str | None = None,
) -> Installed:
    if service not in SERVICES:
        raise ConfigError(f"service: {service!r} is not one of {', '.join(SERVICES)}")
    if redis_url:
        check_url(redis_url)
    if username is not None and not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", username):
        raise ConfigError(f"--redis-username: {username!r} is not a Redis user name (letters, digits, _ . -)")
    etc = root / "etc" / "fleet"
    etc.mkdir(parents=True, exist_ok=True)
    config = etc / "fleet.toml"
    secret: Path | None = None
    if not config.exists():
        text = template("fleet.toml")
        if redis_url:
            text = text.replace('redis_url = "redis://127.0.0.1:6379/0"', f"redis_url = {redis_url!r}")
        config.write_text(text)
    group = storage_group(config) if service in ("agent", "api") else ""
    unit_name = f"fleet-{service}.service"
    unit = root / "etc" / "systemd" / "system" / unit_name
    unit.parent.mkdir(parents=True, exist_ok=True)
    unit.write_text(with_group(template(unit_name).replace("@FLEET@", fleet_executable()), group))
    if password is not None or sentinel_password is not None:
        secret = _credentials(unit, etc, password, username, sentinel_password)
    made = ensure_group(group) if group and root == Path("/") else False  # before the unit starts in it
    started = False
    if root == Path("/") and shutil.which("systemctl"):
        subprocess.run(["systemctl", "daemon-reload"], check=True)
        subprocess.run(["systemctl", "enable", "--now", unit_name], check=True)
        started = True
    return Installed(unit=unit, config=config, secret=secret, started=started, group=group, made_group=made)


def _credentials(
    unit: Path, etc: Path, password: str | None, username: str | None, sentinel_password: str | None
) -> Path | None:
    """The unit's drop-in handing the service its Redis password and user, and the sentinels'
    password, each from a root-only file under ``etc``; the Redis password's file, if given."""
    service = unit.name.removeprefix("fleet-").removesuffix(".service")
    text, secret = "[Service]\n", None
    if password is not None:
        secret = etc / f"redis-{service}.password"
        write_private(secret, password + "\n")
        text = _CREDENTIALS.format(service=service, username=username or f"fleet-{service}")
    if sentinel_password is not None:
        write_private(etc / f"redis-sentinel-{service}.password", sentinel_password + "\n")
        text += _SENTINEL_CREDENTIALS.format(service=service)
    dropin = unit.parent / f"{unit.name}.d"
    dropin.mkdir(exist_ok=True)
    (dropin / "redis.conf").write_text(text)
    return secret


def storage_group(config: Path) -> str:
    """``storage_group`` of the config file ``config`` (and the environment's ``FLEET_*``)."""
    from fleet.config import load_settings

    return load_settings(config).storage_group


def with_group(unit: str, group: str) -> str:
    """The unit's ``@STORAGE_GROUP@`` line naming ``group``; without that line when there is none."""
    if group:
        return unit.replace("@STORAGE_GROUP@", group)
    return "".join(line for line in unit.splitlines(keepends=True) if "@STORAGE_GROUP@" not in line)


def ensure_group(name: str) -> bool:
    """Make the system group ``name`` unless it exists; whether it was made."""
    try:
        grp.getgrnam(name)
        return False
    except KeyError:
        pass
    if shutil.which("groupadd") is None:
        raise ConfigError(
            f"storage_group: no group {name!r} on this host and no groupadd to make it: make it (with "
            'the gid the other hosts give it), or set storage_group = "" (root alone reads kept outputs)'
        )
    subprocess.run(["groupadd", "--system", name], check=True)
    return True


def installed_credentials(service: str, root: Path = Path("/")) -> tuple[str | None, Path | None]:
    """The Redis user and password file ``fleet install SERVICE`` handed the service (its unit's
    drop-in), or None for each it did not: what the service logs in with, for ``fleet doctor`` run
    from a shell, where systemd's environment is not set."""
    username = None
    for line in _dropin(service, root):
        key, _, value = line.partition("=")
        if key == "Environment" and value.startswith("FLEET_REDIS_USERNAME="):
            username = value.partition("=")[2] or None
    return username, _credential(service, root, "redis-password")


def installed_sentinel_password(service: str, root: Path = Path("/")) -> Path | None:
    """The file of the sentinels' password ``fleet install SERVICE`` handed the service, or None."""
    return _credential(service, root, "redis-sentinel-password")


def _credential(service: str, root: Path, name: str) -> Path | None:
    for line in _dropin(service, root):
        key, _, value = line.partition("=")
        if key == "LoadCredential" and value.startswith(f"{name}:"):
            path = Path(value.partition(":")[2])
            return root / path.relative_to(path.anchor) if path.is_absolute() else None
    return None


def _dropin(service: str, root: Path) -> list[str]:
    dropin = root / "etc" / "systemd" / "system" / f"fleet-{service}.service.d" / "redis.conf"
    try:
        return dropin.read_text().splitlines()
    except OSError:
        return []


@dataclass(frozen=True)
class Uninstalled:
    unit: Path
    #: the agent's node supervisor that was stopped (its pid), None when none ran
    supervisor: int | None = None
    #: what became of the agent's network guard (its rules, its Docker network), in words
    network: tuple[str, ...] = ()


def uninstall(service: str, root: Path = Path("/")) -> Uninstalled:
    """Stop, disable and remove the unit; the config in /etc/fleet is kept. For the agent, then
    stop its node supervisor (which outlives agent restarts on purpose) and the attempts it holds:
    found through ``agent.state_dir`` of ``/etc/fleet/fleet.toml`` (under ``root``); and, on this
    host itself, take out the network guard's rules and Docker network."""
    unit_name = f"fleet-{service}.service"
    unit = root / "etc" / "systemd" / "system" / unit_name
    systemd = root == Path("/") and shutil.which("systemctl") is not None
    if systemd:
        subprocess.run(["systemctl", "disable", "--now", unit_name], check=False)
    unit.unlink(missing_ok=True)
    shutil.rmtree(unit.parent / f"{unit_name}.d", ignore_errors=True)
    if systemd:
        subprocess.run(["systemctl", "daemon-reload"], check=False)
    if service != "agent":
        return Uninstalled(unit)
    supervisor = stop_supervisor(agent_state_dir(root))
    if root != Path("/"):  # a tree for a test or an image: the host's firewall is not its own
        return Uninstalled(unit, supervisor)
    from fleet.agent.netguard import uninstall as unguard

    return Uninstalled(unit, supervisor, tuple(unguard()))


def agent_state_dir(root: Path = Path("/")) -> Path:
    """The installed agent's ``state_dir`` (from ``/etc/fleet/fleet.toml`` under ``root``, if there is
    one), as seen from here: under ``root``."""
    from fleet.config import load_settings

    config = root / "etc" / "fleet" / "fleet.toml"
    state_dir = load_settings(config if config.is_file() else None).agent.state_dir
    return root / state_dir.relative_to("/") if state_dir.is_absolute() else state_dir
