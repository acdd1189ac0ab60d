"""The batch encoder of predictions gives the bytes of encoding one prediction at a time."""
from __future__ import annotations

import numpy as np
import pytest

from streamtopics.service.predictions import PredictionEncoder, label_fields, top_topics
from streamtopics.stream.codec import decode_prediction, encode_prediction, prediction_key


def _one_by_one(ids, theta, version, ts, sup, names, replica):
    extras = label_fields(sup, len(ids), names)
    return [encode_prediction(i, row, model_version=version, ts=ts, replica=replica, **extra)
            for i, row, extra in zip(ids, top_topics(theta), extras)]


def _thetas(rng):
    yield rng.dirichlet(np.full(100, 0.05), size=64)
    yield rng.dirichlet(np.full(7, 1.0), size=5)                      # K below TOP_TOPICS
    yield np.full((3, 300), 1 / 300)                                  # every proportion tied, all below the floor
    t = np.full((4, 50), 0.5 / 40)
    t[:, :10] = 0.05                                                 # ten tied at the top, the rest tied below
    yield t
    t = rng.dirichlet(np.full(20, 0.3), size=16)
    t[:, 3] = t[:, 7] = t[:, 11] = t.max(axis=1)                      # ties with the largest proportion
    yield t / t.sum(axis=1, keepdims=True)
    t = np.zeros((2, 30))
    t[:, 5] = 1.0                                                     # one topic, exact zeros elsewhere
    yield t
    yield np.empty((0, 10))


@pytest.mark.parametrize("replica", [None, "r-1"])
def test_batch_encoding_is_byte_identical(replica):
    rng = np.random.default_rng(3)
    enc = PredictionEncoder("out", "dlq", 1 << 20, replica=replica)
    for theta in _thetas(rng):
        n = theta.shape[0]
        ids = [f"d{i}" if i % 3 else i for i in range(n)]
        msgs = enc.encode([], ids, theta, 41, 1.7e9 + 0.25, None, [])
        assert [m.value for m in msgs] == _one_by_one(ids, theta, 41, 1.7e9 + 0.25, None, [], replica)
        assert [m.key for m in msgs] == [prediction_key(i) for i in ids]
        for m in msgs:
            pairs = decode_prediction(m.value)["topics"]
            assert pairs == sorted(pairs, key=lambda kp: (-kp[1], kp[0])) and len(pairs) >= 1


def test_batch_encoding_with_supervised_fields_is_byte_identical():
    rng = np.random.default_rng(5)
    theta = rng.dirichlet(np.full(12, 0.2), size=6)
    ids = [np.int64(7), "a", "b", 3, "c", "d"]
    scores = rng.random((6, 2))
    cases = [(scores, ["pos", "neg", "pos", None, "neg", "pos"]), (None, [1.5, 2, None, -0.5, 0.0, 3.25]),
             (scores, [["pos"], ("neg", "pos"), [], None, ["neg"], ["pos"]])]
    for sup in cases:
        msgs = PredictionEncoder("out", "dlq", 1 << 20).encode([], ids, theta, 2, 5.0, sup, ["pos", "neg"])
        assert [m.value for m in msgs] == _one_by_one(ids, theta, 2, 5.0, sup, ["pos", "neg"], None)


def test_a_document_of_no_known_word_gets_no_label_fields_whatever_the_classifier():
    """Docs audit: with a multi-label classifier such a document still got ``"labels": []`` (the
    codec's contract, kept by the multi-class and regression cases: no label/labels/scores). An
    empty ``labels`` of a document the model knows words of is a prediction, and stays."""
    scores = np.array([[0.2, -0.4], [np.nan, np.nan]])
    for predicted in ([[], []], [["pos"], []]):
        first, unknown = label_fields((scores, predicted), 2, ["pos", "neg"])
        assert unknown == {} and first["labels"] == predicted[0] and set(first["scores"]) == {"pos", "neg"}
    assert label_fields((scores, ["pos", None]), 2, ["pos", "neg"])[1] == {}


def test_a_scores_map_above_the_budget_keeps_the_highest_scores_and_the_predicted_labels():
    """Bad-input audit: 8,000 labels of 128 characters made every prediction 1.1 MB; the producer
    refused each and it was dropped after the documents were learned and committed. The map is
    now cut to the highest scores that fit half the message limit, the predicted labels always
    kept, with ``scores_omitted``; the message fits and the batch encoding stays byte-identical."""
    rng = np.random.default_rng(0)
    names = [f"{i:04d}" + "x" * 124 for i in range(8000)]
    scores = rng.normal(size=(3, 8000))
    scores[1, 7] = -50.0  # predicted although its score is low: kept anyway
    theta = rng.dirichlet(np.full(10, 0.3), size=3)
    enc = PredictionEncoder("out", "dlq", 1_000_000)
    multiclass = [names[int(np.argmax(scores[0]))], names[7], names[9]]
    for sup in ((scores, multiclass), (scores, [[names[3], names[4]], [names[7]], []])):
        msgs = enc.encode([], ["a", "b", "c"], theta, 1, 2.0, sup, names)
        extras = label_fields(sup, 3, names, max_score_bytes=500_000)
        assert [m.value for m in msgs] == [
            encode_prediction(i, row, model_version=1, ts=2.0, **x) for i, row, x in zip("abc", top_topics(theta), extras)]
        for m, row, p in zip(msgs, scores, sup[1]):
            assert len(m.value) < 1_000_000
            d = decode_prediction(m.value)
            kept = d["scores"]
            assert d["scores_omitted"] == 8000 - len(kept) > 0
            assert all(x in kept for x in (p if isinstance(p, list) else [p]))
            top = sorted(range(8000), key=lambda j: -row[j])[:len(kept) - 2]
            assert all(names[j] in kept for j in top)  # the highest scores
    small = label_fields((scores[:, :3], ["a", "b", "c"]), 3, ["a", "b", "c"], max_score_bytes=500_000)
    assert "scores_omitted" not in small[0] and len(small[0]["scores"]) == 3
