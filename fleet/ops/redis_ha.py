"""``fleet install redis --sentinel``: this host's Redis as the primary of a Sentinel set or a replica
of it, and a sentinel beside it, as an operator of three Redis hosts runs them.

Every Redis of the set has the same users and passwords (the services log in to whichever is
primary): the primary's host makes them (``users.acl``, ``redis-passwords/``), and each replica's host
gets copies of both before its install, which refuses to make passwords of its own. Besides the
services' users, a replica logs in to its primary as ``fleet-replica`` and the sentinels to each Redis
as ``fleet-sentinel`` (config/users.acl: only what replication and a failover need); the sentinels
have a password of their own (``redis-passwords/sentinel.password``), which the services are given
for ``redis_sentinel_password_file``.

Redis and Sentinel rewrite their config files at a failover (the new ``replicaof``, the new primary,
the sentinels and replicas each learnt), so both live in ``/etc/fleet/redis/``, a folder of the user
Redis runs as (0700), each file 0600: they hold the passwords Redis and Sentinel log in with, which
their formats keep in plain text. A second install keeps them, as they may have been rewritten since.
"""

from __future__ import annotations

import ipaddress
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from fleet.config import host_port
from fleet.errors import ConfigError
from fleet.ops.install import redis_unit, redis_user, redis_users, start_units, template, write_private

#: the name the sentinels know the primary by (``redis_master``'s default)
MASTER = "fleet"
REDIS_PORT = 6379
SENTINEL_PORT = 26379
#: the folder of the configs Redis and Sentinel rewrite, under the root
HA_DIR = Path("etc/fleet/redis")
#: the passwords a Sentinel set needs besides the services': replication, Sentinel's login to each
#: Redis, and the sentinels' own (not an ACL user: their ``requirepass``)
SHARED = ("fleet-replica", "fleet-sentinel", "sentinel")


@dataclass(frozen=True)
class Topology:
    """This host's part in a Sentinel set: its address and Redis port, the primary's address, and
    the sentinels (each host's, on ``sentinel_port``) with the quorum that declares a primary down."""

    address: str
    port: int
    primary: tuple[str, int]
    sentinels: tuple[tuple[str, int], ...]
    sentinel_port: int
    quorum: int

    @property
    def is_primary(self) -> bool:
        return (self.address, self.port) == self.primary

    def role(self) -> str:
        return "primary" if self.is_primary else f"replica of {joined(self.primary)}"


def topology(
    address: str, port: int, primary: str, sentinels: str, sentinel_port: int, quorum: int | None
) -> Topology:
    """The options of ``fleet install redis --sentinel``, checked: each error names its option.
    ``sentinels`` is a comma-separated list of hosts (port ``sentinel_port`` unless given)."""
    _host(address, "--address")
    for value, option in ((port, "--port"), (sentinel_port, "--sentinel-port")):
        if not 0 < value < 65536:
            raise ConfigError(f"{option}: {value} is not a port (1-65535)")
    where = _address(primary, "--primary", REDIS_PORT)
    found = tuple(
        _address(s.strip(), "--sentinels", sentinel_port) for s in sentinels.split(",") if s.strip()
    )
    if (address, sentinel_port) not in found:
        raise ConfigError(
            f"--sentinels: lists no sentinel on this host ({joined((address, sentinel_port))}): list every "
            "Redis host's sentinel, this one's too, e.g. --sentinels 10.0.0.1,10.0.0.2,10.0.0.3"
        )
    quorum = len(found) // 2 + 1 if quorum is None else quorum
    if not 0 < quorum <= len(found):
        raise ConfigError(f"--quorum: {quorum} is not between 1 and the {len(found)} sentinels listed")
    return Topology(address, port, where, found, sentinel_port, quorum)


def _address(text: str, option: str, port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``v6`` or ``[v6]:port``, the port ``port`` unless given."""
    bracketed = text.startswith("[")
    if (bracketed and "]:" not in text) or (not bracketed and text.count(":") > 1):
        text = f"[{text.strip('[]')}]:{port}"  # an IPv6 address without a port
    elif ":" not in text:
        text = f"{text}:{port}"
    try:
        found = host_port(text)
    except ValueError:
        raise ConfigError(f"{option}: {text!r} is not host or host:port (e.g. 10.0.0.1:{port})") from None
    return _host(found[0], option), found[1]


def _host(host: str, option: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not host or not all(part.isalnum() or part.replace("-", "").isalnum() for part in host.split(".")):
            raise ConfigError(f"{option}: {host!r} is not an IP address or host name") from None
    return host


def joined(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _binds(address: str) -> str:
    """This host's address first (replication connects from it), then loopback for its operators."""
    return " ".join(dict.fromkeys([address, "127.0.0.1", "-::1"]))


def redis_config(base: str, t: Topology, replica_password: str) -> str:
    """``base`` (config/redis.conf) listening on ``t``'s address and port, with replication: every
    Redis of the set has ``masterauth`` (the primary of today is a replica after a failover)."""
    lines = []
    for line in base.splitlines():
        if line.startswith("bind "):
            line = f"bind {_binds(t.address)}"
        elif line.startswith("port "):
            line = f"port {t.port}"
        lines.append(line)
    lines += [
        "# Replication (fleet install redis --sentinel): replicas log in to the primary as",
        "# fleet-replica. Sentinel rewrites replicaof below at a failover (CONFIG REWRITE).",
        "masteruser fleet-replica",
        f"masterauth {replica_password}",
    ]
    if not t.is_primary:
        host, port = t.primary
        lines.append(f"replicaof {host} {port}")
    return "\n".join(lines) + "\n"


def sentinel_config(base: str, t: Topology, own_password: str, auth_password: str) -> str:
    """``base`` (config/sentinel.conf) for ``t``, with the sentinels' own password (asked of the
    services and given to the other sentinels) and fleet-sentinel's (to each Redis)."""
    host, port = t.primary
    text = (
        base.replace("@PORT@", str(t.sentinel_port))
        .replace("@BIND@", _binds(t.address))
        .replace("@PRIMARY_HOST@", host)
        .replace("@PRIMARY_PORT@", str(port))
        .replace("@QUORUM@", str(t.quorum))
    )
    if not _is_ip(host):
        text += "sentinel resolve-hostnames yes\n"
    return text + (
        f"requirepass {own_password}\nsentinel sentinel-pass {own_password}\n"
        f"sentinel auth-pass {MASTER} {auth_password}\n"
    )


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


@dataclass(frozen=True)
class HaInstalled:
    redis_conf: Path
    sentinel_conf: Path
    #: the folder of the passwords made here (on the primary's host, the first time), else None
    passwords: Path | None
    units: tuple[Path, Path]
    #: whether each config was written now (False: kept, as Redis or Sentinel may have rewritten it)
    wrote: tuple[bool, bool]
    started: bool


def install_redis_ha(t: Topology, root: Path = Path("/")) -> HaInstalled:
    """Write this host's Redis and Sentinel configs for ``t`` under ``/etc/fleet/redis``, the users
    and passwords (on the primary's host; a replica's host must have the primary's), and the
    ``fleet-redis`` and ``fleet-redis-sentinel`` units; at ``/``, hand the files to the user Redis
    runs as, then enable and start both units."""
    etc = root / "etc" / "fleet"
    etc.mkdir(parents=True, exist_ok=True)
    folder = etc / "redis-passwords"
    if not t.is_primary and not (etc / "users.acl").exists():
        raise ConfigError(_copy_first(etc / "users.acl"))
    acl, made = redis_users(etc)
    if made is not None:
        write_private(folder / "sentinel.password", _new_password() + "\n")
    passwords = {name: _shared_password(folder / f"{name}.password") for name in SHARED}
    ha = root / HA_DIR
    ha.mkdir(mode=0o700, parents=True, exist_ok=True)
    redis_conf, sentinel_conf = ha / "redis.conf", ha / "sentinel.conf"
    wrote = (not redis_conf.exists(), not sentinel_conf.exists())
    if wrote[0]:
        write_private(redis_conf, redis_config(template("redis.conf"), t, passwords["fleet-replica"]))
    if wrote[1]:
        text = sentinel_config(
            template("sentinel.conf"), t, passwords["sentinel"], passwords["fleet-sentinel"]
        )
        write_private(sentinel_conf, text)
    conf = Path("/") / HA_DIR
    units = (
        redis_unit(root, "fleet-redis.service", conf / "redis.conf", writable=conf),
        redis_unit(root, "fleet-redis-sentinel.service", conf / "sentinel.conf"),
    )
    if root == Path("/"):
        user = redis_user()
        for path in (acl, ha, redis_conf, sentinel_conf):
            shutil.chown(path, user, user)
    started = start_units(root, *(u.name for u in units))
    return HaInstalled(redis_conf, sentinel_conf, made, units, wrote, started)


def _new_password() -> str:
    return secrets.token_urlsafe(32)


def _shared_password(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        raise ConfigError(_copy_first(path)) from None


def _copy_first(missing: Path) -> str:
    return (
        f"--sentinel: {missing} is missing: every Redis of a Sentinel set has the same users and "
        "passwords, so install the primary's host first, then copy its /etc/fleet/users.acl and "
        "/etc/fleet/redis-passwords/ to this host (scp -p, as root) and run this again (a users.acl "
        "from before --sentinel has no fleet-replica and fleet-sentinel users: move it away on the "
        "primary's host and install again, which makes new passwords for every service)"
    )


def services_settings(t: Topology) -> str:
    """What every controller's, agent's and API's fleet.toml needs to find the primary."""
    listed = ", ".join(f'"{joined(s)}"' for s in t.sentinels)
    return f'redis_sentinels = [{listed}]\nredis_master = "{MASTER}"\n'
