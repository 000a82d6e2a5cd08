"""``fleet sim``: the command's options only; the simulator is ``fleet.sim`` (callable from Python)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

import click

from fleet.cli.common import CONTEXT, pairs
from fleet.errors import SpecError

#: the policies fleet.sim.model names (kept here too, so that --help does not import the simulator)
POLICIES = ("fifo", "fair", "elastic-fixed-batch", "elastic")


@click.command(
    context_settings=CONTEXT,
    short_help="simulate a trace under a scheduling policy on a virtual clock (no services needed)",
)
@click.argument("trace")
@click.option(
    "--policy", type=click.Choice(POLICIES), default="fifo", show_default=True, help="scheduling policy"
)
@click.option("--gpus", type=int, default=64, show_default=True, help="GPUs in the fleet")
@click.option("--nodes", type=int, help="nodes they are spread over (default: 4 GPUs each)")
@click.option(
    "--load",
    type=float,
    default=1.0,
    show_default=True,
    help="arrivals compressed this much (1.5: 50% more per hour)",
)
@click.option(
    "--sustain", is_flag=True, help="keep --load's rate for the trace's whole span (it repeats after itself)"
)
@click.option(
    "--until", metavar="DURATION", help="stop the clock there, e.g. 8h (default: when every job ended)"
)
@click.option("--limit", type=int, help="only the trace's first N jobs")
@click.option("--resize-cost", default="30s", show_default=True, help="checkpoint + restart time of a resize")
@click.option("--min-interval", default="2m", show_default=True, help="least time between resizes of a job")
@click.option(
    "--objective",
    type=click.Choice(["completion", "speedup"]),
    default="completion",
    show_default=True,
    help="elastic: what the optimizer maximises (completion: each job's share of its work left a second; "
    "speedup: the live controller's, a power mean of speedups)",
)
@click.option(
    "--model",
    type=click.Choice(["goodput", "throughput"]),
    default="goodput",
    show_default=True,
    help="progress: goodput (samples count at their statistical efficiency at the batch run, from the "
    "profiles' noise scale per epoch, and elastic sizes by it, as Pollux's simulator) or throughput "
    "(every sample counts the same: a larger batch is free, the seed paper's experiment)",
)
@click.option(
    "--service",
    default="0s",
    show_default=True,
    metavar="DURATION",
    help="elastic: GPU-time that halves a job's weight (least attained service first; 0: off), e.g. 1h",
)
@click.option(
    "--accumulate", is_flag=True, help="elastic-fixed-batch: batches reached by gradient accumulation"
)
@click.option(
    "--learn",
    is_flag=True,
    help="elastic: size jobs as profile: learn does (what they ran at; each declares max_batch_per_gpu)",
)
@click.option("--weight", multiple=True, metavar="TENANT=W", help="a tenant's fair-share weight (repeat)")
@click.option(
    "--guarantee",
    multiple=True,
    metavar="TENANT=GPUS",
    help="a tenant's guaranteed GPUs (fair: it preempts others to get them; repeat)",
)
@click.option("--plot", metavar="PNG", help="also draw utilisation, shares and completion times")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
def sim(trace: str, **args: Any) -> int:
    """Run a trace through the controller's own scheduling pass (the elastic policy within tenants'
    limits, the queue, gangs, fair share, preemption) with simulated time: a workload (jobs training
    profiled models) or a Philly trace (jobs running a duration, one tenant per virtual cluster).
    TRACE: a CSV file, or a bundled one: workload-1 .. workload-4, philly. Prints completion times,
    queueing, utilisation, tenants' shares, resizes and preemptions."""
    return _run(trace, args)


def _numbers(values: tuple[str, ...], flag: str, kind: type) -> dict[str, Any]:
    """``TENANT=NUMBER`` values of a repeatable flag (``pairs``, then each value a number)."""
    out = {}
    for name, number in pairs(values, flag).items():
        try:
            out[name] = kind(number)
        except ValueError:
            raise SpecError(f"{flag} {name}={number!r}: use TENANT=NUMBER") from None
    return out


def _run(trace: str, options: dict[str, Any]) -> int:
    from fleet.models import Tenant, parse_duration
    from fleet.sim import run

    args = SimpleNamespace(trace=trace, **options)

    def seconds(text: str | None, flag: str) -> float | None:
        try:
            return parse_duration(text) if text else None
        except ValueError as exc:
            raise SpecError(f"{flag}: {exc}") from None

    tenants: dict[str, Tenant] = {}
    weights = _numbers(args.weight, "--weight", float)
    for name, gpus in _numbers(args.guarantee, "--guarantee", int).items():
        tenants[name] = Tenant(name=name, guaranteed_gpus=gpus)
    try:
        result = run(
            args.trace,
            args.policy,
            gpus=args.gpus,
            nodes=args.nodes,
            load=args.load,
            until=seconds(args.until, "--until"),
            weights=weights,
            tenants=tenants,
            limit=args.limit,
            resize_cost_s=seconds(args.resize_cost, "--resize-cost"),
            min_interval_s=seconds(args.min_interval, "--min-interval"),
            objective=args.objective,
            model=args.model,
            service_s=seconds(args.service, "--service") or 0.0,
            accumulate=args.accumulate,
            sustain=args.sustain,
            learn=args.learn,
        )
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
