"""BatchingConsumer against the real broker on loopback: batches cut by size, and the
``on_wait`` hook the daemon uses to let its publisher thread run while it is idle."""
from __future__ import annotations

import time
import uuid

import msgpack

from streamtopics.stream.consumer import BatchingConsumer, group_view, stay_in_group_on_close

from test_daemon import _produce  # noqa: E402 - tests/ is on sys.path


def test_on_wait_runs_only_when_next_batch_would_block(broker, fresh_topic):
    topic = fresh_topic()
    waits: list[int] = []
    c = BatchingConsumer(
        {"bootstrap_servers": broker.bootstrap, "group_id": f"g-{uuid.uuid4().hex[:8]}",
         "session_timeout_ms": 2000, "heartbeat_interval_ms": 500, "auto_offset_reset": "earliest",
         "enable_auto_commit": False, "fetch_max_wait_ms": 50},
        topic, max_docs=10, max_wait_ms=60000, decode=lambda r: (msgpack.unpackb(r.value), 1),
        on_wait=lambda: waits.append(1))
    try:
        assert c.next_batch(0.3) is None and waits  # nothing to read: blocked, so it said so first
        _produce(broker.bootstrap, topic, [msgpack.packb(i) for i in range(30)])
        first = None
        for _ in range(200):
            first = c.next_batch(0.1)
            if first is not None:
                break
        assert first is not None and first.decoded == list(range(10)) and first.complete
        # The next two batches are buffered already: handed out without waiting.
        waits.clear()
        rest = [c.next_batch(5.0), c.next_batch(5.0)]
        assert [b.decoded for b in rest] == [list(range(10, 20)), list(range(20, 30))]
        assert not waits
    finally:
        c.close()


def test_records_dropped_at_revocation_are_read_again_when_the_partition_comes_back(broker, fresh_topic):
    """A rebalance that revokes and re-assigns a partition whose records were buffered but not
    yet handed out: kafka-python keeps its fetch position (past those records), so unless the
    consumer seeks back they are skipped - CI lost 31 documents this way after a broker restart.
    The rebalance callbacks are driven directly; fetching, positions and seeks are the real
    client against the real broker."""
    topic = fresh_topic()
    _produce(broker.bootstrap, topic, [msgpack.packb(i) for i in range(30)])
    c = BatchingConsumer(
        {"bootstrap_servers": broker.bootstrap, "group_id": f"g-{uuid.uuid4().hex[:8]}",
         "session_timeout_ms": 2000, "heartbeat_interval_ms": 500, "auto_offset_reset": "earliest",
         "enable_auto_commit": False, "fetch_max_wait_ms": 50},
        topic, max_docs=10, max_wait_ms=60000, decode=lambda r: (msgpack.unpackb(r.value), 1))
    try:
        first = None
        for _ in range(200):
            first = c.next_batch(0.1)
            if first is not None:
                break
        assert first is not None and first.decoded == list(range(10)) and c.buffered() == 20
        # what the member knew at its assignment (logged as "group assignment"): the only member
        # computed it, from metadata listing the topic's one partition
        view = group_view(c)
        assert view["leader"] is True and view["topic_partitions"] == [0] and view["generation"] >= 0, view
        tp = c.assignment()[0]
        c._on_revoked([tp], lost=False)     # buffered 10..29 dropped; the client's position is 30
        c._on_assigned([tp])                # the owner has no offset for it (start_offset -> None)
        got = []
        for _ in range(200):
            b = c.next_batch(0.1)
            if b is not None:
                got += b.decoded
            if len(got) >= 20:
                break
        assert got == list(range(10, 30))
    finally:
        c.close()


def test_decode_ahead_decodes_the_next_batches_once_and_batches_stay_the_same(broker, fresh_topic):
    """Read-ahead (another thread decodes buffered records while the loop runs kernels):
    records within the next two batches are decoded once, batches are cut exactly as without
    it, and a record is never decoded again when its batch is handed out."""
    topic = fresh_topic()
    _produce(broker.bootstrap, topic, [msgpack.packb(i) for i in range(50)])
    calls: list[int] = []

    def decode(r):
        calls.append(r.offset)
        return msgpack.unpackb(r.value), 1

    c = BatchingConsumer(
        {"bootstrap_servers": broker.bootstrap, "group_id": f"g-{uuid.uuid4().hex[:8]}",
         "session_timeout_ms": 2000, "heartbeat_interval_ms": 500, "auto_offset_reset": "earliest",
         "enable_auto_commit": False, "fetch_max_wait_ms": 50},
        topic, max_docs=10, max_wait_ms=60000, decode=decode)
    try:
        first = None
        for _ in range(200):
            first = c.next_batch(0.1)
            if first is not None:
                break
        assert first is not None and first.decoded == list(range(10))
        for _ in range(100):  # the rest of the 50 records buffered
            if c.buffered() >= 40:
                break
            c.prefetch()
            time.sleep(0.05)
        assert c.buffered() == 40
        assert c.undecoded.is_set()
        n_before = len(calls)
        assert c.decode_ahead(max_records=15) == 15
        assert c.decode_ahead(max_records=15) == 5   # window: the next 2 batches = 20 records
        assert c.decode_ahead() == 0
        assert sorted(calls[n_before:]) == list(range(10, 30))
        got = []
        for _ in range(4):
            b = c.next_batch(0.1)
            got.append(b.decoded)
        assert got == [list(range(10 * i, 10 * i + 10)) for i in range(1, 5)]
        assert sorted(calls) == list(range(50))  # every record decoded exactly once
    finally:
        c.close()


def test_a_group_join_that_never_completes_is_abandoned_and_the_partition_read(broker, fresh_topic):
    """A JoinGroup whose response never comes holds a kafka-python consumer without partitions
    until the rebalance timeout (max_poll_interval_ms + 5 s: over 5 minutes by default); CI saw
    a daemon stay unready for 2 minutes after a broker restart. The first client's join is made
    to hang (the broker is real); the consumer gives up after ``join_patience_s`` of polling,
    builds a new client, which joins, and reads every record."""
    from kafka import KafkaConsumer

    topic = fresh_topic()
    _produce(broker.bootstrap, topic, [msgpack.packb(i) for i in range(20)])
    made = []

    def factory(**kw):
        client = KafkaConsumer(**kw)
        if not made:
            coord = client._coordinator

            async def hang():
                await coord._manager._net.sleep(3600)

            coord._do_join_and_sync_async = hang
        made.append(client)
        return client

    c = BatchingConsumer(
        {"bootstrap_servers": broker.bootstrap, "group_id": f"g-{uuid.uuid4().hex[:8]}",
         "session_timeout_ms": 2000, "heartbeat_interval_ms": 500, "auto_offset_reset": "earliest",
         "enable_auto_commit": False, "fetch_max_wait_ms": 50},
        topic, max_docs=10, max_wait_ms=60000, decode=lambda r: (msgpack.unpackb(r.value), 1),
        factory=factory)
    assert c.join_patience_s == 6.0
    try:
        got: list = []
        t0 = time.monotonic()
        seen_joining = 0.0
        while len(got) < 20 and time.monotonic() - t0 < 60:
            b = c.next_batch(0.2)
            if b is not None:
                got += b.decoded
            if len(made) == 1:
                seen_joining = max(seen_joining, c.join_progress()["joining_s"])
        assert got == list(range(20))
        assert len(made) == 2 and c.joins_abandoned == 1 and c.recreated == 1
        assert seen_joining >= 3.0 and c.join_progress()["abandoned"] == 1  # what /readyz shows meanwhile
        assert time.monotonic() - t0 >= c.join_patience_s  # not before its patience ran out
    finally:
        c.close()


def test_a_client_that_cannot_be_rebuilt_is_retried_without_raising(broker, fresh_topic):
    """A rebuild (after poll failures, or an abandoned join) while the broker goes away leaves
    no client: kafka-python's constructor raises when it cannot bootstrap. ``next_batch`` then
    says "no batch" and builds it again later, instead of raising into the daemon's loop
    (which would end the daemon). The failed build is a real one, against a closed port."""
    from kafka import KafkaConsumer

    topic = fresh_topic()
    _produce(broker.bootstrap, topic, [msgpack.packb(i) for i in range(10)])
    calls = []

    def factory(**kw):
        calls.append(1)
        if len(calls) == 2:  # the broker is away just then
            return KafkaConsumer(**{**kw, "bootstrap_servers": "127.0.0.1:1", "bootstrap_timeout_ms": 300})
        return KafkaConsumer(**kw)

    c = BatchingConsumer(
        {"bootstrap_servers": broker.bootstrap, "group_id": f"g-{uuid.uuid4().hex[:8]}",
         "session_timeout_ms": 2000, "heartbeat_interval_ms": 500, "auto_offset_reset": "earliest",
         "enable_auto_commit": False, "fetch_max_wait_ms": 50},
        topic, max_docs=10, max_wait_ms=60000, decode=lambda r: (msgpack.unpackb(r.value), 1), factory=factory,
        start_offset=lambda tp: 0)  # the owner says where to resume (the daemon: its model's offsets)
    try:
        def read_all():
            for _ in range(300):
                b = c.next_batch(0.1)
                if b is not None:
                    return b.decoded
            return None

        assert read_all() == list(range(10))
        c.close()                        # what a failed rebuild leaves: no client
        assert c.next_batch(0.1) is None and len(calls) == 2 and "KafkaTimeoutError" in c.last_error
        got = read_all()
        assert len(calls) == 3 and got == list(range(10))  # built again, resumed where its owner said
    finally:
        c.close()


def _member(broker, topic: str, group: str) -> BatchingConsumer:
    return BatchingConsumer(
        {"bootstrap_servers": broker.bootstrap, "group_id": group, "session_timeout_ms": 2000,
         "heartbeat_interval_ms": 500, "auto_offset_reset": "earliest", "enable_auto_commit": False,
         "fetch_max_wait_ms": 50},
        topic, max_docs=10, max_wait_ms=200, decode=lambda r: (msgpack.unpackb(r.value), 1))


def _read_between(members, want: int, timeout_s: float) -> set:
    got: set = set()
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for m in members:
            b = m.next_batch(0.05)
            if b is not None:
                got.update(b.decoded)
    return got


def test_members_stopped_in_turn_and_restarted_into_their_group_get_its_partitions(broker, fresh_topic):
    """tansu keeps a member that left during a rebalance as the group's leader, so a leader that
    left right after a follower (a rolling stop) froze the group: the restarted members' every
    SyncGroup was refused for a minute or more (42-78 refusals measured). A leader whose group is
    rebalancing now closes without LeaveGroup and is expired after a session timeout; a follower,
    and a leader of a stable group, still leave at once."""
    topic = fresh_topic(partitions=2)
    group = f"g-{uuid.uuid4().hex[:8]}"
    _produce(broker.bootstrap, topic, [msgpack.packb(i) for i in range(40)])
    first = [_member(broker, topic, group), _member(broker, topic, group)]
    try:
        assert _read_between(first, 40, 60) == set(range(40))
        leader = [m for m in first if group_view(m).get("leader")]
        assert len(leader) == 1, [group_view(m) for m in first]
        follower = first[1 - first.index(leader[0])]
        assert not stay_in_group_on_close(follower._consumer)  # leaves: its partition is handed over now
        # the leader of a stable group would leave at once too (its next heartbeat finds it stable)
        assert not stay_in_group_on_close(leader[0]._consumer)
    finally:
        follower.close()
        leader[0].close()  # right after: the group is rebalancing (follower gone) as the leader stops
    _produce(broker.bootstrap, topic, [msgpack.packb(i) for i in range(40, 80)])
    again = [_member(broker, topic, group), _member(broker, topic, group)]
    try:
        # Before: no partition for over a minute. Now: a session timeout (2 s) plus two joins.
        # (Nothing was committed, so both partitions are read from their beginning.)
        assert _read_between(again, 80, 30) == set(range(80))
        # Alone in its group (as a single daemon is), the leader leaves as before: no restart delay.
        again.pop().close()
        deadline = time.monotonic() + 30
        while len(again[0].assignment()) < 2 and time.monotonic() < deadline:
            again[0].next_batch(0.05)
        assert len(again[0].assignment()) == 2 and group_view(again[0]).get("leader")
        assert not stay_in_group_on_close(again[0]._consumer)
    finally:
        for m in again:
            m.close()
