"""Plots of simulations (matplotlib, PNG): one run's utilisation, queue and tenants' shares over
time and its completion-time distribution; several runs side by side."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleet.errors import SpecError
from fleet.sim.metrics import SimResult

#: tenants drawn apart in a share plot; the rest are summed as "others"
TOP_TENANTS = 8


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:  # pragma: no cover - the dev install has it
        raise SpecError("--plot needs matplotlib: pip install 'fleet[sim]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _hours(series: Mapping[str, Any]) -> tuple[list[float], float]:
    """Bin starts in hours (or days for long runs) and the unit's size in seconds."""
    t = series.get("t", [])
    unit = 86400.0 if t and t[-1] > 4 * 86400 else 3600.0
    return [x / unit for x in t], unit


def plot(result: SimResult, path: str | Path) -> Path:
    """One run: GPU utilisation and jobs waiting, each tenant's share of the fleet, and the
    distribution of completion times."""
    plt = _pyplot()
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(10, 9.5))
    x, unit = _hours(result.series)
    label = "days" if unit == 86400 else "hours"
    top.step(x, [100 * u for u in result.series.get("utilisation", [])], where="post", color="tab:blue")
    top.set_ylabel("GPUs busy (%)", color="tab:blue")
    top.set_ylim(0, 105)
    waiting = top.twinx()
    waiting.step(x, result.series.get("queued", []), where="post", color="tab:red", alpha=0.7)
    waiting.set_ylabel("jobs waiting", color="tab:red")
    top.set_title(f"{result.trace or 'trace'}: {result.policy} on {result.gpus} GPUs, load x{result.load:g}")
    top.set_xlabel(label)

    tenants = result.series.get("tenants", {})
    ranked = sorted(tenants, key=lambda t: -result.tenant_share.get(t, 0.0))
    shown = ranked[:TOP_TENANTS]
    layers = [[100 * v for v in tenants[t]] for t in shown]
    if len(ranked) > TOP_TENANTS:
        rest = [sum(tenants[t][i] for t in ranked[TOP_TENANTS:]) * 100 for i in range(len(x))]
        layers.append(rest)
        shown = [*shown, "others"]
    if layers:
        middle.stackplot(x, layers, labels=shown, step="post")
        middle.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    middle.set_ylabel("share of the fleet's GPUs (%)")
    middle.set_ylim(0, 105)
    middle.set_xlabel(label)

    jct = sorted(result.jct_values)
    if jct:
        bottom.plot([j / 3600 for j in jct], [100 * (i + 1) / len(jct) for i in range(len(jct))])
        bottom.set_xscale("log")
    bottom.set_xlabel("job completion time (hours, log)")
    bottom.set_ylabel("jobs completed (%)")
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def compare(results: Mapping[str, Sequence[SimResult]], path: str | Path, title: str = "") -> Path:
    """Several policies (``results``: policy -> one result per workload or load, in the same
    order for each): average completion time per run, and jobs completed over time of the first."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    policies = list(results)
    runs = max(len(v) for v in results.values())
    width = 0.8 / max(len(policies), 1)
    for k, policy in enumerate(policies):
        values = [r.jct.mean / 3600 if r.jct.mean is not None else 0.0 for r in results[policy]]
        left.bar([i + k * width for i in range(len(values))], values, width, label=policy)
    labels = [f"{r.trace.replace('workload-', 'w')} x{r.load:g}" for r in next(iter(results.values()))]
    left.set_xticks(
        [i + width * (len(policies) - 1) / 2 for i in range(runs)], labels, rotation=45, fontsize=7
    )
    left.set_ylabel("average JCT (hours)")
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize=7)
    for policy in policies:
        r = results[policy][-1]
        ends = sorted(r.jct_ends)
        right.step([e / 3600 for e in ends], range(1, len(ends) + 1), where="post", label=policy)
    last = next(iter(results.values()))[-1]
    right.set_title(f"{last.trace} x{last.load:g}: jobs completed", fontsize=9)
    right.set_xlabel("hours from the first arrival")
    right.axvline(8, color="grey", linestyle=":", linewidth=1)
    right.legend(fontsize=7)
    right.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out
