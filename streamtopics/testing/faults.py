"""Fault injection at named points of the daemon's cycle (tests and drills only).

``STREAMTOPICS_FAULT="point:n[:action][,point:n[:action]...]"`` makes the
``n``-th arrival at ``point`` (counted per process) do ``action``:

=============  ================================================================
``kill``       (default) SIGKILL this process at once: a crash at that point
``mid``        start a thread that SIGKILLs the process right away, while the
               caller goes on into the work that follows (a kill *inside* a
               GIL-free numba kernel, say); where exactly it lands is not fixed
``enospc``     raise ``OSError(ENOSPC)`` (disk full)
``erofs``      raise ``OSError(EROFS)`` (read-only file system)
``eacces``     raise ``PermissionError(EACCES)``
``eio``        raise ``OSError(EIO)``
``raise``      raise ``RuntimeError`` (a bug in the called code)
=============  ================================================================

``n`` may be ``n+`` for "the n-th and every later arrival" (a disk that stays
full). Unset (the default), ``hit()`` is one attribute test: no cost in
production. Unknown point names are configuration errors, so a typo cannot
silently test nothing. Before a kill, ``fault: point:n`` is written to stderr
(raw ``os.write``, no buffering) so a harness can tell which point fired.
"""
from __future__ import annotations

import errno
import os
import signal
import threading

__all__ = ["ENV", "POINTS", "FaultInjector", "hit", "install", "injector"]

ENV = "STREAMTOPICS_FAULT"

# Every named point, in the order a batch meets them (docs: where each one sits).
POINTS: dict[str, str] = {
    "startup": "process start, before the snapshot directory is read",
    "model_loaded": "model (or snapshot) loaded, before connecting to Kafka",
    "connected": "Kafka clients built, before the first poll",
    "assigned": "partitions assigned (rebalance callback), after seeking",
    "poll": "top of the loop, before polling for a batch",
    "decode": "a record is being decoded (consumer buffer scan)",
    "batch_received": "a batch was cut, before tokenizing",
    "tokenized": "batch tokenized, before the vocabulary grows",
    "prepared": "batch prepared (vocabulary grown), before the local step",
    "learn": "right before the local step + global update",
    "learned": "model updated, before the offsets move with it",
    "offsets_advanced": "offsets moved with the model, before the predictions are handed over",
    "submitted": "predictions handed to the publisher thread",
    "publish_build": "publisher thread: encoding a batch's messages",
    "publish_sent": "publisher thread: messages sent, before waiting for acknowledgements",
    "publish_acked": "publisher thread: every message acknowledged, before the job completes",
    "collected": "acknowledged batches counted, before the offsets are committed",
    "committed": "offsets committed to the group (async request sent)",
    "snapshot_begin": "a snapshot is due, acknowledgements are in, before writing",
    "snapshot_write": "snapshot temp file created, before its bytes are written",
    "snapshot_mid_write": "half of the snapshot's bytes written to the temp file",
    "snapshot_before_rename": "temp file complete and fsynced, before the atomic rename",
    "snapshot_after_rename": "right after the rename, before the directory fsync",
    "snapshot_written": "snapshot written, before old snapshots are pruned",
    "snapshot_pruned": "old snapshots pruned, before the announcement",
    "housekeeping": "periodic work (metrics, lag, snapshot triggers)",
    "shutdown": "graceful stop begins (after SIGTERM), before the final snapshot",
    "shutdown_commit": "final snapshot written, before the final commit",
}

_ERRORS = {
    "enospc": lambda p: OSError(errno.ENOSPC, f"No space left on device (injected at {p})"),
    "erofs": lambda p: OSError(errno.EROFS, f"Read-only file system (injected at {p})"),
    "eacces": lambda p: PermissionError(errno.EACCES, f"Permission denied (injected at {p})"),
    "eio": lambda p: OSError(errno.EIO, f"Input/output error (injected at {p})"),
    "raise": lambda p: RuntimeError(f"injected fault at {p}"),
}
ACTIONS = ("kill", "mid", *_ERRORS)


class FaultInjector:
    """Parsed ``STREAMTOPICS_FAULT`` rules with per-point arrival counters (thread-safe)."""

    def __init__(self, spec: str | None = None) -> None:
        self.rules: dict[str, list[tuple[int, bool, str]]] = {}
        self.counts: dict[str, int] = {}
        self.fired: list[str] = []
        self._lock = threading.Lock()
        for item in filter(None, (s.strip() for s in (spec or "").split(","))):
            parts = item.split(":")
            if len(parts) not in (2, 3):
                raise ValueError(f"{ENV}: {item!r} is not point:n[:action]")
            point, n, action = parts[0], parts[1], parts[2] if len(parts) == 3 else "kill"
            if point not in POINTS:
                raise ValueError(f"{ENV}: unknown point {point!r} (known: {', '.join(POINTS)})")
            if action not in ACTIONS:
                raise ValueError(f"{ENV}: unknown action {action!r} (known: {', '.join(ACTIONS)})")
            repeat = n.endswith("+")
            try:
                count = int(n.rstrip("+"))
            except ValueError:
                raise ValueError(f"{ENV}: count {n!r} of {point!r} is not an integer") from None
            if count < 1:
                raise ValueError(f"{ENV}: count of {point!r} must be >= 1")
            self.rules.setdefault(point, []).append((count, repeat, action))

    @property
    def active(self) -> bool:
        return bool(self.rules)

    def __call__(self, point: str) -> None:
        rules = self.rules.get(point)
        if not rules:
            return
        with self._lock:
            k = self.counts[point] = self.counts.get(point, 0) + 1
        for count, repeat, action in rules:
            if k == count or (repeat and k > count):
                self._fire(point, k, action)

    def _fire(self, point: str, k: int, action: str) -> None:
        self.fired.append(f"{point}:{k}:{action}")
        if action in ("kill", "mid"):
            try:
                os.write(2, f"fault: {point}:{k}:{action}\n".encode())
            except OSError:
                pass
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGKILL), daemon=True).start()
            return
        raise _ERRORS[action](point)


injector = FaultInjector(os.environ.get(ENV))


def install(spec: str | None) -> FaultInjector:
    """Replace the process-wide injector (tests running the daemon in-process)."""
    global injector
    injector = FaultInjector(spec)
    return injector


def hit(point: str) -> None:
    """Arrive at ``point``: does nothing unless a rule names it."""
    if injector.rules:
        injector(point)
