"""``fleet sim``: argparse glue only; the simulator is ``fleet.sim`` (callable from Python)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from fleet.errors import SpecError

#: fleet.sim.POLICIES, spelt out: building the parser must not import the simulator (numpy), or
#: every command would pay for it
POLICIES = ("fifo", "fair", "elastic-fixed-batch", "elastic")


def register(sub: Any, output: Any) -> None:
    p = sub.add_parser(
        "sim", help="simulate a trace under a scheduling policy on a virtual clock (no services needed)",
        description="Run a trace through the controller's own scheduling code (the queue, gangs, fair "
        "share, preemption, the elastic policy) with simulated time: a workload (jobs training profiled "
        "models) or a Philly trace (jobs running a duration, one tenant per virtual cluster). TRACE: a CSV "
        "file, or a bundled one: workload-1 .. workload-4, philly. Prints completion times, queueing, "
        "utilisation, tenants' shares, resizes and preemptions.",
    )  # fmt: skip
    p.add_argument("trace", metavar="TRACE")
    p.add_argument("--policy", choices=POLICIES, default="fifo", help="scheduling policy (default fifo)")
    p.add_argument("--gpus", type=int, default=64, help="GPUs in the fleet (default 64)")
    p.add_argument("--nodes", type=int, help="nodes they are spread over (default: 4 GPUs each)")
    p.add_argument(
        "--load", type=float, default=1.0, help="arrivals compressed this much (1.5: 50%% more per hour)"
    )
    p.add_argument("--until", help="stop the clock there, e.g. 8h (default: when every job has ended)")
    p.add_argument("--limit", type=int, help="only the trace's first N jobs")
    p.add_argument("--resize-cost", default="30s", help="checkpoint + restart time of a resize (default 30s)")
    p.add_argument("--min-interval", default="2m", help="least time between resizes of a job (default 2m)")
    p.add_argument("--objective", choices=["completion", "speedup"], default="completion",
                   help="elastic: what the optimizer maximises (default completion)")  # fmt: skip
    p.add_argument("--accumulate", action="store_true",
                   help="elastic-fixed-batch: batches reached by gradient accumulation")  # fmt: skip
    p.add_argument(
        "--weight", action="append", default=[], metavar="TENANT=W", help="a tenant's fair-share weight"
    )
    p.add_argument("--guarantee", action="append", default=[], metavar="TENANT=GPUS",
                   help="a tenant's guaranteed GPUs (fair: it preempts others to get them)")  # fmt: skip
    p.add_argument("--plot", metavar="PNG", help="also draw utilisation, shares and completion times")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table", help="output format")
    p.set_defaults(handler=sim)


def _pairs(values: list[str], flag: str, kind: type) -> dict[str, Any]:
    out = {}
    for value in values:
        name, sep, number = value.partition("=")
        try:
            out[name] = kind(number)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise SpecError(f"{flag} {value!r}: use TENANT=NUMBER")
    return out


def sim(args: argparse.Namespace) -> int:
    from fleet.models import Tenant, parse_duration
    from fleet.sim import run

    def seconds(text: str | None, flag: str) -> float | None:
        try:
            return parse_duration(text) if text else None
        except ValueError as exc:
            raise SpecError(f"{flag}: {exc}") from None

    tenants: dict[str, Tenant] = {}
    weights = _pairs(args.weight, "--weight", float)
    for name, gpus in _pairs(args.guarantee, "--guarantee", int).items():
        tenants[name] = Tenant(name=name, guaranteed_gpus=gpus)
    try:
        result = run(
            args.trace, args.policy, gpus=args.gpus, nodes=args.nodes, load=args.load,
            until=seconds(args.until, "--until"), weights=weights, tenants=tenants, limit=args.limit,
            resize_cost_s=seconds(args.resize_cost, "--resize-cost"),
            min_interval_s=seconds(args.min_interval, "--min-interval"), objective=args.objective,
            accumulate=args.accumulate,
        )  # fmt: skip
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if args.plot:
        from fleet.sim.plot import plot

        plot(result, args.plot)
    if args.output == "json":
        json.dump(result.to_dict(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    rows = result.summary()
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")
    if args.plot:
        print(f"{'plot'.ljust(width)}  {args.plot}")
    return 0
