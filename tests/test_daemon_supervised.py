"""Supervised topics through the daemon, against the real broker on loopback.

Labelled Reuters R8 documents in: every prediction carries the predicted label and a
score per label, the prequential accuracy metric goes live and beats always-the-
majority-class, and a multi-label / regression stream gets ``labels`` / ``response``.
"""
from __future__ import annotations

import math
from collections import Counter

import msgpack

from streamtopics import load_snapshot
from streamtopics.corpora import load_reuters_r8
from streamtopics.stream.codec import decode_prediction

from test_daemon import _cfg, _consumed, _produce, _read_all, _running, _samples, _topics, _wait  # noqa: E402


def test_supervised_daemon_publishes_labels_scores_and_prequential_accuracy(broker, fresh_topic, tmp_path):
    corpus = load_reuters_r8("train")[:600]
    topics = _topics(fresh_topic)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snap", model={"supervision": "hinge", "sup_c": 16.0, "sup_ell": 4.0, "sup_prior_var": 10.0,
                                                              "prequential_window": 300})
    values = [msgpack.packb({"id": d.id, "text": d.text, "label": d.label}) for d in corpus]
    # a few documents without a label still get topics and a predicted label
    values += [msgpack.packb({"id": f"nolabel-{i}", "text": d.text}) for i, d in enumerate(corpus[:20])]
    n = len(values)
    _produce(broker.bootstrap, topics["input"], values)
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], n), 120, "all documents consumed")
        metrics = _samples(d.metrics_url)
        st = d.status()
        model = d.model
        assert sorted(model.label_names) == sorted(set(x.label for x in corpus))
    preds = {p["id"]: p for p in (decode_prediction(r.value) for r in _read_all(broker.bootstrap, topics["output"], n))}
    assert len(preds) == n
    names = set(model.label_names)
    # the first batch is predicted by an untrained classifier (no labels yet): no label then
    labelled = [p for p in preds.values() if "label" in p]
    assert len(labelled) >= n - 2 * 50
    for p in labelled:
        assert p["label"] in names
        assert set(p["scores"]) <= names and p["label"] == max(p["scores"], key=p["scores"].get)
    assert preds["nolabel-0"].get("label") in names
    acc = metrics[("streamtopics_prequential_accuracy", ())]
    window = metrics[("streamtopics_prequential_window_documents", ())]
    majority = Counter(x.label for x in corpus).most_common(1)[0][1] / len(corpus)
    assert window == 300 and math.isfinite(acc)
    assert acc > majority + 0.1, (acc, majority)  # R8 is 50% 'earn'; a useful classifier does far better
    assert st["prequential_accuracy"] == acc and st["prequential_curve"]
    # the accuracy published equals the predictions checked by hand over the same window
    truth = {x.id: x.label for x in corpus}
    ids_in_order = [x.id for x in corpus]
    hits = [preds[i].get("label") == truth[i] for i in ids_in_order if "label" in preds[i]][-300:]
    assert abs(sum(hits) / len(hits) - acc) < 1e-9
    snap = st["last_snapshot"]
    m2 = load_snapshot(snap)
    assert m2.label_names == model.label_names


def test_regression_stream_gets_a_response(broker, fresh_topic, tmp_path):
    corpus = load_reuters_r8("train")[:200]
    topics = _topics(fresh_topic)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snap", model={"supervision": "regression"})
    values = [msgpack.packb({"id": i, "text": d.text, "response": float(len(d.text) % 7)})
              for i, d in enumerate(corpus)]
    _produce(broker.bootstrap, topics["input"], values)
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(values)), 120, "all documents consumed")
    preds = [decode_prediction(r.value) for r in _read_all(broker.bootstrap, topics["output"], len(values))]
    assert len(preds) == len(values)
    late = [p for p in preds if p["id"] >= 100]
    assert late and all(isinstance(p.get("response"), float) and math.isfinite(p["response"]) for p in late)
    assert all("label" not in p for p in preds)


def test_multilabel_stream_gets_labels_and_scores(broker, fresh_topic, tmp_path):
    """Documents with ``labels`` (lists): each prediction carries ``labels`` (the labels with a
    positive score) and a score per label; the prequential metric compares label sets."""
    corpus = load_reuters_r8("train")[:400]
    topics = _topics(fresh_topic)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snap",
               model={"supervision": "hinge", "sup_c": 16.0, "sup_ell": 4.0, "sup_prior_var": 10.0})
    # a second, derived label on the money topics makes it multi-label
    money = {"earn", "acq"}
    targets = {d.id: [d.label] + (["money"] if d.label in money else []) for d in corpus}
    values = [msgpack.packb({"id": d.id, "text": d.text, "labels": targets[d.id]}) for d in corpus]
    _produce(broker.bootstrap, topics["input"], values)
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(values)), 120, "all documents consumed")
        names = set(d.model.label_names)
        acc = _samples(d.metrics_url)[("streamtopics_prequential_accuracy", ())]
    assert "money" in names and names >= {d.label for d in corpus}
    preds = [decode_prediction(r.value) for r in _read_all(broker.bootstrap, topics["output"], len(values))]
    assert len(preds) == len(values)
    late = [p for p in preds if "labels" in p]
    assert len(late) >= len(values) - 2 * 50  # the first batch meets an untrained classifier
    for p in late:
        assert "label" not in p and set(p["labels"]) <= names and set(p["scores"]) == names
        assert set(p["labels"]) == {k for k, v in p["scores"].items() if v > 0}
    exact = sum(set(p["labels"]) == set(targets[p["id"]]) for p in late) / len(late)
    assert exact > 0.5 and 0.0 < acc <= 1.0, (exact, acc)


def test_alias_engine_from_configuration_with_labels(broker, fresh_topic, tmp_path):
    """engine = "alias" in the configuration: the daemon runs the supervised Alias-MH local
    step (word/doc/exp proposals), publishes labelled predictions, shows MH acceptance per
    proposal and table rebuilds on /metrics, and its snapshot loads as a TopicModel."""
    corpus = load_reuters_r8("train")[:300]
    topics = _topics(fresh_topic)
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "snap",
               model={"engine": "alias", "supervision": "hinge", "sup_c": 16.0, "sup_ell": 4.0,
                      "sup_prior_var": 10.0})
    values = [msgpack.packb({"id": d.id, "text": d.text, "label": d.label}) for d in corpus]
    _produce(broker.bootstrap, topics["input"], values)
    with _running(cfg) as d:
        _wait(lambda: _consumed(d, topics["input"], len(values)), 120, "all documents consumed")
        s = _samples(d.metrics_url)
    for proposal in ("word", "doc", "exp"):
        assert 0.0 < s[("streamtopics_mh_acceptance_ratio", (("proposal", proposal),))] <= 1.0, proposal
    assert s[("streamtopics_alias_rebuilds_total", ())] > 0
    preds = [decode_prediction(r.value) for r in _read_all(broker.bootstrap, topics["output"], len(values))]
    assert sorted(p["id"] for p in preds) == sorted(x.id for x in corpus)
    truth = {x.id: x.label for x in corpus}
    late = [p for p in preds if "label" in p]
    assert len(late) >= len(values) - 2 * 50
    assert sum(p["label"] == truth[p["id"]] for p in late) / len(late) > 0.6  # R8 majority class is ~0.5
    m = load_snapshot(d.last_snapshot)  # written at shutdown
    assert m.engine == "alias" and m.supervision == "hinge" and m.state.docs_seen == len(values)
