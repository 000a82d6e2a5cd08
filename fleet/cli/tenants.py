"""Teams sharing the fleet: ``fleet tenants``, ``fleet tenant set|delete``."""

from __future__ import annotations

import re
from typing import Any

import click

from fleet.cli.common import CONTEXT, Globals, duration, output_option, pass_globals
from fleet.cli.output import emit_json, show_view
from fleet.cli.view import Table, View
from fleet.models.tenant import normal_user
from fleet.text import ago, guarantee


@click.command(
    context_settings=CONTEXT,
    short_help="each tenant's guarantee, limit, weight, use, fair share and decayed usage",
)
@output_option
@pass_globals
def tenants(globals_: Globals, output: str) -> int:
    """Every tenant with a policy or with jobs: its guarantee, limit and weight, the GPUs its jobs
    hold, the fair share weighted dominant-resource fair share gives it now, and its GPU-hours of
    decayed usage (controller.fair_share_half_life_s), as the leader last published them."""
    found = globals_.client().tenants()
    if output == "json":
        emit_json(found)
        return 0
    rows = [
        (
            s.tenant.name + ("" if s.configured else " (default)"),
            guarantee(s.tenant),
            "-" if s.tenant.max_gpus is None else s.tenant.max_gpus,
            f"{s.tenant.weight:g}",
            s.gpus_used,
            f"{s.fair_share_gpus:.1f}",
            s.jobs_running,
            s.jobs_pending,
            f"{s.usage_gpu_s / 3600:.1f}",
        )
        for s in found
    ]
    headers = ["TENANT", "GUARANTEED", "MAX", "WEIGHT", "USING", "FAIR SHARE", "RUNNING", "PENDING", "GPU-H"]
    view = View([Table(headers, rows)])
    if found:
        view.add(f"(as of {ago(max(s.as_of for s in found))})")
    show_view(view)
    return 0


@click.group(context_settings=CONTEXT, short_help="set or delete a tenant's policy (admins)")
def tenant() -> None:
    """Set or delete a tenant's policy (admins)."""


@tenant.command(
    "set", context_settings=CONTEXT, short_help="create a tenant's policy, or change the fields given"
)
@click.argument("name")
@click.option("--guaranteed-gpus", type=int, help="GPUs it gets first whenever it has work (default 0)")
@click.option("--guaranteed-cpus", type=float, help="CPUs it gets first (queue order only; default 0)")
@click.option(
    "--guaranteed-memory", metavar="SIZE", help="memory it gets first, e.g. 256g (queue order only)"
)
@click.option("--max-gpus", help="most GPUs its jobs hold at once; 'none': no limit (default)")
@click.option("--max-cpus", help="most CPUs its jobs hold at once; 'none': no limit (default)")
@click.option(
    "--max-memory", metavar="SIZE", help="most memory its jobs hold at once, e.g. 512g; 'none': no limit"
)
@click.option(
    "--outputs-quota",
    metavar="SIZE",
    help="most its jobs' kept outputs hold at once, e.g. 50g; 'none': the fleet's outputs_quota_bytes",
)
@click.option("--weight", type=float, help="its part of the GPUs beyond guarantees (default 1)")
@click.option("--webhook", metavar="URL", help="POST here when its jobs end; 'none': no webhook")
@click.option(
    "--webhook-format", type=click.Choice(["json", "slack"]), help="signed JSON (default) or Slack text"
)
@click.option(
    "--webhook-nodes/--no-webhook-nodes", default=None, help="the webhook hears node state changes too"
)
@click.option(
    "--preempt-grace",
    metavar="DURATION",
    help="SIGTERM to SIGKILL when its jobs are preempted (default 120s)",
)
@click.option(
    "--min-run", metavar="DURATION", help="a job runs this long before it may be preempted (default 10m)"
)
@click.option(
    "--allow-user",
    multiple=True,
    metavar="UID:GID",
    help="its jobs may run as this host user (spec `user`; repeat); gid 0 never",
)
@click.option(
    "--disallow-user", multiple=True, metavar="UID:GID", help="take a user off its allow-list (repeat)"
)
@output_option
@pass_globals
def set_tenant(globals_: Globals, /, name: str, output: str, **given: Any) -> int:
    """Create a tenant's policy, or change only the fields given on an existing one. A tenant below
    its guarantee is served first and may preempt tenants above their fair share; beyond the
    guarantees, GPUs are shared by weight; a tenant never holds more than its max. Its jobs run as a
    uid of its own (agent.job_uid_range) unless their spec names a `user` its allow-list holds."""
    client = globals_.client()
    current = next((s.tenant for s in client.tenants() if s.configured and s.tenant.name == name), None)
    policy = current.model_dump(exclude={"name"}) if current else {}
    policy.update(_changes(given))
    if given["allow_user"] or given["disallow_user"]:
        gone = {
            normal_user(u) if re.fullmatch(r"\d{1,10}(:\d{1,10})?", u) else u for u in given["disallow_user"]
        }
        kept = [u for u in policy.get("allowed_users", []) if u not in gone]
        policy["allowed_users"] = kept + list(given["allow_user"])
    tenant = client.set_tenant(name, **policy)
    if output == "json":
        emit_json(tenant)
    else:
        limit = "no limit" if tenant.max_gpus is None else f"max {tenant.max_gpus}"
        users = ", ".join(tenant.allowed_users) or "none"
        print(
            f"tenant {tenant.name}: {guarantee(tenant)} guaranteed, {limit}, weight "
            f"{tenant.weight:g}, preempted with {tenant.preempt_grace_s:g}s grace after "
            f"{tenant.min_run_s:g}s; host users its jobs may name: {users}"
        )
    return 0


def _changes(given: dict[str, Any]) -> dict[str, Any]:
    """The policy fields the flags set ('none' lifts a limit; durations in seconds)."""
    changes: dict[str, Any] = {}
    for field in ("guaranteed_gpus", "guaranteed_cpus", "guaranteed_memory", "weight"):
        if given[field] is not None:
            changes[field] = given[field]
    for field in ("max_gpus", "max_cpus", "max_memory", "outputs_quota"):
        if given[field] is not None:
            changes[field] = None if given[field].lower() == "none" else given[field]
    hook = given["webhook"]
    if hook is not None:
        changes["webhook"] = (
            None if hook.lower() == "none" else {"url": hook, "format": given["webhook_format"] or "json"}
        )
    elif given["webhook_format"] is not None:
        raise click.UsageError("--webhook-format goes with --webhook URL (the URL it formats for)")
    if given["webhook_nodes"] is not None:
        changes["webhook_nodes"] = given["webhook_nodes"]
    if given["preempt_grace"] is not None:
        changes["preempt_grace_s"] = duration(given["preempt_grace"], "--preempt-grace")
    if given["min_run"] is not None:
        changes["min_run_s"] = duration(given["min_run"], "--min-run")
    return changes


@tenant.command(
    "delete", context_settings=CONTEXT, short_help="forget a tenant's policy (its jobs get the default one)"
)
@click.argument("name")
@pass_globals
def delete_tenant(globals_: Globals, name: str) -> int:
    """Forget a tenant's policy (its jobs get the default one)."""
    globals_.client().delete_tenant(name)
    print(f"tenant {name}: policy deleted; its jobs get the default one")
    return 0
