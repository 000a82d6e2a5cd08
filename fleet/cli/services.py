"""The long-running services (``fleet controller``, ``fleet agent``, ``fleet api``) and ``fleet up``."""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet import log
from fleet.errors import ConfigError

if TYPE_CHECKING:  # the services' modules are imported when one runs, not for every CLI command
    from fleet.bus import Bus
    from fleet.config import Settings
    from fleet.state import JobStore, NodeStore


def register(sub: Any) -> None:
    p = sub.add_parser("controller", help="run the controller service (scheduling, failure detection)")
    _log_level_option(p)
    p.set_defaults(handler=controller)

    p = sub.add_parser("agent", help="run the node agent service (GPUs, containers, heartbeats)")
    p.add_argument("--node-name", help="this node's name (default: hostname)")
    p.add_argument("--runtime", choices=["auto", "docker", "process"])
    p.add_argument("--gpus", choices=["auto", "nvml", "simulated"], help="GPU inventory backend")
    _log_level_option(p)
    p.set_defaults(handler=agent)

    p = sub.add_parser(
        "api", help="run the HTTP API (tokens, roles, tenants; what the CLI and Client talk to)",
        description="Serve the fleet's HTTP API: HTTPS with --tls-cert and --tls-key (or api.tls_cert "
        "and api.tls_key in fleet.toml), else plain HTTP. OpenAPI at /docs and /openapi.json.",
    )  # fmt: skip
    p.add_argument("--host", help="address to listen on (default: api.host, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default: api.port, 8080)")
    p.add_argument("--tls-cert", type=Path, metavar="PEM", help="certificate (chain) for HTTPS")
    p.add_argument("--tls-key", type=Path, metavar="PEM", help="the certificate's private key")
    _log_level_option(p)
    p.set_defaults(handler=api)

    verbs = (("install", "write config and systemd unit, enable and start it"),
             ("uninstall", "stop, disable and remove the systemd unit (config is kept)"))  # fmt: skip
    for verb, what in verbs:
        p = sub.add_parser(verb, help=f"{what} (bare metal)")
        services = (
            ["agent", "api", "controller", "redis"] if verb == "install" else ["agent", "api", "controller"]
        )
        p.add_argument(
            "service", choices=services, help="redis: write /etc/fleet/redis.conf, users.acl, passwords"
        )
        p.add_argument("--root", default="/", help="install under this directory instead of / (no systemctl)")
        if verb == "install":
            p.add_argument(
                "--redis-url", default=argparse.SUPPRESS, help="the fleet's Redis, without a password"
            )
            p.add_argument(
                "--redis-password-file", metavar="FILE",
                help="file holding the service's Redis password (- reads stdin); it goes to a 0600 "
                "/etc/fleet/redis-SERVICE.password that only the service is given",
            )  # fmt: skip
            p.add_argument(
                "--redis-username", metavar="USER",
                help="the service's Redis ACL user (default fleet-SERVICE; 'default' for requirepass)",
            )  # fmt: skip
        p.set_defaults(handler=install if verb == "install" else uninstall)

    p = sub.add_parser(
        "up",
        help="run a whole local fleet in the foreground (Redis, controller, agent, API)",
        description="Run Redis, a controller, an agent and the API in the foreground. Ctrl-C, SIGTERM or "
        "SIGHUP stops them all; should `fleet up` be killed, its children stop too (Linux).",
    )
    p.add_argument("--gpus", type=int, default=4, help="simulated GPUs when the machine has none (default 4)")
    p.add_argument("--runtime", choices=["auto", "docker", "process"], default="auto")
    p.add_argument(
        "--state-dir", help="keep Redis data, checkpoints and agent state here (default: a temp dir)"
    )
    p.add_argument("--demo", action="store_true", help="submit example jobs, show them finish, then stop")
    p.set_defaults(handler=up)


def _log_level_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", type=_log_level, default="INFO", metavar="LEVEL",
                        help=f"{', '.join(log.LEVELS).lower()} (any case; default info)")  # fmt: skip


def _log_level(text: str) -> str:
    """argparse turns ArgumentTypeError into a usage error (exit 2) carrying our message."""
    try:
        return log.level_name(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _stores(settings: Settings) -> tuple[JobStore, NodeStore, Bus]:
    from fleet.bus import Bus
    from fleet.keys import Keys
    from fleet.state import JobStore, NodeStore, connect

    client, keys = connect(settings), Keys(settings.key_prefix)
    return JobStore(client, keys), NodeStore(client, keys), Bus(settings)


def _stop_on_signals(stop: threading.Event) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())


def controller(args: argparse.Namespace) -> int:
    from fleet.config import load_settings
    from fleet.controller.service import Controller

    log.setup(args.log_level)
    settings = load_settings(args.config, redis_url=args.redis_url)
    jobs, nodes, bus = _stores(settings)
    service = Controller(settings, jobs, nodes, bus)
    _stop_on_signals(service.stop_event)
    service.run()
    return 0


def agent(args: argparse.Namespace) -> int:
    from fleet.agent.gpus import open_inventory
    from fleet.agent.runtime import open_runtime
    from fleet.agent.service import Agent
    from fleet.agent.supervision import SupervisorClient
    from fleet.config import load_settings

    log.setup(args.log_level)
    settings = load_settings(args.config, redis_url=args.redis_url)
    overrides = {"node_name": args.node_name, "runtime": args.runtime, "gpus": args.gpus}
    settings.agent = settings.agent.model_copy(update={k: v for k, v in overrides.items() if v})
    jobs, nodes, bus = _stores(settings)
    cfg = settings.agent
    supervisor = SupervisorClient(cfg.state_dir, cfg.fence_margin_s, tick_s=min(0.05, cfg.fence_margin_s / 4))
    runtime = open_runtime(cfg, supervisor)
    service = Agent(settings, jobs, nodes, bus, open_inventory(cfg), runtime, supervisor)
    _stop_on_signals(service.stop_event)
    service.run()
    return 0


def api(args: argparse.Namespace) -> int:
    from fleet.api import serve
    from fleet.config import load_settings

    log.setup(args.log_level)
    settings = load_settings(args.config, redis_url=args.redis_url)
    cfg = settings.api
    cert, key = args.tls_cert or cfg.tls_cert, args.tls_key or cfg.tls_key
    if (cert is None) != (key is None):
        raise ConfigError("--tls-cert and --tls-key: give both (HTTPS) or neither (HTTP)")
    serve(settings, args.host or cfg.host, cfg.port if args.port is None else args.port, cert=cert, key=key)
    return 0


def up(args: argparse.Namespace) -> int:
    from fleet.local import LocalFleet

    with LocalFleet(gpus=args.gpus, runtime=args.runtime, state_dir=args.state_dir,
                    redis_url=args.redis_url) as fleet:  # fmt: skip
        if args.demo:
            return fleet.demo()
        fleet.serve()
    return 0


def install(args: argparse.Namespace) -> int:
    from fleet.install import install as do_install
    from fleet.install import read_password

    if args.service == "redis":
        return _install_redis(Path(args.root))
    password = read_password(args.redis_password_file) if args.redis_password_file else None
    done = do_install(args.service, Path(args.root), args.redis_url, password, args.redis_username)
    print(f"wrote {done.unit}\nconfig {done.config}")
    if done.secret:
        print(f"secret {done.secret} (0600), given to the service alone (LoadCredential=)")
    print(
        f"started fleet-{args.service}"
        if done.started
        else "not started (use systemctl, or --root was given)"
    )
    return 0


def _install_redis(root: Path) -> int:
    from fleet.install import install_redis

    acl, passwords = install_redis(root)
    conf = acl.parent / "redis.conf"
    print(f"wrote {conf}: start Redis with it (redis-server {conf})")
    if passwords is None:
        print(f"kept {acl} and its users' passwords")
        return 0
    print(f"wrote {acl} (0600; chown it to the user Redis runs as)")
    print(f"passwords {passwords}/USER.password (0600): give each service its own, with "
          "fleet install SERVICE --redis-password-file FILE on its machine")  # fmt: skip
    return 0


def uninstall(args: argparse.Namespace) -> int:
    from fleet.install import uninstall as do_uninstall

    print(f"removed {do_uninstall(args.service, Path(args.root))}")
    return 0
