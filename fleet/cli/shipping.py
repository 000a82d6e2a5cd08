"""``fleet submit --workdir DIR`` on a terminal: what is packed and uploaded, as it happens (a rich
progress bar on standard error), and a line saying what was shipped. Piped or redirected, nothing is
printed: the Client ships the directory as the Python API does."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from fleet.models import JobSpec

if TYPE_CHECKING:
    from fleet.client import Client


def shipped_on_terminal(client: Client, spec: JobSpec) -> JobSpec:
    """``spec`` with its ``workdir`` uploaded and named by digest, told on standard error when that is
    a terminal; ``spec`` as it is otherwise (the submit ships it)."""
    path = spec.workdir
    if not path or path.startswith("sha256:") or not sys.stderr.isatty():
        return spec
    from rich.console import Console
    from rich.filesize import decimal
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"packing {path}", total=None)

        def progress(step: str, done: int, total: int) -> None:
            if step == "upload" and done == 0:
                bar.reset(task, description=f"uploading {path}", total=total)
            bar.update(task, completed=done, total=total)

        shipped = client.ship_workdir(path, progress)
    what = f"workdir {path}: {shipped.files} files, {decimal(shipped.size)}"
    if shipped.packed is None:
        done = "unchanged since it was last packed here, and the fleet holds it"
    elif shipped.uploaded:
        done = f"packed to {decimal(shipped.packed)}, uploaded"
    else:
        done = f"packed to {decimal(shipped.packed)}; the fleet holds it already"
    print(f"{what}; {done} ({shipped.digest[:19]}…)", file=sys.stderr)
    return spec.model_copy(update={"workdir": shipped.digest})
