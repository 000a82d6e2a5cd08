"""Wall time of ``fleet submit --workdir DIR -- true`` on a project-sized directory (``python -m
bench.workdir``): 30,000 files, ~60 MB (source-like text, compressible as code is; a few larger
files), as a fresh ``python -m fleet`` process against a ``fleet api`` and ``redis-server`` of its
own (``bench.cli``'s).

Three cases, each ``--runs`` times: **cold**, a tree this client has never packed and the fleet
does not hold (one file's content differs each run; the client's cache emptied); **unchanged**, the
same tree submitted again (the fleet holds it); **one file changed**, a file rewritten (new content
and mtime) since the last submit. The floor, ``fleet submit -- true`` without a workdir, is timed
too. ``--pythonpath`` names the checkout to time, as in ``bench.cli`` (given twice, the checkouts
alternate). The tree's files are dated an hour back, as a project's files are when it is submitted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.cli import run_once, seeded_fleet

WORDS = ["import", "def", "return", "self", "class", "for", "in", "if", "else", "while", "with", "yield"]
CASES = ("no workdir (floor)", "cold", "unchanged", "one file changed")


def make_tree(root: Path, files: int, total_mb: int, seed: int = 7) -> None:
    """``files`` files of source-like text in nested folders, ``total_mb`` MB in all (gzip packs it
    to about a fifth, as it does code): 0.5% of the files hold a quarter of the bytes (a few data
    files beside the code)."""
    rng = random.Random(seed)
    big = max(1, files // 200)
    big_size = total_mb * 1_000_000 // 4 // big
    small_size = (total_mb * 1_000_000 - big * big_size) // (files - big)
    names = [*WORDS, *("".join(rng.choices("abcdefghijklmnopqrstuvwxyz_", k=7)) for _ in range(2000))]
    line = " ".join(rng.choice(names) for _ in range(200_000)).encode()
    hour_ago = time.time() - 3600
    for i in range(files):
        folder = root / f"pkg{i % 30}" / f"mod{i % 37}"
        folder.mkdir(parents=True, exist_ok=True)
        size = big_size if i < big else small_size
        start = rng.randrange(len(line) - 100_000)
        chunk = (line[start:] + line) * (size // len(line) + 1)
        path = folder / f"f{i}.py"
        path.write_bytes(chunk[:size])
        os.utime(path, (hour_ago, hour_ago))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pythonpath", action="append", help="a fleet checkout to time (default: .)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--files", type=int, default=30_000)
    parser.add_argument("--mb", type=int, default=60, help="the tree's size in MB")
    args = parser.parse_args()
    checkouts = args.pythonpath or [os.getcwd()]
    times: dict[tuple[str, str], list[float]] = {(c, n): [] for c in checkouts for n in CASES}
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="fleet-bench-workdir-")))
        tree, cache = work / "tree", work / "cache"
        make_tree(tree, args.files, args.mb)
        fleets = {c: stack.enter_context(seeded_fleet(c, False)) for c in checkouts}
        marker, changed = tree / "run.txt", next((tree / "pkg0" / "mod0").iterdir())
        for i in range(args.runs):
            for checkout, (env, cwd) in fleets.items():
                env = {**env, "XDG_CACHE_HOME": str(cache / Path(checkout).name)}
                submit = ["-m", "fleet", "submit", "--workdir", str(tree), "--", "true"]
                times[checkout, CASES[0]].append(run_once(["-m", "fleet", "submit", "--", "true"], env, cwd))
                shutil.rmtree(cache, ignore_errors=True)
                marker.write_text(f"{checkout} {i} {time.time()}\n")
                os.utime(marker, (time.time() - 60, time.time() - 60))
                times[checkout, "cold"].append(run_once(submit, env, cwd))
                times[checkout, "unchanged"].append(run_once(submit, env, cwd))
                changed.write_text(f"# changed {checkout} {i} {time.time()}\n")
                times[checkout, "one file changed"].append(run_once(submit, env, cwd))
    print(f"{args.files} files, {args.mb} MB; {args.runs} runs, checkouts alternating")
    print("| checkout | case | mean ms | median ms | min ms | max ms |")
    print("|---|---|---|---|---|---|")
    for (checkout, name), t in times.items():
        print(
            f"| {checkout} | {name} | {statistics.mean(t):.0f} | {statistics.median(t):.0f} | "
            f"{min(t):.0f} | {max(t):.0f} |"
        )


if __name__ == "__main__":
    main()
