"""What is free where, indexed so a placement costs a lookup, not a scan of every node.

Built per pass from the node views (nodes x GPUs, cheap); nodes are bucketed by how many GPUs
matching a constraint class (model substring, minimum memory) they have free, so best fit is the
first bucket with enough GPUs. Placements update the buckets as they go.

A multi-node job (a gang) is split into equal members (``split``) and placed whole or not at all:
every member on its own node, best fit each, in one step of the pass, so no pass ever leaves part
of a gang placed and two gangs can never each hold part of what the other needs. A gang that
does not fit reserves as many nodes as it has members, the ones closest to fitting, so a stream of
smaller jobs cannot starve it.
"""

from __future__ import annotations

import bisect
import dataclasses

from fleet.scheduler.feasible import (
    capacity_reason,
    constraint_text,
    fits_resources,
    free_reason,
    gpu_matches,
    matching,
    node_reason,
    short_of,
)
from fleet.scheduler.snapshot import GpuSlot, NodeView, PendingJob, Placement

ConstraintClass = tuple[str | None, int | None]
#: how a waiting reason starts when no registered node, in any state, could hold the job even empty
#: (its healthy GPUs counted): ``fleet jobs`` shows it, and the job waits for a node not there yet
NEVER = "fits no registered node: "


class Capacity:
    def __init__(self, nodes: tuple[NodeView, ...] | list[NodeView]) -> None:
        self.nodes = {n.name: n for n in nodes}
        #: free GPUs per schedulable node, lowest index first
        self.free: dict[str, list[GpuSlot]] = {
            n.name: sorted((g for g in n.gpus if g.free), key=lambda g: g.index)
            for n in nodes
            if n.schedulable
        }
        self.cpus = {n.name: n.cpus - n.used_cpus for n in nodes}
        self.memory = {n.name: n.memory - n.used_memory for n in nodes}
        #: nodes kept for a higher-ranked GPU job that could not be placed yet
        self.reserved: set[str] = set()
        self._classes: dict[ConstraintClass, dict[int, list[str]]] = {}
        #: per constraint class: each schedulable node's free matching GPUs (kept with the buckets),
        #: and each node's healthy matching GPUs, free or not (fixed for the pass)
        self._free_counts: dict[ConstraintClass, dict[str, int]] = {}
        self._totals: dict[ConstraintClass, dict[str, int]] = {}
        self._largest: dict[ConstraintClass, int] = {}
        #: per ask (GPUs, model, GPU memory, CPUs, memory): the nodes that could ever hold it, and
        #: why the others cannot (fixed for the pass)
        self._static: dict[tuple[object, ...], tuple[list[str], frozenset[str], frozenset[str]]] = {}
        self._names = sorted(self.nodes)
        #: per ask: how many nodes could ever hold it (see :meth:`_could_ever`)
        self._ever: dict[tuple[object, ...], int] = {}

    # -- gangs ------------------------------------------------------------------------

    def split(self, job: PendingJob) -> tuple[int, int]:
        """(members, GPUs per member). As the user pinned it (``nodes`` or ``gpus_per_node``); else
        one node when some node has that many matching GPUs, else the fewest equal shares that fit
        the largest matching node (12 GPUs on 8-GPU nodes: 2 x 6; on 4-GPU nodes: 3 x 4), which
        leaves the rest of each node to smaller jobs (7 GPUs there: 7 x 1; pin ``nodes`` to choose).
        A job asking for GPUs no node has stays one member: it waits for such a node."""
        if job.nodes:
            return job.nodes, job.gpus // job.nodes
        if job.gpus_per_node:
            return job.gpus // job.gpus_per_node, job.gpus_per_node
        return even_split(job.gpus, self.largest(job))

    def largest(self, job: PendingJob) -> int:
        """The most matching healthy GPUs one node has, free or not (down or cordoned nodes too:
        they are the fleet's shape, and come back)."""
        key = (job.gpu_model, job.min_gpu_memory)
        found = self._largest.get(key)
        if found is None:
            found = self._largest[key] = max(self._total(job).values(), default=0)
        return found

    def _total(self, job: PendingJob) -> dict[str, int]:
        key = (job.gpu_model, job.min_gpu_memory)
        if key not in self._totals:
            self._totals[key] = {n.name: len(matching(job, n)) for n in self.nodes.values()}
        return self._totals[key]

    @staticmethod
    def member(job: PendingJob, per_node: int) -> PendingJob:
        """What one member of ``job`` asks of its node."""
        if not job.nodes and not job.gpus_per_node and per_node == job.gpus:
            return job
        return dataclasses.replace(job, gpus=per_node, nodes=0, gpus_per_node=0)

    # -- index ------------------------------------------------------------------------

    def _index(self, job: PendingJob) -> dict[int, list[str]]:
        key = (job.gpu_model, job.min_gpu_memory)
        if key not in self._classes:
            buckets: dict[int, list[str]] = {}
            counts = {
                name: sum(1 for g in self.free[name] if gpu_matches(job, g)) for name in sorted(self.free)
            }
            for name, count in counts.items():
                buckets.setdefault(count, []).append(name)
            self._classes[key], self._free_counts[key] = buckets, counts
        return self._classes[key]

    def _reindex(self, name: str, before: list[GpuSlot]) -> None:
        """Move ``name`` between buckets of every built class after its free GPUs changed."""
        for (model, min_memory), buckets in self._classes.items():
            probe = PendingJob("", 0, 0, 0, model, min_memory)
            old = sum(1 for g in before if gpu_matches(probe, g))
            new = sum(1 for g in self.free[name] if gpu_matches(probe, g))
            if old != new:
                buckets[old].remove(name)
                bisect.insort(buckets.setdefault(new, []), name)
                self._free_counts[(model, min_memory)][name] = new

    # -- placing ----------------------------------------------------------------------

    def place(self, job: PendingJob) -> list[Placement] | None:
        """Every member of ``job`` placed (one for a single-node job, rank 0 first), or None and
        nothing taken. Best fit: the nodes with the fewest matching free GPUs that still fit,
        ties by name."""
        members, per_node = self.split(job)
        member = self.member(job, per_node)
        nodes = self._fitting(member, members)
        if len(nodes) < members:
            return None
        return [self._take(member, name, rank, members) for rank, name in enumerate(nodes)]

    def _fitting(self, member: PendingJob, wanted: int) -> list[str]:
        """Up to ``wanted`` distinct nodes that fit ``member`` now, best fit first; for a gang, the
        first group (rack) to hold all its members, else the best fit across groups."""
        found: list[str] = []
        groups: dict[str, list[str]] = {}
        buckets = self._index(member)
        for count in sorted(k for k in buckets if k >= member.gpus):
            for name in buckets[count]:
                if member.gpus and name in self.reserved:
                    continue
                if fits_resources(member, self.nodes[name], self.cpus[name], self.memory[name]):
                    found.append(name)
                    if wanted == 1:
                        return found
                    group = self.nodes[name].group
                    if group and len(same := groups.setdefault(group, [])) < wanted:
                        same.append(name)
                        if len(same) == wanted:
                            return same
        return found[:wanted]

    def _take(self, member: PendingJob, name: str, rank: int = 0, members: int = 1) -> Placement:
        before = self.free[name]
        chosen = [g for g in before if gpu_matches(member, g)][: member.gpus]
        self.free[name] = [g for g in before if g not in chosen]
        self.cpus[name] -= member.cpus
        self.memory[name] -= member.memory
        if chosen:
            self._reindex(name, before)
        gpus = tuple(g.uuid for g in chosen)
        return Placement(member.id, name, gpus, member.cpus, member.memory, rank, members)

    # -- explaining -------------------------------------------------------------------

    def explain(self, job: PendingJob) -> tuple[str, list[str]]:
        """Why ``job`` fits nowhere now, and the nodes that could take it (each one member of a
        gang) once work ends there."""
        members, per_node = self.split(job)
        member = self.member(job, per_node)
        why, later = self._explain(member)
        if members > 1 and len(later) < members:  # it cannot fit even empty: what the others lack
            why = _gang_summary(members, member, len(later), 0, self._lacking(member, set(later)))
        elif members > 1:
            why = _gang_summary(members, member, len(later), len(self._fitting(member, members)), "")
        if self.nodes and self._could_ever(member) < members:
            why = NEVER + why
        return why, later

    def _could_ever(self, member: PendingJob) -> int:
        """How many registered nodes, in any state, could hold ``member`` were they empty."""
        ask = (member.gpus, member.gpu_model, member.min_gpu_memory, member.cpus, member.memory)
        if ask not in self._ever:
            total = self._total(member)
            self._ever[ask] = sum(
                capacity_reason(member, node, total[name]) is None for name, node in self.nodes.items()
            )
        return self._ever[ask]

    def _lacking(self, member: PendingJob, could: set[str]) -> str:
        """Why the nodes outside ``could`` can never hold ``member``: each named when few, else what
        they lack, without counts."""
        reasons = []
        for name in sorted(set(self.nodes) - could):
            node = self.nodes[name]
            total = self._total(member)[name]
            reasons.append((name, node_reason(node) or capacity_reason(member, node, total) or ""))
        if len(reasons) <= 3:
            return "; ".join(f"{name}: {why}" for name, why in reasons)
        return "the others: " + ", ".join(sorted({why for _, why in reasons}))

    def _explain(self, job: PendingJob) -> tuple[str, list[str]]:
        if len(self._names) > 3:
            return self._categories(job)
        reasons: list[tuple[str, str, str]] = []  # (node, detail, category)
        later = []
        total = self._total(job)
        self._index(job)
        free_counts = self._free_counts[(job.gpu_model, job.min_gpu_memory)]
        for name in self._names:
            node = self.nodes[name]
            why = node_reason(node) or capacity_reason(job, node, total[name])
            if why is not None:
                reasons.append((name, why, why))
                continue
            later.append(name)
            if job.gpus and name in self.reserved:
                reasons.append((name, "reserved for a higher-ranked job", "reserved for a higher-ranked job"))
            else:
                free = free_counts.get(name, 0)
                detail = free_reason(job, node, free, total[name], self.cpus[name], self.memory[name])
                reasons.append((name, detail, _busy_category(detail)))
        return _summary(job, reasons), later

    def _categories(self, job: PendingJob) -> tuple[str, list[str]]:
        """``_explain`` for more than three nodes, where the summary names only what the nodes lack:
        which nodes could ever hold ``job`` is fixed for the pass (kept per ask), and what the
        others lack now is found in the buckets of free GPUs, not by visiting every node."""
        ask = (job.gpus, job.gpu_model, job.min_gpu_memory, job.cpus, job.memory)
        static = self._static.get(ask)
        if static is None:
            total, later, fixed = self._total(job), [], set()
            for name in self._names:
                node = self.nodes[name]
                why = node_reason(node) or capacity_reason(job, node, total[name])
                if why is None:
                    later.append(name)
                else:
                    fixed.add(why)
            static = self._static[ask] = (later, frozenset(later), frozenset(fixed))
        later, could, categories = static[0], static[1], set(static[2])
        busy = could
        if job.gpus and not self.reserved.isdisjoint(could):
            categories.add("reserved for a higher-ranked job")
            busy = could - self.reserved
        buckets = self._index(job)
        for count, names in buckets.items():
            if count < job.gpus:
                if "busy (not enough free GPUs)" not in categories and not busy.isdisjoint(names):
                    categories.add("busy (not enough free GPUs)")
                continue
            for name in names:  # enough GPUs free: CPUs or memory are short
                if name in busy:
                    node = self.nodes[name]
                    short = short_of(job, node, self.cpus[name], self.memory[name]) or "memory"
                    categories.add(f"busy (not enough free {short})")
        need = f"needs {job.gpus} GPU{'s' if job.gpus != 1 else ''}{constraint_text(job)}"
        return f"{need}; on the {len(self._names)} nodes: " + ", ".join(sorted(categories)), later

    def reserve_for(self, job: PendingJob, later: list[str]) -> None:
        """Keep the nodes closest to fitting ``job`` (one per member) from lower-ranked GPU jobs;
        none for a gang the fleet could not hold even empty (it would keep nodes for nothing)."""
        members, per_node = self.split(job)
        if not job.gpus or len(later) < members:
            return
        member = self.member(job, per_node)
        buckets = self._index(member)
        could = set(later)
        closest: list[str] = []  # the most free matching GPUs first, ties by name, last first
        for count in sorted(buckets, reverse=True):
            closest.extend(name for name in reversed(buckets[count]) if name in could)
            if len(closest) >= members:
                break
        self.reserved.update(closest[:members])

    def withhold(self, gpus: set[str]) -> None:
        """Take these GPUs out of the pass (freed for a job that preempted others, which is tried
        before anyone else)."""
        if not gpus:
            return
        for name, before in list(self.free.items()):
            kept = [g for g in before if g.uuid not in gpus]
            if len(kept) != len(before):
                self.free[name] = kept
                self._reindex(name, before)


def even_split(gpus: int, largest: int) -> tuple[int, int]:
    """(members, GPUs per member) of a job of ``gpus`` GPUs on nodes of at most ``largest`` matching
    GPUs, when the user pinned neither: one node if it fits, else the fewest equal shares that fit one
    node each; (1, gpus) when none does (it waits for a bigger node)."""
    if gpus <= largest:
        return 1, gpus
    for members in range(2, gpus + 1):
        if gpus % members == 0 and gpus // members <= largest:
            return members, gpus // members
    return 1, gpus


def _busy_category(detail: str) -> str:
    """What a busy node lacks, without counts: a large fleet's summary must not change with every
    job that starts or ends, or every waiting job's reason would be rewritten every pass."""
    lacking = "GPUs" if "GPUs free" in detail else "CPUs" if "CPUs free" in detail else "memory"
    return f"busy (not enough free {lacking})"


def _gang_summary(members: int, member: PendingJob, could: int, free_now: int, detail: str) -> str:
    """ "needs 3 nodes with 4 free GPUs each (...); 2 have them": what is missing, in the unit a user
    resizes by. Counts change as jobs come and go, so a gang's reason is rewritten when they do
    (gangs are few)."""
    each = f"{member.gpus} free GPU{'s' if member.gpus != 1 else ''} each" if member.gpus else "room each"
    need = f"needs {members} nodes with {each}{constraint_text(member)}"
    if could < members:
        lacking = f" ({detail})" if detail else ""
        return f"{need}; only {could} node{'s' if could != 1 else ''} could ever hold a member{lacking}"
    return f"{need}; {free_now} {'has' if free_now == 1 else 'have'} them now"


def _summary(job: PendingJob, reasons: list[tuple[str, str, str]]) -> str:
    need = f"needs {job.gpus} GPU{'s' if job.gpus != 1 else ''}{constraint_text(job)}"
    if not reasons:
        return f"{need}; no nodes registered"
    if len(reasons) <= 3:
        return f"{need}; " + "; ".join(f"{name}: {detail}" for name, detail, _ in reasons)
    # what the nodes lack, without counts: how many nodes are busy changes with every job that
    # starts or ends, and every waiting job of the shape would have its reason rewritten
    categories = sorted({category for _, _, category in reasons})
    return f"{need}; on the {len(reasons)} nodes: " + ", ".join(categories)
