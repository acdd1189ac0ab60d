"""The update log's reader thread (service/update_log.py) on a real broker.

The loop of a replica no longer polls the update log itself: a reader thread fetches, decodes
and reassembles split records and hands them over in log order. What must not change is what
gets applied and in which order: a record split into parts applies at the offset of its last
part, after every record that completed before it, and a message that is not a record is
skipped, so a replica reading through the thread ends bit-identical to one applying the same
log in-process. And the thread must end when the replica closes, also while it waits for the
loop to take what it decoded.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from streamtopics import TopicModel
from streamtopics.config import Config
from streamtopics.corpora import load_reuters_r8
from streamtopics.service.replica_sync import NewerUpdateFormat, ReplicaSync, update_log_clients
from streamtopics.service.replication import Replica, Source, decode, digest, encode
from streamtopics.service.update_log import UpdateReader

K = 12
SPLIT = 65536  # the smallest max_record_bytes: the summary records of 300 documents come in parts


@pytest.fixture(scope="module")
def records():
    """Three update records (a first "batch" record, then two summaries) computed by one replica."""
    tok = TopicModel(n_topics=K).tokenizer
    tokens = [t for t in (tok(d.text) for d in load_reuters_r8("train")[:1000]) if t][:900]
    rep = Replica(TopicModel(n_topics=K, seed=3, threads=1))
    out = []
    for i, j in enumerate(range(0, 900, 300)):
        rec, _ = rep.compute(tokens[j:j + 300], Source("docs", 0, j, j + 300))
        rep.apply(rec, i)
        out.append(rec)
    return out


class _Telemetry:
    def __init__(self) -> None:
        self.applied = 0
        self.behind: list[int] = []

    def on_update_applied(self, seconds: float, applied: bool, births: int = 0) -> None:
        self.applied += 1

    def on_update_lag(self, n: int) -> None:
        pass

    def on_staleness(self, n: int) -> None:
        pass

    def on_own_update_learned(self, behind: int) -> None:
        self.behind.append(behind)


def _produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", max_request_size=4 * SPLIT)
    for v in values:
        p.send(topic, v, partition=0)
    p.flush(timeout=30)
    p.close(timeout=5)


def _config(broker, topic: str, compression: str = "none") -> Config:
    """Replication on, the update log on ``topic``, records split at SPLIT bytes."""
    return Config.from_dict({"kafka": {"bootstrap_servers": broker.bootstrap},
                             "replication": {"enabled": True, "updates_topic": topic, "max_record_bytes": SPLIT,
                                             "compression_type": compression}},
                            env={})


def _on_the_wire(ptr, topics, values):
    """A CSR as the update log carries it: values in float16, entries that round to zero left out."""
    half = values.astype(np.float16)
    keep = half != 0
    rows = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
    new_ptr = np.zeros_like(ptr)
    np.cumsum(np.bincount(rows[keep], minlength=ptr.size - 1), out=new_ptr[1:])
    return new_ptr, topics[keep], half[keep].astype(np.float64)


def _reader_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "streamtopics-update-reader"]


def test_split_records_apply_whole_in_log_order_through_the_reader_thread(broker, fresh_topic, records):
    topic = fresh_topic(prefix="upd")
    first, one, two = records
    parts_one = encode(one, SPLIT)
    assert len(parts_one) >= 3, "the test needs a record split into parts"
    # Log: first | one.0 | junk | two (all parts) | one.1 ... -> "two" completes, so applies, before "one".
    log_values = encode(first, SPLIT) + parts_one[:1] + [b"not an update record"] + encode(two, SPLIT) + parts_one[1:]
    _produce(broker.bootstrap, topic, log_values)
    n_first, n_two = len(encode(first, SPLIT)), len(encode(two, SPLIT))
    at_first = n_first - 1
    at_two = n_first + 2 + n_two - 1
    at_one = len(log_values) - 1

    # the reader alone: one item per message, consecutive offsets, whole records where they complete
    reader = UpdateReader(lambda: KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                                                auto_offset_reset="earliest", max_partition_fetch_bytes=4 * SPLIT),
                          TopicPartition(topic, 0), start=0, max_items=2)
    reader.start()
    try:
        items = []
        deadline = time.monotonic() + 30
        while len(items) < len(log_values) and time.monotonic() < deadline:
            item = reader.take(timeout_s=0.2)
            if item is not None:
                items.append(item)
    finally:
        reader.close()
    assert [it.offset for it in items] == list(range(len(log_values)))
    whole = {it.offset: it.record for it in items if it.record is not None}
    assert sorted(whole) == [at_first, at_two, at_one]
    assert [it.offset for it in items if it.error is not None] == [n_first + 1]
    got = whole[at_one]
    for name in ("known", "totals"):
        assert np.array_equal(getattr(got, name), getattr(one, name)), name
    assert got.topics.size < one.topics.size  # the summary's far tails round to zero and stay home
    for ptr, top, val in (("indptr", "topics", "values"), ("doc_ptr", "doc_topics", "doc_values")):
        want = _on_the_wire(getattr(one, ptr), getattr(one, top), getattr(one, val))
        assert all(np.array_equal(g, w) for g, w in zip((getattr(got, ptr), getattr(got, top), getattr(got, val)), want))
    assert got.new_words == one.new_words and got.rid == one.rid

    # a replica reading the log through ReplicaSync ends where an in-process one does, bit for bit
    reference = Replica(TopicModel(n_topics=K, seed=3, threads=1))
    for offset, raw_rec in ((at_first, first), (at_two, two), (at_one, one)):
        reference.apply(decode(encode(raw_rec)[0])[0], offset)  # the wire's float32 values
    cfg = _config(broker, topic)
    telemetry = _Telemetry()
    sync = ReplicaSync(cfg, Replica(TopicModel(n_topics=K, seed=3, threads=1)), telemetry)
    sync.connect()
    try:
        assert sync.catch_up(timeout_s=30) == 3
        assert sync.replica.offset == len(log_values) == sync.end_offset()
        assert digest(sync.replica.model) == digest(reference.model)
        assert sync.replica.applied == 3 and telemetry.applied == 3
        assert _reader_threads()
    finally:
        sync.close()
    assert not _reader_threads(), "the reader thread outlived ReplicaSync.close()"


def test_the_reader_stops_while_waiting_for_the_loop_to_take_its_records(broker, fresh_topic, records):
    topic = fresh_topic(prefix="upd")
    _produce(broker.bootstrap, topic, [encode(r)[0] for r in records] * 3)
    reader = UpdateReader(lambda: KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                                                auto_offset_reset="earliest"),
                          TopicPartition(topic, 0), start=0, max_items=1)
    reader.start()
    deadline = time.monotonic() + 30
    while reader.position < 1 and time.monotonic() < deadline:  # one handed over, the next one waiting
        time.sleep(0.05)
    assert reader.position == 1 and reader.alive
    t0 = time.monotonic()
    reader.close(timeout_s=10)
    assert time.monotonic() - t0 < 5
    assert not reader.alive and not _reader_threads()
    assert reader.take().offset == 0  # what it handed over stays there


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_records_published_through_the_writer_thread_reach_the_log_in_order(broker, fresh_topic, records,
                                                                             compression):
    topic = fresh_topic(prefix="upd")
    cfg = _config(broker, topic, compression)
    writer = ReplicaSync(cfg, Replica(TopicModel(n_topics=K, seed=3, threads=1)), _Telemetry())
    writer.connect()
    assert update_log_clients(cfg)[1].get("compression_type") == (None if compression == "none" else compression)
    try:
        for rec in records:
            writer.publish(rec)
        writer.flush()  # every record queued is in the log now
        n_parts = sum(len(encode(r, SPLIT)) for r in records)
        assert writer.end_offset() == n_parts and writer.published == 3 and not writer.failed
    finally:
        writer.close()
    assert not [t for t in threading.enumerate() if t.name == "streamtopics-update-writer"]
    # read back by a replica of the same writer: its own records, learned at their log offsets
    telemetry = _Telemetry()
    reader = ReplicaSync(cfg, Replica(TopicModel(n_topics=K, seed=3, threads=1), writer=records[0].writer), telemetry)
    reference = Replica(TopicModel(n_topics=K, seed=3, threads=1))
    at, behind = -1, []
    for rec in records:
        at += len(encode(rec, SPLIT))
        reference.apply(decode(encode(rec)[0])[0], at)
        behind.append(at - rec.base)
    reader.connect()
    try:
        assert reader.catch_up(timeout_s=30) == 3
        assert digest(reader.replica.model) == digest(reference.model)
        # each one's staleness as learned: records split into parts sit further from their base
        assert telemetry.behind == behind and max(behind) > 0
    finally:
        reader.close()
    other = _Telemetry()  # another writer's replica learns the same records, none of them its own
    reader = ReplicaSync(cfg, Replica(TopicModel(n_topics=K, seed=3, threads=1)), other)
    reader.connect()
    try:
        assert reader.catch_up(timeout_s=30) == 3 and other.applied == 3 and other.behind == []
    finally:
        reader.close()


def test_the_logs_end_counts_every_record_of_a_shared_batch(broker, fresh_topic, records):
    """tansu answers ListOffsets with the last batch's base offset + 1: with small messages
    sharing one produce batch, catch_up() stopped short of the log's end and the lag metric read
    low. The reader's fetch high watermark is the true end."""
    topic = fresh_topic(prefix="upd")
    values = encode(records[0], SPLIT) + [b"not an update record %d" % i for i in range(5)]
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=300, max_request_size=4 * SPLIT)
    for v in values[:-5]:
        p.send(topic, v, partition=0)
    p.flush(timeout=30)
    for v in values[-5:]:  # one batch of five
        p.send(topic, v, partition=0)
    p.flush(timeout=30)
    p.close(timeout=5)
    cfg = _config(broker, topic)
    sync = ReplicaSync(cfg, Replica(TopicModel(n_topics=K, seed=3, threads=1)), _Telemetry())
    sync.connect()
    try:
        deadline = time.monotonic() + 30
        while sync.replica.offset < len(values) and time.monotonic() < deadline:
            sync.catch_up(timeout_s=30)
        assert sync.replica.offset == len(values) == sync.end_offset()
        assert sync.catch_up(timeout_s=5) == 0  # at the end: nothing more to wait for
    finally:
        sync.close()


def test_a_snapshot_taken_between_the_parts_of_a_record_restores_to_the_same_model(broker, fresh_topic, records):
    """A replica whose offset has passed the first part of a split record, but not its last,
    is snapshotted: restored at that offset it must read the log again from the first part,
    or it never sees those parts and skips the record every other replica applies."""
    import copy

    topic = fresh_topic(prefix="upd")
    first, one, two = records
    parts_one = encode(one, SPLIT)
    log_values = encode(first, SPLIT) + parts_one[:1] + encode(two, SPLIT) + parts_one[1:]
    _produce(broker.bootstrap, topic, log_values)
    n_first, n_two = len(encode(first, SPLIT)), len(encode(two, SPLIT))
    cfg = _config(broker, topic)

    def synced(replica, read_from=None):
        s = ReplicaSync(cfg, replica, _Telemetry())
        s.connect(read_from=read_from)
        return s

    whole = synced(Replica(TopicModel(n_topics=K, seed=3, threads=1)))
    a = synced(Replica(TopicModel(n_topics=K, seed=3, threads=1)))
    try:
        whole.catch_up(timeout_s=30)
        a.catch_up(until=n_first + 1 + n_two, timeout_s=30)  # "two" applied, "one" still open
        assert a.replica.offset == n_first + 1 + n_two and a.replica.applied == 2
        assert a.read_from() == n_first  # where "one" began
        saved = (copy.deepcopy(a.replica.model), a.replica.offset, a.read_from())
    finally:
        whole.close()
        a.close()
    model, offset, read_from = saved
    restored = synced(Replica(copy.deepcopy(model), offset=offset), read_from=read_from)
    naive = synced(Replica(copy.deepcopy(model), offset=offset))  # what a snapshot without read_from gave
    try:
        restored.catch_up(timeout_s=30)
        naive.catch_up(timeout_s=30)
        assert restored.replica.offset == naive.replica.offset == len(log_values)
        assert restored.replica.applied == 1 and digest(restored.replica.model) == digest(whole.replica.model)
        assert naive.replica.applied == 0 and digest(naive.replica.model) != digest(whole.replica.model)
    finally:
        restored.close()
        naive.close()


def test_a_record_of_a_newer_wire_format_stops_the_replica_before_it(broker, fresh_topic, records):
    """A newer release's record is not skipped (its replicas apply it): the replica applies up to
    it, then refuses to go on, and stays refusing; nothing after it is applied."""
    import msgpack

    from streamtopics.service.replication import FORMAT_VERSION

    topic = fresh_topic(prefix="upd")
    first, one, two = records
    newer = msgpack.unpackb(encode(two)[0])
    newer["v"] = FORMAT_VERSION + 1
    values = encode(first) + encode(one) + [msgpack.packb(newer)] + encode(two)
    _produce(broker.bootstrap, topic, values)
    at_newer = len(encode(first)) + len(encode(one))
    telemetry = _Telemetry()
    sync = ReplicaSync(_config(broker, topic), Replica(TopicModel(n_topics=K, seed=3, threads=1)), telemetry)
    sync.connect()
    try:
        with pytest.raises(NewerUpdateFormat, match=f"offset {at_newer}.*version {FORMAT_VERSION + 1}"):
            sync.catch_up(timeout_s=30)
        assert sync.replica.offset == at_newer and sync.replica.applied == 2 and telemetry.applied == 2
        refused, deadline = False, time.monotonic() + 10
        while not refused and time.monotonic() < deadline:  # and stays refusing once "two" is read
            try:
                sync.apply_fetched()
                time.sleep(0.1)
            except NewerUpdateFormat:
                refused = True
        assert refused and sync.replica.offset == at_newer and sync.replica.applied == 2
    finally:
        sync.close()


def test_a_reader_far_behind_the_end_is_checked_without_waiting_for_the_loop(broker, fresh_topic):
    """verify() at a replica's start waits for ``checked``; the reader set it only after queueing
    a whole poll, and its queue (16) is not taken from during verify, so a replica restarted more
    than 16 small records behind waited the whole 30 s timeout (replicas audit: 30.5 s from
    'connected' to 'joined' at 33 records behind, 0.55 s at 14)."""
    topic = fresh_topic(prefix="upd")
    _produce(broker.bootstrap, topic, [f"small message {i}".encode() for i in range(60)])
    reader = UpdateReader(lambda: KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                                                auto_offset_reset="earliest", fetch_max_wait_ms=100),
                          TopicPartition(topic, 0), start=5)
    t0 = time.monotonic()
    reader.start()
    try:
        assert reader.checked.wait(20), "not checked: the reader blocked on its queue"
        assert time.monotonic() - t0 < 15
    finally:
        reader.close()


class _RetainedFrom:
    """A real consumer of the bundled broker, its partition's log seen as a broker with retention
    shows it after deleting the records below ``begins``: a fetch from below comes back from
    ``begins`` (kafka-python resets an out-of-range position to the earliest offset) and the
    beginning offset is ``begins``. tansu has no retention and closes the connection on
    DeleteRecords, so this is how a truncated update log is read here."""

    def __init__(self, consumer, topic: str, begins: int) -> None:
        self._c, self._topic, self._begins = consumer, topic, begins

    def __getattr__(self, name):
        return getattr(self._c, name)

    def seek(self, tp, offset):
        return self._c.seek(tp, max(offset, self._begins) if tp.topic == self._topic else offset)

    def beginning_offsets(self, tps):
        got = self._c.beginning_offsets(tps)
        return {tp: max(v, self._begins) if tp.topic == self._topic else v for tp, v in got.items()}


def test_a_log_that_retention_cut_past_the_replicas_offset_is_told_and_nothing_after_it_is_handed_over(
        broker, fresh_topic):
    """A replica restored at offset 3 of a log that now begins at 10: the client moves to 10 on
    its own, and the reader used to hand records 10.. over as if they followed 2 (the replica
    then skipped 3..9 and diverged from every other replica, silently). Now it hands over one
    ``truncated`` message with the log's beginning and stops reading."""
    topic = fresh_topic(prefix="upd")
    _produce(broker.bootstrap, topic, [f"small message {i}".encode() for i in range(20)])

    def consumer():
        return _RetainedFrom(KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=None,
                                           auto_offset_reset="earliest", fetch_max_wait_ms=100), topic, 10)

    reader = UpdateReader(consumer, TopicPartition(topic, 0), start=3)
    reader.start()
    try:
        got = reader.take(timeout_s=20)
        assert got is not None and got.truncated and got.offset == 3 and "begins at offset 10" in got.error
        assert reader.truncated == 10 and reader.take(timeout_s=1.0) is None
        reader._thread.join(5)
        assert not reader.alive
    finally:
        reader.close()
    # a reader whose offset the log still holds reads on as before
    reader = UpdateReader(consumer, TopicPartition(topic, 0), start=12)
    reader.start()
    try:
        got = reader.take(timeout_s=20)
        assert got is not None and got.offset == 12 and not got.truncated
    finally:
        reader.close()
