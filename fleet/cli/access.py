"""Who you are to the fleet: ``fleet login``, ``fleet logout``, ``fleet whoami``, ``fleet token ...``."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from fleet.cli.commands import duration
from fleet.cli.output import emit_json, stamp, table
from fleet.client import Client, credentials_path, save_credentials
from fleet.errors import SpecError
from fleet.models import Role, TokenInfo


def register(sub: Any, output: Any) -> None:
    p = sub.add_parser(
        "login", help="save the API's URL and your token (0600 credentials file)",
        description="Check the token against the API, then save URL and token to the credentials file "
        "($FLEET_CREDENTIALS, default ~/.config/fleet/credentials.json, mode 0600). The token is read "
        "from $FLEET_TOKEN, else from standard input (a prompt on a terminal): never from argv, which "
        "every user of the machine can read.",
    )  # fmt: skip
    p.add_argument("url", help="the fleet API, e.g. https://fleet.example.org:8080")
    p.add_argument("--ca-file", help="CA bundle that signed the API's certificate (a fleet's own CA)")
    p.set_defaults(handler=login)

    p = sub.add_parser("logout", help="forget the saved credentials")
    p.set_defaults(handler=logout)

    p = sub.add_parser("whoami", help="the user, tenant and role of your token")
    output(p)
    p.set_defaults(handler=whoami)

    token = sub.add_parser("token", help="create, list and revoke API tokens (admins)")
    verbs = token.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser(
        "create", help="issue a token (printed once: only its hash is kept)",
        description="Issue a token for USER in TENANT with ROLE: user (its tenant's jobs), operator "
        "(also cordon/drain, every tenant's jobs), admin (also tokens and tenants). Through the API with "
        "an admin token; on a server that holds the Redis credentials (fleet.toml / FLEET_REDIS_*), "
        "--direct writes it to Redis itself: how the first admin token is made.",
    )  # fmt: skip
    p.add_argument("--user", required=True)
    p.add_argument("--tenant", required=True)
    p.add_argument("--role", choices=[r.value for r in Role], default="user")
    p.add_argument("--expires", help="lifetime, e.g. 90d, 12h, 30m (default: until revoked)")
    p.add_argument("--direct", action="store_true", help="write to the fleet's Redis, not through the API")
    output(p)
    p.set_defaults(handler=create_token)

    p = verbs.add_parser("list", help="tokens not revoked or expired (never the tokens themselves)")
    output(p)
    p.set_defaults(handler=list_tokens)

    p = verbs.add_parser("revoke", help="revoke a token by its id (from `fleet token list`)")
    p.add_argument("id")
    p.set_defaults(handler=revoke_token)


def login(args: argparse.Namespace) -> int:
    token = os.environ.get("FLEET_TOKEN") or _read_token()
    client = Client(args.url, token, ca_file=args.ca_file)
    who = client.whoami()
    path = save_credentials(client.url, token, args.ca_file)
    print(f"logged in to {client.url} as {who.user} (tenant {who.tenant}, role {who.role}); saved to {path}")
    return 0


def _read_token() -> str:
    if sys.stdin.isatty():
        import getpass

        return getpass.getpass("token: ").strip()
    token = sys.stdin.readline().strip()
    if not token:
        raise SpecError(
            "no token: set FLEET_TOKEN or pass it on standard input (`fleet token create` prints one)"
        )
    return token


def logout(args: argparse.Namespace) -> int:
    path = credentials_path()
    try:
        path.unlink()
    except FileNotFoundError:
        print(f"not logged in ({path} does not exist)")
        return 0
    print(f"removed {path}")
    return 0


def whoami(args: argparse.Namespace) -> int:
    client = Client(args.api_url)
    who = client.whoami()
    if args.output == "json":
        emit_json({**who.model_dump(mode="json"), "url": client.url})
    else:
        print(f"{who.user} (tenant {who.tenant}, role {who.role}) at {client.url}")
    return 0


def create_token(args: argparse.Namespace) -> int:
    expires = None if args.expires is None else duration(args.expires, "--expires")
    if args.direct:
        token, info = _create_direct(args, expires)
    else:
        token, info = Client(args.api_url).create_token(args.user, args.tenant, args.role, expires)
    if args.output == "json":
        emit_json({"token": token, "info": info.model_dump(mode="json")})
    else:
        until = stamp(info.expires_at) if info.expires_at else "revoked"
        print(token)
        print(f"# id {info.id}: {info.user} in tenant {info.tenant}, role {info.role}, valid until {until}. "
              "Shown once: only its hash is kept.", file=sys.stderr)  # fmt: skip
    return 0


def _create_direct(args: argparse.Namespace, expires: float | None) -> tuple[str, TokenInfo]:
    from fleet.config import load_settings
    from fleet.keys import Keys
    from fleet.state import connect
    from fleet.state.tokens import TokenStore

    settings = load_settings(args.config, redis_url=args.redis_url)
    store = TokenStore(connect(settings), Keys(settings.key_prefix))
    return store.create(args.user, args.tenant, Role(args.role), expires_in_s=expires,
                        created_by=f"{_local_user()} (direct)")  # fmt: skip


def _local_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def list_tokens(args: argparse.Namespace) -> int:
    found = Client(args.api_url).tokens()
    if args.output == "json":
        emit_json(found)
        return 0
    rows = [(t.id, t.user, t.tenant, t.role, stamp(t.created_at), _until(t.expires_at), t.created_by or "-")
            for t in found]  # fmt: skip
    table(["ID", "USER", "TENANT", "ROLE", "CREATED", "EXPIRES", "BY"], rows)
    return 0


def _until(at: float | None) -> str:
    return "never" if at is None else stamp(at)


def revoke_token(args: argparse.Namespace) -> int:
    info = Client(args.api_url).revoke_token(args.id)
    print(f"revoked {info.id} ({info.user}, tenant {info.tenant}, role {info.role})")
    return 0
