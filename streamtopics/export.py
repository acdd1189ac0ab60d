"""Exports of a model (usually a loaded snapshot) to the formats people use.

``pyldavis_data``: the five arrays ``pyLDAvis.prepare`` takes.  A snapshot holds no documents,
so the document side is made of **pseudo-documents**: one per point of the model's prevalence
series (the smoothed share of token mass per topic after each of the last <= 256 learned
batches; ``streamtopics.trends``), each given an equal share of the tokens the model has seen.
pyLDAvis only uses doc_topic_dists and doc_lengths through ``doc_lengths @ doc_topic_dists``
(the topic sizes), so topic sizes are the mean recent prevalence x tokens seen.  A model
without a series (nothing learned since trends were kept) gets one pseudo-document with the
topics' shares of the learned topic-word mass.  term_frequency is the vocabulary's decayed
token count (x ``vocab_decay`` per batch: recent frequency), floored at a tiny positive value.
With ``max_terms`` only the most frequent terms are kept and topic_term rows renormalised.

``topics_json`` / ``topics_rows``: top words, weights, prevalence, and the coherence the daemon
measured when it wrote the snapshot (snapshot extra ``daemon.quality``), for JSON and CSV.

``classifier_json``: a supervised model's classifier: its loss, task, features, how much it has
learned, and per label the topics with the largest weights (the score of a label is its weights
times the document's topic proportions, so these topics raise it most).
"""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import numpy as np

from .quality import top_word_ids, topic_diversity

__all__ = ["classifier_json", "json_safe", "pyldavis_data", "topics_json", "topics_rows", "topics_csv",
           "snapshot_quality"]


def json_safe(v):
    """JSON-safe copy: NaN/inf -> None (JSON has none: a model with no words yet has an undefined
    diversity), tuples -> lists, numpy scalars -> Python."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [json_safe(x) for x in v]
    return v


def pyldavis_data(model, max_terms: int | None = 5000) -> dict[str, Any]:
    st = model.state
    if st.n_words == 0:
        raise ValueError("the model has no vocabulary yet (nothing learned)")
    lam = st.lam()                                          # (V, K)
    tf = np.maximum(np.asarray(model.vocab.counts, dtype=np.float64), 1e-9)
    keep = np.arange(st.n_words)
    if max_terms and max_terms < st.n_words:
        keep = np.sort(np.argsort(-tf, kind="stable")[:max_terms])
    ttd = lam[keep].T                                       # (K, V')
    ttd = ttd / ttd.sum(axis=1, keepdims=True)
    _, series = model.trends.series()
    if len(series):
        dtd = series / series.sum(axis=1, keepdims=True)
    else:
        mass = np.maximum(st.lam_totals() - st.n_words * st.beta, 0.0)
        dtd = (mass / mass.sum() if mass.sum() > 0 else np.full(model.n_topics, 1.0 / model.n_topics))[None, :]
    tokens = max(float(st.tokens_seen), float(len(dtd)))
    words = model.vocab.words
    return {
        "topic_term_dists": ttd.tolist(),
        "doc_topic_dists": dtd.tolist(),
        "doc_lengths": [tokens / len(dtd)] * len(dtd),
        "vocab": [words[i] for i in keep],
        "term_frequency": tf[keep].tolist(),
        "note": "doc_topic_dists/doc_lengths are pseudo-documents from the prevalence series "
                "(see streamtopics.export)",
    }


def snapshot_quality(model) -> dict:
    """The topic quality the daemon stored in the snapshot ({} when none)."""
    extra = (getattr(model, "snapshot_info", None) or {}).get("extra") or {}
    return (extra.get("daemon") or {}).get("quality") or {}


def topics_json(model, top_n: int = 10) -> dict[str, Any]:
    st = model.state
    top = top_word_ids(st.mu[: st.n_words], max(top_n, 25))
    totals = st.lam_totals()
    prev = model.trends.current()
    q = snapshot_quality(model)
    npmi = q.get("npmi") or [None] * model.n_topics
    words = model.vocab.words
    topics = []
    for k in range(model.n_topics):
        ids = top[k, :top_n]
        w = (st.beta + st.scale * st.mu[ids, k]) / totals[k]
        topics.append({"topic": k, "top_words": [words[i] for i in ids], "weights": [float(x) for x in w],
                       "prevalence": None if not np.isfinite(prev[k]) else float(prev[k]),
                       "npmi": npmi[k] if k < len(npmi) else None})
    return {"model_version": int(model.version), "n_topics": int(model.n_topics), "docs_seen": int(st.docs_seen),
            "vocabulary": int(st.n_words), "diversity_top25": topic_diversity(top, 25),
            "quality": q, "topics": topics}


def classifier_json(model, top_topics: int = 3) -> dict[str, Any] | None:
    """The classifier of a supervised model (None without supervision): loss, task, the
    features it reads, labelled documents and updates seen, and per label (one entry for
    regression, named "response") the ``top_topics`` topics of largest posterior mean weight,
    largest first, as [topic, weight]. A regression weight is given with the response's offset
    added: the response predicted for a document of that topic alone."""
    head = getattr(model, "head", None)
    if head is None:
        return None
    eta = np.asarray(head.eta_mean, dtype=np.float64)[: head.n_labels] + head.response_offset
    names = list(head.labels.labels) if head.task != "regression" else ["response"] * eta.shape[0]
    labels = []
    for name, row in zip(names, eta):
        order = np.argsort(-row, kind="stable")[: max(0, int(top_topics))]
        labels.append({"label": name, "topics": [[int(k), float(row[k])] for k in order]})
    return {"loss": head.loss, "task": head.task, "features": getattr(model, "features", None),
            "labelled_docs": int(head.docs_seen), "updates": int(head.n_updates), "n_labels": int(head.n_labels),
            "labels": labels}


def topics_rows(model, top_n: int = 10) -> list[dict]:
    rows = []
    for t in topics_json(model, top_n)["topics"]:
        for rank, (word, weight) in enumerate(zip(t["top_words"], t["weights"]), start=1):
            rows.append({"topic": t["topic"], "rank": rank, "word": word, "weight": weight,
                         "prevalence": t["prevalence"], "npmi": t["npmi"]})
    return rows


def topics_csv(model, top_n: int = 10) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=["topic", "rank", "word", "weight", "prevalence", "npmi"],
                       lineterminator="\n")
    w.writeheader()
    for r in topics_rows(model, top_n):
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()
