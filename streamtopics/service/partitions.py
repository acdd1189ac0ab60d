"""Where each input partition resumes, what is learned from it, which log it is: pure bookkeeping.

``PartitionBook`` wraps the offset ledger (``ledger.py``: learned offset ranges per partition and
log epoch, saved in every snapshot) with the state the rebalance and reset callbacks change:
partitions found reset (re-read from their beginning), the topic ids of logs left behind, the
batch being learned right now, and the assignment. No Kafka here: partitions are
``"topic:partition"`` keys and topic ids are strings the caller gets from its client, so every
rule is unit-testable (``tests/test_service_partitions.py``). The daemon calls it from its
loop and from the consumer's callbacks, which run on the same thread.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from .ledger import OffsetLedger, fingerprint

__all__ = ["PartitionBook", "Span", "tp_key"]

log = logging.getLogger("streamtopics.daemon")


def tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


@dataclass(frozen=True)
class Span:
    """The offsets a batch covers once learned (records skipped as already learned are inside
    it), the fingerprints of its first and last records, and the id of the log (topic id) the
    consumer read them from, when it knows one that is not a log already left."""

    key: str
    first: int
    next: int
    head: int | None
    tail: int | None = None
    topic_id: str | None = None

    @classmethod
    def of(cls, rb) -> Span:
        r0, r1 = rb.records[0], rb.records[-1]
        return cls(tp_key(rb.topic, rb.partition), rb.first_offset, rb.next_offset,
                   fingerprint(r0.value, r0.timestamp), fingerprint(r1.value, r1.timestamp))

    def read_from(self, topic_id: str | None) -> Span:
        """This span, read from the log with ``topic_id``."""
        return replace(self, topic_id=topic_id)


class PartitionBook:
    """Offsets, epochs and topic ids of the input partitions; see the module docstring.

    ``telemetry`` receives ``on_partition_reset``, ``on_quarantined(partition)`` and
    ``on_offsets_skipped(skipped)``; ``changed()`` is called when the state a snapshot holds
    changed outside a learned batch (a new epoch).
    """

    def __init__(self, telemetry, changed: Callable[[], None] = lambda: None) -> None:
        self.ledger = OffsetLedger()
        self.telemetry = telemetry
        self._changed = changed
        self.reread: set[str] = set()  # partitions found reset: re-read from their beginning
        self.left_topic_ids: dict[str, str] = {}  # ids of logs found reset behind us (never recorded again)
        self.in_batch: Span | None = None  # the batch being learned (None: between batches)
        self.assigned: list[tuple[str, int]] = []
        # Replica mode: ``through_log(key, epoch, topic_id) -> bool`` moves a partition to a new
        # epoch through the update log (a claim); the ledger is never changed here then.
        self.through_log: Callable[[str, int, str | None], bool] | None = None

    def adopt(self, ledger: OffsetLedger) -> None:
        """A loaded snapshot's ledger replaces ours."""
        self.ledger = ledger
        self.reread.clear()

    # -- where to read ------------------------------------------------------------------

    def start_offset(self, topic: str, partition: int, topic_id: str | None, have_snapshot: bool) -> int | None:
        """Where a newly assigned partition resumes: an offset, 0 for its beginning, or None for
        the group's committed offset. ``topic_id``: the client's id of the topic now."""
        key = tp_key(topic, partition)
        if self.in_batch is not None:
            # Asked by the prefetch poll in the middle of a batch: that batch will be learned,
            # so its partition resumes after it.
            return self.in_batch.next if self.in_batch.key == key else self.ledger.position(key)
        if key in self.reread:
            return 0  # its log was found reset: from the beginning (the ledger skips what was learned)
        if self.ledger.position(key) is not None and (
                self.topic_recreated(topic, topic_id) if self.through_log is None
                else self.another_log(topic, key, self.current_topic_id(topic, topic_id))):
            return 0  # a new log: from its beginning (out of range on a trimmed log -> earliest)
        pos = self.ledger.position(key)
        if pos is None and (not have_snapshot or key in self.ledger.keys()):
            # Nothing learned from this log by this model's lineage. Without any snapshot the
            # group's committed offset means nothing (commits never pass a snapshot: a committed
            # offset without one is a lost lineage's): read from the earliest offset. A known
            # partition in a new epoch: its new log from the beginning. The single daemon notes the
            # partition in its ledger (replicas' ledgers change only through the update log): a first
            # snapshot holds one partition's batch, and without the note a restart read the others from
            # the group's committed offset, skipping what no snapshot held (a fault audit found it).
            if self.through_log is None:
                self.ledger.note(key)
            return 0
        return pos  # None: a partition this lineage never saw -> the group's committed offset

    def before(self, topic: str, partition: int, start: int | None) -> int | None:
        """The fingerprint of the record just before ``start`` (where a partition resumes), when
        this model learned it: the consumer reads it again first and resets the partition if it
        has other contents (a new log that has grown past our offset)."""
        return None if start is None else self.ledger.tail(tp_key(topic, partition), start)

    def current_topic_id(self, topic: str, client_id: str | None) -> str | None:
        """The client's topic id of ``topic``, None when unknown or still naming a log we left."""
        return None if client_id is None or client_id == self.left_topic_ids.get(topic) else client_id

    def saved_topic_id(self, topic: str) -> str | None:
        for key in self.ledger.keys():
            if key.rpartition(":")[0] == topic and self.ledger.topic_id(key) is not None:
                return self.ledger.topic_id(key)
        return None

    def topic_recreated(self, topic: str, client_id: str | None) -> bool:
        """The topic the saved offsets refer to was deleted and created again (another topic id):
        its offsets mean nothing in the new log, even where they are in range. New epochs."""
        now = self.current_topic_id(topic, client_id)
        if not self.another_log(topic, None, now):
            return False
        log.warning("topic was recreated since the model's offsets were saved (another topic id): reading it "
                    "from its beginning", extra={"topic": topic, "saved_topic_id": self.saved_topic_id(topic),
                                                 "topic_id": now})
        for key in [k for k in self.ledger.keys() if k.rpartition(":")[0] == topic]:
            self.ledger.new_epoch(key, now)
            self.telemetry.on_partition_reset()
        self._changed()
        return True

    def another_log(self, topic: str, key: str | None, now: str | None) -> bool:
        """Whether ``now`` (the topic's id now) names another log than the one the learned offsets
        of ``key`` refer to: its epoch's own topic id, else the topic's (``key`` None: the topic's)."""
        saved = (self.ledger.topic_id(key) if key is not None else None) or self.saved_topic_id(topic)
        return saved is not None and now is not None and saved != now

    # -- replica mode: the ledger is the replicated one and changes only through the log ----

    def claim_epoch(self, topic: str, partition: int, client_id: str | None) -> tuple[str, int, str | None]:
        """Replica mode: the claim of a newly assigned partition: its key, the epoch to claim it in,
        and the topic's id now.
        A partition whose topic was created again is claimed in a new epoch: applying the claim
        moves every replica's ledger, in log order (a move made here alone made this replica skip
        records every other replica applied: docs/scale-out.md, "When the update log is lost")."""
        key = tp_key(topic, partition)
        now = self.current_topic_id(topic, client_id)
        epoch = self.ledger.epoch(key)
        if self.ledger.position(key) is None or not self.another_log(topic, key, now):
            return key, epoch, now
        log.warning("topic was recreated since the model learned this partition (another topic id): "
                    "claiming it in a new epoch", extra={"partition": key, "saved_topic_id": self.ledger.topic_id(key),
                                                         "topic_id": now, "epoch": epoch + 1})
        self.telemetry.on_partition_reset()
        return key, epoch + 1, now

    def record_topic_id(self, key: str, topic: str, client_id: str | None) -> None:
        """Remember which log (topic id) the offsets of ``key`` refer to, after learning from it."""
        if self.current_topic_id(topic, client_id) is None:
            # After a log reset the client's metadata can still name the log we left; recording
            # that id would make the next assignment think the topic was recreated again and
            # re-read what was just learned. Wait for the new id.
            return
        self.left_topic_ids.pop(topic, None)
        self.ledger.set_topic_id(key, client_id)

    # -- rebalance and reset callbacks --------------------------------------------------

    def assign(self, tps: list[tuple[str, int]]) -> list[tuple[str, int]]:
        """Partitions assigned; returns those to hold (quarantined)."""
        self.assigned = sorted(set(self.assigned) | set(tps))
        return [tp for tp in tps if self.ledger.is_quarantined(tp_key(*tp))]

    def revoke(self, tps: list[tuple[str, int]]) -> None:
        gone = set(tps)
        self.assigned = [tp for tp in self.assigned if tp not in gone]

    def on_reset(self, topic: str, partition: int, expected: int, highwater: int) -> bool:
        """The consumer found the log behind our position and re-reads it from its beginning.
        Whether it is a new log (new epoch) or the same one served again is decided by the
        ledger when the records arrive; records already learned are never learned again.
        Returns True when the partition is quarantined now (hold it)."""
        key = tp_key(topic, partition)
        if self.in_batch is not None and self.in_batch.key == key:
            self.in_batch = Span("", 0, 0, None)  # a log we left: the batch's offsets are not recorded
        left = self.ledger.topic_id(key)
        if left is not None:
            self.left_topic_ids[topic] = left
        self.reread.add(key)
        self.telemetry.on_partition_reset()
        if self.ledger.note_reset(key, f"expected offset {expected}, found {highwater}"):
            reason = self.ledger.quarantined()[key]
            log.error("partition quarantined: its log keeps being reset; not reading it any more",
                      extra={"topic": topic, "partition": partition, "reason": reason})
            self.telemetry.on_quarantined(partition)
            return True
        return False

    # -- batches ------------------------------------------------------------------------

    def batch_key(self, topic: str, partition: int, first_offset: int) -> str:
        """The memoized update's key of a batch: stable across restarts, new per log epoch."""
        key = f"{topic}:{partition}:{first_offset}"
        epoch = self.ledger.epoch(tp_key(topic, partition))
        return f"{key}~{epoch}" if epoch else key

    def admit(self, rb, topic_id: str | None):
        """The batch without records the ledger says were learned already (or came out of
        order); None when nothing is left or the partition is quarantined."""
        key = tp_key(rb.topic, rb.partition)
        if self.ledger.is_quarantined(key):
            return None
        self.reread.discard(key)
        offsets = [r.offset for r in rb.records]
        prints = [fingerprint(r.value, r.timestamp) for r in rb.records]
        now = self.current_topic_id(rb.topic, topic_id)
        if self.through_log is not None and self.ledger.starts_epoch(key, offsets, prints, now):
            # Replica mode: a new log of an owned partition, moved to its new epoch through the log
            # (after this replica's own records of the old one: the claim applies the log through it).
            if not self.through_log(key, self.ledger.epoch(key) + 1, now):
                return None  # stopping (read again after the restart), or another replica owns it now
        adm = self.ledger.admit(key, offsets, prints, topic_id=now)
        if adm.new_epoch:
            self._changed()
            log.warning("records at offsets already learned have other contents: a new log; new epoch",
                        extra={"partition": rb.partition, "first_offset": rb.first_offset,
                               "epoch": self.ledger.epoch(key)})
        if not adm.n_skipped:
            return rb
        self.telemetry.on_offsets_skipped(adm.skipped)
        log.warning("records skipped: the model learned these offsets of this log already",
                    extra={"partition": rb.partition, "first_offset": rb.first_offset,
                           "next_offset": rb.next_offset, "skipped": adm.skipped})
        keep = [i for i, k in enumerate(adm.keep) if k]
        if not keep:
            return None
        rb.records = [rb.records[i] for i in keep]
        rb.decoded = [rb.decoded[i] for i in keep]
        return rb

    def learned(self, span: Span) -> bool:
        """The batch of ``span`` is in the model: record its offsets (unless its log was found
        reset meanwhile). Returns whether they were recorded."""
        if not span.key:
            return False
        self.ledger.learned(span.key, span.first, span.next, span.head, tail_print=span.tail)
        return True
