"""The loop's heartbeat and how old it may grow before ``/healthz`` calls the loop stuck.

A liveness probe restarts a daemon whose ``/healthz`` fails, so the limit must cover the longest
normal gap between two heartbeats, and no more. The loop beats between batches and while it waits
on the publisher; the gaps it cannot beat in are a batch's decode, local step and update, and a
snapshot write. So the limit is

    max(base, BUSY_FACTOR x the slowest recent batch),   base = max(10 s, 5 x batch.max_wait_ms),

and, until the first batch is done, at least STARTUP_GRACE_S: after a fresh install numba compiles
the kernels inside the first batch (15-60 s measured on 2 cores, more under load), and loading a
large snapshot takes its own time (a 1.6 GB file, K = 1000, ~15 s). The slowest batch decays by
SLOWEST_DECAY per batch, so one slow batch (a snapshot of a big model, a compile) stops counting
after a few hundred normal ones; big batches keep their own limit (a 10 s batch gives 50 s).
Before this, the limit was the base alone: with K = 1000 and batches of 20,000 documents
``/healthz`` failed on 24 of 65 probes during normal work, and for ~15 s of every cold start.
"""
from __future__ import annotations

import time

STARTUP_GRACE_S = 300.0   # until the first batch is done: model load + numba's first compile
BUSY_FACTOR = 5.0         # a gap this many times the slowest recent batch is not normal work
SLOWEST_DECAY = 0.99      # per batch: a one-off slow batch fades after a few hundred normal ones


class Liveness:
    """Heartbeat (``tick``), batch durations (``batch_done``) and the verdict (``check``)."""

    def __init__(self, base_s: float) -> None:
        self.base_s = float(base_s)
        self.beat = time.monotonic()
        self.batches = 0
        self.slowest_s = 0.0

    def tick(self) -> None:
        self.beat = time.monotonic()

    def batch_done(self, seconds: float) -> None:
        """A batch (and whatever the loop did after it before its next beat) took ``seconds``."""
        self.batches += 1
        self.slowest_s = max(float(seconds), self.slowest_s * SLOWEST_DECAY)

    def limit_s(self) -> float:
        lim = max(self.base_s, BUSY_FACTOR * self.slowest_s)
        return lim if self.batches else max(lim, STARTUP_GRACE_S)

    def check(self, finished: bool) -> tuple[bool, dict]:
        age = time.monotonic() - self.beat
        limit = self.limit_s()
        return age < limit and not finished, {"loop_heartbeat_age_s": round(age, 3), "stale_after_s": round(limit, 3),
                                              "batches": self.batches}
