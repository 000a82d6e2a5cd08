"""Summarise ``py-spy record --format raw --function`` output: where a process spends its samples.

Each raw line is ``root;caller;...;leaf COUNT``. A function's *inclusive* share counts every
sample with it anywhere on the stack (once per sample), its *self* share only those where it is
the leaf. The leaf table folds comprehensions, generator expressions and lambdas into the function
that defines them: on Python 3.11 py-spy sometimes loses the frame between a comprehension and its
caller's caller, so inclusive shares can miss them, but the leaf is always right.
Run: ``python -m bench.profile RAW [--top 25]``.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_NESTED = re.compile(r"\.<locals>\.<(listcomp|dictcomp|setcomp|genexpr|lambda)>")
_SITE = re.compile(r".*/(site-packages|lib/python3\.\d+)/")
#: frames on (nearly) every stack that say nothing about where the time goes
WRAPPERS = (
    "<module> ",
    "_run_code ",
    "_run_module_as_main ",
    "main (bench/",
    "Thread.run ",
    "Thread._bootstrap",
    "translated.<locals>.wrapper ",
    "Retry.call_with_retry ",
    "StepHealth.guard ",
)


def frame(text: str) -> str:
    """``fn (path:line)`` -> ``fn (short/path)``: fleet's own path or the library's module path."""
    name, _, where = text.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    path = _SITE.sub("", path)
    if "/fleet/" in path:
        path = "fleet/" + path.rsplit("/fleet/", 1)[1]
    return f"{name} ({path})"


def summarise(raw: str, top: int = 25) -> str:
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame(f) for f in stack.split(";")]
        total += int(count)
        leaf[_NESTED.sub("", frames[-1])] += int(count)
        for name in set(frames):
            inclusive[name] += int(count)
    if not total:
        return "no samples (the process was idle, or py-spy could not read it)\n"
    shown = [(name, n) for name, n in inclusive.most_common() if not name.startswith(WRAPPERS)][:top]
    rows = [f"| {name} | {100 * n / total:.1f} % | {100 * leaf[name] / total:.1f} % |" for name, n in shown]
    head = f"{total} samples while busy\n\n| function | inclusive | self |\n|---|---|---|\n"
    selfs = [f"| {name} | {100 * n / total:.1f} % |" for name, n in leaf.most_common(top // 2)]
    return (
        head
        + "\n".join(rows)
        + "\n\n| leaf function (comprehensions folded in) | self |\n|---|---|\n"
        + "\n".join(selfs)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("raw", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    print(summarise(args.raw.read_text(), args.top))


if __name__ == "__main__":
    main()
