"""``streamtopics export`` (pyLDAvis arrays, JSON, CSV) and ``inspect``'s topic quality lines."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from streamtopics import TopicModel
from streamtopics.cli import main
from streamtopics.corpora import load_reuters_r8


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    docs = [d.text for d in load_reuters_r8("train")[:300]]
    m = TopicModel(n_topics=6, seed=4)
    for i in range(0, 300, 60):
        m.partial_fit(docs[i:i + 60])
    path = tmp_path_factory.mktemp("snap") / "m.stsnap"
    m.save(path, extra={"daemon": {"quality": {"npmi": [0.1, -0.2, 0.3, 0.0, 0.05, -1.0], "mean_npmi": -0.125,
                                               "diversity": 0.8, "window_documents": 300, "model_version": 5}}})
    return path, m


def test_export_pyldavis_loads_into_prepare(snapshot, tmp_path, capsys):
    path, m = snapshot
    out = tmp_path / "lda.json"
    assert main(["export", str(path), "--format", "pyldavis", "-o", str(out), "--max-terms", "800"]) == 0
    data = json.loads(out.read_text())
    ttd = np.array(data["topic_term_dists"])
    assert ttd.shape == (6, 800) and np.allclose(ttd.sum(axis=1), 1)
    dtd = np.array(data["doc_topic_dists"])
    assert dtd.shape == (5, 6) and np.allclose(dtd.sum(axis=1), 1)  # one pseudo-document per learned batch
    assert len(data["doc_lengths"]) == 5 and sum(data["doc_lengths"]) == pytest.approx(m.state.tokens_seen)
    assert len(data["vocab"]) == len(data["term_frequency"]) == 800 and min(data["term_frequency"]) > 0
    pyLDAvis = pytest.importorskip("pyLDAvis", reason="pyLDAvis is a bench-only dependency")
    vis = pyLDAvis.prepare(data["topic_term_dists"], data["doc_topic_dists"], data["doc_lengths"],
                           data["vocab"], data["term_frequency"], mds="pcoa", sort_topics=False, n_jobs=1)
    assert len(vis.topic_coordinates) == 6
    assert set(vis.topic_info["Term"]) <= set(data["vocab"])


def test_export_json_and_csv(snapshot, capsys):
    path, m = snapshot
    assert main(["export", str(path), "--format", "json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert [t["top_words"] for t in j["topics"]] == [m.top_words(k, 10) for k in range(6)]
    assert j["topics"][2]["npmi"] == 0.3 and 0 < j["diversity_top25"] <= 1
    assert sum(t["prevalence"] for t in j["topics"]) == pytest.approx(1.0)
    assert main(["export", str(path), "--format", "csv", "--top", "5"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 30 and rows[0]["topic"] == "0" and rows[0]["rank"] == "1"
    assert rows[0]["word"] == m.top_words(0, 1)[0]


def test_inspect_shows_prevalence_coherence_and_trends(snapshot, capsys):
    path, _ = snapshot
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "mean NPMI -0.125 over the daemon's last 300 documents" in out
    assert "trends      rising" in out and "+0.300" in out
    assert main(["inspect", str(path), "--json"]) == 0
    j = json.loads(capsys.readouterr().out)
    assert len(j["prevalence"]) == 6 and j["npmi"][5] == -1.0 and j["quality"]["diversity"] == 0.8
