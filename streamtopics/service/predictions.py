"""A processed batch as the messages the daemon publishes: predictions and dead letters.

Runs on the publisher thread (``PublishJob.build``), so it reads nothing live: every value
(the topic mixtures, the model version that predicted, the label names the scores are over)
was fixed when the batch was processed. The wire format itself is ``stream/codec.py``'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..stream.codec import DeadLetter, dead_letter_record, encode_predictions, prediction_key
from ..stream.producer import OutMessage

__all__ = ["BatchMeta", "PredictionEncoder", "label_fields", "message_topics", "top_topics", "MIN_TOPIC_PROB",
           "TOP_TOPICS"]

TOP_TOPICS = 10          # at most this many [topic, proportion] pairs per prediction ...
MIN_TOPIC_PROB = 0.01    # ... each at least this large (the largest one is always kept)


@dataclass
class BatchMeta:
    """What the loop needs back once a batch's messages are acknowledged."""

    tp: Any  # kafka TopicPartition
    first_offset: int
    next_offset: int
    docs: int
    tokens: int
    dead: list[str]
    origins: list[float]
    stages: dict[str, float]
    started: float


class PredictionEncoder:
    """Encodes one batch's dead letters and predictions for the configured topics."""

    def __init__(self, output_topic: str, dead_letter_topic: str, max_raw_bytes: int,
                 replica: str | None = None) -> None:
        self.output_topic = output_topic
        self.dead_letter_topic = dead_letter_topic
        self.max_raw_bytes = max_raw_bytes
        self.replica = replica  # named in every prediction when replicas share the model

    @classmethod
    def from_config(cls, cfg) -> PredictionEncoder:
        limit = int(cfg.kafka.extra_producer.get("max_request_size", 1048576))
        max_raw = max(1024, min(limit, cfg.limits.max_message_bytes) - 16384)
        return cls(cfg.topics.output, cfg.topics.dead_letter, max_raw)

    def named(self, replica: str | None) -> PredictionEncoder:
        return PredictionEncoder(self.output_topic, self.dead_letter_topic, self.max_raw_bytes, replica)

    def encode(self, dead: list[DeadLetter], ids: list, theta: np.ndarray | None, version: int, now: float,
               sup: tuple | None, label_names: list) -> list[OutMessage]:
        out: list[OutMessage] = []
        for dl in dead:
            value, key, headers = dead_letter_record(dl, ts=now, max_bytes=self.max_raw_bytes)
            out.append(OutMessage(self.dead_letter_topic, value, key=key, headers=headers))
        if theta is not None:
            extras = label_fields(sup, len(ids), label_names or [], max_score_bytes=self.max_raw_bytes // 2)
            values = encode_predictions(ids, message_topics(theta), extras, model_version=version, ts=now,
                                        replica=self.replica)
            topic = self.output_topic
            out.extend([OutMessage(topic, v, key=prediction_key(i)) for i, v in zip(ids, values)])
        return out


# What one entry of a prediction's "scores" map costs beyond its label's UTF-8 bytes: the str
# header (at most 5) and a float64 (9).
SCORE_ENTRY_BYTES = 14


def label_fields(sup: tuple | None, n: int, names: list, max_score_bytes: int | None = None) -> list[dict]:
    """``label``/``labels``/``scores``/``response`` of each prediction message; ``names``: the
    labels the scores are over (taken with the batch, never from the live model). A "scores" map
    above ``max_score_bytes`` keeps the highest scores that fit, the predicted labels always, and
    says how many it left out (``scores_omitted``): with 8,000 labels of 128 characters every
    prediction was 1.1 MB, refused by the producer and dropped (bad-input audit)."""
    if sup is None:
        return [{}] * n
    scores, predicted = sup
    # A label's UTF-8 bytes are at most 4 per character: most batches need no label encoded to know
    # that every score fits.
    trim = (max_score_bytes is not None and scores is not None
            and 4 * sum(len(str(x)) for x in names) + SCORE_ENTRY_BYTES * len(names) > max_score_bytes)
    if trim:
        cost = np.array([len(str(x).encode("utf-8")) + SCORE_ENTRY_BYTES for x in names], dtype=np.int64)
        trim = int(cost.sum()) > max_score_bytes
    position = {x: j for j, x in enumerate(names)} if trim else {}
    out = []
    for i in range(n):
        p = predicted[i]
        known = scores is None or bool(np.isfinite(scores[i]).all())  # NaN scores: no word the model knew
        extra: dict[str, Any] = {}
        if isinstance(p, (list, tuple)):  # multi-label; no word known: no "labels", as no "label" (codec.py)
            if known:
                extra["labels"] = [str(x) for x in p]
        elif isinstance(p, str):
            extra["label"] = p
        elif p is not None:
            extra["response"] = float(p)
        if scores is not None and names and known:
            if trim:
                extra["scores"], extra["scores_omitted"] = _top_scores(scores[i], names, cost, max_score_bytes,
                                                                       [position[x] for x in _as_list(p) if x in position])
            else:
                extra["scores"] = dict(zip(names, scores[i].tolist()))
        out.append(extra)
    return out


def _as_list(p) -> list:
    return list(p) if isinstance(p, (list, tuple)) else [p] if isinstance(p, str) else []


def _top_scores(row: np.ndarray, names: list, cost: np.ndarray, budget: int, must: list[int]) -> tuple[dict, int]:
    """The highest scores of ``row`` whose entries fit ``budget`` bytes, with ``must`` (the predicted
    labels) among them; and how many were left out."""
    order = np.argsort(-row, kind="stable")
    room = budget - int(cost[must].sum()) if must else budget
    keep = set(must)
    for j in order[: int(np.searchsorted(np.cumsum(cost[order]), max(room, 0), side="right"))]:
        keep.add(int(j))
    kept = sorted(keep, key=lambda j: (-row[j], j))
    return {names[j]: float(row[j]) for j in kept}, len(names) - len(kept)


def _top_sorted(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Per row the TOP_TOPICS largest (topic, proportion), proportion descending (ties in
    ``argpartition``'s order), and how many that is."""
    n, k = theta.shape
    top = min(TOP_TOPICS, k)
    idx = np.argpartition(-theta, top - 1, axis=1)[:, :top] if top < k else np.tile(np.arange(k), (n, 1))
    vals = np.take_along_axis(theta, idx, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1), np.take_along_axis(vals, order, axis=1), top


def message_topics(theta: np.ndarray) -> list[list[list]]:
    """``top_topics`` as the prediction message holds them: ``[topic, proportion]`` lists, proportion
    descending and ties by topic index (what ``codec.encode_prediction`` makes of ``top_topics``),
    with one sort for the whole batch instead of one per document."""
    idx, vals, top = _top_sorted(theta)
    n = theta.shape[0]
    if n == 0:
        return []
    kept = np.maximum(1, (vals >= MIN_TOPIC_PROB).sum(axis=1))  # the kept pairs: a prefix of that order
    # Every pair at or above MIN_TOPIC_PROB is kept and every other one is below it, so ordering the
    # row by (-proportion, topic) keeps the kept ones in front. A row that keeps only its first pair
    # keeps it as ``top_topics`` picks it (among equal largest proportions: argpartition's first).
    order = np.lexsort((idx, -vals), axis=1)
    idx2, vals2 = np.take_along_axis(idx, order, axis=1), np.take_along_axis(vals, order, axis=1)
    one = kept == 1
    idx2[one, 0], vals2[one, 0] = idx[one, 0], vals[one, 0]
    ks, ps, cut = idx2.tolist(), vals2.tolist(), kept.tolist()
    return [[[k, p] for k, p in zip(kr[:c], pr[:c])] for kr, pr, c in zip(ks, ps, cut)]


def top_topics(theta: np.ndarray) -> list[list[tuple[int, float]]]:
    """Per row: up to TOP_TOPICS (topic, proportion) pairs >= MIN_TOPIC_PROB, largest first (always >= 1)."""
    idx, vals, top = _top_sorted(theta)
    out = []
    for r in range(theta.shape[0]):
        row = [(int(idx[r, j]), float(vals[r, j])) for j in range(top) if j == 0 or vals[r, j] >= MIN_TOPIC_PROB]
        out.append(row)
    return out
