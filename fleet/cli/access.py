"""Who you are to the fleet: ``fleet login``, ``fleet logout``, ``fleet whoami``, ``fleet token ...``."""

from __future__ import annotations

import os
import sys

import click

from fleet.cli.common import CONTEXT, Globals, duration, output_option, pass_globals
from fleet.cli.output import emit_json, show_view
from fleet.cli.view import Table, View
from fleet.client import Client, credentials_path, save_credentials
from fleet.errors import SpecError
from fleet.models import Role, TokenInfo
from fleet.text import stamp


@click.command(
    context_settings=CONTEXT, short_help="save the API's URL and your token (0600 credentials file)"
)
@click.argument("url")
@click.option(
    "--ca-file", metavar="PEM", help="CA bundle that signed the API's certificate (a fleet's own CA)"
)
def login(url: str, ca_file: str | None) -> int:
    """Check the token against the API at URL (e.g. https://fleet.example.org:8080), then save URL
    and token to the credentials file ($FLEET_CREDENTIALS, default ~/.config/fleet/credentials.json,
    mode 0600). The token is read from $FLEET_TOKEN, else from standard input (a prompt on a
    terminal): never from argv, which every user of the machine can read."""
    token = os.environ.get("FLEET_TOKEN") or _read_token()
    client = Client(url, token, ca_file=ca_file)
    who = client.whoami()
    path = save_credentials(client.url, token, ca_file)
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


@click.command(context_settings=CONTEXT, short_help="forget the saved credentials")
def logout() -> int:
    """Forget the saved credentials."""
    path = credentials_path()
    try:
        path.unlink()
    except FileNotFoundError:
        print(f"not logged in ({path} does not exist)")
        return 0
    print(f"removed {path}")
    return 0


@click.command(context_settings=CONTEXT, short_help="the user, tenant and role of your token")
@output_option
@pass_globals
def whoami(globals_: Globals, output: str) -> int:
    """The user, tenant and role of your token, and the API it is for."""
    client = globals_.client()
    who = client.whoami()
    if output == "json":
        emit_json({**who.model_dump(mode="json"), "url": client.url})
    else:
        print(f"{who.user} (tenant {who.tenant}, role {who.role}) at {client.url}")
    return 0


@click.group(context_settings=CONTEXT, short_help="create, list and revoke API tokens (admins)")
def token() -> None:
    """Create, list and revoke API tokens (admins)."""


@token.command(
    "create", context_settings=CONTEXT, short_help="issue a token (printed once: only its hash is kept)"
)
@click.option("--user", required=True, help="who it is for")
@click.option(
    "--tenant",
    required=True,
    help="the tenant whose jobs it may submit and see: `default`, or one `fleet tenant set` created",
)
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    default="user",
    show_default=True,
    help="user, operator or admin",
)
@click.option("--expires", metavar="DURATION", help="lifetime, e.g. 90d, 12h, 30m (default: until revoked)")
@click.option("--direct", is_flag=True, help="write to the fleet's Redis, not through the API")
@output_option
@pass_globals
def create_token(
    globals_: Globals, user: str, tenant: str, role: str, expires: str | None, direct: bool, output: str
) -> int:
    """Issue a token for USER in TENANT with ROLE: user (its tenant's jobs), operator (also
    cordon/drain, every tenant's jobs), admin (also tokens and tenants). Through the API with an
    admin token; on a server that holds the Redis credentials (fleet.toml / FLEET_REDIS_*), --direct
    writes it to Redis itself: how the first admin token is made (`--tenant default --role admin
    --direct`: `default` is the one tenant that exists before an admin creates others). TENANT must
    exist: `default`, or one created with `fleet tenant set TENANT`."""
    expires_s = None if expires is None else duration(expires, "--expires")
    if direct:
        token, info = _create_direct(globals_, user, tenant, role, expires_s)
    else:
        token, info = globals_.client().create_token(user, tenant, role, expires_s)
    if output == "json":
        emit_json({"token": token, "info": info.model_dump(mode="json")})
    else:
        until = stamp(info.expires_at) if info.expires_at else "revoked"
        print(token)
        print(
            f"# id {info.id}: {info.user} in tenant {info.tenant}, role {info.role}, valid until {until}. "
            "Shown once: only its hash is kept.",
            file=sys.stderr,
        )
    return 0


def _create_direct(
    globals_: Globals, user: str, tenant: str, role: str, expires: float | None
) -> tuple[str, TokenInfo]:
    from fleet.config import load_settings
    from fleet.state import Stores

    settings = load_settings(globals_.config, redis_url=globals_.redis_url)
    stores = Stores.open(settings)
    stores.tenants.check(tenant)
    return stores.tokens.create(
        user, tenant, Role(role), expires_in_s=expires, created_by=f"{_local_user()} (direct)"
    )


def _local_user() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


@token.command(
    "list", context_settings=CONTEXT, short_help="tokens not revoked or expired (never the tokens themselves)"
)
@output_option
@pass_globals
def list_tokens(globals_: Globals, output: str) -> int:
    """Tokens not revoked or expired (never the tokens themselves)."""
    found = globals_.client().tokens()
    if output == "json":
        emit_json(found)
        return 0
    rows = [
        (t.id, t.user, t.tenant, t.role, stamp(t.created_at), _until(t.expires_at), t.created_by or "-")
        for t in found
    ]
    show_view(View([Table(["ID", "USER", "TENANT", "ROLE", "CREATED", "EXPIRES", "BY"], rows)]))
    return 0


def _until(at: float | None) -> str:
    return "never" if at is None else stamp(at)


@token.command(
    "revoke", context_settings=CONTEXT, short_help="revoke a token by its id (from fleet token list)"
)
@click.argument("token_id", metavar="ID")
@pass_globals
def revoke_token(globals_: Globals, token_id: str) -> int:
    """Revoke a token by its id (from `fleet token list`)."""
    info = globals_.client().revoke_token(token_id)
    print(f"revoked {info.id} ({info.user}, tenant {info.tenant}, role {info.role})")
    return 0
