"""The long-running services (``fleet controller``, ``fleet agent``, ``fleet api``) and ``fleet up``."""

from __future__ import annotations

import grp
import shutil
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import click

from fleet import log
from fleet.cli.common import CONTEXT, F, Globals, pass_globals
from fleet.errors import ConfigError

if TYPE_CHECKING:  # the services' modules are imported when one runs, not for every CLI command
    from fleet.bus import Bus
    from fleet.config import Settings
    from fleet.state import JobStore, NodeStore


def log_level_option(func: F) -> F:
    return click.option(
        "--log-level",
        callback=_log_level,
        default="INFO",
        metavar="LEVEL",
        help=f"{', '.join(log.LEVELS).lower()} (any case; default info)",
    )(func)


def _log_level(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A logging level in any case; another word is a usage error naming the allowed levels."""
    try:
        return log.level_name(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


RUNTIMES = click.Choice(["auto", "docker", "process"])


def _stores(settings: Settings) -> tuple[JobStore, NodeStore, Bus]:
    from fleet.bus import Bus
    from fleet.state import Stores

    stores = Stores.open(settings)
    return stores.jobs, stores.nodes, Bus(settings)


def _stop_on_signals(stop: threading.Event) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())


@click.command(
    context_settings=CONTEXT, short_help="run the controller service (scheduling, failure detection)"
)
@log_level_option
@pass_globals
def controller(globals_: Globals, log_level: str) -> int:
    """Run the controller service (scheduling, failure detection)."""
    from fleet.config import load_settings
    from fleet.controller.service import Controller

    log.setup(log_level)
    settings = load_settings(globals_.config, redis_url=globals_.redis_url)
    jobs, nodes, bus = _stores(settings)
    service = Controller(settings, jobs, nodes, bus)
    _stop_on_signals(service.stop_event)
    service.run()
    return 0


@click.command(
    context_settings=CONTEXT, short_help="run the node agent service (GPUs, containers, heartbeats)"
)
@click.option("--node-name", help="this node's name (default: hostname)")
@click.option("--runtime", type=RUNTIMES, help="how jobs run: docker containers or plain processes")
@click.option("--gpus", type=click.Choice(["auto", "nvml", "simulated"]), help="GPU inventory backend")
@log_level_option
@pass_globals
def agent(
    globals_: Globals, node_name: str | None, runtime: str | None, gpus: str | None, log_level: str
) -> int:
    """Run the node agent service (GPUs, containers, heartbeats)."""
    from fleet.agent.cgroups import open_cgroups
    from fleet.agent.gpus import open_inventory
    from fleet.agent.runtime import open_runtime
    from fleet.agent.service import Agent
    from fleet.agent.supervision import SupervisorClient
    from fleet.config import load_settings

    log.setup(log_level)
    settings = load_settings(globals_.config, redis_url=globals_.redis_url)
    overrides = {"node_name": node_name, "runtime": runtime, "gpus": gpus}
    settings.agent = settings.agent.model_copy(update={k: v for k, v in overrides.items() if v})
    jobs, nodes, bus = _stores(settings)
    cfg = settings.agent
    cgroups = open_cgroups(cfg.cgroup_parent, cfg.node_name)
    supervisor = SupervisorClient(
        cfg.state_dir,
        cfg.fence_margin_s,
        tick_s=min(0.05, cfg.fence_margin_s / 4),
        idle_exit_s=cfg.supervisor_idle_exit_s,
        cgroup_dirs=cgroups.node_dirs(),
    )
    service = Agent(
        settings, jobs, nodes, bus, open_inventory(cfg), open_runtime(cfg, supervisor, cgroups), supervisor
    )
    _stop_on_signals(service.stop_event)
    service.run()
    return 0


@click.command(
    context_settings=CONTEXT,
    short_help="run the HTTP API (tokens, roles, tenants; what the CLI and Client talk to)",
)
@click.option("--host", help="address to listen on (default: api.host, 127.0.0.1)")
@click.option("--port", type=int, help="port (default: api.port, 8080)")
@click.option(
    "--tls-cert", type=click.Path(path_type=Path), metavar="PEM", help="certificate (chain) for HTTPS"
)
@click.option(
    "--tls-key", type=click.Path(path_type=Path), metavar="PEM", help="the certificate's private key"
)
@log_level_option
@pass_globals
def api(
    globals_: Globals,
    host: str | None,
    port: int | None,
    tls_cert: Path | None,
    tls_key: Path | None,
    log_level: str,
) -> int:
    """Serve the fleet's HTTP API: HTTPS with --tls-cert and --tls-key (or api.tls_cert and
    api.tls_key in fleet.toml), else plain HTTP. OpenAPI at /docs and /openapi.json."""
    from fleet.api import serve
    from fleet.config import load_settings

    log.setup(log_level)
    settings = load_settings(globals_.config, redis_url=globals_.redis_url)
    cfg = settings.api
    cert, key = tls_cert or cfg.tls_cert, tls_key or cfg.tls_key
    if (cert is None) != (key is None):
        raise ConfigError("--tls-cert and --tls-key: give both (HTTPS) or neither (HTTP)")
    serve(settings, host or cfg.host, cfg.port if port is None else port, cert=cert, key=key)
    return 0


@click.command(
    context_settings=CONTEXT,
    short_help="run a whole local fleet in the foreground (Redis, controller, agent, API)",
)
@click.option(
    "--gpus", type=int, default=4, show_default=True, help="simulated GPUs when the machine has none"
)
@click.option(
    "--runtime", type=RUNTIMES, default="auto", show_default=True, help="docker containers or processes"
)
@click.option(
    "--state-dir",
    metavar="DIR",
    help="keep Redis data, checkpoints and agent state here (default: a temp dir)",
)
@click.option("--demo", is_flag=True, help="submit example jobs, show them finish, then stop")
@click.option(
    "--ha",
    is_flag=True,
    help="Redis Sentinel: a primary, two replicas and three sentinels (kill the primary to see a failover)",
)
@pass_globals
def up(globals_: Globals, gpus: int, runtime: str, state_dir: str | None, demo: bool, ha: bool) -> int:
    """Run Redis, a controller, an agent and the API in the foreground, and print the API's URL and
    an admin token. Jobs run as you (under sudo: as SUDO_USER). Ctrl-C, SIGTERM or SIGHUP stops them
    all; should `fleet up` be killed, its children stop too (Linux).

    With --ha, Redis is a primary, two replicas and three sentinels (each with a password of its
    own, in files only the services read); the services follow whichever Redis the sentinels name
    primary, so `kill -9` of the primary shows a failover with nothing restarted."""
    from fleet.ops.local import LocalFleet

    with LocalFleet(
        gpus=gpus, runtime=runtime, state_dir=state_dir, redis_url=globals_.redis_url, ha=ha
    ) as fleet:
        if demo:
            return fleet.demo()
        fleet.serve()
    return 0


ROOT_OPTION = click.option(
    "--root", default="/", show_default=True, help="install under this directory instead of / (no systemctl)"
)


@click.command(
    context_settings=CONTEXT, short_help="write config and systemd unit, enable and start it (bare metal)"
)
@click.argument("service", type=click.Choice(["agent", "api", "controller", "redis"]))
@ROOT_OPTION
@click.option("--redis-url", "service_redis_url", metavar="URL", help="the fleet's Redis, without a password")
@click.option(
    "--redis-password-file",
    metavar="FILE",
    help="file holding the service's Redis password (- reads stdin); it goes to a 0600 "
    "/etc/fleet/redis-SERVICE.password that only the service is given",
)
@click.option(
    "--redis-username",
    metavar="USER",
    help="the service's Redis ACL user (default fleet-SERVICE; 'default' for requirepass)",
)
@click.option(
    "--redis-sentinel-password-file",
    metavar="FILE",
    help="file holding the sentinels' password (redis-passwords/sentinel.password of `fleet install "
    "redis --sentinel`); given to the service alone, as its Redis password is",
)
@click.option(
    "--sentinel",
    is_flag=True,
    help="redis: this host's Redis as the primary or a replica of a Sentinel set, and a sentinel",
)
@click.option(
    "--address", metavar="HOST", help="redis --sentinel: this host's address (Redis and its sentinel bind it)"
)
@click.option("--port", type=int, default=6379, show_default=True, help="redis --sentinel: this Redis' port")
@click.option(
    "--primary",
    metavar="HOST[:PORT]",
    help="redis --sentinel: the primary's address; this host is the primary when it is its own "
    "--address and --port, else a replica of it",
)
@click.option(
    "--sentinels",
    metavar="HOST[:PORT],...",
    help="redis --sentinel: every Redis host's sentinel, this one's too (port: --sentinel-port)",
)
@click.option(
    "--sentinel-port",
    type=int,
    default=26379,
    show_default=True,
    help="redis --sentinel: the sentinel's port",
)
@click.option(
    "--quorum",
    type=int,
    help="redis --sentinel: sentinels that must agree the primary is down (default: a majority)",
)
@pass_globals
def install(
    globals_: Globals,
    service: str,
    root: str,
    service_redis_url: str | None,
    redis_password_file: str | None,
    redis_username: str | None,
    redis_sentinel_password_file: str | None,
    sentinel: bool,
    address: str | None,
    port: int,
    primary: str | None,
    sentinels: str | None,
    sentinel_port: int,
    quorum: int | None,
) -> int:
    """Write SERVICE's config and systemd unit, enable and start it (bare metal). redis: write
    /etc/fleet/redis.conf, users.acl and each service's password. redis --sentinel --address HOST
    --primary HOST[:PORT] --sentinels HOST,HOST,HOST: this host's Redis (the primary, or a replica of
    --primary) and a sentinel, in /etc/fleet/redis/; install the primary's host first, then copy its
    users.acl and redis-passwords/ to the others (README, "HA: Redis Sentinel"). agent, api: make
    the storage group (storage_group, fleet) if missing; the API runs in it to read kept outputs."""
    from fleet.ops.install import install as do_install
    from fleet.ops.install import read_password

    if service == "redis":
        if not sentinel:
            return _install_redis(Path(root))
        if not (address and primary and sentinels):
            raise ConfigError(
                "redis --sentinel: give --address, --primary and --sentinels (fleet install --help)"
            )
        return _install_redis_ha(Path(root), address, port, primary, sentinels, sentinel_port, quorum)
    if sentinel:
        raise ConfigError(f"--sentinel: only for `fleet install redis`, not {service}")
    password = read_password(redis_password_file) if redis_password_file else None
    sentinel_password = None
    if redis_sentinel_password_file:
        sentinel_password = read_password(redis_sentinel_password_file, "--redis-sentinel-password-file")
    redis_url = service_redis_url or globals_.redis_url
    done = do_install(service, Path(root), redis_url, password, redis_username, sentinel_password)
    print(f"wrote {done.unit}\nconfig {done.config}")
    if done.secret:
        print(f"secret {done.secret} (0600), given to the service alone (LoadCredential=)")
    if sentinel_password is not None:
        print("the sentinels' password too (0600, LoadCredential=): set redis_sentinels in the config")
    if done.group:
        reads = "reads kept outputs and checkpoints as" if service == "api" else "gives kept outputs to"
        gid = grp.getgrnam(done.group).gr_gid if done.made_group else 0
        made = f" (made here, gid {gid}: the same on every host of checkpoint_root)" if gid else ""
        print(f"fleet-{service} {reads} group {done.group}{made}")
    print(f"started fleet-{service}" if done.started else "not started (use systemctl, or --root was given)")
    return 0


def _install_redis(root: Path) -> int:
    from fleet.ops.install import install_redis

    acl, passwords, unit = install_redis(root)
    print(f"wrote {acl.parent / 'redis.conf'} (bind the address agents reach; see its comments)")
    _said_users(acl, passwords)
    started = root == Path("/") and shutil.which("systemctl") is not None
    print(
        f"wrote {unit}; "
        + ("started fleet-redis" if started else "not started (--root was given, or no systemd)")
    )
    return 0


def _said_users(acl: Path, passwords: Path | None) -> None:
    if passwords is None:
        print(f"kept {acl} and its users' passwords")
    else:
        print(f"wrote {acl} (0600, owned by the user Redis runs as)")
        print(
            f"passwords {passwords}/USER.password (0600): give each service its own, with "
            "fleet install SERVICE --redis-password-file FILE on its machine"
        )


def _install_redis_ha(
    root: Path, address: str, port: int, primary: str, sentinels: str, sentinel_port: int, quorum: int | None
) -> int:
    from fleet.ops.redis_ha import install_redis_ha, services_settings, topology

    t = topology(address, port, primary, sentinels, sentinel_port, quorum)
    done = install_redis_ha(t, root)
    acl = root / "etc" / "fleet" / "users.acl"
    _said_users(acl, done.passwords)
    for path, wrote in zip((done.redis_conf, done.sentinel_conf), done.wrote, strict=True):
        print(f"{'wrote' if wrote else 'kept'} {path} (0600: Redis and Sentinel rewrite it at a failover)")
    print(
        f"this Redis: {t.role()}; its sentinel: port {t.sentinel_port}, quorum {t.quorum}/{len(t.sentinels)}"
    )
    if done.passwords is not None:
        print(
            f"copy {acl} and {done.passwords}/ to the other Redis hosts (scp -p, as root) "
            "before installing them"
        )
    print("every controller's, agent's and API's /etc/fleet/fleet.toml:")
    print(services_settings(t), end="")
    print(
        "and the sentinels' password: fleet install SERVICE --redis-sentinel-password-file "
        "sentinel.password (a copy of redis-passwords/sentinel.password)"
    )
    units = " and ".join(u.name.removesuffix(".service") for u in done.units)
    print(
        f"wrote {units}; "
        + (f"started {units}" if done.started else "not started (--root was given, or no systemd)")
    )
    return 0


@click.command(
    context_settings=CONTEXT, short_help="stop, disable and remove the systemd unit (config is kept)"
)
@click.argument("service", type=click.Choice(["agent", "api", "controller", "redis"]))
@ROOT_OPTION
def uninstall(service: str, root: str) -> int:
    """Stop, disable and remove SERVICE's systemd unit (bare metal; its config is kept). agent: then
    stop the node's supervisor and any job it still holds, and remove the rules and the Docker
    network that keep jobs off the node's services."""
    from fleet.ops.install import uninstall as do_uninstall

    done = do_uninstall(service, Path(root))
    print(f"removed {done.unit}")
    if done.supervisor is not None:
        print(f"stopped the node supervisor (pid {done.supervisor}) and the jobs it held")
    for line in done.network:
        print(line)
    return 0
