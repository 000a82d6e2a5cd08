"""The elastic allocator's dynamic program: a multiple-choice knapsack over jobs x GPUs (each job
takes exactly one of its options), exact, vectorised over GPU counts with numpy; and the max-plus
combination of tenants' tables. Pure."""

from __future__ import annotations

from functools import lru_cache

import numpy as np

#: (gpus, batch, value) of one choice for a job
Option = tuple[int, int, float]


@lru_cache(maxsize=4096)
def _offsets(gs: tuple[int, ...], cap: int) -> tuple[np.ndarray, np.ndarray]:
    """For options of ``gs`` GPUs: index of dp[c - g] for every c (clipped) and where c < g."""
    c = np.arange(cap + 1)[None, :] - np.asarray(gs)[:, None]
    return np.maximum(c, 0), c < 0


def knapsack(opts: list[list[Option]], cap: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """best[c]: the most value with at most c GPUs; picks[j][c]: job j's option there."""
    dp = np.zeros(cap + 1)
    picks = []
    for job_opts in opts:
        where = [i for i, o in enumerate(job_opts) if o[0] <= cap]
        gs = tuple(job_opts[i][0] for i in where)
        values = np.asarray([job_opts[i][2] for i in where])
        index, short = _offsets(gs, cap)
        table = dp[index] + values[:, None]
        table[short] = -np.inf
        k = table.argmax(axis=0)
        dp = table[k, np.arange(cap + 1)]
        picks.append(np.asarray(where)[k])  # positions in the job's list (those over cap left out)
    return dp, picks


def walk(opts: list[list[Option]], picks: list[np.ndarray], cap: int) -> list[Option]:
    """Each job's option in the best plan with at most ``cap`` GPUs, from :func:`knapsack`'s picks."""
    out: list[Option] = []
    c = cap
    for job_opts, pick in zip(reversed(opts), reversed(picks), strict=True):
        g, b, v = job_opts[int(pick[c])]
        out.append((g, b, v))
        c -= g
    return out[::-1]


def combine(total: np.ndarray, best: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Max-plus convolution of the GPUs so far with one tenant's table; per c, the tenant's part."""
    size, cap = len(total), len(best) - 1
    take = np.arange(cap + 1)[:, None]
    index = np.arange(size)[None, :] - take
    table = total[np.maximum(index, 0)] + best[:, None]
    table[index < 0] = -np.inf
    pick = table.argmax(axis=0)
    return table[pick, np.arange(size)], pick
