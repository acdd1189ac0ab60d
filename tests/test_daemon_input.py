"""Daemon input polish (issue 14): input.format json/auto, the "looks like JSON" hint, dead
letters that keep the record's key and headers, and text without spaces (CJK) learned under
model.segmentation = "cjk_bigrams". A real broker on loopback (fixtures ``broker``,
``fresh_topic``), an in-process daemon."""
from __future__ import annotations

import json
import os
import sys

import msgpack
from kafka import KafkaProducer

sys.path.insert(0, os.path.dirname(__file__))

from streamtopics.stream.codec import decode_dead_letter, decode_prediction  # noqa: E402
from test_daemon import _cfg, _consumed, _read_all, _running, _topics, _wait  # noqa: E402

ZH = "机器学习是人工智能的一个分支，研究计算机怎样模拟人类的学习行为以获取新的知识和技能并改善自身的性能"
JA = "東京都に住んでいる研究者たちは自然言語処理と機械学習の新しい手法について毎日議論しています"


def _send(bootstrap: str, topic: str, msgs: list[tuple[bytes | None, bytes, list | None]]) -> list[int]:
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, enable_idempotence=False)
    try:
        futs = [p.send(topic, v, key=k, headers=h or []) for k, v, h in msgs]
        p.flush(timeout=30)
        return [f.get(timeout=10).offset for f in futs]
    finally:
        p.close(timeout=5)


def test_json_input_cjk_text_and_dead_letters_with_key_and_headers(broker, fresh_topic, tmp_path):
    topics = _topics(fresh_topic)
    hdr = [("trace-id", b"t-42"), ("tenant", b"acme")]
    english = [{"id": f"en-{i}", "text": f"grain wheat exports rose {w} in the market report"}
               for i, w in enumerate(["sharply", "again", "slowly", "today"])]
    msgs = [(None, json.dumps(d).encode(), None) for d in english[:2]]            # JSON (auto)
    msgs += [(None, msgpack.packb(d), None) for d in english[2:]]                 # msgpack (auto)
    msgs += [
        (b"k-zh", json.dumps({"id": "zh", "text": ZH}, ensure_ascii=False).encode(), hdr),
        (b"k-ja", msgpack.packb({"id": "ja", "text": JA}), None),
        (b"k-bad", b'{"id": "broken", "text": ', hdr),                             # malformed JSON
        (b"k-stop", json.dumps({"id": "stop", "text": "the and of to"}).encode(), hdr),  # empty after tokenizing
        (None, b"[" + json.dumps({"id": "arr-ok", "text": "oil prices"}).encode() + b', {"id": "arr-bad"}]', None),
    ]
    offsets = _send(broker.bootstrap, topics["input"], msgs)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snaps", input={"format": "auto"},
               model={"segmentation": "cjk_bigrams"})
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(msgs)), 60, "all messages consumed")
    preds = {decode_prediction(r.value)["id"] for r in _read_all(broker.bootstrap, topics["output"], want=8)}
    # before issue 14 the JSON documents were dead letters and ZH/JA one dropped "word" each
    assert preds == {"en-0", "en-1", "en-2", "en-3", "zh", "ja", "arr-ok"}
    recs = _read_all(broker.bootstrap, topics["dead_letter"], want=3)
    by_off = {decode_dead_letter(r.value)["source"]["offset"]: r for r in recs}
    assert set(by_off) == {offsets[6], offsets[7], offsets[8]}
    bad, stop, arr = by_off[offsets[6]], by_off[offsets[7]], by_off[offsets[8]]
    m = decode_dead_letter(bad.value)
    assert m["reason"] == "malformed_json" and m["key"] == b"k-bad" and m["headers"] == [list(h) for h in hdr]
    assert bad.key == b"k-bad" and list(bad.headers) == hdr          # the Kafka record itself
    m = decode_dead_letter(stop.value)                                # a dead letter the daemon made
    assert m["reason"] == "empty_document" and m["key"] == b"k-stop" and stop.key == b"k-stop"
    assert list(stop.headers) == hdr
    m = decode_dead_letter(arr.value)
    assert m["reason"] == "missing_text" and m["index"] == 1 and json.loads(m["raw"]) == {"id": "arr-bad"}
    assert arr.key is None and "key" not in m and "headers" not in m


def test_json_under_the_default_msgpack_format_is_dead_lettered_as_looking_like_json(broker, fresh_topic, tmp_path):
    topics = _topics(fresh_topic)
    msgs = [(b"k1", json.dumps({"id": "j", "text": "grain wheat exports"}).encode(), [("h", b"v")]),
            (None, msgpack.packb({"id": "m", "text": "grain wheat exports"}), None)]
    _send(broker.bootstrap, topics["input"], msgs)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snaps")
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(msgs)), 60, "all messages consumed")
    (rec,) = _read_all(broker.bootstrap, topics["dead_letter"], want=1)
    m = decode_dead_letter(rec.value)
    assert m["reason"] == "malformed_msgpack" and "looks like JSON" in m["detail"], m["detail"]
    assert rec.key == b"k1" and m["key"] == b"k1" and m["headers"] == [["h", b"v"]]


def test_dead_letters_with_large_keys_and_headers_still_fit_the_message_limit(broker, fresh_topic, tmp_path):
    """A bad record's key and headers go out twice (in the map and on the record): a 400 kB key
    with a 900 kB value, and a 2 MB value with a 300 kB header, were dead letters the producer
    refused as too large, while the dead-letter counter still counted them."""
    topics = _topics(fresh_topic)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", max_request_size=8_000_000,
                      enable_idempotence=False)
    try:
        sends = [(None, msgpack.packb({"id": "before", "text": "oil prices rose sharply"}), None),
                 (b"k" * 200_000, msgpack.packb({"id": 1.5, "text": "word " * 180_000}), None),
                 (b"q" * 400_000, msgpack.packb({"id": 3.5, "text": "grain"}), None),
                 (None, msgpack.packb({"id": "big", "text": "word " * 400_000}), [("h", b"v" * 300_000)]),
                 (b"k" * 700_000, msgpack.packb({"id": 2.5, "text": "grain"}), None),
                 (None, msgpack.packb({"id": "after", "text": "wheat corn grain harvest"}), None)]
        for k, v, h in sends:
            p.send(topics["input"], v, key=k, headers=h or []).get(timeout=30)
    finally:
        p.close(timeout=5)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snaps")
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(sends)), 60, "all messages consumed")
        dropped = d.metrics.registry.get_sample_value("streamtopics_messages_dropped_total",
                                                      {"topic": topics["dead_letter"]})
    assert {decode_prediction(r.value)["id"] for r in _read_all(broker.bootstrap, topics["output"], want=2)} \
        == {"before", "after"}
    recs = sorted(_read_all(broker.bootstrap, topics["dead_letter"], want=4),
                  key=lambda r: decode_dead_letter(r.value)["source"]["offset"])
    assert len(recs) == 4 and dropped == 0
    bad_id, large_key, big, huge_key = recs
    m = decode_dead_letter(bad_id.value)                   # key in the map and on the record
    assert m["reason"] == "bad_id" and m["key"] == b"k" * 200_000 and bad_id.key == b"k" * 200_000
    assert m["raw_truncated"] and len(bad_id.value) + len(bad_id.key) < 1_048_576  # the value holds it once
    m = decode_dead_letter(large_key.value)                # over a quarter of the limit: on the record only
    assert "key" not in m and m["key_size"] == 400_000 and large_key.key == b"q" * 400_000
    m = decode_dead_letter(big.value)
    assert m["reason"] == "message_too_large" and m["headers_size"] == 300_001 and "headers" not in m
    assert list(big.headers) == [("h", b"v" * 300_000)] and m["raw_size"] > 2_000_000
    m = decode_dead_letter(huge_key.value)                 # key over half the limit: sizes only
    assert m["reason"] == "bad_id" and "key" not in m and m["key_size"] == 700_000 and huge_key.key is None


class _NotUtf8(str):
    """A header key the producer writes as bytes that are not UTF-8 (other clients can)."""

    def encode(self, *a, **k):
        return b"\xff\xfe-bad"


def test_a_record_the_client_cannot_parse_is_dead_lettered_and_the_stream_goes_on(broker, fresh_topic, tmp_path):
    """Bad-input audit: one record with a header key that is not UTF-8 made kafka-python raise
    CorruptRecordError once and then spin in poll for good: nothing more learned, SIGTERM ignored,
    /readyz 200, and the same again after a restart. Now the record is skipped to the dead-letter
    topic (reason corrupt_record, its offset in the source) and the stream goes on; records after
    it in its own record batch cannot be read by the client either and follow it there."""
    topics = _topics(fresh_topic)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=0, enable_idempotence=False)
    try:
        def send(doc_id, headers=None):  # one record batch each: .get() before the next send
            return p.send(topics["input"], msgpack.packb({"id": doc_id, "text": f"wheat grain harvest {doc_id}"}),
                          headers=headers or []).get(timeout=30).offset
        for i in range(5):
            send(f"a{i}")
        bad = send("bad", [(_NotUtf8("x"), b"v")])
        for i in range(5):
            send(f"b{i}")
    finally:
        p.close(timeout=5)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snaps")
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], 11), 60, "past the unreadable record")
        assert d.session.consumer.unreadable == 1 and d.readiness()[0]
    assert d.model.state.docs_seen == 10
    ids = {decode_prediction(r.value)["id"] for r in _read_all(broker.bootstrap, topics["output"], want=10)}
    assert ids == {f"a{i}" for i in range(5)} | {f"b{i}" for i in range(5)}
    (rec,) = _read_all(broker.bootstrap, topics["dead_letter"], want=1)
    m = decode_dead_letter(rec.value)
    assert m["reason"] == "corrupt_record" and m["source"]["offset"] == bad and "CorruptRecordError" in m["detail"]
