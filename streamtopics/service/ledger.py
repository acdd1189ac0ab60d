"""The offset ledger: which record offsets the model has learned, per partition and log epoch.

Pure Python, no Kafka: the daemon asks it before learning a batch and tells it after.

A partition (``"topic:partition"``) has a current **epoch**: one incarnation of its log.
The epoch changes only when the log is positively known to be another one:

* the broker's topic id differs from the one recorded for the epoch (topic deleted and
  created again, a broker that lost its data created it anew), or
* a record comes back at an offset the epoch already learned, but with other contents
  (the fingerprint - crc32c of value and timestamp - kept for the first record of every
  learned batch differs): the offsets were reused by a new log.

The fingerprint of the record just before ``position`` (the **tail**) is kept too: a
partition resumed there is read from one record earlier, and that record must come back
unchanged (``stream.batching``), so a new log that has grown past our offset is found
before anything in it is skipped.

Within an epoch the learned offsets are a short list of ``[first, next)`` ranges. A record
whose offset lies in them is **never learned again**, whatever the broker returns (a
re-read after a reset of the same log, duplicate or non-monotonic offsets from a broker
that corrupted its log): ``admit`` skips it with a reason. A partition found reset more
than ``max_resets`` times within ``window_s`` is **quarantined**: the caller stops reading
it and reports it (metric, log, readiness) instead of re-reading in a loop. A reset that
turns out to lead to a new log (a new epoch) does not count: only resets that serve again
what was learned do.

The ledger is saved in every snapshot (``to_dict``/``from_dict``), next to the model it
describes, so what a snapshot claims and what its model learned cannot drift apart.
"""
from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..stream.batching import fingerprint

__all__ = ["Admission", "OffsetLedger", "SKIP_REASONS", "fingerprint"]

SKIP_REASONS = ("already_learned", "non_monotonic")
MAX_MARKS = 4096      # fingerprints of batch heads kept per partition (newest)
MAX_RANGES = 64       # learned ranges kept per epoch (oldest merged away; see _add_range)
KEEP_EPOCHS = 4       # past epochs kept (for reports; only the current one filters)
FORMAT = 1


@dataclass
class Admission:
    """What ``admit`` decided for one batch."""

    keep: list[bool]                         # per record: learn it
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> records
    new_epoch: bool = False                  # the batch showed a new log: a new epoch began

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped.values())


@dataclass
class _Epoch:
    number: int
    topic_id: str | None = None
    ranges: list[list[int]] = field(default_factory=list)  # sorted, disjoint [first, next)

    def covers(self, offset: int) -> bool:
        for a, b in self.ranges:
            if a <= offset < b:
                return True
            if offset < a:
                return False
        return False


@dataclass
class _Partition:
    epoch: _Epoch
    past: list[_Epoch] = field(default_factory=list)
    marks: OrderedDict = field(default_factory=OrderedDict)  # offset -> fingerprint (current epoch)
    tail: tuple[int, int] | None = None                       # (offset, fingerprint) before position
    resets: deque = field(default_factory=deque)             # monotonic times (not saved)
    quarantine: str | None = None                            # reason (not saved: a restart retries)


class OffsetLedger:
    """Learned offset ranges per partition and epoch; see the module docstring."""

    def __init__(self, max_resets: int = 10, window_s: float = 600.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_resets = int(max_resets)
        self.window_s = float(window_s)
        self.clock = clock
        self._parts: dict[str, _Partition] = {}

    # -- queries -----------------------------------------------------------------------

    def _part(self, key: str) -> _Partition:
        p = self._parts.get(key)
        if p is None:
            p = self._parts[key] = _Partition(_Epoch(0))
        return p

    def keys(self) -> list[str]:
        return sorted(self._parts)

    def epoch(self, key: str) -> int:
        p = self._parts.get(key)
        return p.epoch.number if p is not None else 0

    def epochs(self) -> dict[str, int]:
        return {k: p.epoch.number for k, p in self._parts.items() if p.epoch.number}

    def topic_id(self, key: str) -> str | None:
        p = self._parts.get(key)
        return p.epoch.topic_id if p is not None else None

    def position(self, key: str) -> int | None:
        """Where reading resumes: the end of the last learned range of the current epoch
        (None: nothing learned in it)."""
        p = self._parts.get(key)
        if p is None or not p.epoch.ranges:
            return None
        return p.epoch.ranges[-1][1]

    def positions(self) -> dict[str, int]:
        """``{"topic:partition": next offset}`` of every partition with something learned."""
        return {k: p.epoch.ranges[-1][1] for k, p in self._parts.items() if p.epoch.ranges}

    def tail(self, key: str, start: int) -> int | None:
        """The fingerprint of the record at ``start - 1`` when known (the newest learned record
        of the current epoch, when ``start`` is where reading resumes)."""
        p = self._parts.get(key)
        if p is None or p.tail is None or p.tail[0] != int(start) - 1:
            return None
        return p.tail[1]

    def ranges(self, key: str) -> list[tuple[int, int]]:
        p = self._parts.get(key)
        return [tuple(r) for r in p.epoch.ranges] if p is not None else []

    def learned_count(self, key: str | None = None, all_epochs: bool = True) -> int:
        """Offsets covered by learned ranges (an upper bound of the records learned: gaps
        in a log's offsets, such as transaction markers, are covered too)."""
        keys = [key] if key is not None else list(self._parts)
        n = 0
        for k in keys:
            p = self._parts.get(k)
            if p is None:
                continue
            for e in ([p.epoch] + (p.past if all_epochs else [])):
                n += sum(b - a for a, b in e.ranges)
        return n

    def covers(self, key: str, offset: int) -> bool:
        p = self._parts.get(key)
        return p is not None and p.epoch.covers(offset)

    def quarantined(self) -> dict[str, str]:
        return {k: p.quarantine for k, p in self._parts.items() if p.quarantine}

    def is_quarantined(self, key: str) -> bool:
        p = self._parts.get(key)
        return p is not None and p.quarantine is not None

    # -- decisions ---------------------------------------------------------------------

    def admit(self, key: str, offsets: Sequence[int], prints: Sequence[int] | None = None,
              topic_id: str | None = None) -> Admission:
        """Which records of a batch (offsets in arrival order) may be learned.

        A batch touching offsets the current epoch learned is first checked for a new log
        (fingerprints of batch heads, then the topic id); if it is the same log, those
        records are skipped (``already_learned``). Offsets not above the previous kept one
        are skipped (``non_monotonic``).
        """
        p = self._part(key)
        out = Admission([True] * len(offsets))
        covered = [p.epoch.covers(o) for o in offsets]
        if any(covered) and self._is_new_log(p, offsets, prints, covered, topic_id):
            self.new_epoch(key, topic_id)
            out.new_epoch = True
            covered = [False] * len(offsets)
        last = None
        for i, o in enumerate(offsets):
            if covered[i]:
                reason = "already_learned"
            elif last is not None and o <= last:
                reason = "non_monotonic"
            else:
                last = o
                continue
            out.keep[i] = False
            out.skipped[reason] = out.skipped.get(reason, 0) + 1
        return out

    def starts_epoch(self, key: str, offsets: Sequence[int], prints: Sequence[int] | None = None,
                     topic_id: str | None = None) -> bool:
        """Whether ``admit`` would start a new epoch for this batch (changes nothing)."""
        p = self._parts.get(key)
        if p is None:
            return False
        covered = [p.epoch.covers(o) for o in offsets]
        return any(covered) and self._is_new_log(p, offsets, prints, covered, topic_id)

    @staticmethod
    def _is_new_log(p: _Partition, offsets, prints, covered, topic_id) -> bool:
        if prints is not None:
            for o, fp, c in zip(offsets, prints, covered):
                if c and o in p.marks:
                    return p.marks[o] != fp  # the first stored head decides
        # No stored head among them: only another topic id proves another log.
        return topic_id is not None and p.epoch.topic_id is not None and topic_id != p.epoch.topic_id

    def learned(self, key: str, first: int, next_offset: int, head_print: int | None = None,
                topic_id: str | None = None, tail_print: int | None = None) -> None:
        """The model learned the records of ``[first, next_offset)`` (skipped ones included:
        they were learned before); ``tail_print``: the fingerprint of the record at
        ``next_offset - 1``."""
        if next_offset <= first:
            return
        self.name_log(key, topic_id)
        p = self._part(key)
        self._add_range(p.epoch, int(first), int(next_offset))
        if p.epoch.ranges[-1][1] == int(next_offset):
            p.tail = None if tail_print is None else (int(next_offset) - 1, int(tail_print))
        if head_print is not None:
            p.marks[int(first)] = int(head_print)
            while len(p.marks) > MAX_MARKS:
                p.marks.popitem(last=False)

    @staticmethod
    def _add_range(e: _Epoch, a: int, b: int) -> None:
        rs = e.ranges
        rs.append([a, b])
        rs.sort()
        merged: list[list[int]] = []
        for r in rs:
            if merged and r[0] <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], r[1])
            else:
                merged.append(list(r))
        while len(merged) > MAX_RANGES:
            # Bound the size: close the smallest gap among the oldest ranges (offsets in such a
            # gap were never delivered in order; treating them as learned only skips them).
            i = min(range(len(merged) - 1), key=lambda j: merged[j + 1][0] - merged[j][1])
            merged[i][1] = merged[i + 1][1]
            del merged[i + 1]
        e.ranges = merged

    def new_epoch(self, key: str, topic_id: str | None = None) -> int:
        """A new log for ``key``: its offsets mean nothing in the old one. Returns the epoch."""
        p = self._part(key)
        if p.epoch.ranges or p.epoch.topic_id is not None:
            p.past.append(p.epoch)
            del p.past[:-KEEP_EPOCHS]
        p.epoch = _Epoch(p.epoch.number + 1, topic_id)
        p.marks.clear()
        p.tail = None
        if p.resets:
            # The newest reset is explained: it led to a new log, not to the same records again.
            # Only resets that keep serving what was learned count towards the quarantine.
            p.resets.pop()
        return p.epoch.number

    def note(self, key: str) -> None:
        """Know ``key`` with nothing learned in it yet (a partition this model reads from its start),
        so that a snapshot names it and a restart reads it from its start again, never from the group's
        committed offset (which can only be another model's, or a lost newer snapshot's)."""
        self._part(key)

    def set_topic_id(self, key: str, topic_id: str) -> None:
        self._part(key).epoch.topic_id = topic_id

    def name_log(self, key: str, topic_id: str | None) -> None:
        """Give the current epoch of ``key`` the topic id of its log, unless it has one (or ``topic_id``
        is None): which log its offsets refer to, from the first record or claim that knew it."""
        p = self._part(key)
        if topic_id is not None and p.epoch.topic_id is None:
            p.epoch.topic_id = topic_id

    def note_reset(self, key: str, why: str = "") -> bool:
        """The consumer found the partition's log behind its position and re-reads it.
        Returns True when this makes the partition quarantined (too many resets)."""
        p = self._part(key)
        now = self.clock()
        p.resets.append(now)
        while p.resets and now - p.resets[0] > self.window_s:
            p.resets.popleft()
        if p.quarantine is None and len(p.resets) > self.max_resets:
            p.quarantine = (f"{len(p.resets)} log resets within {self.window_s:g} s "
                            f"(limit {self.max_resets}){': ' + why if why else ''}; "
                            "re-reading stopped: check the broker's log for this partition, then restart")
            return True
        return False

    def release(self, key: str) -> None:
        """Lift a quarantine (operator action / tests)."""
        p = self._parts.get(key)
        if p is not None:
            p.quarantine = None
            p.resets.clear()

    # -- persistence -------------------------------------------------------------------

    def to_dict(self) -> dict:
        def ep(e: _Epoch) -> dict:
            return {"n": e.number, "topic_id": e.topic_id, "ranges": [list(r) for r in e.ranges]}

        return {"format": FORMAT, "partitions": {
            k: {"epoch": ep(p.epoch), "past": [ep(e) for e in p.past],
                "marks": [[o, f] for o, f in p.marks.items()],
                **({"tail": list(p.tail)} if p.tail is not None else {})}
            for k, p in self._parts.items()}}

    @classmethod
    def from_dict(cls, d: dict | None, **kw) -> OffsetLedger:
        led = cls(**kw)
        if not d:
            return led
        if int(d.get("format", 0)) > FORMAT:
            raise ValueError(f"offset ledger format {d.get('format')} is newer than this streamtopics ({FORMAT})")

        def ep(x: dict) -> _Epoch:
            return _Epoch(int(x["n"]), x.get("topic_id"), [[int(a), int(b)] for a, b in x.get("ranges", [])])

        for k, x in (d.get("partitions") or {}).items():
            p = _Partition(ep(x["epoch"]), [ep(e) for e in x.get("past", [])])
            for o, f in x.get("marks", []):
                p.marks[int(o)] = int(f)
            if x.get("tail") is not None:
                p.tail = (int(x["tail"][0]), int(x["tail"][1]))
            led._parts[str(k)] = p
        return led

    @classmethod
    def from_offsets(cls, offsets: dict[str, int], epochs: dict[str, int] | None = None,
                     topic_ids: dict[str, str] | None = None, **kw) -> OffsetLedger:
        """A ledger for a snapshot written before ledgers existed: each partition learned
        ``[0, offset)`` of its current epoch (what the old format meant)."""
        led = cls(**kw)
        epochs = epochs or {}
        topic_ids = topic_ids or {}
        for k in set(offsets) | set(epochs):
            p = led._part(str(k))
            p.epoch.number = int(epochs.get(k, 0))
            p.epoch.topic_id = topic_ids.get(str(k).rpartition(":")[0])
            if k in offsets and int(offsets[k]) > 0:
                p.epoch.ranges = [[0, int(offsets[k])]]
        return led
