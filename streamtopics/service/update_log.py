"""The update log's reader and writer threads: Kafka's side of a replica, off the daemon's loop.

kafka-python's consumer parses fetched records inside ``poll()``, in the caller's thread, and
every ``poll()`` hands its next fetch request to the client's IO thread and waits until that
thread has run it. On the daemon's loop that cost 10-20 ms of waiting per batch (measured with
one replica at one core: the IO thread waits for the GIL behind the read-ahead and publisher
threads) before anything was applied. ``UpdateReader`` owns a consumer assigned to the update
log's one partition and runs it on its own thread: it polls, decodes every message
(``replication.decode``), puts split records back together (``Assembler``) and hands the
results to the loop **in log order** through a bounded queue, one ``Fetched`` per message. The
loop only applies them (``ReplicaSync``); nothing here touches the model, so what is applied,
and in which order, is what the loop read itself before.

``UpdateWriter`` encodes this replica's records (msgpack, split into parts when large) and hands
them to the producer on its own thread too: the loop only queues a record once its batch's
predictions are acknowledged (that order is what makes a kill -9 safe, and it is kept: a record
still queued when the process dies is lost exactly like one still in the producer's buffer).
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..stream.batching import record_print
from ..stream.consumer import ConnectionWatch
from .rebase import Rebase, RebaseJoiner
from .replication import Assembler, NewerFormat, UpdateRecord, decode, encode

__all__ = ["Fetched", "UpdateReader", "UpdateWriter"]

log = logging.getLogger("streamtopics.daemon")

_RECREATE_AFTER = 5  # consecutive poll failures before the consumer is built again


@dataclass(frozen=True)
class Fetched:
    """One update-log message, decoded: ``record`` is the whole record that completes at
    ``offset`` (None: a part of a split record still incomplete, or not an update record, in
    which case ``error`` says why)."""

    offset: int
    record: UpdateRecord | None
    error: str | None = None
    part_of: str | None = None  # a part: the id of the record it belongs to
    newer: bool = False  # an update record of a newer wire format: not to be skipped (``NewerFormat``)
    reset: bool = False  # the log is not the one this replica's offsets refer to (``error`` says why)
    truncated: bool = False  # the log no longer holds the records from ``offset`` on (retention deleted them)
    rebase: Rebase | None = None  # a whole rebase message (``rebase.py``) completes at ``offset``
    crc: int = 0  # the message's fingerprint (``record_print``): whether the log still holds it (``last``)


class UpdateReader:
    """See the module docstring. ``make_consumer()`` builds a KafkaConsumer (no group); the
    reader assigns it ``tp`` and seeks to ``start``. ``take`` is for the one applying thread."""

    def __init__(self, make_consumer: Callable[[], object], tp, start: int, max_items: int = 16,
                 poll_ms: int = 200, topic_id: str | None = None, last: tuple[int, int] | None = None) -> None:
        self._make = make_consumer
        self.tp = tp
        self.position = int(start)   # the next offset to hand over (read by the reader thread)
        # The broker's id of the log's topic (KIP-516) that the offsets refer to: from the snapshot,
        # else the first one seen. Another id means the topic was deleted and created again.
        self.topic_id = topic_id
        self.reset: str | None = None  # why the log is not the one our offsets refer to (then it stops)
        self.truncated: int | None = None  # the log's first offset, past ours: retention deleted records we need
        # (offset, fingerprint) of a message the replica had read (from its snapshot, then the last handed
        # over): read again at start and after a lost broker connection, it must come back unchanged
        self.last = tuple(last) if last else None
        self._verify = self.last is not None
        self._conns = ConnectionWatch()
        self.checked = threading.Event()  # a fetch answered: the log was compared with our offsets once
        self.highwater = int(start)  # the log's end as the newest fetch saw it
        self._queue: queue.Queue[Fetched] = queue.Queue(maxsize=max(1, max_items))
        self._assembler = Assembler()
        self._rebases = RebaseJoiner()
        self._poll_ms = int(poll_ms)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0            # consecutive poll failures
        self.last_error: str | None = None

    # -- the loop's side ------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (again, after it died: from the next offset to hand over, with the
        parts of split records it holds)."""
        if not self.alive and not self._stop.is_set():
            self._thread = threading.Thread(target=self._run, name="streamtopics-update-reader", daemon=True)
            self._thread.start()

    def take(self, timeout_s: float = 0.0) -> Fetched | None:
        """The next message in log order, waiting up to ``timeout_s`` (0: only what is decoded)."""
        try:
            return self._queue.get(timeout=timeout_s) if timeout_s > 0 else self._queue.get_nowait()
        except queue.Empty:
            return None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the thread (it closes its consumer) and wait for it."""
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout_s)
            if t.is_alive():
                log.warning("update log reader did not stop in time")

    # -- the reader thread ----------------------------------------------------------------

    def _connect(self):
        consumer = self._make()
        consumer.assign([self.tp])
        consumer.seek(self.tp, self.position)
        return consumer

    def _run(self) -> None:
        consumer = None
        try:
            while not self._stop.is_set():
                if consumer is None:
                    consumer = self._try(self._connect)
                    if consumer is None:
                        continue
                if self._verify:
                    done = self._try(lambda: self._same_last(consumer))
                    if done is None or not done[0]:
                        continue
                    self._verify = False
                    if done[1] is not None:
                        return self._lost(done[1])
                fetched = self._try(lambda: consumer.poll(timeout_ms=self._poll_ms, max_records=64))
                if fetched is None:
                    if self.failures >= _RECREATE_AFTER:  # built again, from the next offset to hand over
                        _close(consumer)
                        consumer = None
                    continue
                msgs = fetched.get(self.tp, [])
                if self.last is not None and self._conns.lost(getattr(consumer, "_client", None)):
                    self._verify = True  # the broker may have come back without its data: before these
                    consumer.seek(self.tp, self.position)
                    continue
                why = self._not_our_log(consumer, msgs)
                if why is not None:
                    return self._lost(why)
                if msgs and msgs[0].offset > self.position and self._deleted_below(consumer, msgs[0].offset):
                    return None
                if msgs:  # compared with our offsets: checked, before the (bounded) queue can block
                    self.checked.set()  # (set after queueing, a poll of > 16 records stalled a start 30 s)
                for msg in msgs:
                    fp = record_print(msg)
                    if not self._put(replace(self._decode(msg), crc=fp)):
                        return
                    self.position = msg.offset + 1
                    self.last = (msg.offset, fp)
                hw = consumer.highwater(self.tp)
                if hw is not None:
                    self.highwater = max(self.highwater, int(hw), self.position)
                if hw is not None or msgs:
                    self.checked.set()
        except Exception as exc:  # noqa: BLE001 - never die silently: the loop sees ``alive`` False
            self.last_error = repr(exc)
            log.exception("update log reader failed", extra={"error": repr(exc)})
        finally:
            if consumer is not None:
                _close(consumer)

    def _lost(self, why: str) -> None:
        """The log is not the one our offsets refer to: say so, hand the loop a reset, stop reading."""
        self.reset = why
        log.error("update log: the log is not the one this replica's offsets refer to; nothing more is applied",
                  extra={"offset": self.position, "why": why})
        self._put(Fetched(self.position, None, why, reset=True))
        self.checked.set()

    def _deleted_below(self, consumer, first: int) -> bool:
        """A fetch that begins past ``position``: the client moved to the log's beginning after an
        out-of-range fetch, so the records between were deleted (retention, DeleteRecords). Applying
        on would skip them: the replica's model could not be the one the others hold at any offset.
        Confirmed with the broker's first offset; a gap the log's beginning does not explain is
        logged and read past (a writer's control records)."""
        begin = int(consumer.beginning_offsets([self.tp])[self.tp])
        if begin <= self.position:
            log.warning("update log: offsets %d..%d hold no records; reading on", self.position, first - 1)
            return False
        self.truncated = begin
        why = (f"the update log now begins at offset {begin}: the records from {self.position} to {begin - 1} "
               f"that this replica's model needs were deleted (the topic's retention.ms or retention.bytes)")
        log.error("update log: records this replica needs were deleted; nothing more is applied",
                  extra={"offset": self.position, "log_begins": begin})
        self._put(Fetched(self.position, None, why, truncated=True))
        self.checked.set()
        return True

    def _same_last(self, consumer) -> tuple[bool, str | None]:
        """Read the message at ``last`` again: (concluded, why the log is another one, or None).
        A log that lost its data and has grown past our offset since passes every other check."""
        o, crc = self.last
        consumer.seek(self.tp, o)
        got, hw, deadline = [], None, time.monotonic() + 10.0
        try:  # polled until it answers: a seek each time would cancel the fetch in flight
            while not got and time.monotonic() < deadline and not self._stop.is_set():
                got = consumer.poll(timeout_ms=self._poll_ms, max_records=1).get(self.tp, [])
                hw = consumer.highwater(self.tp)
                if hw is not None and int(hw) <= o:
                    break
        finally:
            consumer.seek(self.tp, self.position)
        if got:
            m = got[0]
            if m.offset == o:
                same = record_print(m) == crc
                return True, None if same else f"the message at offset {o} has other contents than this replica read"
            if int(consumer.beginning_offsets([self.tp])[self.tp]) > o:
                return True, None  # retention deleted it: nothing to compare
            return True, f"the log no longer holds offset {o} (its first record is at {m.offset})"
        if hw is not None and int(hw) <= o:
            return True, f"the update log ends at {int(hw)}, at or below offset {o} that this replica read"
        return False, None

    def _not_our_log(self, consumer, msgs) -> str | None:
        """Why the log just read is not the one ``position`` refers to (None: it is). A broker that
        lost its data (tansu's memory storage restarted) or a topic deleted and created again starts
        the log over at offset 0: records there were computed against models of the old log, and
        our offsets point into it. kafka-python seeks to our position and drops a fetch's records
        below it, so records below it mean the client moved back itself (our offset was out of
        range); a high watermark below it, a log shorter than what we applied; another topic id, a
        new log that may already have grown past our offset (as in ``stream.consumer``)."""
        try:
            tid = consumer._client.cluster.topic_id(self.tp.topic)  # kafka-python 3 internals
        except Exception:  # noqa: BLE001 - absent in other versions: not checked
            tid = None
        if tid is not None:
            tid = str(tid)
            if self.topic_id is None:
                self.topic_id = tid
            elif tid != self.topic_id:
                return f"the update log's topic was created again (topic id {tid}, this model's {self.topic_id})"
        if msgs and msgs[0].offset < self.position:
            return (f"the broker's log starts over below this replica's offset {self.position} (record at "
                    f"{msgs[0].offset}): it was created again or truncated")
        if not msgs:
            try:
                hw = consumer.highwater(self.tp)
            except Exception:  # noqa: BLE001
                hw = None
            if hw is not None and int(hw) < self.position:
                return (f"the update log ends at {int(hw)}, below this replica's offset {self.position}: "
                        f"it was created again or truncated")
        return None

    def _try(self, fn):
        """``fn()``, or None after a failure (logged; waits with backoff)."""
        try:
            out = fn()
            self.failures = 0
            return out
        except Exception as exc:  # noqa: BLE001 - the broker away: again after a pause
            self.failures += 1
            self.last_error = repr(exc)
            log.warning("update log: reading failed; retrying", extra={"error": repr(exc),
                                                                        "consecutive": self.failures})
            self._stop.wait(min(5.0, 0.1 * 2 ** min(self.failures, 6)))
            return None

    def _decode(self, msg) -> Fetched:
        try:
            part, i, parts = decode(msg.value)
        except NewerFormat as exc:  # ours, from a newer release: the loop stops before it
            return Fetched(msg.offset, None, str(exc), newer=True)
        except ValueError as exc:  # not ours: skipped identically by every replica
            return Fetched(msg.offset, None, str(exc))
        if isinstance(part, Rebase):
            joined = self._rebases.add(part)
            return Fetched(msg.offset, None, rebase=joined, part_of=part.rid if joined is None else None)
        whole = self._assembler.add(part, i, parts)
        return Fetched(msg.offset, whole, part_of=part.rid if whole is None else None)

    def _put(self, item: Fetched) -> bool:
        """Into the queue, waiting while it is full (the loop applies slower than the log grows)."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False


class UpdateWriter:
    """See the module docstring. ``producer``: a KafkaProducer (thread-safe); ``on_error(rec,
    exc)`` runs on the producer's thread for a record the broker refused."""

    def __init__(self, producer, topic: str, max_bytes: int, on_error: Callable) -> None:
        self._producer = producer
        self._topic = topic
        self._max_bytes = int(max_bytes)
        self._on_error = on_error
        self._queue: queue.Queue[UpdateRecord] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def send(self, rec: UpdateRecord) -> None:
        """Queue the record (it is encoded and sent on the writer's thread)."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="streamtopics-update-writer", daemon=True)
            self._thread.start()
        self._queue.put(rec)

    def drain(self, timeout_s: float = 30.0) -> bool:
        """Wait until every queued record is in the producer's hands (True), or ``timeout_s`` passed."""
        q = self._queue
        deadline = time.monotonic() + timeout_s
        with q.all_tasks_done:
            while q.unfinished_tasks:
                left = deadline - time.monotonic()
                if left <= 0 or not (self._thread is not None and self._thread.is_alive()):
                    return False
                q.all_tasks_done.wait(min(left, 0.2))
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Hand what is queued to the producer, then stop the thread."""
        self.drain(timeout_s)
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                rec = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                for raw in encode(rec, self._max_bytes):
                    self._producer.send(self._topic, value=raw, partition=0).add_errback(self._on_error, rec)
            except Exception as exc:  # noqa: BLE001 - the producer closed or failing: sent again by retry
                self._on_error(rec, exc)
            finally:
                self._queue.task_done()


def _close(consumer) -> None:
    try:
        consumer.close()
    except Exception:  # noqa: BLE001 - closing
        pass

