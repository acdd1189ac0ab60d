"""Deterministic multi-threading for the numba kernels: split, run GIL-free, write disjoint slices.

Kernels compiled with ``nogil=True`` release the GIL, so a plain thread pool runs them on
several cores.  Work is split into ranges whose outputs are disjoint slices of
preallocated arrays, and anything that is summed is reduced afterwards in a fixed order
(range by range, or over the whole array), so a result never depends on the number of
threads or on which thread ran which range.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from threading import Lock

import numpy as np


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def resolve_threads(threads) -> int:
    """``None`` (or 0) -> the available cores; otherwise an integer >= 1."""
    if threads is None or (isinstance(threads, (int, np.integer)) and not isinstance(threads, bool) and threads == 0):
        return available_cores()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be None, 0 (all available cores) or an integer >= 1 (got {threads!r})")
    return int(threads)


def split_weighted(weights_cum: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Split items 0..n-1 into at most ``parts`` contiguous ranges of about equal weight.

    ``weights_cum`` is the (n+1) cumulative weight (e.g. a CSR pointer)."""
    n = weights_cum.shape[0] - 1
    if n <= 0:
        return []
    parts = max(1, min(parts, n))
    total = weights_cum[-1] - weights_cum[0]
    if parts == 1 or total <= 0:
        return [(0, n)]
    targets = weights_cum[0] + total * np.arange(1, parts) / parts
    cuts = np.searchsorted(weights_cum, targets, side="left")
    bounds = np.unique(np.concatenate(([0], np.clip(cuts, 0, n), [n])))
    return [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


class ThreadRunner:
    """A lazily started pool of ``threads - 1`` helpers; the calling thread works beside them."""

    def __init__(self, threads=None):
        self.threads = resolve_threads(threads)
        self._pool: ThreadPoolExecutor | None = None

    def chunks(self, uneven: bool = True) -> int:
        """How many ranges to cut work into.  Documents differ in cost (their iterations), so
        the ranges are handed out one at a time as threads come free: with 16 per thread the
        last one's straggling costs ~1 % (a greedy schedule of measured 20NG ranges: 96 % of
        the ideal two-thread time with 4 per thread, 98.7 % with 16).  Work of even cost per
        item (``uneven=False``: rows of E[log phi], of the summary, of the update) needs fewer
        (each range costs a GIL-holding call of a few microseconds)."""
        if self.threads == 1:
            return 1
        return (16 if uneven else 4) * self.threads

    def run(self, fn, ranges):
        """``fn(lo, hi)`` for every range; returns the results in range order.  Each thread takes
        the next range not yet taken (dynamic scheduling), so which thread ran a range varies, and
        ``fn`` must write only its own range's outputs."""
        if self.threads == 1 or len(ranges) <= 1:
            return [fn(lo, hi) for lo, hi in ranges]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads - 1, thread_name_prefix="streamtopics")
        out = [None] * len(ranges)
        todo = iter(enumerate(ranges))
        lock = Lock()

        def work():
            while True:
                with lock:
                    nxt = next(todo, None)
                if nxt is None:
                    return
                i, (lo, hi) = nxt
                out[i] = fn(lo, hi)

        helpers = [self._pool.submit(work) for _ in range(min(self.threads, len(ranges)) - 1)]
        try:
            work()
        finally:
            for f in helpers:  # wait for every helper (and raise its error) before returning
                f.result()
        return out

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __getstate__(self):  # a pool cannot be copied; a copy starts its own
        return {"threads": self.threads, "_pool": None}


def overlapped(items, prepare, compute, overlap: bool) -> list:
    """``compute(prepare(item))`` for every item, results in item order.

    With ``overlap`` the calling thread prepares item i+1 while a helper thread computes item i
    (a two-stage pipeline: worth it when ``prepare`` holds the GIL, e.g. building batches from
    Python strings, and ``compute`` mostly runs GIL-free kernels).  Computations still run one at
    a time and in order, so anything they draw or update sequentially is the same either way;
    ``prepare`` must not change what ``compute`` reads."""
    if not overlap:
        return [compute(prepare(x)) for x in items]
    out = []
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="streamtopics-pipe") as pipe:
        pending = None
        for x in items:
            ready = prepare(x)
            if pending is not None:
                out.append(pending.result())
            pending = pipe.submit(compute, ready)
        if pending is not None:
            out.append(pending.result())
    return out

