"""The checkpointer: when to snapshot, writing the model with its ledger, what the group may be told.

``Checkpointer`` owns the snapshot store (file naming and newest-valid loading live in
``checkpoint.SnapshotStore``), the directory lock (one writer per snapshot directory), the
lineage (id and sequence of this model's snapshots), the commit gate (the group's offsets only
ever come from a written snapshot) and the cadence (after the first learned batch, every N
batches, every S seconds, at shutdown; a failed write retries at the next trigger, not after
every batch). Ordered steps of one checkpoint (docs/exactly-once.md):

1. the daemon waits until every learned batch's predictions are acknowledged;
2. ``write``: model + ledger + lineage in one atomic file (``snapshot.write_snapshot``);
3. ``gate.durable(offsets)``: only now may the group be told these offsets (``commit``);
4. ``prune``: older files beyond ``snapshot.keep``.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ..model import load_snapshot
from ..snapshot import SnapshotWriteError
from .checkpoint import CommitGate, DirectoryLock, Lineage, SnapshotStore
from .ledger import OffsetLedger

__all__ = ["Checkpointer"]

log = logging.getLogger("streamtopics.daemon")


class Checkpointer:
    """Snapshot cadence, store, lock, lineage and commit gate of one daemon."""

    def __init__(self, snapshot_cfg, instance: str, telemetry, point: Callable[[str], None]) -> None:
        self.cfg = snapshot_cfg
        self.telemetry = telemetry
        self._point = point
        self.store = SnapshotStore(snapshot_cfg.dir, snapshot_cfg.keep, on_load_failed=telemetry.on_snapshot_load_failed)
        self.lock = DirectoryLock(snapshot_cfg.dir, instance)
        self.gate = CommitGate()
        self.lineage = Lineage.new()
        self.last_snapshot: Path | None = None
        self.known: set[str] = set()  # snapshot files this process wrote, loaded or rejected
        self.dirty = False            # the state differs from the newest snapshot
        self.batches_since = 0
        self._last_mono = time.monotonic()
        self.retry_at = 0.0
        self._written: tuple = (0, 0.0, {}, 0)  # bytes, seconds, offsets, seq of the last write

    # -- loading ---------------------------------------------------------------------------

    def load(self):
        """The newest valid snapshot as (model, ledger, path), or None (a new lineage)."""
        self.store.clean_temp()
        found = self.store.load_newest(skip=self.known)
        self.known.update(p.name for p in self.store.files())
        if found is None:
            self.lineage = Lineage.new()
            self.gate = CommitGate()
            log.info("no usable snapshot: starting a new model that reads every partition from its "
                     "earliest offset (the group's committed offsets never pass a snapshot, so without "
                     "one they do not say what a model learned)",
                     extra={"snapshot_dir": str(self.store.dir), "lineage": self.lineage.id})
            return None
        return (*self.adopt(*found), found[1])

    def adopt(self, model, path: Path) -> tuple:
        """Take a loaded snapshot as this daemon's state: (model, its ledger)."""
        info = model.snapshot_info
        ledger = _ledger_of(info)
        self.lineage = Lineage.of(info) or Lineage.new()
        self.gate.durable(ledger.positions())
        self.last_snapshot = path
        self.known.add(path.name)
        self.dirty = False
        created = info.get("created")
        self.telemetry.on_snapshot_written(None, at=float(created) if created else None)
        return model, ledger

    def adopt_bytes(self, data: bytes) -> tuple:
        """A snapshot received as bytes (the update log's rebase, ``service/rebase.py``) as this
        daemon's state: (model, its ledger). Read through a file in the snapshot directory; the
        snapshot written next holds it."""
        tmp = self.store.dir / f"rebase-{os.getpid()}.tmp"
        tmp.write_bytes(data)
        try:
            model = load_snapshot(tmp)
        finally:
            tmp.unlink(missing_ok=True)
        self.lineage = Lineage.of(model.snapshot_info) or Lineage.new()
        return model, _ledger_of(model.snapshot_info)

    def log_adopted(self, model, path: Path, differences: dict) -> None:
        """Say which snapshot the daemon runs on, and which of its settings the config differs in."""
        log.info("model loaded from snapshot", extra={
            "path": str(path), "version": model.version, "docs_seen": model.state.docs_seen,
            "offsets": self.gate.snapshot_offsets, "vocabulary": len(model.vocab), "lineage": self.lineage.id,
            "seq": self.lineage.seq})
        if differences:
            log.warning("snapshot model settings differ from [model]; the snapshot's are kept",
                        extra={"differences": {k: {"snapshot": a, "config": b} for k, (a, b) in differences.items()}})

    def newer_of_lineage(self, docs_seen: int):
        """A snapshot this process did not write nor load, that continues this model's lineage
        with a higher sequence and no fewer documents: (model, ledger, path), else None. With the
        directory lock there is no other writer; a file that appears anyway (copied in, or
        written before a lock takeover) is adopted only then - never by its file name alone."""
        if not [p for p in self.store.files() if p.name not in self.known]:
            return None
        while True:
            found = self.store.load_newest(skip=self.known)
            if found is None:
                return None
            model, path = found
            self.known.add(path.name)
            ok, why = self.lineage.may_adopt(Lineage.of(model.snapshot_info), int(model.state.docs_seen),
                                             int(docs_seen))
            if ok:
                log.warning("a newer snapshot of this model's lineage appeared; adopting it",
                            extra={"path": str(path), "why": why})
                return (*self.adopt(model, path), path)
            log.warning("ignoring a snapshot this daemon did not write", extra={"path": str(path), "why": why})

    # -- cadence ---------------------------------------------------------------------------

    def due(self, force: bool = False, publish_failed: bool = False) -> str | None:
        """``"early"`` (the first learned batch's extra snapshot), ``"regular"``, or None."""
        now = time.monotonic()
        by_batches = self.cfg.every_batches > 0 and self.batches_since >= self.cfg.every_batches
        by_time = self.cfg.every_seconds > 0 and now - self._last_mono >= self.cfg.every_seconds
        # A young model is covered at once: the first learned batch gets a snapshot (the cadence
        # counts on from start-up, unchanged), so a crash never meets a model without one.
        first = self.last_snapshot is None and self.dirty and now >= self.retry_at
        if first and not (force or by_batches or by_time):
            return "early"
        if not (force or by_batches or by_time):
            return None
        if not self.dirty:
            # The newest snapshot already holds the whole state: nothing would be replayed.
            if by_time:
                self.telemetry.on_snapshot_written(None)
                self._last_mono = now
            return None
        if publish_failed or (not force and now < self.retry_at):
            return None
        return "regular"

    def postpone(self, seconds: float) -> None:
        self.retry_at = time.monotonic() + seconds

    # -- writing ---------------------------------------------------------------------------

    def write(self, model, ledger: OffsetLedger, extra: dict, early: bool = False) -> Path | None:
        """Write model + ledger atomically; None (counted, logged, retried later) on failure."""
        t0 = time.perf_counter()
        offsets = ledger.positions()
        seq = self.lineage.seq + 1
        extra = {"daemon": {**extra, "lineage": self.lineage.id, "seq": seq, "ledger": ledger.to_dict(),
                            "epochs": ledger.epochs(),
                            "topic_ids": {k.rpartition(":")[0]: ledger.topic_id(k) for k in ledger.keys()
                                          if ledger.topic_id(k) is not None}}}
        try:
            self._point("snapshot_begin")
            path, nbytes = self.store.write(model, offsets, extra)
        except Exception as exc:  # noqa: BLE001 - SnapshotWriteError (disk) or a bug
            reason = self.telemetry.on_snapshot_failed(exc)
            self._after_failure()
            log.error("snapshot failed; keeping the previous snapshots and running on",
                      extra={"reason": reason, "error": str(exc)},
                      exc_info=None if isinstance(exc, SnapshotWriteError) else exc)
            return None
        dt = time.perf_counter() - t0
        self._point("snapshot_written")
        self.telemetry.on_snapshot_written(dt)
        self.last_snapshot = path
        self.lineage.seq = seq
        self.known.add(path.name)
        self.dirty = False
        if not early:
            self.batches_since = 0
            self._last_mono = time.monotonic()
        # Durable now: the group may be told these offsets (and never anything newer).
        self.gate.durable(offsets)
        self._written = (nbytes, dt, offsets, seq)
        return path

    def prune(self, path: Path, model_version: int, early: bool) -> None:
        removed = self.store.prune()
        # Only files still in the directory need remembering: one name per snapshot ever written
        # made this set grow for as long as the daemon ran.
        self.known.difference_update(p.name for p in removed)
        self._point("snapshot_pruned")
        nbytes, dt, offsets, seq = self._written
        log.info("snapshot written", extra={
            "path": str(path), "version": model_version, "bytes": nbytes, "seconds": round(dt, 4),
            "offsets": offsets, "seq": seq, "early": early, "pruned": [p.name for p in removed]})

    def log_final_failure(self, learned: dict) -> None:
        last = self.last_snapshot
        log.error("final snapshot failed: the group's committed offsets stay at the last good snapshot; what "
                  "was learned since is read and learned again at the next start (free the snapshot directory "
                  "first). Exiting with status 1.",
                  extra={"last_snapshot": str(last) if last else None,
                         "committed": dict(self.gate.snapshot_offsets), "learned": learned})

    def log_final_skipped(self, learned: dict) -> None:
        last = self.last_snapshot
        log.error("final snapshot skipped: predictions of learned batches were not acknowledged before the "
                  "stop (broker unreachable), and a snapshot must not claim them; the group's committed offsets stay at "
                  "the last good snapshot, and what was learned since is read and learned again at the next "
                  "start. Exiting with status 1.",
                  extra={"last_snapshot": str(last) if last else None,
                         "committed": dict(self.gate.snapshot_offsets), "learned": learned})

    def _after_failure(self) -> None:
        # Try again at the next trigger, not after every batch.
        self.batches_since = 0
        self._last_mono = time.monotonic()
        self.retry_at = time.monotonic() + min(30.0, self.cfg.every_seconds or 30.0)

    # -- the group's offsets ---------------------------------------------------------------

    def commit(self, consumer, assigned: dict, sync: bool = False) -> None:
        """Tell the group the offsets of the newest snapshot (never more: see CommitGate).
        ``assigned``: partition key -> the client's TopicPartition."""
        if consumer is None:
            return
        pending = self.gate.pending(list(assigned))
        if not pending:
            return
        offsets = {assigned[k]: v for k, v in pending.items()}
        t0 = time.perf_counter()
        if sync:
            if consumer.commit(offsets, timeout_s=5.0):
                self.gate.committed(pending)
        else:
            consumer.commit_async(offsets)
            self.gate.committed(pending)
        self._point("committed")
        self.telemetry.on_commit(time.perf_counter() - t0)


def _ledger_of(info: dict) -> OffsetLedger:
    """The ledger a snapshot's info holds (or, written before ledgers, [0, offset) learned in the saved epoch)."""
    offsets = {str(k): int(v) for k, v in (info.get("offsets") or {}).items()}
    daemon_extra = (info.get("extra") or {}).get("daemon") or {}
    if daemon_extra.get("ledger"):
        return OffsetLedger.from_dict(daemon_extra["ledger"])
    topic_ids = {str(k): str(v) for k, v in (daemon_extra.get("topic_ids") or {}).items()}
    return OffsetLedger.from_offsets(offsets, daemon_extra.get("epochs") or {}, topic_ids)
