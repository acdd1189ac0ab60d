"""Per-partition record buffers cut into deterministic batches: the half of the consumer that
knows no Kafka (``consumer.BatchingConsumer`` fetches into it and applies its decisions).

A batch is consecutive records of **one** partition, taken from the head of that partition's
buffer; it closes at the first record where it holds ``max_docs`` documents or ``max_docs``
records (array messages carry several documents), so when the records are already there a
batch depends only on the offset it starts from.  A batch that cannot fill up is handed out
once its first record has waited ``max_wait_s``.  ``decode(record) -> (decoded, n_docs)`` runs
once per record, lazily when batches are cut, or ahead on another thread (``decode_ahead``).

**Continuity.** A partition resumed at offset X (assigned again, or after the connection to the
broker was lost) is read from X - 1 when the fingerprint of the record at X - 1 is known: that
record must come back with the same contents, else the log is another one than the offsets refer
to (recreated, or served by a broker that lost its data), even where it has grown past X
(``verify``). Kafka's own consumer validates its position after a leader change the same way
with leader epochs (KIP-320); a record fingerprint needs no broker support.

Records only need an ``offset`` (``value`` and ``timestamp`` for fingerprints); partitions any
hashable key (the consumer uses kafka-python's ``TopicPartition``).  Every method takes
``lock`` (re-entrant: the consumer holds it around compound steps, and kafka-python's
rebalance callbacks run on its IO thread).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BufferedRecord", "Cut", "PartitionBuffers", "PartitionState", "fingerprint", "record_print"]


def fingerprint(value: bytes | None, timestamp: int | None) -> int:
    """A 32-bit fingerprint of one record (value and create timestamp)."""
    import crc32c

    head = (int(timestamp or 0) & ((1 << 64) - 1)).to_bytes(8, "little")
    return crc32c.crc32c(value or b"", crc32c.crc32c(head))


def record_print(record: Any) -> int:
    return fingerprint(getattr(record, "value", None), getattr(record, "timestamp", None))


@dataclass(slots=True)
class BufferedRecord:
    record: Any
    arrived: float  # monotonic time the record entered the buffer
    decoded: Any = None
    n_docs: int = -1
    decode_s: float = 0.0
    claimed: bool = False  # being decoded ahead on another thread


@dataclass
class PartitionState:
    buffer: deque = field(default_factory=deque)
    expected: int | None = None  # offset of the next record to accept
    paused: bool = False
    held: bool = False  # the owner stopped reading it (quarantine): paused, nothing handed out
    verify: int | None = None  # fingerprint the record at ``expected`` must have (it is then dropped)
    last: Any = None  # the newest record accepted (its successor is ``expected``)

    def next_offset(self) -> int | None:
        """First offset not handed out yet (None: unknown, the group's position decides)."""
        return self.buffer[0].record.offset if self.buffer else self.frontier()

    def frontier(self) -> int | None:
        """One past the newest record read or being verified: the log must reach it."""
        return self.expected + 1 if self.verify is not None else self.expected


@dataclass
class Cut:
    """A batch cut from one partition's buffer."""

    tp: Hashable
    entries: list[BufferedRecord]
    complete: bool  # closed by the size rule (False: closed by max_wait)
    waited_seconds: float


class PartitionBuffers:
    """Buffers of the assigned partitions; what to cut, pause, resume and where to restart."""

    def __init__(self, max_docs: int, max_wait_s: float, decode: Callable[[Any], tuple[Any, int]]) -> None:
        self.max_docs = max(1, int(max_docs))
        self.max_wait_s = max(0.0, float(max_wait_s))
        self.pause_at = 4 * self.max_docs  # a partition holding this many records is paused
        self.decode = decode
        self.lock = threading.RLock()
        self.undecoded = threading.Event()  # set when records arrive: work for decode_ahead
        self._parts: dict[Hashable, PartitionState] = {}
        self._resume: dict[Hashable, int] = {}  # revoked partitions: first offset not handed out
        self._handed: dict[Hashable, Any] = {}  # per partition the last record handed out

    # -- assignment ------------------------------------------------------------------------
    def assign(self, tp: Hashable, start: int | None, before: int | None = None) -> int | None:
        """A fresh buffer for ``tp``; returns the offset to seek to: ``start`` (the owner's), else
        where we stopped handing out records when it was revoked, else None (the group decides).
        ``before``: the fingerprint of the record just before ``start`` when the owner knows it;
        it (or the last record handed out, when that is the one) is verified first: the seek
        goes one record back."""
        with self.lock:
            st = self._parts[tp] = PartitionState()
            resume = self._resume.pop(tp, None)
            off = start if start is not None else resume
            if off is None:
                return None
            st.expected = int(off)
            handed = self._handed.get(tp)
            if before is None and handed is not None and handed.offset == off - 1:
                before = record_print(handed)
            if before is not None and off > 0:
                st.expected, st.verify = int(off) - 1, int(before)
            return st.expected

    def rewind(self, tp: Hashable) -> int | None:
        """After the connection to the broker was lost: read ``tp`` again from the last record
        accepted, which must come back unchanged (``verify``). Returns the offset to seek to
        (None: not assigned, held, or no known position).

        The poll that saw the lost connection dropped its records, and the client's position
        has moved past them, so every partition with a known position is sought back to it,
        also when a verification is already pending (the second of two lost connections) or
        nothing was accepted yet. Until 2026-11-29 those two returned None and were not sought:
        the next fetch started past the dropped records, and they were never read (a replicas
        audit: 94-168 records of a partition lost after a 30 s broker freeze, 2 runs of 17)."""
        with self.lock:
            st = self._parts.get(tp)
            if st is None or st.held or st.expected is None:
                return None
            if st.verify is None and st.last is not None and st.expected == st.last.offset + 1:
                st.expected, st.verify = st.last.offset, record_print(st.last)
            return st.expected

    def rewind_all(self) -> dict[Hashable, int]:
        """``rewind`` every partition: {partition: offset to seek to} of those rewound."""
        with self.lock:
            out = {tp: self.rewind(tp) for tp in list(self._parts)}
        return {tp: off for tp, off in out.items() if off is not None}

    def verify(self, tp: Hashable, records: list) -> int | None:
        """Check fetched records against a pending verification: the offset of a record at the
        verified offset with other contents (another log: the caller resets the partition), else
        None. A matching record is consumed (the next one is expected); a fetch starting past the
        verified offset (no record there: compacted, a transaction marker) ends the check."""
        with self.lock:
            st = self._parts[tp]
            if st.verify is None or not records:
                return None
            r = next((r for r in records if r.offset >= st.expected), None)  # earlier: a stale fetch
            if r is None:
                return None
            if r.offset == st.expected:
                if record_print(r) != st.verify:
                    return r.offset
                st.expected = r.offset + 1
            st.verify = None
            return None

    def revoke(self, tp: Hashable) -> None:
        """Drop ``tp``'s buffer and remember the first offset not handed out."""
        with self.lock:
            st = self._parts.pop(tp, None)
            if st is not None:
                first = st.next_offset()
                if first is not None:
                    self._resume[tp] = int(first)

    def hold(self, tp: Hashable) -> bool:
        """Stop handing out ``tp`` (buffer dropped, resumable from its head); False if not assigned."""
        with self.lock:
            st = self._parts.get(tp)
            if st is None:
                return False
            st.held = True
            st.expected = st.next_offset()
            st.verify = None
            st.buffer.clear()
            return True

    def set_paused(self, tp: Hashable, paused: bool) -> None:
        with self.lock:
            st = self._parts.get(tp)
            if st is not None:
                st.paused = paused

    def clear(self) -> None:
        with self.lock:
            self._parts.clear()

    # -- intake ----------------------------------------------------------------------------
    def accepts(self, tp: Hashable) -> bool:
        """False for a partition revoked while its fetch was in flight, or held."""
        st = self._parts.get(tp)
        return st is not None and not st.held

    def below_expected(self, tp: Hashable, records: list) -> int | None:
        """The first fetched offset when it lies below the one expected (the log moved back), else None."""
        st = self._parts[tp]
        if records and st.expected is not None and records[0].offset < st.expected:
            return records[0].offset
        return None

    def behind(self, tp: Hashable, highwater: int | None) -> bool:
        """True when the log ends below the offset expected next (it was recreated or truncated)."""
        st = self._parts[tp]
        end = st.frontier()
        return highwater is not None and end is not None and highwater < end

    def reset(self, tp: Hashable) -> tuple[int | None, int]:
        """Forget ``tp``'s offsets (its log is not the one they refer to); returns (the offset
        that was expected, records dropped from the buffer)."""
        with self.lock:
            st = self._parts[tp]
            old, dropped = st.frontier(), len(st.buffer)
            st.buffer.clear()
            st.expected = st.verify = st.last = None
            self._handed.pop(tp, None)
            return old, dropped

    def append(self, tp: Hashable, records: list, now: float) -> int:
        """Buffer the fetched records at or past the expected offset; returns how many."""
        st = self._parts[tp]
        if st.verify is not None:
            return 0  # ``verify`` decides first
        n = 0
        for r in records:
            if st.expected is not None and r.offset < st.expected:
                continue  # stale fetch from before a seek
            st.buffer.append(BufferedRecord(r, now))
            st.expected = r.offset + 1
            st.last = r
            n += 1
        if n:
            self.undecoded.set()
        return n

    def pause_changes(self) -> list[tuple[Hashable, bool]]:
        """(tp, pause) for the partitions to pause (buffer full) or resume (drained to half)."""
        out = []
        for tp, st in self._parts.items():
            if st.held:
                continue
            if not st.paused and len(st.buffer) >= self.pause_at:
                out.append((tp, True))
            elif st.paused and len(st.buffer) < self.pause_at // 2:
                out.append((tp, False))
        return out

    # -- state -----------------------------------------------------------------------------
    def partitions(self) -> list[Hashable]:
        with self.lock:
            return sorted(self._parts)

    def buffered(self) -> int:
        with self.lock:
            return sum(len(p.buffer) for p in self._parts.values())

    def next_offsets(self) -> dict[Hashable, int | None]:
        """Per partition the first offset not handed out yet (None: unknown)."""
        with self.lock:
            return {tp: st.next_offset() for tp, st in self._parts.items()}

    def oldest_arrival(self) -> float | None:
        with self.lock:
            heads = [st.buffer[0].arrived for st in self._parts.values() if st.buffer]
        return min(heads) if heads else None

    # -- batches ---------------------------------------------------------------------------
    def take_ready(self, now: float) -> Cut | None:
        """The next batch: a closed one, else one whose head waited ``max_wait_s``; the oldest
        head first (ties by partition).  None when no partition has one."""
        with self.lock:
            complete: list[tuple[float, Hashable, int]] = []
            due: list[tuple[float, Hashable, int]] = []
            for tp, st in self._parts.items():
                if not st.buffer or st.held:
                    continue
                n, closed = self._scan(st)
                head = st.buffer[0].arrived
                if closed:
                    complete.append((head, tp, n))
                elif now - head >= self.max_wait_s:
                    due.append((head, tp, n))
            pick = min(complete or due, default=None, key=lambda x: (x[0], x[1]))
            if pick is None:
                return None
            head, tp, n = pick
            st = self._parts[tp]
            entries = [st.buffer.popleft() for _ in range(n)]
            self._handed[tp] = entries[-1].record
        return Cut(tp, entries, complete=bool(complete), waited_seconds=now - head)

    def _scan(self, st: PartitionState) -> tuple[int, bool]:
        """How many head records form the next batch, and whether the size rule closed it."""
        docs = 0
        for i, e in enumerate(st.buffer):
            if e.n_docs < 0:
                t0 = time.perf_counter()
                e.decoded, e.n_docs = self.decode(e.record)
                e.decode_s = time.perf_counter() - t0
            docs += e.n_docs
            if docs >= self.max_docs or i + 1 >= self.max_docs:
                return i + 1, True
        return len(st.buffer), False

    def decode_ahead(self, max_records: int = 32) -> int:
        """Decode up to ``max_records`` buffered records that are not decoded yet; returns how many.

        Meant for another thread while the owner's thread runs GIL-free kernels: decoding is
        GIL-bound Python that otherwise sits on the batch loop's critical path. Only records
        within the next two batches of each partition are taken (bounded extra memory), and
        nothing else changes: batches are cut, handed out and committed by the owner's thread
        exactly as before. A record the owner's thread reaches first is decoded there too;
        ``decode`` is a pure function of the record, so either result is the same.
        """
        window = 2 * self.max_docs
        todo: list[BufferedRecord] = []
        with self.lock:
            for st in self._parts.values():
                for i, e in enumerate(st.buffer):
                    if i >= window or len(todo) >= max_records:
                        break
                    if e.n_docs < 0 and not e.claimed:
                        e.claimed = True
                        todo.append(e)
        for e in todo:
            t0 = time.perf_counter()
            try:
                decoded, n = self.decode(e.record)
            except Exception:  # noqa: BLE001 - left to the owner's thread, which reports it
                e.claimed = False
                continue
            dt = time.perf_counter() - t0
            with self.lock:
                if e.n_docs < 0:
                    e.decoded, e.n_docs, e.decode_s = decoded, n, dt
        return len(todo)
