"""Deterministic minibatches from a Kafka consumer group.

``BatchingConsumer.next_batch()`` returns a ``RecordBatch``: consecutive records
of **one** partition, cut from that partition's buffer by ``batching.PartitionBuffers``
(the Kafka-free half: the batch rule, pausing, read-ahead decoding, resume offsets):

    a batch closes at the first record where it holds ``max_docs`` documents
    or ``max_docs`` records (array messages carry several documents);

so, when the records are already in the topic, a batch depends only on the
offset it starts from — a restarted daemon that seeks to a batch boundary sees
the same batches as a run that was never interrupted. A batch that cannot fill
up (the end of the data so far) is returned once its first record has waited
``max_wait_ms``.

The daemon owns the offsets: on every assignment (``ConsumerRebalanceListener``)
each partition is sought to ``start_offset(tp)`` — the offset saved with the
model — or, when that is None, left to the group's committed offset (else
earliest). A log that was recreated or truncated behind the daemon's offset (tansu loses
everything on restart; Kafka topics can be deleted and recreated) shows either
as records *below* the expected offset (kafka-python found our offset out of
range and reset to earliest; it discards fetches that do not start at its
position, so nothing else produces them) or as a high watermark below it: the
partition is re-read from its beginning and ``on_reset`` tells the daemon. A third case shows
neither: a new log that has already grown past our offset when we fetch from it (the broker
restarted with nothing while we were paused or busy, and the producers were quicker). So a
partition resumed at X is read from X - 1 whenever the record there is known (``before_offset``
on assignment; the last record read after a lost broker connection), and the partition is reset
when that record comes back with other contents (``batching``: continuity).

Buffers are bounded: a partition holding ``4 * max_docs`` unprocessed records is
paused until the daemon has taken some. Kafka errors never escape: they are
logged, polling backs off, and after repeated failures the KafkaConsumer is
rebuilt. So is a consumer whose group join does not complete (``join_patience_s``
of polling, 3 session timeouts): a JoinGroup whose response never comes would
otherwise hold it without partitions until the rebalance timeout (kafka-python:
``max_poll_interval_ms`` + 5 s, over 5 minutes by default).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from kafka.consumer.subscription_state import ConsumerRebalanceListener
from kafka.structs import OffsetAndMetadata

from .assignment_check import JoinCheck, member_generation
from .batching import PartitionBuffers

__all__ = ["BatchingConsumer", "ConnectionWatch", "JoinWatch", "RecordBatch", "heal_lost_join", "heartbeats_unanswered",
           "stay_in_group_on_close"]

log = logging.getLogger(__name__)

_RECREATE_AFTER = 5  # consecutive poll failures before the client is rebuilt
# A healthy join takes about half a session timeout (tansu) and a rebalance waits at most one
# session timeout for a dead member to be expelled: three of them without completing is stuck.
_JOIN_PATIENCE_SESSIONS = 3.0


@dataclass(frozen=True)
class UnreadableRecord:
    """Stands for a record the Kafka client could not parse (``skip_unreadable``):
    what the pipeline reads of a ConsumerRecord, no value, and ``unreadable``, the client's error."""

    topic: str
    partition: int
    offset: int
    unreadable: str
    value: None = None
    key: None = None
    headers: None = None
    timestamp: int = -1


def unreadable_partition(consumer) -> TopicPartition | None:
    """The partition whose fetched records kafka-python failed to parse in the last ``poll`` (its
    fetcher's records next in line; kafka-python internals, None where they differ)."""
    part = getattr(getattr(consumer, "_fetcher", None), "_next_partition_records", None)
    tp = getattr(part, "topic_partition", None)
    return tp if isinstance(tp, TopicPartition) else None


def seek_to_beginning(consumer, tp: TopicPartition) -> None:
    try:
        consumer.seek_to_beginning(tp)
    except Exception as exc:  # noqa: BLE001
        log.warning("seek_to_beginning failed", extra={"error": repr(exc)})


def skip_unreadable(consumer, exc: BaseException) -> dict | None:
    """A record the client cannot parse (``CorruptRecordError``: a header key that is not UTF-8,
    a failed checksum): {partition: [an ``UnreadableRecord`` at its position]}, the partition moved
    past it, for the buffers to hand on like any record (the decoder dead-letters it, reason
    ``corrupt_record``, and its offset is committed in order); None when it is not that or the
    partition cannot be told. kafka-python (3.0.12) raises once, then spins in ``poll`` for good
    on the batch's dead record iterator: one such record hung the daemon, SIGTERM included, with
    /readyz 200 (bad-input audit). The client cannot read the rest of that record batch either, so
    each of its later records comes here in turn."""
    from kafka.errors import CorruptRecordError

    if not isinstance(exc, CorruptRecordError):
        return None
    tp = unreadable_partition(consumer)
    if tp is None:
        return None
    try:
        offset = int(consumer.position(tp))
        consumer.seek(tp, offset + 1)  # kafka-python drops the dead iterator: not next in line
    except Exception as seek_exc:  # noqa: BLE001 - not assigned any more
        log.warning("could not skip an unreadable record", extra={"error": repr(seek_exc)})
        return None
    log.error("skipping a record the Kafka client cannot read; it goes to the dead-letter topic",
              extra={"topic": tp.topic, "partition": tp.partition, "offset": offset, "error": repr(exc)})
    return {tp: [UnreadableRecord(tp.topic, tp.partition, offset, repr(exc))]}


@dataclass
class RecordBatch:
    """Consecutive records of one partition, with their decoded contents."""

    topic: str
    partition: int
    records: list[Any]
    decoded: list[Any]
    complete: bool  # closed by the size rule (False: closed by max_wait)
    decode_seconds: float = 0.0
    waited_seconds: float = 0.0

    @property
    def first_offset(self) -> int:
        return self.records[0].offset

    @property
    def next_offset(self) -> int:
        return self.records[-1].offset + 1

    @property
    def tp(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


class _Listener(ConsumerRebalanceListener):
    def __init__(self, owner: BatchingConsumer) -> None:
        self.owner = owner

    def on_partitions_revoked(self, revoked):
        self.owner._on_revoked(revoked, lost=False)

    def on_partitions_lost(self, lost):
        self.owner._on_revoked(lost, lost=True)

    def on_partitions_assigned(self, assigned):
        self.owner._on_assigned(assigned)


class JoinWatch:
    """When to give a consumer-group join up: after ``patience_s`` (3 session timeouts) of polling
    while a join is in progress and a coordinator is known (a broker away is not a join that
    hangs: reconnecting is kafka-python's). Time the caller spent elsewhere is not counted (at
    most 1 s per poll); a group that keeps rejoining counts as joining until it stays stable for
    half a session. The patience doubles after each join given up, up to 8x, and is reset once a
    group stays stable."""

    def __init__(self, session_s: float) -> None:
        self.patience_s = _JOIN_PATIENCE_SESSIONS * session_s
        self._patience_s = self.patience_s
        self._stable_for_s = 0.5 * session_s
        self._joining_s = 0.0               # polled time spent joining since the group was last stable
        self._stable_since: float | None = None
        self._last_poll: float | None = None
        self.abandoned = 0

    def observe(self, coord, now: float) -> float | None:
        """After a poll of the client whose coordinator is ``coord``: the seconds spent joining
        when the join is given up now, else None."""
        try:
            joining = _joining(coord)
            reachable = coord.coordinator_id is not None
        except Exception:  # noqa: BLE001 - kafka-python internals changed: nothing to watch
            return None
        last, self._last_poll = self._last_poll, now
        if joining and not reachable:
            self._stable_since = None
            return None
        if not joining:
            if self._stable_since is None:
                self._stable_since = now
            if now - self._stable_since >= self._stable_for_s:
                self._joining_s = 0.0
                self._patience_s = self.patience_s
            return None
        self._stable_since = None
        if last is not None:
            self._joining_s += min(1.0, max(0.0, now - last))
        if self._joining_s < self._patience_s:
            return None
        waited, self._joining_s = self._joining_s, 0.0
        self.abandoned += 1
        self._patience_s = min(2.0 * self._patience_s, 8.0 * self.patience_s)
        return waited

    def restart(self) -> None:
        """A new client: its first poll starts the count."""
        self._last_poll = self._stable_since = None

    def progress(self) -> dict:
        """For /readyz; ``stable``: the group has stood without a join in progress for half a
        session (a member given no partition then is a standby, not a join that hangs)."""
        stable = (self._stable_since is not None and self._last_poll is not None
                  and self._last_poll - self._stable_since >= self._stable_for_s)
        return {"joining_s": round(self._joining_s, 1), "patience_s": self._patience_s, "abandoned": self.abandoned,
                "stable": stable}


def _joining(coord) -> bool:
    """Whether the member behind kafka-python's coordinator ``coord`` is in a group join: a rejoin
    is due, or its JoinGroup/SyncGroup task is still in flight."""
    task = getattr(coord, "_join_task", None)
    return bool(coord.need_rejoin()) or (task is not None and not task.is_done)


def stay_in_group_on_close(consumer) -> bool:
    """Have a closing member skip its LeaveGroup when leaving could freeze its group; True when it will.

    tansu (0.6.0, and its source to date) drops a member that leaves while the group is
    rebalancing but keeps it as the group's leader: every later JoinGroup names the departed
    member as leader, no live member computes the assignment, and each SyncGroup ends in
    REBALANCE_IN_PROGRESS - measured, 42-78 refusals and 60 s to minutes without a partition for
    replicas restarted into the group. So a member mid-join (it may just have been made leader),
    and a group leader whose next heartbeat finds the group rebalancing (or does not come), close
    without leaving: the broker expires them after one session timeout, which also clears the
    leader (Apache Kafka does the same for static members). A leader waits for that heartbeat (at
    most one heartbeat interval): leaving a stable group hands its partitions over at once, where a
    member left to expire holds every partition of the group still for a session timeout at the
    next rebalance. Followers leave as before, and so does a leader that owns every partition of
    its topics (alone in its group, as a single daemon is: no other member can start a rebalance).
    """
    coord = getattr(consumer, "_coordinator", None)
    try:
        joining = _joining(coord)
        leading = bool(getattr(coord, "_is_leader", False)) and not _owns_every_partition(consumer)
        if not (joining or leading) or not callable(getattr(coord, "maybe_leave_group", None)):
            return False
        if not joining and _stable_at_next_heartbeat(coord):
            return False
        coord.maybe_leave_group = lambda *args, **kwargs: coord.reset_generation()
    except Exception:  # noqa: BLE001 - kafka-python internals changed: leave as it does
        return False
    log.info("closing the consumer without LeaveGroup (%s): the broker expires it after a session timeout",
             "joining" if joining else "group leader, group rebalancing")
    return True


def _stable_at_next_heartbeat(coord) -> bool:
    """Whether a heartbeat sent from now on is answered with the group not rebalancing (kafka-python
    asks to rejoin when it is). Waits for the member's heartbeat thread: at most one heartbeat
    interval and a second; False when none is answered by then."""
    hb = coord.heartbeat
    since = time.monotonic()
    deadline = since + float(coord.config.get("heartbeat_interval_ms", 3000)) / 1000.0 + 1.0
    while time.monotonic() < deadline:
        if hb.last_send >= since and hb.last_receive >= hb.last_send:
            return not coord.need_rejoin()
        time.sleep(0.01)
    return False


def _owns_every_partition(consumer) -> bool:
    """Whether the member is assigned every partition of the topics it subscribes to (as its
    client's metadata lists them; never blocks)."""
    try:
        mine = consumer.assignment()
        topics = {tp.topic for tp in mine} | set(consumer.subscription() or ())
        cluster = consumer._client.cluster
        every = {(t, p) for t in topics for p in (cluster.partitions_for_topic(t) or ())}
        return bool(every) and every <= {(tp.topic, tp.partition) for tp in mine}
    except Exception:  # noqa: BLE001 - no metadata: not known to be alone
        return False


def heal_lost_join(consumer) -> bool:
    """Re-run a group join whose result kafka-python 3.0 dropped; True when one was.

    When a rebalance is triggered by a partition-count change, the leader's own assignment
    makes ``need_rejoin()`` false while the JoinGroup/SyncGroup task is still in flight;
    if ``poll()`` returned early meanwhile (short timeouts, as here), the next poll no
    longer awaits the finished task, the assignment is never applied and the consumer
    owns no partition for good (seen with tansu after a restart; upstream is chasing the
    same symptom, dpkp/kafka-python#2855). That state - a finished join task nobody
    collected and no rejoin pending - is asked to rejoin, which completes normally.
    """
    coord = getattr(consumer, "_coordinator", None)
    task = getattr(coord, "_join_task", None)
    try:
        lost = task is not None and task.is_done and not coord.need_rejoin()
    except Exception:  # noqa: BLE001 - kafka-python internals changed: nothing to heal
        return False
    if lost:
        log.warning("consumer group join finished but its assignment was never applied; rejoining")
        coord.request_rejoin()
    return lost


class ConnectionWatch:
    """Whether a broker connection open at the previous poll is gone (closed; a new one may
    already stand in its place): the broker may have restarted, without its data."""

    def __init__(self) -> None:
        self._seen: frozenset = frozenset()

    def lost(self, client) -> bool:
        try:  # kafka-python 3 internals; absent in other versions -> nothing to watch
            now = frozenset(list(client._manager._conns.values()))
        except (AttributeError, RuntimeError):  # RuntimeError: changed by the IO thread meanwhile
            return False
        gone = bool(self._seen - now)
        self._seen = now
        return gone

    def restart(self) -> None:
        self._seen = frozenset()


def heartbeats_unanswered(consumer) -> bool:
    """``consumer`` (a KafkaConsumer or a BatchingConsumer) is a member of a stable group whose
    heartbeats have gone unanswered for a session timeout: the broker holds the connection but
    does not answer (hung, SIGSTOPped, overloaded). Only what ``broker_up`` reports, not
    ``connected()``: a broker restarted without its data leaves a stable-looking member with
    unanswered heartbeats too, and the daemon must go on re-creating its topics then. Measured
    with tansu SIGSTOPped: the connections stay "connected" until the request timeout (30 s)
    closes them, while heartbeats stop being answered at once; the broker counts as down from
    ``session_timeout_ms`` (10 s) on instead. Not during a rebalance (no heartbeats are sent while
    joining, which may take long with slow members); False when the internals are absent."""
    try:  # kafka-python 3 internals; a BatchingConsumer's own client
        co = getattr(consumer, "_consumer", consumer)._coordinator
        return bool(co.stable()) and bool(co.heartbeat.session_timeout_expired())
    except AttributeError:
        return False


class BatchingConsumer:
    """A KafkaConsumer in a group, with per-partition buffers cut into deterministic batches.

    ``decode(record) -> (decoded, n_docs)`` is applied once per record (lazily,
    when batches are formed); the time it takes is reported per batch.
    Callbacks: ``start_offset(tp) -> int | None`` (where to seek on assignment),
    ``before_offset(tp, start) -> int | None`` (the fingerprint of the record before it, if known),
    ``on_assigned(tps)``, ``on_revoked(tps)``, ``on_reset(tp, expected, highwater)``, and
    ``on_wait()`` just before ``next_batch`` blocks waiting for records (the caller is idle).
    """

    def __init__(
        self,
        consumer_kwargs: dict[str, Any],
        topic: str,
        *,
        max_docs: int,
        max_wait_ms: int,
        decode: Callable[[Any], tuple[Any, int]],
        start_offset: Callable[[TopicPartition], int | None] = lambda tp: None,
        on_assigned: Callable[[list[TopicPartition]], None] = lambda tps: None,
        on_revoked: Callable[[list[TopicPartition]], None] = lambda tps: None,
        on_reset: Callable[[TopicPartition, int, int], None] = lambda tp, expected, hw: None,
        on_wait: Callable[[], None] = lambda: None,
        before_offset: Callable[[TopicPartition, int], int | None] = lambda tp, start: None,
        factory: Callable[..., Any] = KafkaConsumer,
    ) -> None:
        self._kwargs = dict(consumer_kwargs)
        self.topic = topic
        self._buffers = PartitionBuffers(max_docs, max(0, int(max_wait_ms)) / 1000.0, decode)
        self.max_docs = self._buffers.max_docs
        self.max_wait_s = self._buffers.max_wait_s
        self.pause_at = self._buffers.pause_at
        # Fewer, larger polls: kafka-python's per-call work is paid once per several batches.
        self.poll_records = max(500, 2 * self.max_docs)
        self._start_offset = start_offset
        self._on_assigned_cb = on_assigned
        self._on_revoked_cb = on_revoked
        self._on_reset_cb = on_reset
        self._on_wait = on_wait
        self._before_offset = before_offset
        self._factory = factory
        self._conn_watch = ConnectionWatch()
        self.rewinds = 0  # times the assigned partitions were verified after a lost connection
        self._consumer: Any = None
        self._lock = self._buffers.lock  # listener callbacks run on kafka-python's IO thread
        self._failures = 0
        self.recreated = 0
        self.rejoins_forced = 0  # lost group joins re-run (see heal_lost_join)
        self.unreadable = 0  # records the client could not parse, skipped to the dead-letter topic
        self.assignments_refused = 0  # joins the coordinator answered against the protocol (assignment_check)
        self._join_check = JoinCheck()
        self._refused: str | None = None  # set on an assignment (IO thread), acted on by _poll
        self.undecoded = self._buffers.undecoded  # set when records arrive: work for decode_ahead
        self.resets = 0  # partition logs found recreated behind our offsets
        self.last_error: str | None = None
        self._join_watch = JoinWatch(float(self._kwargs.get("session_timeout_ms", 10000)) / 1000.0)

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Build the KafkaConsumer and subscribe (the group join happens in the first polls)."""
        if self._consumer is None:
            kwargs = self._kwargs
            if "partition_assignment_strategy" not in kwargs:
                kwargs = {**kwargs, "partition_assignment_strategy": self._join_check.new_member()}
            self._consumer = self._factory(**kwargs)
            self._consumer.subscribe([self.topic], listener=_Listener(self))
            self._join_check.warm(self._consumer, self.topic)

    def close(self) -> None:
        c, self._consumer = self._consumer, None
        if c is None:
            return
        try:
            stay_in_group_on_close(c)
            c.close(autocommit=False)
        except Exception as exc:  # noqa: BLE001
            log.warning("closing the consumer failed", extra={"error": repr(exc)})
        self._buffers.clear()

    def _watch_join(self, now: float) -> bool:
        """Rebuild the client when ``JoinWatch`` gives its group join up; True when it was rebuilt
        (what the old client returned is dropped)."""
        waited = self._join_watch.observe(getattr(self._consumer, "_coordinator", None), now)
        if waited is None:
            return False
        self._rebuild(f"group join not completed after {waited:.0f} s of polling")
        return True

    @property
    def joins_abandoned(self) -> int:
        return self._join_watch.abandoned

    @property
    def join_patience_s(self) -> float:
        return self._join_watch.patience_s

    def join_progress(self) -> dict:
        """For /readyz: the current join's polled seconds, the patience before a rebuild, joins abandoned."""
        return self._join_watch.progress()

    def _ensure_client(self) -> bool:
        """A client exists, or is built now. A rebuild that failed (the broker went away as it
        was rebuilt: kafka-python cannot bootstrap) leaves none; building it again is retried
        here, with a backoff, instead of raising into the caller's loop."""
        if self._consumer is not None:
            return True
        try:
            self.start()
            return True
        except Exception as exc:  # noqa: BLE001 - broker away: the next call tries again
            self._failed("could not build the Kafka consumer; retrying", exc)
            return False

    def _failed(self, what: str, exc: BaseException) -> None:
        """One more consecutive failure: logged, then a backoff (0.1 s doubling, at most 5 s)."""
        self._failures += 1
        self.last_error = repr(exc)
        log.warning(what, extra={"error": repr(exc), "consecutive": self._failures})
        time.sleep(min(5.0, 0.1 * 2 ** min(self._failures, 6)))

    def _rebuild(self, why: str) -> None:
        """``_recreate``, logging instead of raising when the new client cannot start (broker away:
        ``next_batch`` builds one again)."""
        try:
            self._recreate(why)
        except Exception as exc:  # noqa: BLE001
            log.error("could not recreate the consumer", extra={"error": repr(exc)})

    def _recreate(self, why: str) -> None:
        log.warning("recreating Kafka consumer", extra={"reason": why})
        self.recreated += 1
        self.close()
        self._failures = 0
        self._join_watch.restart()
        self._conn_watch.restart()
        self.start()

    # -- rebalance callbacks (kafka-python's IO thread, while poll() runs) --------------

    def _on_assigned(self, assigned) -> None:
        tps = sorted(assigned)
        with self._lock:
            for tp in tps:
                start = before = None
                try:
                    start = self._start_offset(tp)
                    before = None if start is None else self._before_offset(tp, int(start))
                except Exception as exc:  # noqa: BLE001 - never break the group protocol
                    log.exception("start_offset failed", extra={"partition": tp.partition, "error": repr(exc)})
                # Without an offset from the owner, a partition we held before goes back to the
                # records buffered and dropped at its revocation: kafka-python keeps its fetch
                # position for a partition assigned again, which is past them. With the record
                # before it known, reading starts there (continuity: see the module docstring).
                off = self._buffers.assign(tp, None if start is None else int(start), before)
                if off is not None:
                    self._consumer.seek(tp, int(off))
                log.info("partition assigned", extra={"topic": tp.topic, "partition": tp.partition, "start": (
                    off if off is not None else "committed offset, else earliest")})
        log.info("group assignment", extra={"partitions": [tp.partition for tp in tps], **group_view(self)})
        # As the group's leader, rebuild (next _poll) when the coordinator's answer broke the group
        # protocol: tansu can answer a SyncGroup with an earlier assignment of the same generation,
        # and kafka-python would never rejoin; a rejoin keeps the generation (assignment_check).
        if (why := self._join_check.judge(self._consumer, tps)) is not None:
            self.assignments_refused += 1
            self._refused = why
            log.warning("group assignment refused: rebuilding the consumer", extra={"reason": why})
        self._on_assigned_cb(tps)

    def _on_revoked(self, revoked, lost: bool) -> None:
        tps = sorted(revoked)
        for tp in tps:
            self._buffers.revoke(tp)  # buffered records are dropped; it resumes from the first of them
            log.info("partition lost" if lost else "partition revoked",
                     extra={"topic": tp.topic, "partition": tp.partition})
        self._on_revoked_cb(tps)

    def hold(self, tp: TopicPartition) -> None:
        """Stop reading ``tp`` until it is assigned again: paused, buffer dropped, no batches."""
        with self._lock:
            if not self._buffers.hold(tp):
                return
            try:
                if self._consumer is not None:
                    self._consumer.pause(tp)
                self._buffers.set_paused(tp, True)
            except Exception as exc:  # noqa: BLE001
                log.debug("pause failed: %r", exc)

    # -- state -------------------------------------------------------------------------

    def assignment(self) -> list[TopicPartition]:
        return self._buffers.partitions()

    def connected(self) -> bool:
        """True when the client holds at least one live broker connection."""
        c = self._consumer
        if c is None:
            return False
        try:  # kafka-python 3 internals; absent in other versions -> assume connected
            conns = c._client._manager._conns
        except AttributeError:
            return True
        return any(getattr(conn, "connected", False) for conn in list(conns.values()))

    def topic_id(self, topic: str) -> str | None:
        """The broker's id of ``topic`` (KIP-516, metadata v10+), or None when unknown."""
        try:
            tid = self._consumer._client.cluster.topic_id(topic)
        except Exception:  # noqa: BLE001 - kafka-python internals; absent -> unknown
            return None
        return str(tid) if tid is not None else None

    def refresh_metadata(self) -> None:
        """Ask for fresh cluster metadata (topics were just created)."""
        try:
            self._consumer._client.cluster.request_update()
        except Exception as exc:  # noqa: BLE001 - kafka-python internals; best effort
            log.debug("metadata refresh request failed: %r", exc)

    def buffered(self) -> int:
        return self._buffers.buffered()

    def lag(self) -> dict[int, int]:
        """Per assigned partition: high watermark minus the next unprocessed offset."""
        out: dict[int, int] = {}
        c = self._consumer
        if c is None:
            return out
        for tp, nxt in self._buffers.next_offsets().items():
            try:
                hw = c.highwater(tp)
            except Exception:  # noqa: BLE001 - not assigned any more
                continue
            if hw is not None and nxt is not None:
                out[tp.partition] = max(0, hw - nxt)
        return out

    def positions(self) -> dict[int, int | None]:
        return {tp.partition: off for tp, off in self._buffers.next_offsets().items()}

    # -- batches -----------------------------------------------------------------------

    def next_batch(self, timeout_s: float, should_stop: Callable[[], bool] = lambda: False) -> RecordBatch | None:
        """The next batch, or None after ``timeout_s`` without one (or when ``should_stop()``)."""
        if not self._ensure_client():
            return None
        deadline = time.monotonic() + timeout_s
        while True:
            batch = self._take_ready(time.monotonic())
            if batch is not None:
                return batch
            now = time.monotonic()
            if should_stop() or now >= deadline:
                return None
            wait = deadline - now
            oldest = self._buffers.oldest_arrival()
            if oldest is not None:
                wait = min(wait, max(0.0, oldest + self.max_wait_s - now))
            if wait > 0.0:
                self._on_wait()
            self._poll(max(0.0, min(wait, 0.25)))

    def prefetch(self) -> None:
        """Non-blocking poll when buffers run low: the fetch request goes out now and its
        response arrives while the caller computes, instead of a round trip at the next poll."""
        if self._consumer is not None and self.buffered() < self.pause_at // 2:
            self._poll(0.0)

    def _poll(self, timeout_s: float) -> None:
        c = self._consumer
        try:
            records = c.poll(timeout_ms=int(timeout_s * 1000), max_records=self.poll_records)
            self._failures = 0
        except Exception as exc:  # noqa: BLE001 - Kafka errors never escape the loop
            records = skip_unreadable(c, exc)
            if records is None:
                self._failed("poll failed", exc)
                if self._failures >= _RECREATE_AFTER:
                    self._rebuild(f"{self._failures} consecutive poll failures: {exc!r}")
                return
            self.unreadable += 1
        if heal_lost_join(self._consumer):
            self.rejoins_forced += 1
        if self._refused is not None:
            why, self._refused = self._refused, None
            self._rebuild(why)
            return
        now = time.monotonic()
        if self._watch_join(now):
            return
        with self._lock:
            if self._conn_watch.lost(self._consumer._client):
                # What this poll returned may come from a broker that lost its data since: read
                # every partition again from its last record, which must come back unchanged.
                self._rewind()
                return
            for tp, recs in records.items():
                if not self._buffers.accepts(tp):  # revoked while the fetch was in flight, or held
                    continue
                below = self._buffers.below_expected(tp, recs)
                if below is not None:
                    # kafka-python discards fetched records that do not start at its position, so
                    # records below the offset we expect mean the client itself moved back: our
                    # offset was out of range (auto_offset_reset -> earliest). The log was
                    # recreated (tansu restarted; a topic deleted and created again).
                    self._log_reset(tp, below, "records below the expected offset")
                other = self._buffers.verify(tp, recs)
                if other is not None:
                    # The record before our offset has other contents: a new log that has grown
                    # past our offset (neither check above sees it).
                    self._log_reset(tp, other, "the record before the expected offset has other contents")
                    seek_to_beginning(self._consumer, tp)
                    continue
                self._buffers.append(tp, recs, now)
            self._check_highwater(records)
            self._pause_resume()

    def _check_highwater(self, records: dict) -> None:
        c = self._consumer
        for tp in self._buffers.partitions():
            if records.get(tp):
                continue
            try:
                hw = c.highwater(tp)
            except Exception:  # noqa: BLE001
                continue
            if not self._buffers.behind(tp, hw):
                continue
            # The log is shorter than what we already read: it was recreated or truncated.
            self._log_reset(tp, hw, "high watermark below the expected offset")
            seek_to_beginning(self._consumer, tp)

    def _rewind(self) -> None:
        offsets = self._buffers.rewind_all()
        for tp, off in offsets.items():
            try:
                self._consumer.seek(tp, off)
            except Exception as exc:  # noqa: BLE001 - not assigned any more: its next owner verifies
                log.debug("seek failed: %r", exc)
        if offsets:
            self.rewinds += 1
            log.info("a broker connection was lost: verifying that each partition's last record "
                     "read comes back unchanged", extra={"partitions": len(offsets)})

    def _log_reset(self, tp: TopicPartition, found: int, why: str) -> None:
        """The partition's log is not the one our offsets refer to: forget them, tell the owner."""
        old, dropped = self._buffers.reset(tp)
        log.warning("partition log is behind our offset: it was recreated or truncated; "
                    "re-reading it from its beginning", extra={
                        "topic": tp.topic, "partition": tp.partition, "expected_offset": old,
                        "found_offset": found, "why": why, "dropped_buffered": dropped})
        self.resets += 1
        self._on_reset_cb(tp, old, found)

    def _pause_resume(self) -> None:
        c = self._consumer
        for tp, pause in self._buffers.pause_changes():
            try:
                if pause:
                    c.pause(tp)
                else:
                    c.resume(tp)
                self._buffers.set_paused(tp, pause)
            except Exception as exc:  # noqa: BLE001
                log.debug("pause/resume failed: %r", exc)

    def _take_ready(self, now: float) -> RecordBatch | None:
        with self._lock:
            cut = self._buffers.take_ready(now)
            if cut is None:
                return None
            self._pause_resume()
        e = cut.entries
        return RecordBatch(cut.tp.topic, cut.tp.partition, [x.record for x in e], [x.decoded for x in e],
                           complete=cut.complete, decode_seconds=sum(x.decode_s for x in e),
                           waited_seconds=cut.waited_seconds)

    def decode_ahead(self, max_records: int = 32) -> int:
        """Decode up to ``max_records`` buffered records ahead (another thread); see
        ``PartitionBuffers.decode_ahead``. Returns how many."""
        return self._buffers.decode_ahead(max_records)

    # -- offsets -----------------------------------------------------------------------

    def commit_async(self, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``{tp: next_offset}`` without waiting; failures are logged (the snapshot holds the truth)."""
        if self._consumer is not None and offsets:
            commit_offsets(self._consumer, offsets, self._commit_failed, None)

    def commit(self, offsets: dict[TopicPartition, int], timeout_s: float = 10.0) -> bool:
        """Commit ``{tp: next_offset}`` to the group. Advisory (the snapshot holds the truth): errors are logged."""
        return (self._consumer is not None and bool(offsets)
                and commit_offsets(self._consumer, offsets, self._commit_failed, timeout_s))

    def _commit_failed(self, error: str) -> None:
        self.last_error = error


def commit_offsets(client, offsets: dict[TopicPartition, int], failed: Callable[[str], None],
                   timeout_s: float | None) -> bool:
    """Commit ``{tp: next_offset}`` with the KafkaConsumer ``client``: waiting up to ``timeout_s``
    (True when committed), or without waiting when it is None. A failure is logged and passed to
    ``failed`` (its repr), never raised."""
    def report(error, offs: dict) -> None:
        failed(repr(error))
        log.warning("offset commit failed", extra={"error": repr(error), "offsets": {
            f"{tp.topic}:{tp.partition}": off for tp, off in offs.items()}})

    def done(committed, response):  # commit_async's callback
        if isinstance(response, BaseException):
            report(response, {tp: om.offset for tp, om in committed.items()})

    request = {tp: OffsetAndMetadata(int(off), "", -1) for tp, off in offsets.items()}
    try:
        if timeout_s is None:
            client.commit_async(request, callback=done)
        else:
            client.commit(request, timeout_ms=int(timeout_s * 1000))
        return True
    except Exception as exc:  # noqa: BLE001
        report(exc, offsets)
        return False


def group_view(consumer: BatchingConsumer) -> dict:
    """What ``consumer``'s group member knew when it was assigned partitions: the generation,
    whether it computed the assignment (the leader), and the partitions its metadata lists for
    the topic. Logged with each assignment ("group assignment"): one missing partitions of the
    topic then shows whether the metadata or the group was behind. Empty where kafka-python's
    internals differ; never blocks."""
    view: dict = {}
    client = consumer._consumer
    if (mg := member_generation(client)) is not None:
        view["generation"] = mg[1]
        view["leader"] = bool(getattr(client._coordinator, "_is_leader", False))
    try:
        known = client._client.cluster.partitions_for_topic(consumer.topic)
        view["topic_partitions"] = sorted(known) if known is not None else None
    except Exception:  # noqa: BLE001
        pass
    return view
