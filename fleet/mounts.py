"""The operator's mount allow-list: a job may bind only directories under ``allowed_mounts``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from fleet.errors import SpecError
from fleet.models import Mount


def check_mounts(mounts: Sequence[Mount], allowed: Sequence[Path]) -> list[Mount]:
    """``mounts`` with each source resolved (links followed) and checked against ``allowed``: hand
    these to the runtime, never the sources as given, which could be relinked after the check (a
    link swapped while an image is pulled)."""
    roots = [Path(a).resolve() for a in allowed]
    resolved = []
    for i, mount in enumerate(mounts):
        source = Path(mount.source).resolve()
        if not any(source == root or source.is_relative_to(root) for root in roots):
            hint = ", ".join(str(r) for r in roots) or "none configured"
            raise SpecError(
                f"mounts.{i}.source: {mount.source} is outside the operator's allowed_mounts ({hint}); "
                "ask an operator to add it to allowed_mounts in fleet.toml"
            )
        resolved.append(mount.model_copy(update={"source": str(source)}))
    return resolved
