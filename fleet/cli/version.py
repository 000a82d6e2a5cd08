"""``fleet version``: this client's release, and the API's, the leading controller's and the nodes'."""

from __future__ import annotations

import sys
from typing import Any

import click

from fleet.cli.common import CONTEXT, Globals, output_option, pass_globals
from fleet.cli.output import emit_json, show_view
from fleet.cli.view import Field, View
from fleet.errors import FleetError, NotFound
from fleet.versions import VERSION, shown


@click.command(
    context_settings=CONTEXT,
    short_help="this client's release, and the API's, the controller's and each node's",
)
@output_option
@pass_globals
def version(globals_: Globals, output: str) -> int:
    """This client's release; and, through the API, the API's, the leading controller's and each live
    node's agent's, with a `mixed versions: ...` line when they differ (a fleet part way through an
    upgrade: README, "Upgrading"). `fleet nodes` shows each node's in its VERSION column. Without an
    API it reaches, the client's alone and why, with that error's exit code."""
    found: dict[str, Any] = {"client": VERSION, "api": None, "controller": None, "nodes": {}, "mixed": ""}
    error: FleetError | None = None
    try:
        client = globals_.client()
        try:
            found.update(client.versions().model_dump())
        except NotFound:  # an API without the route: it predates recorded versions
            found["api"] = client.server_version
        except FleetError as exc:  # no token or a bad one: the API still named its release
            found["api"] = client.server_version or None
            error = exc
        finally:
            client.close()
    except FleetError as exc:  # no API configured, or none reachable
        error = exc
    if output == "json":
        emit_json(found)
    else:
        show_view(_view(found))
    if error is not None:
        print(f"fleet: {error}", file=sys.stderr)
        return error.exit_code
    return 0


def _view(found: dict[str, Any]) -> View:
    view = View([Field("client", found["client"])], label_width=12)
    if found["api"] is not None:
        view.add(Field("api", shown(found["api"])))
    if found["controller"] is not None:
        view.add(Field("controller", shown(found["controller"])))
    nodes: dict[str, list[str]] = {}
    for name, release in found["nodes"].items():
        nodes.setdefault(shown(release), []).append(name)
    if nodes:
        view.add(Field("nodes", "; ".join(f"{release} on {len(names)}" for release, names in nodes.items())))
    if found["mixed"]:
        view.add(found["mixed"])
    return view
