"""The daemon against the real Kafka-protocol broker on loopback (tansu; never a mock).

Each test uses fresh topics, a fresh consumer group and its own snapshot
directory, small models (K=10) and a few hundred Reuters R8 documents, and
bounds every wait. The exactly-once test runs the daemon as a subprocess
(``python -m streamtopics.cli run``) so it can be SIGKILLed and SIGTERMed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import msgpack
import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from streamtopics import load_snapshot
from streamtopics.config import Config, ConfigError
from streamtopics.corpora import load_reuters_r8
from streamtopics.config import check_daemon_config
from streamtopics.daemon import Daemon
from streamtopics.testing.broker import EmbeddedBroker, create_topics
from streamtopics.stream.codec import decode_dead_letter, decode_prediction

ROOT = Path(__file__).resolve().parents[1]
K = 10
BATCH = 50


# --------------------------------------------------------------------------- helpers


def _docs(n: int, offset: int = 0) -> list[dict]:
    corpus = load_reuters_r8("train")[offset: offset + n]
    return [{"id": d.id, "text": d.text, "label": d.label} for d in corpus]


def _topics(fresh_topic) -> dict[str, str]:
    return {"input": fresh_topic(prefix="in"), "output": fresh_topic(prefix="out"),
            "dead_letter": fresh_topic(prefix="dlq")}


def _cfg_dict(bootstrap: str, topics: dict, snap_dir: Path, **sections) -> dict:
    d = {
        "kafka": {"bootstrap_servers": bootstrap, "group_id": f"g-{uuid.uuid4().hex[:8]}",
                  "session_timeout_ms": 2000, "heartbeat_interval_ms": 500, "create_topics": False},
        "topics": dict(topics),
        "model": {"n_topics": K, "seed": 3},
        "batch": {"max_docs": BATCH, "max_wait_ms": 1000},
        "snapshot": {"dir": str(snap_dir), "every_batches": 4, "every_seconds": 0, "keep": 3},
        "metrics": {"port": 0},
    }
    for name, values in sections.items():
        d.setdefault(name, {}).update(values)
    return d


def _cfg(*args, **kw) -> Config:
    return Config.from_dict(_cfg_dict(*args, **kw), env={})


def _produce(bootstrap: str, topic: str, values: list[bytes], **kw) -> list[int]:
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=False, **kw)
    try:
        futs = [p.send(topic, v) for v in values]
        p.flush(timeout=30)
        return [f.get(timeout=10).offset for f in futs]
    finally:
        p.close(timeout=5)


def _read_to_end(c, tp) -> bool:
    """The consumer's position in ``tp`` has reached the high watermark of its last fetch."""
    hw = c.highwater(tp)
    return hw is not None and c.position(tp) >= hw


def _read_all(bootstrap: str, topic: str, want: int | None = None, timeout_s: float = 10.0,
              settle_s: float = 0.5) -> list:
    """Every record of ``topic`` (all partitions): until ``want`` arrived, then ``settle_s`` more;
    without ``want``, once records arrive, until the position reaches the high watermark the
    fetches report (a poll that came back empty on a loaded machine used to end the read: a
    prefix was returned). Not ListOffsets: tansu answers it with the last batch's base offset + 1."""
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      fetch_max_wait_ms=100)
    out = []
    try:
        parts = c.partitions_for_topic(topic) or {0}
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        c.assign(tps)
        c.seek_to_beginning()
        deadline = time.monotonic() + timeout_s
        quiet_until = None
        while time.monotonic() < deadline:
            got = [r for rs in c.poll(timeout_ms=100).values() for r in rs]
            out.extend(got)
            if want is not None and len(out) >= want:
                quiet_until = quiet_until or time.monotonic() + settle_s
                if time.monotonic() >= quiet_until:
                    break
            elif want is None and out and all(_read_to_end(c, tp) for tp in tps):
                break
    finally:
        c.close()
    return out


def _wait(pred, timeout_s: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@contextmanager
def _running(cfg: Config):
    d = Daemon(cfg)
    t = threading.Thread(target=d.run, name="daemon-under-test", daemon=True)
    t.start()
    try:
        assert d.wait_started(30)
        yield d
    finally:
        d.stop()
        t.join(60)
        assert not t.is_alive(), "daemon did not stop within 60 s"


@contextmanager
def _own_broker(tmp_path: Path):
    """A broker of its own (the test stops, freezes or restarts it) and a daemon config on it with
    the topics "docs", "preds", "dlq", created by the daemon: yields (broker, config)."""
    b = EmbeddedBroker()
    try:
        b.start()
        topics = {"input": "docs", "output": "preds", "dead_letter": "dlq"}
        yield b, _cfg(b.bootstrap, topics, tmp_path / "snaps", kafka={"create_topics": True})
    finally:
        b.cleanup()


def _consumed(d: Daemon, topic: str, n: int) -> bool:
    return d.status().get("offsets", {}).get(f"{topic}:0", -1) >= n


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read()


def _samples(url: str) -> dict:
    out = {}
    for fam in text_string_to_metric_families(_get(url + "/metrics")[1].decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _model_arrays(path) -> tuple:
    m = load_snapshot(path)
    st = m.state
    return m, st.docs_seen, st.lam(), st.lam_totals(), list(m.vocab.words)


# --------------------------------------------------------------------------- tests


def test_consumer_lag_is_reported_while_the_first_batch_is_in_the_works(broker, fresh_topic, tmp_path):
    """The lag gauge was set by housekeeping only, after a batch: it read 0 for the whole first
    batch, which with a cold kernel cache compiles for ~15 s (operator audit)."""
    from streamtopics.service.hooks import Hooks

    topics = _topics(fresh_topic)
    _produce(broker.bootstrap, topics["input"], [msgpack.packb(d) for d in _docs(400)])
    reached, release = threading.Event(), threading.Event()

    def hold_first_batch(point):
        if point == "batch_received" and not reached.is_set():
            reached.set()
            release.wait(30)

    d = Daemon(_cfg(broker.bootstrap, topics, tmp_path / "snaps"), hooks=Hooks([hold_first_batch]))
    t = threading.Thread(target=d.run, name="daemon-under-test", daemon=True)
    t.start()
    try:
        assert d.wait_started(30) and reached.wait(60)
        lag = _samples(d.metrics_url).get(("streamtopics_consumer_lag_messages", (("partition", "0"),)))
        assert lag == 400 - BATCH  # the records after the batch being learned
    finally:
        release.set()
        d.stop()
        t.join(30)


def test_a_first_poll_of_three_documents_seeds_three_topics_and_the_next_batch_the_rest(broker, fresh_topic,
                                                                                        tmp_path):
    """A live stream's first batch is whatever the first poll returned (seeding.py, docs/defaults.md
    §6): three documents seed three of the K topics (not K copies of three), the next batch seeds
    the rest before its local step, and streamtopics_topics_seeded says where seeding stands."""
    topics = _topics(fresh_topic)
    docs = _docs(3 + BATCH)
    _produce(broker.bootstrap, topics["input"], [msgpack.packb(d) for d in docs[:3]])
    with _running(_cfg(broker.bootstrap, topics, tmp_path / "snaps")) as d:
        url = d.metrics_url
        seeded = ("streamtopics_topics_seeded", ())
        _wait(lambda: _consumed(d, topics["input"], 3) and _samples(url).get(seeded) == 3, 60,
              "the first three documents learned, three topics seeded")
        assert d.model.state.n_seeded == 3 and not d.model.state.fully_seeded
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in docs[3:]])
        _wait(lambda: _consumed(d, topics["input"], len(docs)) and _samples(url).get(seeded) == K, 60,
              "the next batch learned, every topic seeded")
        assert d.model.state.fully_seeded


def test_n_documents_in_exactly_n_predictions_out(broker, fresh_topic, tmp_path):
    topics = _topics(fresh_topic)
    topics["snapshots"] = fresh_topic(prefix="snaps")
    docs = _docs(400)
    _produce(broker.bootstrap, topics["input"], [msgpack.packb(d) for d in docs])
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snaps")
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(docs)), 60, "all documents consumed")
        url = d.metrics_url
        s = _wait(lambda: (lambda x: x if x[("streamtopics_ready", ())] == 1 else None)(_samples(url)), 5, "ready")
        assert _get(url + "/healthz")[0] == 200
        status, body = _get(url + "/readyz")
        assert status == 200 and json.loads(body)["partitions"] == [0]
    # Counters reflect exactly the input.
    assert s[("streamtopics_documents_total", ())] == len(docs)
    assert s[("streamtopics_batches_total", ())] == len(docs) // BATCH
    assert s[("streamtopics_tokens_total", ())] > 10 * len(docs)
    assert s[("streamtopics_model_version", ())] == len(docs) // BATCH
    assert s[("streamtopics_topics_seeded", ())] == K
    assert s[("streamtopics_vocabulary_size", ())] > 1000
    assert s[("streamtopics_end_to_end_latency_seconds_count", ())] == len(docs)
    assert s[("streamtopics_local_iterations_count", ())] == len(docs)
    assert s[("streamtopics_consumer_lag_messages", (("partition", "0"),))] == 0
    assert s[("streamtopics_broker_up", ())] == 1
    assert s[("streamtopics_snapshots_total", ())] >= 2
    assert s[("streamtopics_batch_duration_seconds_count", (("stage", "predict"),))] == len(docs) // BATCH
    assert np.isfinite(s[("streamtopics_objective_per_token", ())])
    assert sum(v for (n, _), v in s.items() if n == "streamtopics_dead_letters_total") == 0

    # Exactly N predictions, matched by id, keyed by id, topics in descending order.
    recs = _read_all(broker.bootstrap, topics["output"], want=len(docs))
    preds = [decode_prediction(r.value) for r in recs]
    assert len(preds) == len(docs)
    assert Counter(p["id"] for p in preds) == Counter(d["id"] for d in docs)
    assert all(r.key == p["id"].encode() for r, p in zip(recs, preds))
    for p in preds:
        probs = [q for _, q in p["topics"]]
        assert 1 <= len(probs) <= K and probs == sorted(probs, reverse=True) and sum(probs) <= 1 + 1e-9
        assert all(0 <= k < K for k, _ in p["topics"])
        assert "label" not in p and "scores" not in p
    # Prequential: batch b is predicted by the model that had learned b batches.
    assert sorted({p["model_version"] for p in preds}) == list(range(len(docs) // BATCH))

    # The final snapshot holds the model with the offsets it has consumed.
    snaps = sorted((tmp_path / "snaps").glob("*.stsnap"))
    assert 1 <= len(snaps) <= 3  # keep = 3
    m = load_snapshot(d.last_snapshot)
    assert m.snapshot_info["offsets"] == {f"{topics['input']}:0": len(docs)}
    assert m.state.docs_seen == len(docs) and m.version == len(docs) // BATCH
    assert len(m.top_words(0, 5)) == 5
    # Each snapshot was announced for downstream jobs.
    ann = [msgpack.unpackb(r.value) for r in _read_all(broker.bootstrap, topics["snapshots"], want=3)]
    # after the first batch (a young model is covered at once), then every 4 batches; none at
    # shutdown: the snapshot after batch 8 already holds everything
    assert [a["version"] for a in ann] == [1, 4, 8]
    assert [a["seq"] for a in ann] == [1, 2, 3] and len({a["lineage"] for a in ann}) == 1
    assert ann[-1]["path"] == str(Path(d.last_snapshot).resolve())
    assert ann[-1]["offsets"] == {f"{topics['input']}:0": len(docs)}


def test_several_partitions_each_batch_from_one_partition(broker, fresh_topic, tmp_path):
    topics = _topics(fresh_topic)
    topics["input"] = fresh_topic(partitions=3, prefix="in3")
    docs = _docs(300)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5, enable_idempotence=False)
    try:
        for i, x in enumerate(docs):
            p.send(topics["input"], msgpack.packb(x), partition=i % 3)
        p.flush(timeout=30)
    finally:
        p.close(timeout=5)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snaps", model={"update": "memoized"})
    with _running(cfg) as d:
        _wait(lambda: sum(d.status().get("offsets", {}).values()) >= 300, 60, "all partitions consumed")
    offsets = load_snapshot(d.last_snapshot).snapshot_info["offsets"]
    assert offsets == {f"{topics['input']}:{i}": 100 for i in range(3)}
    # Memoized batches are keyed by partition and first offset: one partition per batch.
    keys = sorted(k for k, _ in d.model.updater.cache_items())
    assert keys == sorted(f"{topics['input']}:{i}:{o}" for i in range(3) for o in (0, 50))
    preds = [decode_prediction(r.value)["id"] for r in _read_all(broker.bootstrap, topics["output"], want=300)]
    assert sorted(preds) == sorted(x["id"] for x in docs)


def test_malformed_input_goes_to_dead_letters_and_good_documents_still_flow(broker, fresh_topic, tmp_path):
    topics = _topics(fresh_topic)
    good = _docs(120)
    bad = [
        (b"\xc1\x00not msgpack", "malformed_msgpack"),
        (msgpack.packb({"id": "no-text"}), "missing_text"),
        (msgpack.packb({"id": "wrong-type", "text": 12345}), "bad_text"),
        (msgpack.packb({"id": 3.5, "text": "a float id"}), "bad_id"),
        (msgpack.packb({"id": "huge", "text": "word " * 2_000_000}), "message_too_large"),  # 10 MB
        (msgpack.packb({"id": "blank", "text": "   "}), "empty_document"),
        (msgpack.packb({"id": "stopwords", "text": "the and of to a in"}), "empty_document"),
        (msgpack.packb({"id": "extra", "text": "grain wheat exports", "color": "red"}), "unknown_field"),
        (msgpack.packb("a bare string"), "not_a_document"),
    ]
    # An array (minibatch) message: two good documents around one bad element.
    array_msg = msgpack.packb([{"id": "arr-0", "text": "oil prices rose sharply in trading"},
                               {"id": "arr-1", "text": 7},
                               {"id": "arr-2", "text": "the bank raised interest rates"}])
    values, expect = [], {}
    for i, d in enumerate(good):
        values.append(msgpack.packb(d))
        if i % 13 == 5 and bad:
            raw, reason = bad.pop(0)
            expect[len(values)] = reason
            values.append(raw)
    expect[len(values)] = "bad_text"
    values.append(array_msg)
    assert not bad
    offsets = _produce(broker.bootstrap, topics["input"], values, max_request_size=16 << 20)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snaps")
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(values)), 60, "all messages consumed")
        s = _samples(d.metrics_url)
        assert d.status()["ready"]
        # The daemon keeps going: a later good document is still predicted.
        _produce(broker.bootstrap, topics["input"], [msgpack.packb({"id": "after", "text": "crude oil output"})])
        _wait(lambda: _consumed(d, topics["input"], len(values) + 1), 30, "the late document")

    dls = [decode_dead_letter(r.value) for r in _read_all(broker.bootstrap, topics["dead_letter"], want=len(expect))]
    got = {dl["source"]["offset"]: dl for dl in dls}
    assert {off: dl["reason"] for off, dl in got.items()} == {offsets[i]: r for i, r in expect.items()}
    for off, dl in got.items():
        assert dl["source"]["topic"] == topics["input"] and dl["source"]["partition"] == 0
        assert dl["detail"]
    huge = next(dl for dl in dls if dl["reason"] == "message_too_large")
    assert huge["raw_truncated"] and huge["raw_size"] > 10_000_000 and len(huge["raw"]) < 1_100_000
    arr = next(dl for dl in dls if dl["source"]["offset"] == offsets[-1])
    assert arr["index"] == 1 and msgpack.unpackb(arr["raw"]) == {"id": "arr-1", "text": 7}
    empties = sorted(msgpack.unpackb(dl["raw"])["id"] for dl in dls if dl["reason"] == "empty_document")
    assert empties == ["blank", "stopwords"]  # whether the codec or the tokenizer found them empty

    preds = {decode_prediction(r.value)["id"] for r in _read_all(broker.bootstrap, topics["output"],
                                                                  want=len(good) + 3)}
    assert preds == {d["id"] for d in good} | {"arr-0", "arr-2", "after"}
    reasons = Counter(expect.values())
    for reason, n in reasons.items():
        assert s[("streamtopics_dead_letters_total", (("reason", reason),))] == n, reason
    assert s[("streamtopics_documents_total", ())] == len(good) + 2


def test_corrupt_newest_snapshot_is_skipped_and_replay_learns_exactly_once(broker, fresh_topic, tmp_path):
    """Crash recovery without a subprocess: the newest snapshot is truncated, so the daemon
    must fall back to the one before, re-read from its offsets and end where a clean run ends."""
    topics = _topics(fresh_topic)
    docs = _docs(500)
    _produce(broker.bootstrap, topics["input"], [msgpack.packb(d) for d in docs])
    snaps = tmp_path / "snaps"
    base = _cfg_dict(broker.bootstrap, topics, snaps, snapshot={"every_batches": 3, "keep": 10})
    with _running(Config.from_dict(base, env={})) as d:
        _wait(lambda: _consumed(d, topics["input"], len(docs)), 60, "first run")
    clean = _model_arrays(d.last_snapshot)
    files = sorted(snaps.glob("*.stsnap"))
    assert [load_snapshot(p).snapshot_info["offsets"][f"{topics['input']}:0"] for p in files] == \
        [50, 150, 300, 450, 500]  # the first after batch 1: a young model is covered at once
    # Truncate the newest (offset 500) and damage the next (450): recovery starts at 300.
    newest, second = files[-1], files[-2]
    newest.write_bytes(newest.read_bytes()[:1000])
    raw = bytearray(second.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    second.write_bytes(bytes(raw))

    with _running(Config.from_dict(base, env={})) as d2:  # same group: committed offsets say 500
        _wait(lambda: _consumed(d2, topics["input"], len(docs)), 60, "replay")
        s = _samples(d2.metrics_url)
    assert s[("streamtopics_snapshot_load_failures_total", ())] == 2
    assert s[("streamtopics_documents_total", ())] == 200  # re-predicted, learned by the restored model
    replayed = _model_arrays(d2.last_snapshot)
    assert replayed[1] == clean[1] == len(docs)
    assert replayed[4] == clean[4]
    np.testing.assert_allclose(replayed[2], clean[2], rtol=0, atol=1e-9)
    np.testing.assert_allclose(replayed[3], clean[3], rtol=0, atol=1e-9)


def test_snapshot_disk_errors_are_counted_and_the_daemon_keeps_running(broker, fresh_topic, tmp_path):
    topics = _topics(fresh_topic)
    snaps = tmp_path / "snaps"
    cfg = _cfg(broker.bootstrap, topics, snaps, snapshot={"every_batches": 1, "keep": 10})
    first = _docs(100)
    with _running(cfg) as d:
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in first])
        _wait(lambda: _consumed(d, topics["input"], 100), 60, "first documents")
        _wait(lambda: len(list(snaps.glob("*.stsnap"))) == 2, 10, "two snapshots")
        kept = sorted(p.name for p in snaps.glob("*.stsnap"))
        # The directory disappears behind the daemon's back and a file takes its place.
        moved = tmp_path / "moved"
        snaps.rename(moved)
        snaps.write_text("not a directory")
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(100, 100)])
        _wait(lambda: _consumed(d, topics["input"], 200), 60, "documents while the disk fails")
        s = _samples(d.metrics_url)
        assert s[("streamtopics_snapshot_failures_total", (("reason", "io_error"),))] >= 1
        assert s[("streamtopics_documents_total", ())] == 200 and d.status()["ready"]
        # The disk comes back: the final snapshot (at the latest) succeeds.
        snaps.unlink()
        moved.rename(snaps)
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(50, 200)])
        _wait(lambda: _consumed(d, topics["input"], 250), 60, "documents after recovery")
    assert set(kept) <= {p.name for p in snaps.glob("*.stsnap")}
    assert load_snapshot(d.last_snapshot).snapshot_info["offsets"] == {f"{topics['input']}:0": 250}


def test_broker_loss_shows_in_metrics_and_the_daemon_recovers(tmp_path):
    """tansu restarted (memory storage: topics, data, group offsets gone). The daemon must
    report broker_up 0 and not ready, keep retrying, then rewind to the new log and go on."""
    with _own_broker(tmp_path) as (b, cfg):
        with _running(cfg) as d:
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(100)])
            _wait(lambda: _consumed(d, "docs", 100), 60, "documents before the loss")
            b.stop(grace_s=0)
            _wait(lambda: _samples(d.metrics_url)[("streamtopics_broker_up", ())] == 0, 20, "broker_up 0")
            assert _get(d.metrics_url + "/readyz")[0] == 503
            assert _get(d.metrics_url + "/healthz")[0] == 200  # the loop itself is fine
            b.start()
            create_topics(b.bootstrap, {"docs": 1, "preds": 1, "dlq": 1})
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(60, 100)])
            # The consumer sits at offset 100 of a log that now ends at 60: rewind, then consume.
            _wait(lambda: d.status()["documents"] == 160, 60, "documents after the broker came back")
            _wait(lambda: _get(d.metrics_url + "/readyz")[0] == 200, 30, "ready again")
            assert d.status()["broker_up"]
        preds = {decode_prediction(r.value)["id"] for r in _read_all(b.bootstrap, "preds", want=60)}
        assert preds == {x["id"] for x in _docs(60, 100)}
        assert load_snapshot(d.last_snapshot).state.docs_seen == 160


def test_a_hung_broker_shows_as_down_within_the_session_timeout_not_the_request_timeout(tmp_path):
    """A broker that holds its connections but answers nothing (SIGSTOPped here) showed as up,
    /readyz 200, until the request timeout (30 s) closed the connections (replicas audit). The
    group's heartbeats stop being answered at once: broker_up 0 and /readyz 503 from the session
    timeout (2 s in these tests) on, and up again once it answers."""
    import os
    import signal

    with _own_broker(tmp_path) as (b, cfg):
        with _running(cfg) as d:
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(50)])
            _wait(lambda: _consumed(d, "docs", 50), 60, "documents before the freeze")
            _wait(lambda: _get(d.metrics_url + "/readyz")[0] == 200, 30, "ready")
            os.kill(b.pid, signal.SIGSTOP)
            try:
                t0 = time.monotonic()
                _wait(lambda: _samples(d.metrics_url)[("streamtopics_broker_up", ())] == 0, 20, "broker_up 0")
                assert time.monotonic() - t0 < 15  # the request timeout is 30 s
                assert _get(d.metrics_url + "/readyz")[0] == 503
            finally:
                os.kill(b.pid, signal.SIGCONT)
            _wait(lambda: _get(d.metrics_url + "/readyz")[0] == 200, 60, "ready once the broker answers")
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(30, 50)])
            _wait(lambda: _consumed(d, "docs", 80), 60, "documents after the freeze")


def test_daemon_started_before_the_broker_waits_for_it(tmp_path):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    b = EmbeddedBroker(port=port)
    topics = {"input": "docs", "output": "preds", "dead_letter": "dlq"}
    cfg = _cfg(b.bootstrap, topics, tmp_path / "snaps", kafka={"create_topics": True})
    try:
        with _running(cfg) as d:
            time.sleep(1.5)  # a few connection attempts
            s = _samples(d.metrics_url)
            assert s[("streamtopics_broker_up", ())] == 0 and s[("streamtopics_ready", ())] == 0
            assert _get(d.metrics_url + "/readyz")[0] == 503 and _get(d.metrics_url + "/healthz")[0] == 200
            b.start()
            _wait(lambda: _get(d.metrics_url + "/readyz")[0] == 200, 30, "ready once the broker is up")
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(50)])
            _wait(lambda: _consumed(d, "docs", 50), 30, "documents")
    finally:
        b.cleanup()


def test_unsupported_settings_are_config_errors(tmp_path):
    from streamtopics.model import ENGINES

    cfg = Config.from_dict({"model": {"engine": "alias", "supervision": "hinge"}}, env={})
    assert check_daemon_config(cfg) == [] and "alias" in ENGINES  # both engines, supervised, run
    with pytest.raises(ConfigError) as e:
        Config.from_dict({"model": {"supervision": "svm"}}, env={})
    assert "model.supervision" in str(e.value.errors)


# --------------------------------------------------------------------------- subprocess: crash and SIGTERM


class _Proc:
    """``python -m streamtopics.cli run --config FILE`` with its JSON log in a file."""

    def __init__(self, config_path: Path, log_path: Path) -> None:
        self.log_path = log_path
        self.fh = open(log_path, "ab")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.p = subprocess.Popen([sys.executable, "-m", "streamtopics.cli", "run", "--config", str(config_path)],
                                  cwd=ROOT, stdout=self.fh, stderr=subprocess.STDOUT, env=env)

    def logs(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
        return out

    def wait_ready(self, timeout_s: float = 60) -> None:
        _wait(lambda: any(e.get("msg") == "ready" for e in self.logs()) or self.p.poll() is not None,
              timeout_s, "daemon subprocess ready")
        assert self.p.poll() is None, self.log_path.read_text()[-3000:]

    def finish(self, sig: int, timeout_s: float = 60) -> int:
        self.p.send_signal(sig)
        try:
            return self.p.wait(timeout=timeout_s)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait(10)
            self.fh.close()


def _write_toml(path: Path, d: dict) -> Path:
    def val(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, dict):  # e.g. [model.engine] of the shipped file, as an inline table
            return "{" + ", ".join(f"{k} = {val(x)}" for k, x in v.items()) + "}"
        return repr(v)

    path.write_text("\n".join(f"[{s}]\n" + "\n".join(f"{k} = {val(v)}" for k, v in kv.items())
                              for s, kv in d.items()) + "\n")
    return path


def _pace(bootstrap: str, topic: str, values: list[bytes], chunk: int, period_s: float) -> threading.Thread:
    """Produce ``values`` in chunks of ``chunk`` (one batch each) every ``period_s`` seconds."""
    def run():
        p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=False)
        try:
            for i in range(0, len(values), chunk):
                for v in values[i:i + chunk]:
                    p.send(topic, v)
                p.flush(timeout=30)
                time.sleep(period_s)
        finally:
            p.close(timeout=5)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _prediction_ids(bootstrap: str, topic: str) -> list:
    return [decode_prediction(r.value)["id"] for r in _read_all(bootstrap, topic, timeout_s=3, settle_s=0)]


def test_sigkill_and_sigterm_then_restart_learn_every_document_exactly_once(broker, fresh_topic, tmp_path):
    """Run A is SIGKILLed mid-stream (its last snapshot is behind its commits: documents are
    re-read and re-predicted); run B is SIGTERMed mid-stream (graceful: finish the batch,
    publish, commit, snapshot, exit 0); run C finishes. The final model equals the one of an
    uninterrupted run on the same input to 1e-9, and every document has a prediction."""
    topics = _topics(fresh_topic)
    docs = _docs(600)
    values = [msgpack.packb(x) for x in docs]
    snaps = tmp_path / "snaps"
    d = _cfg_dict(broker.bootstrap, topics, snaps, batch={"max_wait_ms": 3000},
                  snapshot={"every_batches": 4, "every_seconds": 0, "keep": 10})
    cfg_path = _write_toml(tmp_path / "daemon.toml", d)
    out_topic = topics["output"]

    def predicted() -> int:
        return len(_prediction_ids(broker.bootstrap, out_topic))

    # Run A: the first 300 documents arrive a batch at a time; SIGKILL after >= 250 predictions
    # (snapshots at 200 and 400 documents, so the kill lands between two snapshots).
    a = _Proc(cfg_path, tmp_path / "a.log")
    a.wait_ready()
    pacer = _pace(broker.bootstrap, topics["input"], values[:300], BATCH, 0.4)
    _wait(lambda: predicted() >= 250, 60, "run A predictions", interval=0.02)
    assert a.finish(signal.SIGKILL) == -signal.SIGKILL
    pacer.join(30)
    killed_at = predicted()
    last_a = max(snaps.glob("*.stsnap"))
    snap_offset = load_snapshot(last_a).snapshot_info["offsets"][f"{topics['input']}:0"]
    assert snap_offset == 200 and killed_at > snap_offset

    # Run B: resumes from the snapshot (not the committed offset), the rest arrives paced;
    # SIGTERM mid-stream.
    b = _Proc(cfg_path, tmp_path / "b.log")
    b.wait_ready()
    pacer = _pace(broker.bootstrap, topics["input"], values[300:], BATCH, 0.4)
    _wait(lambda: predicted() >= killed_at + 200, 60, "run B predictions", interval=0.02)
    assert b.finish(signal.SIGTERM) == 0
    stopped = next(e for e in reversed(b.logs()) if e.get("msg") == "streamtopics daemon stopped")
    last_b = load_snapshot(stopped["last_snapshot"])
    b_offset = last_b.snapshot_info["offsets"][f"{topics['input']}:0"]
    assert b_offset % BATCH == 0 and snap_offset < b_offset < len(docs), b_offset  # mid-stream
    assert last_b.state.docs_seen == b_offset  # graceful: the final snapshot has everything learned
    pacer.join(30)

    # Run C: finishes the stream.
    c = _Proc(cfg_path, tmp_path / "c.log")
    c.wait_ready()
    _wait(lambda: predicted() >= killed_at - snap_offset + len(docs), 60, "run C predictions")
    assert c.finish(signal.SIGTERM) == 0
    stopped = next(e for e in reversed(c.logs()) if e.get("msg") == "streamtopics daemon stopped")
    final = _model_arrays(stopped["last_snapshot"])
    assert final[0].snapshot_info["offsets"] == {f"{topics['input']}:0": len(docs)}

    # At least once: every document predicted; the ones between A's snapshot and A's death twice.
    ids = Counter(_prediction_ids(broker.bootstrap, out_topic))
    assert set(ids) == {x["id"] for x in docs}
    assert sum(n - 1 for n in ids.values()) == killed_at - snap_offset > 0

    # Exactly once: an uninterrupted run (in-process, own group and directory) on the same input.
    ref_cfg = _cfg_dict(broker.bootstrap, topics, tmp_path / "ref", batch={"max_wait_ms": 3000})
    ref_cfg["topics"]["output"] = fresh_topic(prefix="ref-out")
    with _running(Config.from_dict(ref_cfg, env={})) as ref:
        _wait(lambda: _consumed(ref, topics["input"], len(docs)), 60, "reference run")
    clean = _model_arrays(ref.last_snapshot)
    assert final[1] == clean[1] == len(docs)  # state.docs_seen
    assert final[0].version == clean[0].version == len(docs) // BATCH
    assert final[4] == clean[4]  # vocabulary, word for word
    np.testing.assert_allclose(final[2], clean[2], rtol=0, atol=1e-9)  # topic-word statistics
    np.testing.assert_allclose(final[3], clean[3], rtol=0, atol=1e-9)
