"""The topic explorer: a read-only view of the topics, rebuilt once per learned batch.

``TopicExplorer.observe`` runs on the thread that learns (right after a batch, while the model
is not changing) and publishes a new immutable view: a plain dict that is never mutated after
it is published, plus its JSON encoding.  HTTP handlers (``route``) only read the current view
reference, so they never touch the live model.  No Kafka here: the daemon composes it.

Routes (GET only): ``/topics`` (HTML page + ``/topics.js``, shipped in ``streamtopics/web``),
``/v1/topics`` (the whole view as JSON) and ``/v1/topics/{k}`` (one topic).
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import deque
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from .export import json_safe
from .quality import CoherenceMonitor, QualityReport, top_word_ids, top_word_ids_rows
from .trends import TopicEvents

__all__ = ["TopicExplorer", "Observation", "topic_table"]

_JSON = "application/json"
_HTML = "text/html; charset=utf-8"
_JS = "text/javascript; charset=utf-8"
_TOPIC_PATH = re.compile(r"^/v1/topics/(0|[1-9][0-9]{0,8})$")  # no leading zeros, no sign


@dataclass(frozen=True)
class Observation:
    """What one ``observe`` call measured (for metrics and the events topic)."""

    quality: QualityReport
    prevalence: np.ndarray
    rising: list
    fading: list
    events: list = field(default_factory=list)
    seconds: float = 0.0


def topic_table(model, top_n: int = 10, top_ids: np.ndarray | None = None) -> list[dict]:
    """Each topic's top words with their E[phi] weights and the current smoothed prevalence."""
    st = model.state
    if top_ids is None:
        top_ids = top_word_ids(st.mu[: st.n_words], top_n)
    totals = st.lam_totals()
    words = model.vocab.words
    prev = model.trends.current()
    out = []
    ids = top_ids[:, :top_n]
    w = (st.beta + st.scale * np.take_along_axis(st.mu[: st.n_words], ids.T, axis=0).T) / np.where(
        totals > 0, totals, 1.0)[:, None]
    weights = w.round(6).tolist()
    for k in range(model.n_topics):
        out.append({"topic": k, "top_words": [words[i] for i in ids[k]], "weights": weights[k],
                    "prevalence": _num(prev[k])})
    return out


def _num(x) -> float | None:
    x = float(x)
    return round(x, 6) if math.isfinite(x) else None


class TopicExplorer:
    """Topic quality + trends + recent examples, published per batch as an immutable view.

    window_docs : documents in the sliding window NPMI is measured on (``CoherenceMonitor``).
    examples : example documents kept per topic (the highest-theta document of each recent batch).
    snippet_words : words of an example document shown.
    series_points : prevalence points per topic in the view (the model keeps its full series).
    events : a ``TopicEvents`` detector (None: no change events).
    """

    def __init__(self, window_docs: int = 5000, examples: int = 3, snippet_words: int = 24,
                 series_points: int = 120, events: TopicEvents | None = None, top_n: int = 10) -> None:
        self.monitor = CoherenceMonitor(window_docs=window_docs, top_n=top_n, diversity_n=25)
        self.top_n = int(top_n)
        self.n_examples = int(examples)
        self.snippet_words = int(snippet_words)
        self.series_points = int(series_points)
        self.events = events
        self._examples: list[deque] = []
        self._model = None
        self._top: np.ndarray | None = None   # last top-25 ids (K, 25)
        self._since_full = 0
        self._published: tuple[dict[str, Any], list] = (
            {"status": "waiting for the first batch", "topics": [], "model_version": None}, [None])
        self._page: bytes | None = None
        self._script: bytes | None = None

    @classmethod
    def from_config(cls, cfg) -> "TopicExplorer":
        """From a daemon ``Config`` (metrics.quality_window_docs, topics.events, metrics.events_*)."""
        m = cfg.metrics
        events = (TopicEvents(m.events_prevalence_change, m.events_words_changed)
                  if cfg.topics.events else None)
        return cls(window_docs=m.quality_window_docs, events=events)

    # -- the learning thread ------------------------------------------------------------
    def observe(self, model, batch, theta: np.ndarray | None, ids: list, texts: list,
                status: dict | None = None) -> Observation | None:
        """Update quality, trends and examples from a learned ``batch`` (theta/ids/texts of its
        documents, in batch order) and publish the new view.  ``status``: extra fields for the
        page (docs_per_s, prequential_accuracy, prequential_curve, ...)."""
        if not model.state.initialized or batch is None or batch.n_docs == 0:
            return None
        if model is not self._model:  # a new model (e.g. a newer snapshot adopted): new word ids
            self.monitor = CoherenceMonitor(self.monitor.window_docs, self.top_n, self.monitor.diversity_n)
            self._examples = []
            self._model = model
            self._top = None
        t0 = time.perf_counter()
        st = model.state
        top25 = self._top_ids(model, batch)
        # the monitor's NPMI reads the first top_n columns, its diversity all 25 (was given 10: the
        # diversity gauge, /topics and snapshots said top-25 and measured top-10)
        quality = self.monitor.update(batch.doc_ptr, batch.word_ids, top25,
                                      evicted=batch.evicted if batch.evicted.size else None)
        trends = model.trends
        prevalence = trends.current()
        rising, fading = trends.rising(5), trends.fading(5)
        if theta is not None and len(ids):
            self._add_examples(model.n_topics, theta, ids, texts, model.version)
        table = topic_table(model, self.top_n, top25)
        events = []
        if self.events is not None:
            events = self.events.detect(model.version, prevalence, [t["top_words"] for t in table], ts=time.time())
        self._publish(model, table, quality, int(model.version), rising, fading, status=status)
        seconds = time.perf_counter() - t0
        return Observation(quality, prevalence, rising, fading, events, seconds)

    def _publish(self, model, table: list, quality: QualityReport, quality_version, rising: list, fading: list,
                 measure: str = "NPMI, boolean documents, sliding window of the stream", mean_npmi=None,
                 status: dict | None = None) -> None:
        """Give ``table``'s topics their NPMI, prevalence series and examples, build the view
        around it (``quality_version``: the model version coherence was measured at) and publish
        it: one reference assignment of a new (view, JSON cache) pair; readers take it once."""
        st = model.state
        versions, series = model.trends.series()
        series = series[-self.series_points:].T.round(5).tolist()
        npmi = [_num(x) for x in quality.npmi]
        for k, t in enumerate(table):
            t["npmi"] = npmi[k]
            t["prevalence_series"] = series[k]
            t["examples"] = list(self._examples[k]) if self._examples else []
        view = {
            "status": "ok",
            "model_version": int(model.version),
            "quality_version": quality_version,
            "n_topics": int(model.n_topics),
            "docs_seen": int(st.docs_seen),
            "vocabulary": int(st.n_words),
            "engine": model.engine,
            "supervised": model.head is not None,
            "updated": time.time(),
            "quality": {"mean_npmi": _num(quality.mean_npmi if mean_npmi is None else mean_npmi),
                        "diversity": _num(quality.diversity), "window_documents": int(quality.window_docs),
                        "top_n": self.top_n, "measure": measure},
            "series_versions": [int(v) for v in versions[-self.series_points:]],
            "rising": [[k, round(c, 6)] for k, c in rising],
            "fading": [[k, round(c, 6)] for k, c in fading],
            "topics": table,
        }
        for key, value in (status or {}).items():
            view[key] = json_safe(value)
        self._published = (view, [None])

    def show(self, model, quality: dict | None = None) -> Observation | None:
        """The first view of a model that has topics but no batch observed here yet (a daemon
        restarted from a snapshot, before new records arrive): its topics from a full scan, with
        the coherence the snapshot recorded (``quality``: ``summary()`` as saved, None or {}:
        not measured) and ``quality_version`` naming the version it was measured at. Returns
        what it published, for the metrics (None when there is a view already, or no topics)."""
        if self.view.get("status") == "ok" or not model.state.initialized:
            return None
        st, q, K = model.state, quality or {}, model.n_topics
        self._model, self._examples, self._since_full = model, [], 0
        self._top = top_word_ids(st.mu[: st.n_words], 25)
        saved = q.get("npmi") if isinstance(q.get("npmi"), list) and len(q.get("npmi")) == K else [None] * K
        npmi = np.array([np.nan if v is None else float(v) for v in saved])
        diversity = float(q["diversity"]) if isinstance(q.get("diversity"), (int, float)) else float("nan")
        window = int(q["window_documents"]) if isinstance(q.get("window_documents"), int) else 0
        report = QualityReport(npmi, diversity, window, self._top[:, : self.top_n], np.zeros(0, dtype=np.int64))
        trends = model.trends
        rising, fading = trends.rising(5), trends.fading(5)
        self._publish(model, topic_table(model, self.top_n, self._top), report, q.get("model_version"), rising,
                      fading, measure="NPMI, boolean documents, sliding window of the stream (as the snapshot "
                                      "recorded it; measured again from the next batch)",
                      mean_npmi=q["mean_npmi"] if isinstance(q.get("mean_npmi"), (int, float)) else float("nan"))
        return Observation(report, trends.current(), rising, fading)

    def refresh(self, model, min_age_s: float = 1.0) -> bool:
        """Bring the view's topics up to ``model`` when it changed without a batch of ours (a
        replica applying other replicas' update records while its own partitions are idle) and
        the view is at least ``min_age_s`` old: top words, weights and prevalence from a full
        scan; coherence, series and examples stay those of the last batch (``quality_version``
        says which).  While batches flow ``observe`` keeps the view fresh, so this does nothing.
        Returns whether a new view was published."""
        view = self.view
        if (view.get("status") != "ok" or model is not self._model or view["model_version"] == model.version
                or time.time() - view["updated"] < min_age_s or not model.state.initialized):
            return False
        st = model.state
        self._top = top_word_ids(st.mu[: st.n_words], 25)
        self._since_full = 0
        old = view["topics"]
        table = topic_table(model, self.top_n, self._top)
        for t, o in zip(table, old):
            t.update({key: o[key] for key in ("npmi", "prevalence_series", "examples")})
        new = {**view, "model_version": int(model.version), "docs_seen": int(st.docs_seen),
               "vocabulary": int(st.n_words), "updated": time.time(), "topics": table,
               "quality_version": view.get("quality_version", view["model_version"])}
        self._published = (new, [None])
        return True

    def _top_ids(self, model, batch) -> np.ndarray:
        """Each topic's top-25 word ids after the batch.

        The stochastic update rescales every row of the topic-word statistics alike and adds
        non-negative statistics to the rows of the batch's words only, so a word that is neither
        in the batch nor was in a top-25 before cannot enter one: the candidates are the batch's
        words and the previous top words (a full scan after evictions, for other updates, in the
        first updates, when the shape changed and every 64 batches)."""
        st = model.state
        mu = st.mu[: st.n_words]
        prev = self._top
        full = (prev is None or prev.shape != (model.n_topics, 25) or model.update != "stochastic"
                or batch.evicted.size > 0 or st.n_updates <= 2 or self._since_full >= 64
                or prev.max(initial=-1) >= st.n_words or st.n_words < 25)
        if full:
            top = top_word_ids(mu, 25)
            self._since_full = 0
        else:
            top = top_word_ids_rows(mu, np.concatenate([batch.uniq, prev.ravel()]), 25)
            self._since_full += 1
        self._top = top
        return top

    def _add_examples(self, K: int, theta: np.ndarray, ids: list, texts: list, version: int) -> None:
        if len(self._examples) != K:
            self._examples = [deque(maxlen=self.n_examples) for _ in range(K)]
        best = np.argmax(theta, axis=0)                    # highest-theta document per topic
        for k in range(K):
            d = int(best[k])
            p = float(theta[d, k])
            if p < 0.2:                                    # no document of this batch is about k
                continue
            self._examples[k].appendleft({"id": _jsonable_id(ids[d]), "theta": round(p, 4),
                                          "text": self._snippet(texts[d]), "model_version": int(version)})

    def _snippet(self, text) -> str:
        n = self.snippet_words
        words = text[: 40 * n].split() if isinstance(text, str) else [str(w) for w in text[: n + 1]]
        s = " ".join(words[: self.snippet_words])
        return s + (" …" if len(words) > n else "")

    def summary(self) -> dict | None:
        """The last quality measurement, for snapshots (None before the first batch)."""
        view = self.view
        if view.get("status") != "ok":
            return None
        q = view["quality"]
        return {"npmi": [t["npmi"] for t in view["topics"]], "mean_npmi": q["mean_npmi"],
                "diversity": q["diversity"], "window_documents": q["window_documents"],
                "model_version": view.get("quality_version", view["model_version"])}

    # -- any thread (HTTP) -----------------------------------------------------------------
    @property
    def view(self) -> dict:
        """The current view (never mutated after it was published; do not mutate it)."""
        return self._published[0]

    def view_json(self) -> bytes:
        """The current view as JSON, encoded by the first reader (off the learning thread)."""
        view, cache = self._published
        if cache[0] is None:
            cache[0] = json.dumps(view, default=_default, allow_nan=False).encode()
        return cache[0]

    def route(self, path: str) -> tuple[int, bytes, str] | None:
        """Answer a GET path, or None when it is not the explorer's."""
        if path in ("/topics", "/topics/"):
            return 200, self._page_bytes(), _HTML
        if path == "/topics.js":
            if self._script is None:
                self._script = _asset("topics.js")
            return 200, self._script, _JS
        if path == "/v1/topics":
            return 200, self.view_json(), _JSON
        if path.startswith("/v1/topics/"):
            view = self.view
            m = _TOPIC_PATH.match(path)
            topics = view.get("topics") or []
            if m is None or int(m.group(1)) >= len(topics):
                asked = path[len("/v1/topics/"):]
                return 404, json.dumps({"error": f"no topic {asked!r}: topics are numbered 0 to {len(topics) - 1}",
                                        "n_topics": len(topics)}).encode(), _JSON
            k = int(m.group(1))
            body = {"model_version": view.get("model_version"), **topics[k]}
            return 200, json.dumps(body, default=_default, allow_nan=False).encode(), _JSON
        return None

    def _page_bytes(self) -> bytes:
        if self._page is None:
            self._page = _asset("topics.html")
        # the current view is embedded so the page renders at once (then it polls /v1/topics)
        data = self.view_json().replace(b"<", b"\\u003c")
        return self._page.replace(b"/*INITIAL_VIEW*/null", data, 1)


def _asset(name: str) -> bytes:
    return resources.files("streamtopics").joinpath("web", name).read_bytes()


def _jsonable_id(x):
    return x if isinstance(x, (str, int)) and not isinstance(x, bool) else str(x)


def _default(o):
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
