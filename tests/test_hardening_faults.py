"""Broker loss, disk faults and a model that raises, against the real bundled broker.

In-process daemons (``Daemon.run`` on a thread), real tansu on loopback. Disk faults and
model failures are injected with ``streamtopics.testing.faults`` (``OSError(ENOSPC)`` and
``OSError(EROFS)`` raised inside the snapshot writer; running as root, a read-only
directory cannot be made with chmod) or by a tokenizer-level poison word.
"""
from __future__ import annotations

import time

import msgpack
import pytest
from kafka import KafkaAdminClient

from streamtopics import load_snapshot
from streamtopics.config import Config
from streamtopics.daemon import Daemon
from streamtopics.model import TopicModel
from streamtopics.testing import faults
from streamtopics.testing.broker import EmbeddedBroker, create_topics
from streamtopics.stream.codec import decode_dead_letter, decode_prediction

from test_daemon import (  # noqa: E402 - the daemon tests' helpers
    _own_broker,
    _cfg,
    _cfg_dict,
    _consumed,
    _docs,
    _get,
    _produce,
    _read_all,
    _running,
    _samples,
    _topics,
    _wait,
)


@pytest.fixture
def injector():
    yield faults.install
    faults.install(None)


def _partitions(bootstrap: str, names: list[str]) -> dict[str, int]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return {d["name"]: len(d["partitions"]) for d in admin.describe_topics(names)
                if d.get("error_code", 0) == 0}
    finally:
        admin.close()


@pytest.mark.parametrize("idempotent", [False, True], ids=["plain", "idempotent"])
def test_broker_restart_daemon_reconnects_rereads_the_new_log_and_loses_nothing(tmp_path, idempotent):
    """tansu restarted (memory storage: topics, data, group offsets gone). The daemon must
    report the outage on /metrics and /readyz, reconnect, notice that the new log is behind
    its offset and re-read it from the start, and keep everything it had learned.

    tansu auto-creates any topic a client asks metadata for (4 partitions), whatever the
    client's ``allow_auto_create_topics``: the daemon's own re-creation is checked below
    on an empty broker, where nobody races it."""
    b = EmbeddedBroker()
    try:
        b.start()
        topics = {"input": "docs", "output": "preds", "dead_letter": "dlq"}
        cfg = _cfg(b.bootstrap, topics, tmp_path / "snaps",
                   kafka={"create_topics": True, "enable_idempotence": idempotent})
        with _running(cfg) as d:
            url = d.metrics_url
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(100)])
            _wait(lambda: _consumed(d, "docs", 100), 60, "documents before the loss")
            b.stop(grace_s=0)
            _wait(lambda: _samples(url)[("streamtopics_broker_up", ())] == 0, 20, "broker_up 0")
            assert _get(url + "/readyz")[0] == 503 and _get(url + "/healthz")[0] == 200
            b.start()
            _wait(lambda: _get(url + "/readyz")[0] == 200, 40, "ready again")
            # More documents than the old offset (100): a consumer that kept its position would
            # silently skip the first 100 of the new log.
            new = _docs(150, 100)
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in new])
            _wait(lambda: d.status()["documents"] >= 250, 60, "documents after the broker came back")
            time.sleep(0.5)  # a document learned twice would show here
            assert d.status()["documents"] == 250, d.status()
            _wait(lambda: _get(url + "/readyz")[0] == 200, 40, "ready")
            s = _samples(url)
            assert s[("streamtopics_partition_resets_total", ())] >= 1
            assert s[("streamtopics_broker_up", ())] == 1
            recreated = s[("streamtopics_kafka_client_recreations_total", (("client", "producer"),))]
            print(f"\nbroker restart ({'idempotent' if idempotent else 'plain'} producer): "
                  f"producer rebuilt {recreated:.0f} times, partition resets "
                  f"{s[('streamtopics_partition_resets_total', ())]:.0f}")
        preds = {decode_prediction(r.value)["id"] for r in _read_all(b.bootstrap, "preds", want=150)}
        assert preds == {x["id"] for x in new}
        m = load_snapshot(d.last_snapshot)
        assert m.state.docs_seen == 250  # nothing learned before the loss was lost
        offsets = m.snapshot_info["offsets"]
        assert sum(v for k, v in offsets.items() if k.startswith("docs:")) == 150
        assert m.snapshot_info["extra"]["daemon"]["epochs"].get("docs:0") == 1
    finally:
        b.cleanup()


def test_missing_topics_are_created_with_the_configured_partitions_and_counted(tmp_path):
    b = EmbeddedBroker()
    try:
        b.start()
        topics = {"input": "docs2", "output": "preds2", "dead_letter": "dlq2"}
        cfg = _cfg(b.bootstrap, topics, tmp_path / "snaps", kafka={"create_topics": True, "input_partitions": 2})
        d = Daemon(cfg, serve_metrics=False)
        d.session.ensure_topics(timeout_s=5.0)
        assert _partitions(b.bootstrap, list(topics.values())) == {"docs2": 2, "preds2": 2, "dlq2": 1}
        assert d.metrics.topic_creations._value.get() == 1
        d.session.ensure_topics(timeout_s=5.0)  # all there: nothing created, nothing counted
        assert d.metrics.topic_creations._value.get() == 1
        # Clients of a daemon that creates its topics never auto-create them (real Kafka honours it).
        assert d.session.consumer_kwargs()["allow_auto_create_topics"] is False
        assert d.session.producer_kwargs()["allow_auto_create_topics"] is False
    finally:
        b.cleanup()


def test_disk_full_and_read_only_keep_the_previous_snapshots_and_alert(broker, fresh_topic, tmp_path, injector):
    topics = _topics(fresh_topic)
    snaps = tmp_path / "snaps"
    cfg = _cfg(broker.bootstrap, topics, snaps, snapshot={"every_batches": 1, "keep": 10})
    docs = _docs(300)
    with _running(cfg) as d:
        url = d.metrics_url
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in docs[:100]])
        _wait(lambda: _consumed(d, topics["input"], 100), 60, "first documents")
        _wait(lambda: len(list(snaps.glob("*.stsnap"))) == 2, 10, "two snapshots")
        kept = {p.name: p.read_bytes() for p in snaps.glob("*.stsnap")}

        injector("snapshot_write:1+:enospc")  # the disk is full from now on
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in docs[100:200]])
        _wait(lambda: _consumed(d, topics["input"], 200), 60, "documents while the disk is full")
        s = _samples(url)
        assert s[("streamtopics_snapshot_failures_total", (("reason", "disk_full"),))] >= 1
        assert s[("streamtopics_snapshot_consecutive_failures", ())] >= 1
        assert s[("streamtopics_documents_total", ())] == 200 and d.status()["ready"]

        injector("snapshot_write:1+:erofs")  # remounted read-only
        d.checkpoints.retry_at = 0.0  # do not wait the 30 s retry pause in a test
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in docs[200:250]])
        _wait(lambda: _consumed(d, topics["input"], 250), 60, "documents on a read-only disk")
        _wait(lambda: _samples(url)[("streamtopics_snapshot_failures_total", (("reason", "permission"),))] >= 1,
              10, "permission failure counted")
        # Every earlier snapshot is intact, byte for byte, and no temp file is left behind.
        assert {p.name: p.read_bytes() for p in snaps.glob("*.stsnap")} == kept
        assert not list(snaps.glob(".*.tmp"))

        injector(None)  # the disk is back
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in docs[250:300]])
        _wait(lambda: _consumed(d, topics["input"], 300), 60, "documents after recovery")
    assert d.metrics.snapshot_consecutive_failures._value.get() == 0
    newest = load_snapshot(d.last_snapshot)
    assert newest.snapshot_info["offsets"] == {f"{topics['input']}:0": 300}

    # The newest snapshot is truncated on disk: a restart resumes from the newest valid one.
    d.last_snapshot.write_bytes(d.last_snapshot.read_bytes()[:4096])
    with _running(cfg) as d2:
        assert d2.model.snapshot_info["offsets"][f"{topics['input']}:0"] == 100
        _wait(lambda: _consumed(d2, topics["input"], 300), 60, "replay from the newest valid snapshot")
        assert _samples(d2.metrics_url)[("streamtopics_snapshot_load_failures_total", ())] == 1
    assert load_snapshot(d2.last_snapshot).state.docs_seen == 300


def test_documents_the_model_raises_on_are_dead_lettered_and_the_daemon_goes_on(
        broker, fresh_topic, tmp_path, injector, monkeypatch):
    poison = "xyzzypoison"
    real_prepare = TopicModel.prepare

    def prepare(self, tokens, grow=True):
        if any(poison in t for t in tokens):
            raise ValueError("poisoned document")
        return real_prepare(self, tokens, grow=grow)

    monkeypatch.setattr(TopicModel, "prepare", prepare)
    topics = _topics(fresh_topic)
    good = _docs(200)
    values = [msgpack.packb(x) for x in good[:100]]
    values.insert(10, msgpack.packb({"id": "bad-1", "text": f"oil prices {poison} rose"}))
    values.insert(70, msgpack.packb([{"id": "arr-ok", "text": "wheat exports fell"},
                                     {"id": "bad-2", "text": f"{poison} grain"}]))
    offsets = _produce(broker.bootstrap, topics["input"], values)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snaps")
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(values)), 60, "poisoned batches")
        # A failure no single document explains (the whole step raises): the batch is
        # dead-lettered, never retried, and the next batch is learned.
        injector("learn:1:raise")
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in good[100:150]])
        _wait(lambda: _consumed(d, topics["input"], len(values) + 50), 60, "failing batch")
        injector(None)
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in good[150:200]])
        _wait(lambda: _consumed(d, topics["input"], len(values) + 100), 60, "healthy batch")
        s = _samples(d.metrics_url)
        assert d.status()["ready"]
    dls = [decode_dead_letter(r.value) for r in _read_all(broker.bootstrap, topics["dead_letter"], want=52)]
    assert all(dl["reason"] == "model_error" and "raised" in dl["detail"] for dl in dls)
    narrowed = {dl["source"]["offset"]: dl for dl in dls if "poisoned" in dl["detail"]}
    assert sorted(narrowed) == [offsets[10], offsets[70]]
    assert narrowed[offsets[70]]["index"] == 1 and msgpack.unpackb(narrowed[offsets[70]]["raw"])["id"] == "bad-2"
    assert sum(1 for dl in dls if "injected" in dl["detail"]) == 50
    assert s[("streamtopics_dead_letters_total", (("reason", "model_error"),))] == 52
    assert s[("streamtopics_model_errors_total", ())] == 3
    preds = {decode_prediction(r.value)["id"] for r in _read_all(broker.bootstrap, topics["output"], want=151)}
    assert preds == {x["id"] for x in good[:100] + good[150:]} | {"arr-ok"}
    assert load_snapshot(d.last_snapshot).state.docs_seen == 151


def test_topic_recreated_while_the_daemon_was_down_is_read_from_its_beginning(tmp_path):
    """The broker lost everything while the daemon was stopped, and the new log has grown past
    the saved offset (100 < 150): the offset is in range, so only the topic id (KIP-516) tells
    that it belongs to another log. Without the check the first 100 new documents are skipped."""
    with _own_broker(tmp_path) as (b, cfg):
        with _running(cfg) as d:
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(100)])
            _wait(lambda: _consumed(d, "docs", 100), 60, "first documents")
        first = load_snapshot(d.last_snapshot)
        assert first.snapshot_info["offsets"] == {"docs:0": 100}
        assert first.snapshot_info["extra"]["daemon"]["topic_ids"].get("docs")
        b.restart(grace_s=0)
        create_topics(b.bootstrap, {"docs": 1, "preds": 1, "dlq": 1})
        new = _docs(150, 100)
        _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in new])
        with _running(cfg) as d2:
            _wait(lambda: d2.status().get("documents", 0) >= 150, 60, "the new log from its beginning")
            assert _samples(d2.metrics_url)[("streamtopics_partition_resets_total", ())] == 1
        m = load_snapshot(d2.last_snapshot)
        assert m.state.docs_seen == 250 and m.snapshot_info["offsets"] == {"docs:0": 150}
        assert m.snapshot_info["extra"]["daemon"]["epochs"] == {"docs:0": 1}
        preds = {decode_prediction(r.value)["id"] for r in _read_all(b.bootstrap, "preds", want=150)}
        assert preds == {x["id"] for x in new}


def test_sigterm_with_the_broker_away_and_predictions_unacknowledged_skips_the_final_snapshot_and_exits_1(
        tmp_path, caplog):
    """SIGTERM after the broker froze (SIGSTOP) right after a batch was learned, its predictions not
    acknowledged. The final snapshot must not claim that batch (rule 5: its predictions may be lost;
    the model cannot be taken back to the last acknowledged batch), so it is skipped - and then the
    learned batches are in no snapshot: the exit status is 1, as for a final snapshot that failed,
    with an ERROR naming the good snapshot (it was 0 with a WARNING: an operator or supervisor read a
    complete stop). The broker back, a restart learns the rest exactly once."""
    import os
    import signal
    import threading

    from streamtopics.service.hooks import Hooks

    n, batch = 150, 50
    b = EmbeddedBroker()
    try:
        b.start()
        topics = {"input": "docs", "output": "preds", "dead_letter": "dlq"}
        create_topics(b.bootstrap, {t: 1 for t in topics.values()})
        # Snapshots: the early one after the first batch, then only at shutdown.
        cfg = _cfg(b.bootstrap, topics, tmp_path / "snaps", snapshot={"every_batches": 1000},
                   kafka={"request_timeout_ms": 5000})
        learned, frozen = [0], threading.Event()

        def freeze_after_third_batch(point):
            if point == "learned":
                learned[0] += 1
                if learned[0] == 3:
                    os.kill(b.pid, signal.SIGSTOP)
                    frozen.set()

        _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(n)])
        d = Daemon(cfg, hooks=Hooks([freeze_after_third_batch]))
        rc: list = []
        t = threading.Thread(target=lambda: rc.append(d.run()), daemon=True)
        try:
            t.start()
            assert d.wait_started(30) and frozen.wait(120)
            _wait(lambda: d.offsets.get("docs:0", 0) >= n, 30, "the third batch learned")
            time.sleep(1.0)
            assert d.outbox.pending > 0  # its predictions wait for the frozen broker
            t0 = time.monotonic()
            with caplog.at_level("INFO", logger="streamtopics"):
                d.stop()
                t.join(90)
            took = time.monotonic() - t0
        finally:
            os.kill(b.pid, signal.SIGCONT)
        assert not t.is_alive(), "daemon did not stop within 90 s"
        snaps = sorted((tmp_path / "snaps").glob("*.stsnap"))
        assert [load_snapshot(p).state.docs_seen for p in snaps] == [batch]  # nothing claimed past the acks
        skipped = [r for r in caplog.records if r.getMessage().startswith("final snapshot skipped")]
        assert skipped and skipped[0].levelname == "ERROR", [r.getMessage() for r in caplog.records][-20:]
        assert skipped[0].last_snapshot == str(snaps[0]) and skipped[0].learned == {"docs:0": n}
        assert rc == [1], (rc, took)
        print(f"\nSIGTERM, broker frozen, the last batch's predictions unacknowledged: exit {rc[0]} after "
              f"{took:.1f} s, the good snapshot ({batch} documents) kept")
        # The broker back (it kept its data): a restart resumes from the good snapshot and learns the
        # rest once.
        with _running(cfg) as d2:
            _wait(lambda: d2.offsets.get("docs:0", 0) >= n, 60, "the restart caught up")
            time.sleep(0.5)
            assert d2.model.state.docs_seen == n and d2.status()["documents"] == n - batch, d2.status()
        assert load_snapshot(d2.last_snapshot).state.docs_seen == n
    finally:
        b.cleanup()


def test_an_os_error_in_the_model_stops_the_daemon_instead_of_dead_lettering_the_documents(
        broker, fresh_topic, tmp_path, injector):
    """Bad-input audit: a full disk while numba wrote its kernel cache raised OSError in the model
    step, and every document of every batch went to the dead-letter topic as model_error, its
    offset committed: 400 good documents lost for learning. An OSError is the host's failure, not
    the documents': the batch is undone and the daemon stops (exit 1, ``HostFailure``); the restart
    learns every document once and dead-letters none."""
    from streamtopics.service.processor import HostFailure

    topics = _topics(fresh_topic)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snaps")
    _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(200)])
    injector("learn:3:enospc")  # the third batch's step
    d = Daemon(cfg, serve_metrics=False)
    assert d.run() == 1
    assert isinstance(d.error, HostFailure) and "No space left on device" in str(d.error)
    learned = d.model.state.docs_seen
    assert 0 < learned < 200
    injector(None)
    with _running(cfg) as d2:
        _wait(lambda: _consumed(d2, topics["input"], 200), 60, "every document after the restart")
        assert d2.model.state.docs_seen == 200  # the failed batch learned once, after the restart
    assert _read_all(broker.bootstrap, topics["dead_letter"], timeout_s=3) == []
