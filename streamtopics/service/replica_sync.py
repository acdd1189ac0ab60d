"""The update log on Kafka: publish this replica's records, apply everybody's in log order.

``ReplicaSync`` pairs a ``replication.Replica`` with the update-log topic (one partition, so
totally ordered): ``publish`` sends a record (split into parts when large) and waits for the
broker's acknowledgement; ``catch_up`` reads the log from the replica's offset and applies
every record in order (its own included, when they come back). ``bounded`` keeps a batch from
being computed more than ``max_staleness`` records behind the log's end. The consumer is
assigned the partition directly (no group): every replica reads all of it.
"""
from __future__ import annotations

import copy
import logging
import os
import socket
import time
import uuid

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from .replica_snapshots import SnapshotShipper
from .replication import Assembler, Computed, Replica, Source, UpdateRecord, decode, encode
from .session import log_reader_kwargs, log_writer_kwargs

__all__ = ["ReplicaMode", "ReplicaSync"]

log = logging.getLogger("streamtopics.daemon")


class ReplicaSync:
    """See the module docstring. ``telemetry`` gets ``on_update_applied``, ``on_update_lag`` and
    ``on_staleness``; ``tick()`` is the loop's heartbeat while waiting on the log."""

    def __init__(self, cfg, replica: Replica, telemetry, tick=lambda: None) -> None:
        self.cfg = cfg
        self.rc = cfg.replication
        self.replica = replica
        self.telemetry = telemetry
        self._tick = tick
        self.tp = TopicPartition(self.rc.updates_topic, 0)
        self._consumer: KafkaConsumer | None = None
        self._producer: KafkaProducer | None = None
        self._assembler = Assembler()
        self._end = 0
        self.published = 0
        self.failed: list[UpdateRecord] = []  # records the broker refused (appended by the producer thread)

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

    def connect(self) -> None:
        problem = self.check_retention()
        if problem:
            log.error(problem)
        k = self.cfg.kafka
        self._consumer = KafkaConsumer(**log_reader_kwargs(k, max(1048576, 2 * self.rc.max_record_bytes)))
        self._consumer.assign([self.tp])
        self._consumer.seek(self.tp, self.replica.offset)
        self._producer = KafkaProducer(**log_writer_kwargs(k, max(1048576, self.rc.max_record_bytes + 65536)))

    # -- the log's end and applying --------------------------------------------------------

    def end_offset(self) -> int:
        self._end = int(self._consumer.end_offsets([self.tp])[self.tp])
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
            batches = self._consumer.poll(timeout_ms=200, max_records=64)
            for msg in batches.get(self.tp, []):
                if msg.offset < self.replica.offset:
                    continue
                n += self._apply_message(msg)
        self.telemetry.on_update_lag(max(0, self._end - self.replica.offset))
        return n

    def apply_fetched(self) -> int:
        """Apply what the log reader has fetched already, without waiting for more."""
        n = 0
        for msg in self._consumer.poll(timeout_ms=0, max_records=256).get(self.tp, []):
            if msg.offset >= self.replica.offset:
                n += self._apply_message(msg)
        hw = self._consumer.highwater(self.tp)
        if hw is not None:
            self._end = max(self._end, int(hw))
        self.telemetry.on_update_lag(max(0, self._end - self.replica.offset))
        return n

    def _apply_message(self, msg) -> int:
        try:
            part, i, parts = decode(msg.value)
        except ValueError as exc:  # not ours: skipped identically by every replica
            log.error("update log: skipping a message that is not an update record",
                      extra={"offset": msg.offset, "error": str(exc)})
            self.replica.offset = msg.offset + 1
            return 0
        rec = self._assembler.add(part, i, parts)
        if rec is None:  # a part: the record applies at the offset of its last part
            self.replica.offset = msg.offset + 1
            return 0
        t0 = time.perf_counter()
        applied = self.replica.apply(rec, msg.offset)
        self.telemetry.on_update_applied(time.perf_counter() - t0, applied)
        return 1

    def bounded(self) -> None:
        """Apply the log until this replica is at most ``max_staleness`` records behind its end
        (the end as the last fetch saw it: no round trip per batch)."""
        self.apply_fetched()
        hw = self._consumer.highwater(self.tp)
        end = int(hw) if hw is not None else self.end_offset()
        if end - self.replica.offset > self.rc.max_staleness:
            self.catch_up(end - self.rc.max_staleness)
        self.telemetry.on_staleness(max(0, end - self.replica.offset))

    # -- publishing ------------------------------------------------------------------------

    def publish(self, rec: UpdateRecord) -> None:
        """Send the record's parts (the producer's thread delivers them; ``flush`` waits). A part
        the broker refuses puts the record back in ``failed``, sent again by ``retry``: a hole in
        a partition's coverage would leave its documents unlearned."""
        for raw in encode(rec, self.rc.max_record_bytes):
            self._producer.send(self.tp.topic, value=raw, partition=0).add_errback(self._on_send_error, rec)
        self.published += 1

    def _on_send_error(self, rec: UpdateRecord, exc) -> None:  # producer thread
        log.error("update log: a record was not delivered; sending it again", extra={"error": repr(exc)})
        self.failed.append(rec)

    def retry(self) -> None:
        while self.failed:
            self.publish(self.failed.pop(0))

    def flush(self) -> None:
        """Wait until every record sent is in the log (and resend refused ones)."""
        if self._producer is not None:
            self._producer.flush(timeout=30)
            if self.failed:
                self.retry()
                self._producer.flush(timeout=30)

    def close(self) -> None:
        for c in (self._consumer, self._producer):
            if c is not None:
                try:
                    c.close()
                except Exception:  # noqa: BLE001 - closing
                    pass
        self._consumer = self._producer = None


class ReplicaMode:
    """The daemon's replica mode: join the update log, compute-and-publish batches, apply the
    log between batches, and say in snapshots which update offset the model is at."""

    def __init__(self, cfg, telemetry, checkpoints, tick=lambda: None) -> None:
        self.cfg = cfg
        self.telemetry = telemetry
        self.checkpoints = checkpoints
        self._tick = tick
        self.replica_id = cfg.replication.replica_id or f"{socket.gethostname()}-{os.getpid()}"
        self.replica: Replica | None = None
        self.sync: ReplicaSync | None = None
        self.predicted_at = 0  # the update offset of the model that made the last batch's predictions
        # Records wait here until their batch's predictions are acknowledged: what the log covers
        # has always been predicted, so a partition's next owner may resume where coverage ends.
        self.pending: dict[tuple[str, int], UpdateRecord] = {}
        self.shipper = SnapshotShipper(cfg, self.replica_id) if cfg.replication.snapshots_topic else None

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

    def join(self, model, ledger) -> None:
        """The model at its snapshot's update offset, then the log applied to its end."""
        info = getattr(model, "snapshot_info", None) or {}
        saved = (info.get("extra") or {}).get("daemon") or {}
        offset = int(saved.get("update_offset", 0))
        self.replica = Replica(model, offset=offset, ledger=ledger, owners=saved.get("owners") or {},
                               writer=f"{self.replica_id}/{uuid.uuid4().hex[:8]}")
        self.sync = ReplicaSync(self.cfg, self.replica, self.telemetry, tick=self._tick)
        self.sync.connect()
        n = self.sync.catch_up(timeout_s=600.0)
        log.info("replica joined the update log", extra={
            "replica": self.replica_id, "from_offset": offset, "applied": n, "update_offset": self.replica.offset})
        self.checkpoints.dirty = self.checkpoints.dirty or n > 0

    def compute(self, tokens: list, span, ledger, labels: list | None = None) -> Computed:
        """The batch's update record to the log (the model learns it when the log is applied),
        and its predictions from the same local step. ``span``: the batch's source offsets;
        ``labels``: its documents' targets (supervised models)."""
        self.sync.bounded()
        if span.key and span.key not in self.replica.claims:
            # The claim at assignment did not get through. (A claim of ours that another replica's
            # later claim superseded is not renewed here: this replica is then the zombie, and
            # every replica skips its records until it is assigned the partition again.)
            self.claim(span.key, ledger.epoch(span.key), timeout_s=None)
        self.telemetry.on_update_unlearned(self.replica.unlearned)
        model = self.replica.model
        self.predicted_at = self.replica.offset
        if not span.key:  # its log was found reset meanwhile: predict only
            return _predicted(model.process(model.prepare(tokens, grow=False), learn=False))
        topic, _, partition = span.key.rpartition(":")
        source = Source(topic, int(partition), span.first, span.next, ledger.epoch(span.key))
        rec, out = self.replica.compute(tokens, source, labels)
        if out is None:
            # No topics yet: predict with a scratch copy that applies this record as the log will.
            scratch = Replica(copy.deepcopy(model), offset=self.replica.offset)
            scratch.apply(rec, self.replica.offset)
            out = _predicted(scratch.model.process(scratch.model.prepare(tokens, grow=False), learn=False))
        self.pending[(span.key, span.first)] = rec
        return out

    def claim(self, key: str, epoch: int, timeout_s: float | None = 30.0) -> bool:
        """Own the input partition ``key`` in the log: publish a claim and apply the log through
        it, so the partition resumes where the learned ranges end and no earlier owner's record
        can follow (every replica skips records computed under an older claim). Retried until
        ``timeout_s`` (None: until it succeeds; the loop's heartbeat keeps the group session).
        False when it did not get through in time, or another replica claimed the partition after."""
        topic, _, partition = key.rpartition(":")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                self.sync.publish(self.replica.claim(topic, int(partition), epoch))
                self.sync.flush()
                self.sync.catch_up()  # the log's end includes the claim now (flush waited for its ack)
                if self.replica.claimed(key):
                    log.info("claimed an input partition in the update log", extra={
                        "partition": key, "claim_offset": self.replica.claims[key], "replica": self.replica_id,
                        "resume_offset": self.replica.ledger.position(key)})
                    return True
                log.warning("another replica claimed the partition after this one", extra={"partition": key})
                return False
            except Exception as exc:  # noqa: BLE001 - the broker away: try again
                if deadline is not None and time.monotonic() > deadline:
                    log.warning("could not claim an input partition; claiming again before its first batch",
                                extra={"partition": key, "error": repr(exc)})
                    return False
                log.warning("claiming an input partition failed; retrying", extra={"partition": key,
                                                                                    "error": repr(exc)})
                self._tick()
                time.sleep(1.0)

    def acked(self, meta) -> None:
        """A batch's predictions are acknowledged: its update record goes to the log."""
        rec = self.pending.pop((f"{meta.tp.topic}:{meta.tp.partition}", meta.first_offset), None)
        if rec is not None:
            self.sync.publish(rec)
            self.telemetry.on_update_published(self.replica.offset)

    def revoked(self, keys: set[str]) -> None:
        """Partitions go to other replicas: what is not acknowledged by now is theirs to learn
        (they re-read it), so its records are dropped; the rest is in the log before they start."""
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
        except Exception as exc:  # noqa: BLE001 - the broker away, or a slow log: next time
            log.warning("update log: catching up failed; retrying", extra={"error": repr(exc)})

    def finish(self) -> None:
        """Graceful stop: apply the log to its end, so the final snapshot is as fresh as it can be."""
        try:
            if self.sync is not None:
                self.sync.flush()  # our last records are in the log ...
            if self.sync is not None and self.sync.catch_up(timeout_s=30.0):  # ... and applied, with everybody's
                self.checkpoints.dirty = True
        except Exception as exc:  # noqa: BLE001 - the broker away: the snapshot is older, still valid
            log.warning("update log: could not catch up before the final snapshot", extra={"error": repr(exc)})

    def snapshot_extra(self) -> dict:
        return {"update_offset": self.replica.offset, "replica_id": self.replica_id, "owners": dict(self.replica.owners)}

    def close(self) -> None:
        if self.sync is not None:
            self.sync.close()


def _predicted(res) -> Computed:
    """A model's ``BatchResult`` as a replica's prediction."""
    return Computed(res.theta, res.scores, res.predicted, list(res.label_names or []))
