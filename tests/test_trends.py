"""Topic trends: the prevalence series, rising/fading topics, change events, snapshots."""

from __future__ import annotations

import numpy as np
import pytest

from streamtopics import TopicModel, load_snapshot
from streamtopics.corpora import load_reuters_r8
from streamtopics.trends import PrevalenceTracker, TopicEvents


def test_tracker_smooths_bounds_and_ranks():
    t = PrevalenceTracker(3, history=4, smoothing=0.5, lag=2)
    assert t.rising() == [] and np.isnan(t.current()).all()
    t.observe(np.array([2.0, 1.0, 1.0]), 1)
    np.testing.assert_allclose(t.current(), [0.5, 0.25, 0.25])
    t.observe(np.array([0.0, 4.0, 0.0]), 2)
    np.testing.assert_allclose(t.current(), [0.25, 0.625, 0.125])
    for v in range(3, 8):
        t.observe(np.array([0.0, 1.0, 3.0]), v)
    versions, values = t.series()
    assert versions.tolist() == [4, 5, 6, 7] and values.shape == (4, 3)
    assert [k for k, _ in t.rising(1)] == [2] and [k for k, _ in t.fading(1)] == [1]
    np.testing.assert_allclose(values.sum(axis=1), 1.0)
    h, a = t.state()
    r = PrevalenceTracker.restore(h, a)
    assert np.array_equal(r.series()[1], values) and np.array_equal(r.change(), t.change())
    r.observe(np.array([1.0, 1.0, 1.0]), 8)
    t.observe(np.array([1.0, 1.0, 1.0]), 8)
    assert np.array_equal(r.series()[1], t.series()[1])
    with pytest.raises(ValueError):
        t.observe(np.ones(2), 9)


def test_a_small_batch_moves_the_trend_by_its_share_of_a_full_one():
    """Eight batches of 32 documents (weight 1/8 each) move the smoothed prevalence as one of 256 does,
    so a slow stream's small time-cut batches do not make noise of its trend."""
    full, parts = PrevalenceTracker(2, smoothing=0.2), PrevalenceTracker(2, smoothing=0.2)
    for t in (full, parts):
        t.observe(np.array([1.0, 0.0]), 1)
    full.observe(np.array([0.0, 1.0]), 2)
    for v in range(8):
        parts.observe(np.array([0.0, 1.0]), 2 + v, weight=0.125)
    np.testing.assert_allclose(parts.current(), full.current(), rtol=1e-12)
    np.testing.assert_allclose(full.current(), [0.8, 0.2])
    one = PrevalenceTracker(2, smoothing=1.0)
    one.observe(np.array([1.0, 0.0]), 1)
    np.testing.assert_allclose(one.observe(np.array([0.0, 1.0]), 2, weight=0.1), [0.0, 1.0])


def test_events_fire_on_prevalence_and_top_word_changes():
    ev = TopicEvents(prevalence_change=0.5, words_changed=2, top_n=3)
    words = [["a", "b", "c"], ["d", "e", "f"]]
    assert ev.detect(1, np.array([0.5, 0.5]), words) == []
    assert ev.detect(2, np.array([0.55, 0.45]), words) == []
    out = ev.detect(3, np.array([0.9, 0.1]), [["a", "b", "c"], ["d", "x", "y"]])
    assert {e["topic"]: e["reasons"] for e in out} == {0: ["rising"], 1: ["fading", "top_words"]}
    assert ev.detect(4, np.array([0.9, 0.1]), [["a", "b", "c"], ["d", "x", "y"]]) == []


def test_model_keeps_trends_in_snapshots(tmp_path):
    docs = [d.text for d in load_reuters_r8("train")[:300]]
    m = TopicModel(n_topics=5, seed=1)
    for i in range(0, 300, 50):
        m.partial_fit(docs[i:i + 50])
    versions, values = m.trends.series()
    assert versions.tolist() == list(range(1, 7)) and values.shape == (6, 5)
    np.testing.assert_allclose(values.sum(axis=1), 1.0)
    m.save(tmp_path / "m.stsnap")
    m2 = load_snapshot(tmp_path / "m.stsnap")
    assert np.array_equal(m2.trends.series()[1], values)
    assert np.array_equal(m2.trends.series()[0], versions)
