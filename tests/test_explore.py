"""The topic explorer: /topics, /v1/topics and the topic metrics of a daemon fed real documents,
and the page as headless Chromium renders it (skipped where Debian's chromium is absent).

One daemon (K=10, 400 Reuters R8 documents in batches of 50, events on) serves every test here.
STREAMTOPICS_EXPLORER_CORPUS=20ng (with STREAMTOPICS_EXPLORER_DOCS, STREAMTOPICS_EXPLORER_TOPICS)
feeds it the 20 Newsgroups train split instead (for the screenshot in bench/results/).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from html.parser import HTMLParser
from pathlib import Path

import msgpack
import numpy as np
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from streamtopics import TopicModel
from streamtopics.config import Config
from streamtopics.corpora import load_reuters_r8
from streamtopics.daemon import Daemon
from streamtopics.explore import TopicExplorer
from streamtopics.quality import top_word_ids, topic_diversity
from streamtopics.testing.broker import create_topics

ROOT = Path(__file__).resolve().parents[1]
_20NG = os.environ.get("STREAMTOPICS_EXPLORER_CORPUS") == "20ng"
K = int(os.environ.get("STREAMTOPICS_EXPLORER_TOPICS", 20 if _20NG else 10))
BATCH = 256 if _20NG else 50
N_DOCS = int(os.environ.get("STREAMTOPICS_EXPLORER_DOCS", 2560 if _20NG else 400))


def _get(url: str, method: str = "GET") -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.headers.get("Content-Type", ""), e.read()


def _wait(pred, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.fixture(scope="module")
def served(broker, tmp_path_factory):
    """A daemon that has learned N_DOCS R8 documents, still running (its metrics URL, topics)."""
    tag = uuid.uuid4().hex[:10]
    topics = {"input": f"in-{tag}", "output": f"out-{tag}", "dead_letter": f"dlq-{tag}", "events": f"ev-{tag}"}
    create_topics(broker.bootstrap, {t: 1 for t in topics.values()})
    if _20NG:
        from streamtopics.corpora import load_20newsgroups

        docs = load_20newsgroups("train")[:N_DOCS]
    else:
        docs = load_reuters_r8("train")[:N_DOCS]
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5, enable_idempotence=False)
    for d in docs:
        p.send(topics["input"], msgpack.packb({"id": d.id, "text": d.text}))
    p.flush(timeout=30)
    p.close(timeout=5)
    cfg = Config.from_dict({
        "kafka": {"bootstrap_servers": broker.bootstrap, "group_id": f"g-{tag}", "session_timeout_ms": 2000,
                  "heartbeat_interval_ms": 500, "create_topics": False},
        "topics": topics, "model": {"n_topics": K, "seed": 3, "min_word_len": 3},
        "batch": {"max_docs": BATCH, "max_wait_ms": 1000},
        "snapshot": {"dir": str(tmp_path_factory.mktemp("snaps")), "every_batches": 0, "every_seconds": 0},
        "metrics": {"port": 0, "quality_window_docs": 1000 if _20NG else 200, "events_prevalence_change": 0.3},
    }, env={})
    d = Daemon(cfg)
    t = threading.Thread(target=d.run, name="daemon-explorer", daemon=True)
    t.start()
    try:
        assert d.wait_started(30)
        _wait(lambda: d.status().get("offsets", {}).get(f"{topics['input']}:0", -1) >= N_DOCS, 90,
              "all documents learned")
        yield d.metrics_url, topics, broker.bootstrap
    finally:
        d.stop()
        t.join(60)
        assert not t.is_alive()


def test_json_views_metrics_and_events(served):
    url, topics, bootstrap = served
    status, ctype, body = _get(url + "/v1/topics")
    assert status == 200 and ctype == "application/json"
    view = json.loads(body)
    assert view["status"] == "ok" and view["model_version"] == N_DOCS // BATCH and view["n_topics"] == K
    assert len(view["topics"]) == K
    q = view["quality"]
    assert q["window_documents"] >= 200 and -1 <= q["mean_npmi"] <= 1 and 0 < q["diversity"] <= 1
    for t in view["topics"]:
        assert len(t["top_words"]) == 10 and len(t["weights"]) == 10
        assert t["weights"] == sorted(t["weights"], reverse=True)
        assert -1 <= t["npmi"] <= 1
        assert len(t["prevalence_series"]) == N_DOCS // BATCH
    assert sum(t["prevalence"] for t in view["topics"]) == pytest.approx(1.0, abs=1e-3)
    examples = [e for t in view["topics"] for e in t["examples"]]
    assert examples and all(e["id"].startswith("train/" if _20NG else "r8-train/") and e["text"] for e in examples)
    status, _, one = _get(url + "/v1/topics/3")
    assert status == 200 and json.loads(one)["top_words"] == view["topics"][3]["top_words"]
    assert _get(url + f"/v1/topics/{K}")[0] == 404
    for bad in ("-1", "abc", "1.5", "", "007"):  # one JSON answer for every topic that is not there
        status, ctype, body = _get(url + "/v1/topics/" + bad)
        assert status == 404 and ctype.startswith("application/json") and json.loads(body)["n_topics"] == K
    assert _get(url + "/v1/topics", method="POST")[0] == 501  # no write endpoints
    status, ctype, page = _get(url + "/topics")
    assert status == 200 and ctype.startswith("text/html") and b'src="/topics.js"' in page
    assert b"http://" not in page.replace(b"http://www.w3.org", b"") and b"https://" not in page  # no CDN
    assert _get(url + "/topics.js")[0] == 200

    metrics = _get(url + "/metrics")[2].decode()
    assert 'streamtopics_topic_coherence_npmi{topic="9"}' in metrics
    assert f"streamtopics_topic_monitor_duration_seconds_count {N_DOCS // BATCH}.0" in metrics
    assert 'streamtopics_trending_topic{direction="rising",rank="1"}' in metrics

    # topic change events on the optional events topic
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      fetch_max_wait_ms=100)
    try:
        c.assign([TopicPartition(topics["events"], 0)])
        c.seek_to_beginning()
        recs = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not recs:
            recs = [r for rs in c.poll(timeout_ms=200).values() for r in rs]
    finally:
        c.close()
    assert recs, "no topic events published"
    ev = msgpack.unpackb(recs[0].value)
    assert set(ev["reasons"]) <= {"rising", "fading", "top_words"} and 0 <= ev["topic"] < K
    assert recs[0].key == str(ev["topic"]).encode()


class _Cards(HTMLParser):
    """Top words of each ``section.card`` of the rendered page, by its data-topic."""

    def __init__(self):
        super().__init__()
        self.cards: dict[int, list[str]] = {}
        self._topic = None
        self._in_words = self._in_li = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section" and "card" in (a.get("class") or "").split():
            self._topic = int(a["data-topic"])
            self.cards[self._topic] = []
        elif tag == "ol" and self._topic is not None and "words" in (a.get("class") or ""):
            self._in_words = True
        elif tag == "li" and self._in_words:
            self._in_li = True

    def handle_endtag(self, tag):
        if tag == "ol":
            self._in_words = False
        elif tag == "li":
            self._in_li = False
        elif tag == "section":
            self._topic = None

    def handle_data(self, data):
        if self._in_li and self._topic is not None:
            self.cards[self._topic].append(data)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium_cmd(exe: str, profile: Path) -> list[str]:
    return [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={profile}"]


def test_browser_shows_one_card_per_topic_with_the_api_top_words(served, tmp_path):
    exe = _chromium()
    if exe is None:
        pytest.skip("headless Chromium not installed (Debian package 'chromium'): browser check skipped")
    url, _, _ = served
    view = json.loads(_get(url + "/v1/topics")[2])
    out = subprocess.run(_chromium_cmd(exe, tmp_path / "profile") + ["--virtual-time-budget=2000", "--dump-dom",
                                                                       url + "/topics"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    parser = _Cards()
    parser.feed(out.stdout)
    assert len(parser.cards) == K
    for t in view["topics"]:
        assert parser.cards[t["topic"]] == t["top_words"]
    # a screenshot for people (bench/results is not committed)
    shot = ROOT / "bench" / "results" / ("explorer-20ng.png" if _20NG else "explorer.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(_chromium_cmd(exe, tmp_path / "profile2") + [
        "--hide-scrollbars", "--window-size=1400,1000", f"--screenshot={shot}", url + "/topics"],
        capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000


def test_explorer_alone_on_a_library_model():
    docs = load_reuters_r8("train")[:400]
    m = TopicModel(n_topics=5, seed=2)
    ex = TopicExplorer(window_docs=100)
    assert ex.route("/v1/topics")[0] == 200 and json.loads(ex.route("/v1/topics")[1])["topics"] == []
    for i in range(0, 400, 50):
        part = docs[i:i + 50]
        batch = m.prepare(m.tokenize([d.text for d in part]), grow=True)
        res = m.process(batch, learn=True)
        obs = ex.observe(m, batch, m.theta(res.doc_topic), [d.id for d in part], [d.text for d in part],
                         status={"docs_per_s": float("nan")})
        assert obs.seconds > 0
        # the candidate-row top words (after the first updates) equal a full scan of the model
        full = top_word_ids(m.state.mu[: m.state.n_words], 10)
        assert [t["top_words"] for t in ex.view["topics"]] == [[m.vocabulary[i] for i in r] for r in full]
        # diversity is the share of unique words in the top 25 (docs/topic-quality.md), not the top 10
        assert obs.quality.diversity == topic_diversity(top_word_ids(m.state.mu[: m.state.n_words], 25), 25)
    view = ex.view
    assert view["docs_per_s"] is None and len(view["topics"]) == 5
    assert [set(t["top_words"][:5]) for t in view["topics"]] == [set(m.top_words(k, 5)) for k in range(5)]
    assert ex.route("/nope") is None
    page = ex.route("/topics")[1]
    assert b"/*INITIAL_VIEW*/null" not in page and b'"model_version": 8' in page


def test_refresh_follows_a_model_that_changed_without_a_batch_of_ours():
    """A replica whose partitions are idle still applies the others' records: after a quiet
    second its /topics shows the model it holds, keeping the last batch's coherence."""
    docs = load_reuters_r8("train")[:600]
    m = TopicModel(n_topics=6, seed=3)
    ex = TopicExplorer(window_docs=100)
    assert not ex.refresh(m, min_age_s=0.0)  # nothing observed yet: nothing to refresh

    def learn(part):
        batch = m.prepare(m.tokenize([d.text for d in part]), grow=True)
        return batch, m.process(batch, learn=True)

    for i in range(0, 200, 50):
        batch, res = learn(docs[i:i + 50])
        ex.observe(m, batch, m.theta(res.doc_topic), [d.id for d in docs[i:i + 50]], [d.text for d in docs[i:i + 50]])
    before = ex.view
    assert before["quality_version"] == before["model_version"] == m.version
    assert not ex.refresh(m, min_age_s=0.0)  # the same model version: nothing to do
    for i in range(200, 600, 50):  # learned elsewhere (another replica's records), not observed
        learn(docs[i:i + 50])
    assert not ex.refresh(m, min_age_s=3600.0)  # a fresh view is left alone (batches keep it fresh)
    assert ex.view is before
    assert ex.refresh(m, min_age_s=0.0)
    view = ex.view
    assert view["model_version"] == m.version != before["model_version"]
    assert view["quality_version"] == before["model_version"] and view["docs_seen"] == m.state.docs_seen
    full = top_word_ids(m.state.mu[: m.state.n_words], 10)
    assert [t["top_words"] for t in view["topics"]] == [[m.vocabulary[i] for i in r] for r in full]
    assert [t["npmi"] for t in view["topics"]] == [t["npmi"] for t in before["topics"]]
    assert json.loads(ex.route("/v1/topics")[1])["model_version"] == m.version
    # and the next observed batch goes on from the refreshed top words
    batch, res = learn(docs[:50])
    ex.observe(m, batch, m.theta(res.doc_topic), [d.id for d in docs[:50]], [d.text for d in docs[:50]])
    full = top_word_ids(m.state.mu[: m.state.n_words], 10)
    assert [t["top_words"] for t in ex.view["topics"]] == [[m.vocabulary[i] for i in r] for r in full]
