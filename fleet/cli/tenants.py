"""Teams sharing the fleet: ``fleet tenants``, ``fleet tenant set|delete``."""

from __future__ import annotations

import argparse
from typing import Any

from fleet.cli.commands import duration
from fleet.cli.output import ago, emit_json, guarantee, table
from fleet.client import Client


def register(sub: Any, output: Any) -> None:
    p = sub.add_parser(
        "tenants", help="each tenant's guarantee, limit, weight, use, fair share and decayed usage",
        description="Every tenant with a policy or with jobs: its guarantee, limit and weight, the GPUs "
        "its jobs hold, the fair share weighted dominant-resource fair share gives it now, and its "
        "GPU-hours of decayed usage (controller.fair_share_half_life_s), as the leader last published them.",
    )  # fmt: skip
    output(p)
    p.set_defaults(handler=tenants)

    tenant = sub.add_parser("tenant", help="set or delete a tenant's policy (admins)")
    verbs = tenant.add_subparsers(dest="verb", required=True, metavar="VERB")
    p = verbs.add_parser(
        "set", help="create a tenant's policy, or change the fields given",
        description="Create a tenant's policy, or change only the fields given on an existing one. A tenant "
        "below its guarantee is served first and may preempt tenants above their fair share; beyond the "
        "guarantees, GPUs are shared by weight; a tenant never holds more than its max.",
    )  # fmt: skip
    p.add_argument("name")
    p.add_argument("--guaranteed-gpus", type=int, help="GPUs it gets first whenever it has work (default 0)")
    p.add_argument("--guaranteed-cpus", type=float, help="CPUs it gets first (queue order only; default 0)")
    p.add_argument("--guaranteed-memory", help="memory it gets first, e.g. 256g (queue order only)")
    p.add_argument("--max-gpus", help="most GPUs its jobs hold at once; 'none': no limit (default)")
    p.add_argument("--max-cpus", help="most CPUs its jobs hold at once; 'none': no limit (default)")
    p.add_argument("--max-memory", help="most memory its jobs hold at once, e.g. 512g; 'none': no limit")
    p.add_argument("--weight", type=float, help="its part of the GPUs beyond guarantees (default 1)")
    p.add_argument("--preempt-grace", help="SIGTERM to SIGKILL when its jobs are preempted (default 120s)")
    p.add_argument("--min-run", help="a job runs this long before it may be preempted (default 10m)")
    output(p)
    p.set_defaults(handler=set_tenant)

    p = verbs.add_parser("delete", help="forget a tenant's policy (its jobs get the default one)")
    p.add_argument("name")
    p.set_defaults(handler=delete_tenant)


def tenants(args: argparse.Namespace) -> int:
    found = Client(args.api_url).tenants()
    if args.output == "json":
        emit_json(found)
        return 0
    rows = [
        (s.tenant.name + ("" if s.configured else " (default)"), guarantee(s.tenant),
         "-" if s.tenant.max_gpus is None else s.tenant.max_gpus, f"{s.tenant.weight:g}", s.gpus_used,
         f"{s.fair_share_gpus:.1f}", s.jobs_running, s.jobs_pending, f"{s.usage_gpu_s / 3600:.1f}")
        for s in found
    ]  # fmt: skip
    headers = ["TENANT", "GUARANTEED", "MAX", "WEIGHT", "USING", "FAIR SHARE", "RUNNING", "PENDING", "GPU-H"]
    table(headers, rows)
    if found:
        print(f"(as of {ago(max(s.as_of for s in found))})")
    return 0


def set_tenant(args: argparse.Namespace) -> int:
    client = Client(args.api_url)
    current = next((s.tenant for s in client.tenants() if s.configured and s.tenant.name == args.name), None)
    policy = current.model_dump(exclude={"name"}) if current else {}
    for field in ("guaranteed_gpus", "guaranteed_cpus", "guaranteed_memory"):
        if getattr(args, field) is not None:
            policy[field] = getattr(args, field)
    if args.max_gpus is not None:
        policy["max_gpus"] = None if args.max_gpus.lower() == "none" else args.max_gpus
    for field, value in (("max_cpus", args.max_cpus), ("max_memory", args.max_memory)):
        if value is not None:
            policy[field] = None if value.lower() == "none" else value
    if args.weight is not None:
        policy["weight"] = args.weight
    if args.preempt_grace is not None:
        policy["preempt_grace_s"] = duration(args.preempt_grace, "--preempt-grace")
    if args.min_run is not None:
        policy["min_run_s"] = duration(args.min_run, "--min-run")
    tenant = client.set_tenant(args.name, **policy)
    if args.output == "json":
        emit_json(tenant)
    else:
        limit = "no limit" if tenant.max_gpus is None else f"max {tenant.max_gpus}"
        print(f"tenant {tenant.name}: {guarantee(tenant)} guaranteed, {limit}, weight "
              f"{tenant.weight:g}, preempted with {tenant.preempt_grace_s:g}s grace after "
              f"{tenant.min_run_s:g}s")  # fmt: skip
    return 0


def delete_tenant(args: argparse.Namespace) -> int:
    Client(args.api_url).delete_tenant(args.name)
    print(f"tenant {args.name}: policy deleted; its jobs get the default one")
    return 0
