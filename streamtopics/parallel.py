"""Deterministic multi-threading for the numba kernels: split, run GIL-free, write disjoint slices.

Kernels compiled with ``nogil=True`` release the GIL, so a plain thread pool runs them on
several cores; each thread enters its kernel once and claims ranges of the work with an atomic
counter (``claim_range``, ``ThreadRunner.run_claimed``).  Ranges' outputs are disjoint slices of
preallocated arrays, and anything that is summed is reduced afterwards in a fixed order
(range by range, or over the whole array), so a result never depends on the number of
threads or on which thread ran which range.
"""
from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .jit_cache import njit


def available_cores() -> int:
    """Cores this process may use, at least 1: its CPU affinity, capped by the CPU bandwidth limit
    of its cgroup (a container's ``--cpus``, Kubernetes' CPU limit, systemd's ``CPUQuota=``),
    rounded up.  Without the cap, a pod limited to 2 CPUs on a 64-core node would start 64
    threads, and each parallel phase would wait for threads the quota has descheduled."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit()
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


def cgroup_cpu_limit(root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> float | None:
    """The CPU bandwidth limit (in cores, quota / period) of this process's cgroup: the tightest
    limit on the path from its own cgroup up to the root, cgroup v2 (``cpu.max``) or v1
    (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``).  None when there is none or it cannot be read
    (not Linux, no cgroup file system)."""
    try:
        with open(proc_cgroup) as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    best = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, controllers, path = parts
        if hid == "0" and controllers == "":  # v2, unified hierarchy
            dirs = [root]
        elif "cpu" in controllers.split(","):  # v1, the cpu controller's hierarchy
            dirs = [os.path.join(root, controllers), os.path.join(root, "cpu")]
        else:
            continue
        for base in dirs:
            for level in _cgroup_levels(base, path):
                q = _cpu_quota(level)
                if q is not None and (best is None or q < best):
                    best = q
    return best


def _cgroup_levels(base: str, path: str) -> list[str]:
    """``base/path`` and every ancestor up to ``base`` (inside a container's cgroup namespace the
    path is "/", and the limit is at ``base`` itself)."""
    parts = [p for p in path.strip().split("/") if p and p != ".."]
    return [os.path.join(base, *parts[:i]) for i in range(len(parts), -1, -1)]


def _cpu_quota(directory: str) -> float | None:
    try:
        with open(os.path.join(directory, "cpu.max")) as fh:  # v2: "<quota|max> <period>"
            fields = fh.read().split()
        quota, period = fields[0], fields[1] if len(fields) > 1 else "100000"
    except (OSError, IndexError):
        try:
            with open(os.path.join(directory, "cpu.cfs_quota_us")) as fh:  # v1: -1 = no limit
                quota = fh.read().strip()
            with open(os.path.join(directory, "cpu.cfs_period_us")) as fh:
                period = fh.read().strip()
        except OSError:
            return None
    try:
        q, p = int(quota), int(period)
    except ValueError:  # "max": no limit at this level
        return None
    return q / p if q > 0 and p > 0 else None


def resolve_threads(threads) -> int:
    """``None`` (or 0) -> the available cores; otherwise an integer >= 1."""
    if threads is None or (isinstance(threads, (int, np.integer)) and not isinstance(threads, bool) and threads == 0):
        return available_cores()
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be None, 0 (all available cores) or an integer >= 1 (got {threads!r})")
    return int(threads)


def split_weighted(weights_cum: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Split items 0..n-1 into at most ``parts`` contiguous ranges of about equal weight.

    ``weights_cum`` is the (n+1) cumulative weight (e.g. a CSR pointer). The ranges of
    ``split_bounds``, as (lo, hi) pairs."""
    b = split_bounds(weights_cum, parts).tolist()
    return list(zip(b[:-1], b[1:]))


@intrinsic
def claim(typingctx, counter):
    """``counter[0] += 1`` as one atomic read-modify-write (llvm ``atomicrmw add``, sequentially
    consistent); returns the value before.  Threads inside numba kernels take work items with it
    without the GIL."""
    if not (isinstance(counter, types.Array) and counter.ndim == 1 and counter.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        one = ir.Constant(ir.IntType(64), 1)
        return builder.atomic_rmw("add", builder.gep(ary.data, [ir.Constant(ir.IntType(64), 0)]), one, "seq_cst")

    return types.int64(counter), codegen


@intrinsic
def flag_read(typingctx, flag):
    """``flag[0]`` as an atomic load (llvm ``load atomic``, monotonic): a kernel polling a flag
    another thread sets (``ThreadRunner.aside``'s stop) sees the write, and the compiler cannot
    hoist the read out of the kernel's loop."""
    if not (isinstance(flag, types.Array) and flag.ndim == 1 and flag.dtype == types.int64):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        return builder.load_atomic(builder.gep(ary.data, [ir.Constant(ir.IntType(64), 0)]), "monotonic", 8)

    return types.int64(flag), codegen


@njit(cache=True, nogil=True)
def claim_ranges(counter, n):
    """The next work item below ``n`` (``claim``), or -1 when all are taken."""
    i = claim(counter)
    return i if i < n else -1


@njit(cache=True, nogil=True)
def claim_range(counter, bounds):
    """The next range ``(bounds[i], bounds[i + 1])`` this thread claims, or ``(-1, -1)`` when none
    is left: a kernel run by ``ThreadRunner.run_claimed`` loops ``while True: lo, hi =
    claim_range(counter, bounds); if lo < 0: break``.  Not a generator: a numba generator given
    arrays keeps a reference to each for good (numba issues #1807, #5350), so every kernel call
    leaked its ``counter`` and ``bounds`` (~35 arrays a batch, the daemon's RSS grew ~16 B per
    document without end)."""
    i = claim_ranges(counter, bounds.shape[0] - 1)
    if i < 0:
        return -1, -1
    return bounds[i], bounds[i + 1]


def split_bounds(weights_cum: np.ndarray, parts: int) -> np.ndarray:
    """``split_weighted`` as one int64 array of range bounds (range i: ``b[i]:b[i + 1]``), the
    form kernels that claim their ranges (``claim_range``) read. One numba call: a threaded pass
    splits seven times a batch, and the numpy version cost ~50 us each on the serial path."""
    return _split_bounds(np.asarray(weights_cum), int(parts))


@njit(cache=True, nogil=True)
def _split_bounds(w, parts):
    n = w.shape[0] - 1
    if n <= 0:
        return np.zeros(1, dtype=np.int64)
    parts = max(1, min(parts, n))
    total = w[n] - w[0]
    out = np.empty(parts + 1, dtype=np.int64)
    out[0] = 0
    m = 1
    if parts > 1 and total > 0:
        for i in range(1, parts):  # the first item whose cumulative weight reaches i / parts of the total
            cut = min(np.searchsorted(w, w[0] + total * i / parts), n)
            if cut > out[m - 1]:
                out[m] = cut
                m += 1
    if n > out[m - 1]:
        out[m] = n
        m += 1
    return out[:m].copy()


class ThreadRunner:
    """A lazily started pool of ``threads - 1`` helpers; the calling thread works beside them."""

    def __init__(self, threads=None):
        self.threads = resolve_threads(threads)
        self._pool: ThreadPoolExecutor | None = None
        self._aside: Aside | None = None

    def chunks(self, uneven: bool = True) -> int:
        """How many ranges to cut work into.  Documents differ in cost (their iterations), so
        the ranges are handed out one at a time as threads come free: with 16 per thread the
        last one's straggling costs ~1 % (a greedy schedule of measured 20NG ranges: 96 % of
        the ideal two-thread time with 4 per thread, 98.7 % with 16).  Work of even cost per
        item (``uneven=False``: rows of E[log phi], of the summary, of the update) needs fewer."""
        if self.threads == 1:
            return 1
        return (16 if uneven else 4) * self.threads

    def bounds(self, weights_cum: np.ndarray, uneven: bool = False) -> np.ndarray:
        """``split_bounds`` into ``chunks(uneven)`` ranges."""
        return split_bounds(weights_cum, self.chunks(uneven))

    def row_bounds(self, n: int) -> np.ndarray:
        """Bounds of ``n`` rows of even cost."""
        return self.bounds(np.arange(n + 1))

    def run_claimed(self, fn) -> list:
        """``fn(counter)`` once on every thread, all with the same ``counter`` (a one-element int64
        array at 0).  ``fn`` calls a numba kernel that claims ranges with ``claim_range(counter, bounds)``,
        so the ranges are handed out GIL-free inside
        the kernels; a thread never returns to Python between two of them.  (Returning costs little
        alone, but beside a thread that runs Python, such as the daemon's publisher and read-ahead,
        each return waits for the GIL, up to the 5 ms switch interval, while its core idles.)
        Returns each thread's result in no fixed order, so results must combine order-independently
        (integer counts), and outputs go to the ranges' own slices."""
        counter = np.zeros(1, dtype=np.int64)
        if self.threads == 1:
            return [fn(counter)]
        self._stop_aside()  # the helpers are wanted now: the work aside stops where it is
        helpers = [self.pool().submit(fn, counter) for _ in range(self.threads - 1)]
        out = []
        try:
            out.append(fn(counter))
        finally:
            for f in helpers:  # wait for every helper (and raise its error) before returning
                out.append(f.result())
        return out

    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.threads - 1, thread_name_prefix="streamtopics")
        return self._pool

    def aside(self, fn) -> "Aside | None":
        """Run ``fn(stop)`` on one helper while the calling thread goes on with serial work (Python
        under the GIL, which leaves the other cores idle): ``fn`` calls a GIL-free kernel that does
        work the caller will probably want next, checking ``flag_read(stop)`` between items and returning
        what it has done so far.  None with one thread.  The next ``run_claimed`` stops it first,
        so the helpers are free when the parallel work starts; ``Aside.result`` gives its output."""
        if self.threads == 1:
            return None
        self._stop_aside()
        self._aside = Aside(self.pool(), fn)
        return self._aside

    def _stop_aside(self) -> None:
        if self._aside is not None:
            self._aside.stop()
            self._aside = None

    def close(self) -> None:
        self._stop_aside()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __getstate__(self):  # a pool cannot be copied; a copy starts its own
        return {"threads": self.threads, "_pool": None, "_aside": None}


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


class Aside:
    """Work started on a helper by ``ThreadRunner.aside``: ``stop`` asks it to end and waits for it."""

    def __init__(self, pool: ThreadPoolExecutor, fn):
        self.flag = np.zeros(1, dtype=np.int64)
        self.future = pool.submit(fn, self.flag)

    def stop(self) -> None:
        self.flag[0] = 1
        self.future.exception()  # waits; an error is raised by ``result``

    def result(self):
        """Stop the work and return what it returned (raising its error, if any)."""
        self.stop()
        return self.future.result()
