"""Everything the daemon sends, and what comes back acknowledged.

``Outbox`` hands a processed batch to the publish pipeline (its messages are encoded on the
publisher thread by ``PredictionEncoder`` while the next batch is learned), publishes topic
change events and snapshot announcements, and collects acknowledged batches for telemetry.
``failed`` turns true when a learned batch's predictions could not be published: no snapshot
may then claim that batch (it is read and learned again after a restart).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import msgpack

from ..stream.codec import fill_record_meta
from ..stream.producer import OutMessage, PublishJob
from .partitions import tp_key
from .predictions import BatchMeta, PredictionEncoder

__all__ = ["Outbox"]

log = logging.getLogger("streamtopics.daemon")


class Outbox:
    """Publishing side of the daemon; see the module docstring."""

    def __init__(self, cfg, session, telemetry, point: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.session = session  # its pipeline is rebuilt on reconnects: always read it from there
        self.telemetry = telemetry
        self.encoder = PredictionEncoder.from_config(cfg)
        self._point = point
        self.failed = False
        # called with each acknowledged batch's BatchMeta on the publisher thread, as soon as the
        # broker acknowledged it (replicas publish its update record then: waiting for the loop's
        # next ``collect`` left every batch computed two of this replica's own updates behind)
        self.on_acked: Callable[[BatchMeta], None] | None = None

    def submit_batch(self, rb, out, now: float, t_start: float, heartbeat: Callable[[], None]) -> None:
        """Dead letters and predictions of a processed batch (``BatchOutcome``) to the publisher
        thread; blocks (calling ``heartbeat``) while too many predictions await delivery."""
        step, ids = out.step, out.ids
        fill_record_meta(out.dead, rb.records)  # the daemon's own dead letters keep the record's key and headers
        build = partial(self.encoder.encode, out.dead, ids, step.theta, out.version, now, step.sup, out.label_names)
        meta = BatchMeta(rb.tp, rb.first_offset, rb.next_offset, len(step.keep), step.n_tokens,
                         [dl.reason for dl in out.dead], out.origins(), out.stages, t_start)
        on_ok = None if self.on_acked is None else partial(self.on_acked, meta)
        if not self.session.pipeline.submit(PublishJob([], meta, build=build, size=len(out.dead) + len(ids),
                                                       on_ok=on_ok), heartbeat=heartbeat):
            self.failed = True
            log.error("cannot hand predictions to the publisher (stopping while the broker is away): "
                      "this batch will be read and learned again after restart",
                      extra={"partition": rb.partition, "first_offset": rb.first_offset})
        self._point("submitted")

    def submit_events(self, events: list) -> None:
        if events and self.cfg.topics.events and self.session.pipeline is not None:
            self.session.pipeline.submit(PublishJob([
                OutMessage(self.cfg.topics.events, msgpack.packb(ev, use_bin_type=True), key=str(ev["topic"]).encode())
                for ev in events]))

    def announce_snapshot(self, path: Path, version: int, offsets: dict, lineage) -> None:
        if self.cfg.topics.snapshots and self.session.pipeline is not None:
            ann = msgpack.packb({"path": str(path.resolve()), "version": version, "offsets": offsets,
                                 "lineage": lineage.id, "seq": lineage.seq, "ts": time.time()}, use_bin_type=True)
            self.session.pipeline.submit(PublishJob([OutMessage(self.cfg.topics.snapshots, ann, key=b"snapshot")]))

    def collect(self, stopping: bool) -> bool:
        """Acknowledged batches to telemetry (offsets are committed from snapshots only).
        Returns False when publishing itself broke while not ``stopping``."""
        pipeline = self.session.pipeline
        if pipeline is None:
            return True
        healthy, acked = True, False
        for job in pipeline.completed():
            if not job.ok:
                healthy = healthy and stopping
                if job.meta is None:  # topic events or a snapshot announcement: no offsets wait on them
                    log.warning("topic events or a snapshot announcement were not delivered",
                                extra={"messages": len(job.messages)})
                else:
                    self.failed = True  # a learned batch's predictions: no snapshot may claim it
                continue
            if job.meta is None:  # a snapshot announcement or topic events
                continue
            acked = True
            self.telemetry.on_batch_acked(job, tp_key(job.meta.tp.topic, job.meta.tp.partition))
        if acked:
            self._point("collected")
        self.telemetry.on_pending(pipeline.pending_messages)
        return healthy

    def wait_idle(self, timeout_s: float | None, heartbeat: Callable[[], None]) -> bool:
        """Wait until everything handed over is acknowledged (True), or ``timeout_s`` passed."""
        pipeline = self.session.pipeline
        return True if pipeline is None else pipeline.wait_idle(timeout_s, heartbeat=heartbeat)

    @property
    def pending(self) -> int:
        pipeline = self.session.pipeline
        return pipeline.pending_messages if pipeline is not None else 0
