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
