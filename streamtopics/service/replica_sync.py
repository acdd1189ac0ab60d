"""The update log on Kafka: publish this replica's records, apply everybody's in log order.

``ReplicaSync`` pairs a ``replication.Replica`` with the update-log topic (one partition, so
totally ordered): ``publish`` queues a record for an ``UpdateWriter`` thread, which encodes it
(split into parts when large) and hands it to the producer; ``catch_up`` applies every record
in log order from the replica's offset (its own included, when they come back). Reading -
polling, decoding, reassembling parts - runs on an ``UpdateReader`` thread that hands decoded
records over in log order; the loop's thread only applies them. ``bounded`` keeps a batch from
being computed more than ``max_staleness`` records behind the log's end. The reader's consumer
is assigned the partition directly (no group): every replica reads all of it.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import os
import socket
import threading
import time
import uuid

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from .checkpoint import StartRefused
from .processor import StepInterrupted
from .rebase import encode_rebase
from .replica_snapshots import SnapshotShipper
from .replication import Computed, ForeignSettings, Replica, Source, UpdateRecord
from .session import log_reader_kwargs, log_writer_kwargs
from .update_log import Fetched, UpdateReader, UpdateWriter

__all__ = ["ForeignUpdateLog", "NewerUpdateFormat", "ReplicaMode", "ReplicaSync", "UpdateLogRebased", "UpdateLogReset",
           "UpdateLogTruncated", "UpdateLogUnusable",
           "update_log_clients"]

log = logging.getLogger("streamtopics.daemon")

# A split record's parts are sent together; one still open this many offsets after its first
# part will not complete (its writer died between parts).
OPEN_PART_SPAN = 10_000
# How long a replica with no topics yet waits for its first batch record to come back applied
# before computing its next batch (see ReplicaMode.compute); a round trip takes 0.1-0.3 s.
FIRST_TOPICS_WAIT_S = 5.0
# A batch waiting for the update log (the staleness bound) checks between slices this long
# whether the daemon is stopping.
BOUND_WAIT_S = 5.0


class UpdateLogUnusable(StepInterrupted):
    """The update log cannot be applied on from here without the replicas' models drifting apart:
    nothing more is applied and the daemon stops with the reason (the batch in hand is neither
    learned nor dead-lettered)."""


class NewerUpdateFormat(UpdateLogUnusable):
    """The update log holds a record of a newer wire format than this release reads. Skipping it
    would leave this replica's model behind every replica that applied it, so nothing from that
    offset on is applied and the daemon stops with this error: upgrade the replica."""


class ForeignUpdateLog(UpdateLogUnusable, StartRefused):
    """The update log's model has other settings than this replica's (``replication.ForeignSettings``):
    the replica stops before it applies or publishes anything of the log, and the daemon exits 2
    with the settings that differ. The log's own replicas skip what it may have published."""


class UpdateLogRebased(UpdateLogUnusable):
    """A running replica met the first rebase of its log (another replica found the log lost and
    published the state every replica continues from): it stops, and adopts it at its restart,
    where the model can be replaced before anything runs on it."""


class UpdateLogReset(UpdateLogUnusable):
    """The update log is not the one this replica's offsets refer to: the broker lost its data
    (tansu's memory storage restarted), or the topic was deleted and created again, or truncated.
    Applying the new log from our offset would skip its first records and take the rest for the
    continuation of the old one (what happened before this check: a replica learned a few batches
    of it and then nothing more, silently). docs/scale-out.md, "When the update log is lost"."""


class UpdateLogTruncated(UpdateLogUnusable):
    """Retention deleted update-log records that this replica's model has not applied (it
    restarted from a snapshot older than the log's beginning, or fell that far behind): the log
    cannot bring its model to the others'. Nothing more is applied; at start a replica with
    ``snapshots_topic`` continues from the newest shipped snapshot when the log still holds what
    follows it, else it refuses to start (``ReplicaMode.join``). ``begins``: the log's first offset."""

    def __init__(self, message: str, begins: int) -> None:
        super().__init__(message)
        self.begins = begins


def update_log_clients(cfg) -> tuple[dict, dict]:
    """The update log's (reader, writer) client settings: a fetch of two whole records, a request
    of one record and its headers (at least 1 MiB each)."""
    k, rc = cfg.kafka, cfg.replication
    return (log_reader_kwargs(k, max(1048576, 2 * rc.max_record_bytes)),
            log_writer_kwargs(k, max(1048576, rc.max_record_bytes + 65536), rc.compression_type))


class ReplicaSync:
    """See the module docstring. ``telemetry`` gets ``on_update_applied``, ``on_own_update_learned``,
    ``on_update_lag`` and ``on_staleness``; ``tick()`` is the loop's heartbeat while waiting on the log."""

    def __init__(self, cfg, replica: Replica, telemetry, tick=lambda: None,
                 gil_free: threading.Event | None = None) -> None:
        self.cfg = cfg
        self._gil_free = gil_free
        self.rc = cfg.replication
        self.replica = replica
        self.telemetry = telemetry
        self._tick = tick
        self.tp = TopicPartition(self.rc.updates_topic, 0)
        self._reader: UpdateReader | None = None
        self._ends: KafkaConsumer | None = None
        self._ends_lock = threading.Lock()
        self._producer: KafkaProducer | None = None
        self._end = 0
        # Split records whose first parts the replica's offset has passed and whose last part
        # has not come yet: record id -> offset of its first part. A snapshot taken meanwhile
        # must read the log again from there (``read_from``), or a restart would never see
        # those parts and would skip the record that every other replica applies.
        self.open_parts: dict[str, int] = {}
        self.published = 0
        self._publish_lock = threading.Lock()
        self.failed: list[UpdateRecord] = []  # records the broker refused (appended by the producer thread)
        self.ahead: str | None = None  # a record of a newer wire format was met here: nothing more is applied
        self.lost: str | None = None  # the log was found reset (``UpdateLogReset``): nothing more is applied
        self.foreign: str | None = None  # the log's model has other settings (``ForeignUpdateLog``): likewise
        self.rebased: str | None = None  # a running replica met the log's first rebase (``UpdateLogRebased``): likewise
        # ``on_rebase(rebase, offset)``: a whole rebase message in the log (``ReplicaMode._on_rebase``);
        # ``awaiting_rebase``: this replica published one into a new log and skips all before the first
        self.on_rebase = None
        self.awaiting_rebase = False
        self.topic_id: str | None = None  # the log's topic id the offsets refer to (from the snapshot)
        self.last_applied: tuple[int, int] | None = None  # (offset, fingerprint) of the last message applied

    def check_retention(self) -> str | None:
        """The update log must outlast the snapshot interval (a replica that restarts replays it
        from its newest snapshot). Returns the problem, or None (also when the broker does not say)."""
        from kafka import KafkaAdminClient
        from kafka.admin import ConfigResource, ConfigResourceType

        try:
            admin = KafkaAdminClient(**self.cfg.kafka.admin_kwargs())
            try:
                res = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, self.tp.topic)])
            finally:
                admin.close()
            if isinstance(res, dict):  # kafka-python >= 2.1: {"topic": {name: {config: value}}}
                entries = (res.get("topic") or {}).get(self.tp.topic) or {}
            else:  # older: responses with (name, value, ...) rows
                entries = {c[0]: c[1] for r in res for c in r.resources[0][4]}
            value = entries.get("retention.ms")
            if isinstance(value, dict):
                value = value.get("value")
            if value is None:
                log.info("update log: the broker does not report retention.ms; not checked")
                return None
            retention = int(value)
        except Exception as exc:  # noqa: BLE001 - a broker without DescribeConfigs (tansu): cannot check
            log.info("update log: retention not checked", extra={"error": repr(exc)})
            return None
        need = 1000 * max(self.cfg.snapshot.every_seconds, 60.0) * 10
        if 0 <= retention < need:
            return (f"update log {self.tp.topic!r} keeps records for {retention / 1000:.0f} s, less than ten "
                    f"snapshot intervals ({need / 1000:.0f} s): a replica restarting from its newest snapshot "
                    f"could find the records after it deleted; raise retention.ms of the topic")
        return None

    def read_from(self) -> int:
        """Where a replica restored at this replica's offset must read the log from: the first
        part of a split record still open, else the offset itself."""
        return min(self.open_parts.values(), default=self.replica.offset)

    def connect(self, read_from: int | None = None) -> None:
        """``read_from``: where the reader starts (a snapshot's ``read_from``; default the
        replica's offset). Records completed before the replica's offset are not applied again."""
        problem = self.check_retention()
        if problem:
            log.error(problem)
        reader_kw, writer_kw = update_log_clients(self.cfg)
        # Reading (poll, decode, reassembling parts) runs on the reader's thread; the log's end
        # for catch_up is asked by a consumer of its own (a KafkaConsumer is not thread-safe).
        start = self.replica.offset if read_from is None else min(int(read_from), self.replica.offset)
        self._reader = UpdateReader(lambda: KafkaConsumer(**reader_kw), self.tp, start, topic_id=self.topic_id,
                                    last=self.last_applied)
        self._reader.start()
        self._ends = KafkaConsumer(**reader_kw)
        self._producer = KafkaProducer(**writer_kw)
        self._writer = UpdateWriter(self._producer, self.tp.topic, self.rc.max_record_bytes, self._on_send_error)

    # -- the log's end and applying --------------------------------------------------------

    @property
    def log_topic_id(self) -> str | None:
        """The update log's topic id the replica's offsets refer to (None: the broker does not say)."""
        return self._reader.topic_id if self._reader is not None and self._reader.topic_id else self.topic_id

    def verify(self, timeout_s: float = 30.0) -> None:
        """Wait until the reader has compared the log with the replica's offset once (a log that
        was lost raises ``UpdateLogReset`` here, at start, before anything is computed). A broker
        that does not answer in time is checked later, by the reader, before anything is applied."""
        deadline = time.monotonic() + timeout_s
        while not self._reader.checked.wait(0.2):
            self._tick()
            if time.monotonic() > deadline:
                return
        if self._reader.reset is not None or self._reader.truncated is not None:
            self.apply_fetched()

    def end_offset(self) -> int:
        """The log's end now (a round trip to the broker; safe from any thread). A broker may
        answer ListOffsets with the last batch's base offset + 1 (tansu does, when several
        records share a batch), so the reader's newest fetch high watermark bounds it from below."""
        with self._ends_lock:
            listed = int(self._ends.end_offsets([self.tp])[self.tp])
        self._end = max(listed, self._reader.highwater)
        return self._end

    def catch_up(self, until: int | None = None, timeout_s: float = 30.0) -> int:
        """Apply records until the replica's offset reaches ``until`` (None: the log's end now).
        Returns the records applied; raises TimeoutError when the log does not deliver."""
        target = self.end_offset() if until is None else until
        n = 0
        deadline = time.monotonic() + timeout_s
        while self.replica.offset < target:
            if time.monotonic() > deadline:
                raise TimeoutError(f"update log: at offset {self.replica.offset}, waiting for {target}")
            self._tick()
            item = self._reader.take(timeout_s=0.2)
            if item is not None:
                n += self._apply(item)
            elif not self._reader.alive:
                self._reader.start()  # it died (logged): again from where it stopped
        self.telemetry.on_update_lag(max(0, self._end - self.replica.offset))
        return n

    def apply_fetched(self, max_records: int = 256) -> int:
        """Apply what the reader has decoded already, without waiting for more."""
        n = 0
        for _ in range(max_records):
            item = self._reader.take()
            if item is None:
                break
            n += self._apply(item)
        if not self._reader.alive:
            self._reader.start()
        self._end = max(self._end, self._reader.highwater)
        self.telemetry.on_update_lag(max(0, self._end - self.replica.offset))
        return n

    def apply_next(self, timeout_s: float) -> int:
        """Apply the next record, waiting up to ``timeout_s`` for the reader to deliver one, then
        whatever else it has decoded."""
        item = self._reader.take(timeout_s=timeout_s)
        return (self._apply(item) if item is not None else 0) + self.apply_fetched()

    def _apply(self, item: Fetched) -> int:
        """One message from the reader, in log order: a whole record is applied at its offset;
        a part (its record completes later) or a message that is not a record only moves the
        offset on."""
        if item.reset or self.lost is not None:
            self.lost = self.lost or item.error
            raise UpdateLogReset(f"update log {self.tp.topic!r}: {self.lost}; this replica's model is at update "
                                 f"offset {self.replica.offset} of the old log. Nothing more is applied: "
                                 f"docs/scale-out.md, 'When the update log is lost', says how to go on")
        if self.foreign is not None:
            raise ForeignUpdateLog(self.foreign)
        if self.rebased is not None:  # nothing past it: the restart reads the rebase whole and adopts it
            raise UpdateLogRebased(self.rebased)
        if item.truncated:
            raise UpdateLogTruncated(f"update log {self.tp.topic!r}: {item.error}; this replica's model is at "
                                     f"update offset {self.replica.offset}", self._reader.truncated or item.offset)
        if item.offset < self.replica.offset:
            return 0
        last, self.last_applied = self.last_applied, (item.offset, item.crc)
        if item.newer or self.ahead is not None:
            self.ahead = self.ahead or f"update log offset {item.offset}: {item.error}"
            raise NewerUpdateFormat(f"{self.ahead}; upgrade this replica (nothing from that offset on is applied, "
                                    f"so its model stays where every replica of this release is)")
        if item.rebase is not None:
            if self.on_rebase is None:
                raise UpdateLogReset(f"a rebase at update log offset {item.offset}, and no way to adopt it here")
            try:
                self.on_rebase(item.rebase, item.offset)  # moves the offset on (or raises: adopted at start)
            except UpdateLogRebased as exc:
                # The snapshot taken at the stop must lead the restart to the rebase's first part:
                # its parts stay open, and the message is not counted as read (fleet audit: the
                # restart began past it and applied the next records to the old model).
                self.rebased, self.last_applied = str(exc), last
                raise
            self.open_parts.pop(item.rebase.rid, None)
            return 1
        if self.awaiting_rebase:  # a lost log's new one: what precedes the first rebase is not ours to apply
            if item.part_of is not None:
                self._note_part(item.part_of, item.offset)
            self.replica.offset = item.offset + 1
            return 0
        if item.record is None:
            if item.error is not None:  # not ours: skipped identically by every replica
                log.error("update log: skipping a message that is not an update record",
                          extra={"offset": item.offset, "error": item.error})
            elif item.part_of is not None:
                self._note_part(item.part_of, item.offset)
            self.replica.offset = item.offset + 1
            return 0
        self.open_parts.pop(item.record.rid, None)
        t0 = time.perf_counter()
        rec = item.record
        foreign = self.replica.foreign
        try:
            applied = self.replica.apply(rec, item.offset)
        except ForeignSettings as exc:
            self.telemetry.on_update_applied(time.perf_counter() - t0, "foreign")
            self.foreign = str(exc)
            raise ForeignUpdateLog(self.foreign) from None
        result = "applied" if applied else "foreign" if self.replica.foreign > foreign else "skipped"
        self.telemetry.on_update_applied(time.perf_counter() - t0, result, len(rec.reborn) if applied else 0)
        if applied and rec.kind != "claim" and rec.writer == self.replica.writer:
            # what the gauge of on_staleness cannot see: own records computed but not yet in the log
            self.telemetry.on_own_update_learned(item.offset - rec.base)
        return 1

    def _note_part(self, rid: str, offset: int) -> None:
        self.open_parts.setdefault(rid, offset)
        stale = [r for r, first in self.open_parts.items() if first < offset - OPEN_PART_SPAN]
        for r in stale:  # its writer died between parts: the record never completes
            log.warning("update log: a split record never completed; not waiting for it",
                        extra={"first_offset": self.open_parts.pop(r), "offset": offset})

    def bounded(self, timeout_s: float = 30.0) -> None:
        """Apply the log until this replica is at most ``max_staleness`` records behind its end
        (the end as the reader's last fetch saw it: no round trip per batch; no wait unless the
        bound forces one). Applying is GIL-bound: the daemon's GIL-free flag, which the batch
        processor sets before computing, is cleared meanwhile, so its read-ahead and publisher
        threads do not take the GIL from it (measured: 5-7 ms of waiting per batch)."""
        free = self._gil_free is not None and self._gil_free.is_set()
        if free:
            self._gil_free.clear()
        try:
            self.apply_fetched()
            end = self._end
            if end - self.replica.offset > self.rc.max_staleness:
                self.catch_up(end - self.rc.max_staleness, timeout_s=timeout_s)
            self.telemetry.on_staleness(max(0, end - self.replica.offset))
        finally:
            if free:
                self._gil_free.set()

    # -- publishing ------------------------------------------------------------------------

    def publish(self, rec: UpdateRecord) -> None:
        """Queue the record for the log (the writer's thread encodes and sends it, the producer's
        delivers it; ``flush`` waits). A part the broker refuses puts the record back in
        ``failed``, sent again by ``retry``: a hole in a partition's coverage would leave its
        documents unlearned."""
        with self._publish_lock:  # the publisher thread (acknowledged batches) and the loop (retry)
            self._writer.send(rec)
            self.published += 1

    def _on_send_error(self, rec: UpdateRecord, exc) -> None:  # producer or writer thread
        log.error("update log: a record was not delivered; sending it again", extra={"error": repr(exc)})
        self.failed.append(rec)

    def retry(self) -> None:
        while self.failed:
            self.publish(self.failed.pop(0))

    def publish_now(self, messages: list[bytes], timeout_s: float = 120.0) -> None:
        """Send already encoded messages (a rebase) in order and wait until the log has them all."""
        for m in messages:
            self._producer.send(self.tp.topic, value=m, partition=0).get(timeout=timeout_s)

    def flush(self) -> None:
        """Wait until every record sent is in the log (and resend refused ones)."""
        if self._producer is not None:
            self._writer.drain(30)
            self._producer.flush(timeout=30)
            if self.failed:
                self.retry()
                self._writer.drain(30)
                self._producer.flush(timeout=30)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        if self._writer is not None:
            self._writer.close()
        for c in (self._ends, self._producer):
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001 - closing
                    pass
        self._reader = self._ends = self._producer = self._writer = None


class ReplicaMode:
    """The daemon's replica mode: join the update log, compute-and-publish batches, apply the
    log between batches, and say in snapshots which update offset the model is at."""

    def __init__(self, cfg, telemetry, checkpoints, tick=lambda: None,
                 gil_free: threading.Event | None = None, stopping=lambda: False) -> None:
        self.cfg = cfg
        self.telemetry = telemetry
        self._stopping = stopping  # the daemon was asked to stop: a wait for the log gives up
        telemetry.standby_ready = True  # a replica with no partition of its own still follows the log
        self.checkpoints = checkpoints
        self._tick = tick
        self._gil_free = gil_free  # the daemon's flag: set while its loop may leave the GIL to others
        self.replica_id = cfg.replication.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.replica: Replica | None = None
        self.sync: ReplicaSync | None = None
        self.predicted_at = 0  # the update offset of the model that made the last batch's predictions
        # Records wait here until their batch's predictions are acknowledged: what the log covers
        # has always been predicted, so a partition's next owner may resume where coverage ends.
        self.pending: dict[tuple[str, int], UpdateRecord] = {}
        self._pending_lock = threading.Lock()  # the publisher thread takes acknowledged records out
        self.shipper = SnapshotShipper(cfg, self.replica_id) if cfg.replication.snapshots_topic else None
        self._untopical_sent = False  # a batch record computed while the model had no topics
        self.rebase_offset: int | None = None  # the offset of the rebase this log's model descends from
        self._starting = False  # joining: a rebase met now is adopted (later, the daemon stops for it)
        self._claiming: dict[str, tuple[int, str | None]] = {}  # claims not through yet: epoch, topic id

    def fetch_snapshot(self, store) -> None:
        """Start-up with an empty snapshot directory: the newest snapshot shipped to Kafka, if any."""
        if self.shipper is None or store.files():
            return
        try:
            self.shipper.fetch_newest(store.dir)
        except Exception as exc:  # noqa: BLE001 - the broker away: replay the log from its beginning
            log.warning("could not fetch a shipped snapshot; replaying the update log from its beginning",
                        extra={"error": repr(exc)})

    def ship(self, path) -> None:
        if self.shipper is not None and self.replica is not None:
            self.shipper.ship(path, self.replica.offset)

    def join(self, model, ledger, adopt=lambda model, ledger: None) -> None:
        """The model at its snapshot's update offset, then the log applied to its end. ``adopt(model,
        ledger)``: the daemon takes another model and ledger (its log was lost: the new log's base;
        retention deleted records after its snapshot: the newest shipped snapshot)."""
        offset = _saved(model).get("update_offset", 0)
        self._starting = True
        try:
            n = self._start_at(model, ledger, f"{self.replica_id}/{uuid.uuid4().hex[:8]}")
        except UpdateLogTruncated as exc:
            n = self._from_shipped(exc)
        self._starting = False
        if self.replica.model is not model:
            adopt(self.replica.model, self.replica.ledger)
        log.info("replica joined the update log", extra={
            "replica": self.replica_id, "from_offset": offset, "applied": n, "update_offset": self.replica.offset})
        self.checkpoints.dirty = self.checkpoints.dirty or n > 0

    def _start_at(self, model, ledger, writer: str) -> int:
        """Join the log with ``model`` at its snapshot's update offset: the records applied."""
        saved = _saved(model)
        offset = int(saved.get("update_offset", 0))
        self.replica = Replica(model, offset=offset, ledger=ledger, owners=saved.get("owners") or {}, writer=writer)
        self.rebase_offset = saved.get("rebase_offset")
        self._new_sync(saved.get("update_log_topic_id"), saved.get("update_log_last"))
        self.sync.connect(read_from=saved.get("read_from"))
        if offset > 0:
            try:
                self.sync.verify()
            except UpdateLogReset as exc:
                self._refuse_foreign_snapshot(saved, exc)
                self._publish_rebase(str(exc))
        return self.sync.catch_up(timeout_s=600.0)

    def _refuse_foreign_snapshot(self, saved: dict, exc: UpdateLogReset) -> None:
        """A snapshot of another deployment (another consumer group or input topic) finds "the log
        lost" only because it is another log: offering it as the base would replace the model of a
        healthy fleet (fleet audit: a directory copied from another fleet did, and every replica
        stopped for it). Refuse to start instead."""
        k, t = self.cfg.kafka, self.cfg.topics
        theirs = {"group_id": saved.get("group_id"), "input": saved.get("input")}
        ours = {"group_id": k.group_id, "input": t.input}
        differ = {name: (theirs[name], ours[name]) for name in ours if theirs[name] not in (None, ours[name])}
        if differ:
            shown = ", ".join(f"{name} {a!r} (this replica: {b!r})" for name, (a, b) in differ.items())
            raise StartRefused(f"{exc}: the snapshot in {self.checkpoints.store.dir} was written by another "
                               f"deployment ({shown}); it is not a base for this update log. Start this replica "
                               f"with an empty snapshot directory (or the shipped snapshots of this one)") from exc

    def _from_shipped(self, exc: UpdateLogTruncated) -> int:
        """Retention deleted records after this replica's snapshot: go on from the newest snapshot
        shipped to Kafka when the log still holds what follows it; else refuse to start, saying how
        to go on (no rebase: the other replicas' model is intact, only this one is behind)."""
        how = ("start it from a newer snapshot (with [replication] snapshots_topic it fetches the newest shipped one; "
               "else copy one from another replica into its snapshot directory), and raise the update log's "
               "retention.ms above the snapshot interval")
        path = None
        if self.shipper is not None:
            try:
                path = self.shipper.fetch_newest(self.checkpoints.store.dir)
            except Exception as err:  # noqa: BLE001 - the broker away: refused below, with the reason
                log.warning("could not fetch a shipped snapshot", extra={"error": repr(err)})
        if path is None:
            raise StartRefused(f"{exc}; {how}") from exc
        model, ledger = self.checkpoints.adopt_bytes(path.read_bytes())
        at = int(_saved(model).get("update_offset", 0))
        if at < exc.begins:
            raise StartRefused(f"{exc}; the newest shipped snapshot is at update offset {at}, also before it: "
                               f"{how}") from exc
        log.warning("update log: records after this replica's snapshot were deleted; continuing from the newest "
                    "shipped snapshot", extra={"log_begins": exc.begins, "snapshot_update_offset": at,
                                               "path": str(path)})
        self.sync.close()
        self.telemetry.on_update_log_lost(truncated=True)
        return self._start_at(model, ledger, self.replica.writer)

    def _new_sync(self, topic_id: str | None = None, last=None) -> None:
        """The update log's side of ``self.replica`` (not connected yet); ``topic_id`` and ``last``
        say which log the replica's offsets refer to (a snapshot's, or none: any log)."""
        self.sync = ReplicaSync(self.cfg, self.replica, self.telemetry, tick=self._tick, gil_free=self._gil_free)
        self.sync.topic_id = topic_id
        self.sync.last_applied = tuple(last) if last else None
        self.sync.on_rebase = self._on_rebase

    def _publish_rebase(self, why: str) -> None:
        """This replica's log is lost: offer the snapshot it started from as the new log's base
        (``rebase.py``), then read the new log from its beginning. Whoever's rebase comes first is
        adopted (``_on_rebase``); everything before it is skipped."""
        path = self.checkpoints.last_snapshot
        data = path.read_bytes()
        old = self.replica.offset
        self.sync.close()
        self.replica = Replica(self.replica.model, offset=0, ledger=self.replica.ledger, owners={},
                               writer=self.replica.writer)
        self._new_sync()
        self.sync.awaiting_rebase = True
        self.rebase_offset = None
        self.sync.connect(read_from=0)
        self.sync.publish_now(encode_rebase(data, self.replica_id, old, self.cfg.replication.max_record_bytes))
        self.telemetry.on_update_log_lost()
        log.warning("update log lost: this replica's snapshot offered as the new log's base; the first base "
                    "in the log is adopted by every replica", extra={"why": why, "old_update_offset": old,
                                                                     "snapshot": str(path), "bytes": len(data)})

    def _on_rebase(self, reb, offset: int) -> None:
        """A whole rebase message at ``offset``: the first of its log is adopted, at start (the model
        and ledger are replaced before anything runs on them); a running replica stops for it."""
        if self.rebase_offset is not None:
            log.info("update log: a later rebase is skipped (the first one was adopted)",
                     extra={"offset": offset, "adopted": self.rebase_offset, "from_replica": reb.replica})
            self.replica.offset = offset + 1
            return
        if not self._starting:
            raise UpdateLogRebased(f"update log offset {offset}: replica {reb.replica!r} found the log lost and "
                                   f"published the state every replica continues from; it is adopted at the restart")
        model, ledger = self.checkpoints.adopt_bytes(reb.data)
        self.replica = Replica(model, offset=offset + 1, ledger=ledger, owners={}, writer=self.replica.writer)
        self.sync.replica = self.replica
        self.sync.awaiting_rebase = False
        self.rebase_offset = offset
        self.checkpoints.dirty = True
        log.warning("update log: adopted the new log's base", extra={
            "offset": offset, "from_replica": reb.replica, "its_old_update_offset": reb.old_offset,
            "docs_seen": int(model.state.docs_seen)})

    def compute(self, tokens: list, span, ledger, labels: list | None = None) -> Computed:
        """The batch's update record to the log (the model learns it when the log is applied),
        and its predictions from the same local step. ``span``: the batch's source offsets;
        ``labels``: its documents' targets (supervised models)."""
        if self._untopical_sent and not self.replica.model.state.initialized:
            self._await_first_topics()
        self._bounded()
        if span.key and span.key not in self.replica.claims:
            # The claim at assignment did not get through. (A claim of ours that another replica's
            # later claim superseded is not renewed here: this replica is then the zombie, and
            # every replica skips its records until it is assigned the partition again.)
            epoch, topic_id = self._claiming.get(span.key, (0, None))  # the epoch its assignment wanted
            self.claim(span.key, max(epoch, ledger.epoch(span.key)), topic_id, timeout_s=None)
        self.telemetry.on_update_unlearned(self.replica.unlearned)
        model = self.replica.model
        self.predicted_at = self.replica.offset
        if not span.key:  # its log was found reset meanwhile: predict only
            return _predicted(model.process(model.prepare(tokens, grow=False), learn=False))
        topic, _, partition = span.key.rpartition(":")
        # The epoch's topic id, else the consumer's: applying the record gives an epoch without one
        # its id on every replica (a claim made before the consumer knew the id carried none).
        tid = ledger.topic_id(span.key) or span.topic_id
        source = Source(topic, int(partition), span.first, span.next, ledger.epoch(span.key), tid)
        rec, out = self.replica.compute(tokens, source, labels, kernels=self._kernels)
        self._untopical_sent = self._untopical_sent or rec.kind == "batch"
        if out is None:
            # No topics yet: predict with a scratch copy that applies this record as the log will.
            scratch = Replica(copy.deepcopy(model), offset=self.replica.offset)
            scratch.apply(rec, self.replica.offset)
            out = _predicted(scratch.model.process(scratch.model.prepare(tokens, grow=False), learn=False))
        self.pending[(span.key, span.first)] = rec
        return out

    def _bounded(self) -> None:
        """``ReplicaSync.bounded``, waited out. A log that does not deliver in time (the broker
        away) is no fault of the batch's documents, but raised inside the model's step it had the
        batch processor dead-letter them. The wait goes on, in slices of ``BOUND_WAIT_S`` with the
        loop's heartbeat (a warning at the start, then about once a minute; not ready meanwhile),
        until the log delivers, or the daemon stops (``StepInterrupted``: the batch is neither
        learned nor dead-lettered, and its input is read again after the restart)."""
        waits, t0 = 0, time.monotonic()
        try:
            while True:
                try:
                    self.sync.bounded(timeout_s=BOUND_WAIT_S)
                    break
                except TimeoutError as exc:
                    if self._stopping():
                        raise StepInterrupted(f"stopping while the batch waited for the update log: {exc}") from exc
                    waits += 1
                    self.telemetry.on_update_wait(time.monotonic() - t0)  # /readyz 503 meanwhile
                    if waits % 12 == 1:  # the first slice, then about once a minute
                        log.warning("update log: the records a batch must be computed after have not arrived; "
                                    "waiting on", extra={"error": str(exc), "waited_s": round(time.monotonic() - t0, 1),
                                                         "update_offset": self.replica.offset})
                    self._tick()
        finally:
            if waits:
                self.telemetry.on_update_wait(None)
        if waits:
            log.info("update log: records arrived; computing the batch", extra={
                "waited_s": round(time.monotonic() - t0, 1), "update_offset": self.replica.offset})

    def _await_first_topics(self) -> None:
        """A model with no topics computes a batch record that carries its tokens: every replica
        runs the whole local step when applying it, and its computing replica once more, on a copy,
        for the predictions. At the default staleness bound a new replica would send four of them
        before the first came back. So, once, the next batch waits (up to ``FIRST_TOPICS_WAIT_S``)
        for the topics: the log is applied as it arrives while the publisher thread sends the
        acknowledged batch's record (``acked``) and the writer thread delivers it."""
        self._untopical_sent = False  # once: a first batch without tokens initializes nothing
        t0 = time.monotonic()
        model = self.replica.model
        with self._kernels():
            while not model.state.initialized and time.monotonic() - t0 < FIRST_TOPICS_WAIT_S:
                self._tick()
                self.sync.apply_next(timeout_s=0.01)
        log.info("first topics from the update log" if model.state.initialized else
                 "no topics from the update log yet; computing on", extra={
                     "waited_s": round(time.monotonic() - t0, 3), "update_offset": self.replica.offset})

    def claim(self, key: str, epoch: int, topic_id: str | None = None, timeout_s: float | None = 30.0) -> bool:
        """Own the input partition ``key`` in the log: publish a claim and apply the log through
        it, so the partition resumes where the learned ranges end and no earlier owner's record
        can follow (every replica skips records computed under an older claim). A claim in a
        later ``epoch`` (a new log of the partition; ``topic_id``: the topic's now) moves every
        replica's ledger there. Retried until ``timeout_s`` (None: until it succeeds; the loop's
        heartbeat keeps the group session). False when it did not get through in time, or another
        replica claimed the partition after."""
        topic, _, partition = key.rpartition(":")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._claiming[key] = (epoch, topic_id)
        while True:
            try:
                self.sync.publish(self.replica.claim(topic, int(partition), epoch, topic_id))
                self.sync.flush()
                self.sync.catch_up()  # the log's end includes the claim now (flush waited for its ack)
                self._claiming.pop(key, None)
                if self.replica.claimed(key):
                    log.info("claimed an input partition in the update log", extra={
                        "partition": key, "claim_offset": self.replica.claims[key], "replica": self.replica_id,
                        "resume_offset": self.replica.ledger.position(key)})
                    return True
                log.warning("another replica claimed the partition after this one", extra={"partition": key})
                return False
            except UpdateLogUnusable:
                raise
            except Exception as exc:  # noqa: BLE001 - the broker away: try again
                if deadline is None and self._stopping():  # a batch's claim (``compute``): left for the restart
                    raise StepInterrupted(f"stopping while claiming {key} in the update log: {exc!r}") from exc
                if deadline is not None and time.monotonic() > deadline:
                    log.warning("could not claim an input partition; claiming again before its first batch",
                                extra={"partition": key, "error": repr(exc)})
                    return False
                log.warning("claiming an input partition failed; retrying", extra={"partition": key,
                                                                                    "error": repr(exc)})
                self._tick()
                time.sleep(1.0)

    def renew_epoch(self, key: str, epoch: int, topic_id: str | None) -> bool:
        """An owned partition's log turned out to be another (``PartitionBook.through_log``): claim
        it again in ``epoch``, until it gets through. False when another replica owns it now, or
        the daemon is stopping (the batch is then read again after the restart)."""
        try:
            return self.claim(key, epoch, topic_id, timeout_s=None)
        except UpdateLogUnusable:
            raise
        except StepInterrupted:
            return False

    @contextlib.contextmanager
    def _kernels(self):
        """The local step's kernels run GIL-free: the read-ahead and publisher threads may take
        the GIL meanwhile (the daemon's flag, set here only around them)."""
        if self._gil_free is not None:
            self._gil_free.set()
        try:
            yield
        finally:
            if self._gil_free is not None:
                self._gil_free.clear()

    def acked(self, meta) -> None:
        """A batch's predictions are acknowledged: its update record goes to the log. Called on
        the publisher thread the moment the broker acknowledged them (``Outbox.on_acked``), so the
        record is back, and applied, before the batch after next is computed."""
        with self._pending_lock:
            rec = self.pending.pop((f"{meta.tp.topic}:{meta.tp.partition}", meta.first_offset), None)
            if rec is not None:
                self.sync.publish(rec)
        if rec is not None:
            self.telemetry.on_update_published(self.replica.offset)

    def revoked(self, keys: set[str]) -> None:
        """Partitions go to other replicas: what is not acknowledged by now is theirs to learn
        (they re-read it), so its records are dropped; the rest is in the log before they start."""
        with self._pending_lock:  # a record being acknowledged meanwhile is queued before the flush below
            for k in [k for k in self.pending if k[0] in keys]:
                del self.pending[k]
        for key in keys:
            self.replica.claims.pop(key, None)  # claimed again if it comes back
        self.sync.flush()

    def apply_log(self) -> None:
        """Between batches: apply what the log reader fetched (others' records, and ours back)."""
        try:
            self.sync.retry()
            if self.sync.apply_fetched():
                self.checkpoints.dirty = True
                self.telemetry.on_model(self.replica.model)
        except UpdateLogUnusable:
            raise
        except Exception as exc:  # noqa: BLE001 - the broker away, or a slow log: next time
            log.warning("update log: catching up failed; retrying", extra={"error": repr(exc)})
        self.telemetry.on_update_offset(self.replica.offset)
        self.telemetry.refresh_topics(self.replica.model)  # idle partitions: /topics still follows

    def finish(self) -> None:
        """Graceful stop: apply the log to its end, so the final snapshot is as fresh as it can be."""
        try:
            if self.sync is not None:
                self.sync.flush()  # our last records are in the log ...
            if self.sync is not None and self.sync.catch_up(timeout_s=30.0):  # ... and applied, with everybody's
                self.checkpoints.dirty = True
        except UpdateLogUnusable:
            pass  # what stopped the daemon (logged then): nothing past it is applied
        except Exception as exc:  # noqa: BLE001 - the broker away: the snapshot is older, still valid
            log.warning("update log: could not catch up before the final snapshot", extra={"error": repr(exc)})

    def snapshot_extra(self) -> dict:
        return {"update_offset": self.replica.offset, "read_from": self.sync.read_from(), "replica_id": self.replica_id,
                "owners": dict(self.replica.owners), "update_log_topic_id": self.sync.log_topic_id,
                "rebase_offset": self.rebase_offset,
                "update_log_last": list(self.sync.last_applied) if self.sync.last_applied else None}

    def close(self) -> None:
        if self.sync is not None:
            self.sync.close()


def _saved(model) -> dict:
    """What the daemon saved with a snapshot's model (``snapshot_extra``); {} for a new model."""
    info = getattr(model, "snapshot_info", None) or {}
    return (info.get("extra") or {}).get("daemon") or {}


def _predicted(res) -> Computed:
    """A model's ``BatchResult`` as a replica's prediction."""
    return Computed(res.theta, res.scores, res.predicted, list(res.label_names or []))
