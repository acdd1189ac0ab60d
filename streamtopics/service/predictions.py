"""A processed batch as the messages the daemon publishes: predictions and dead letters.

Runs on the publisher thread (``PublishJob.build``), so it reads nothing live: every value
(the topic mixtures, the model version that predicted, the label names the scores are over)
was fixed when the batch was processed. The wire format itself is ``stream/codec.py``'s.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..stream.codec import DeadLetter, encode_dead_letter, encode_prediction, prediction_key
from ..stream.producer import OutMessage

__all__ = ["BatchMeta", "PredictionEncoder", "label_fields", "top_topics", "MIN_TOPIC_PROB", "TOP_TOPICS"]

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
            out.append(OutMessage(self.dead_letter_topic,
                                  encode_dead_letter(dl, ts=now, max_raw_bytes=self.max_raw_bytes),
                                  key=dl.key, headers=dl.headers))
        if theta is not None:
            extras = label_fields(sup, len(ids), label_names or [])
            for doc_id, row, extra in zip(ids, top_topics(theta), extras):
                out.append(OutMessage(self.output_topic,
                                      encode_prediction(doc_id, row, model_version=version, ts=now,
                                                        replica=self.replica, **extra),
                                      key=prediction_key(doc_id)))
        return out


def label_fields(sup: tuple | None, n: int, names: list) -> list[dict]:
    """``label``/``labels``/``scores``/``response`` of each prediction message; ``names``: the
    labels the scores are over (taken with the batch, never from the live model)."""
    if sup is None:
        return [{}] * n
    scores, predicted = sup
    out = []
    for i in range(n):
        p = predicted[i]
        extra: dict[str, Any] = {}
        if isinstance(p, (list, tuple)):  # multi-label
            extra["labels"] = [str(x) for x in p]
        elif isinstance(p, str):
            extra["label"] = p
        elif p is not None:
            extra["response"] = float(p)
        if scores is not None and names:
            extra["scores"] = dict(zip(names, scores[i].tolist()))
        out.append(extra)
    return out


def top_topics(theta: np.ndarray) -> list[list[tuple[int, float]]]:
    """Per row: up to TOP_TOPICS (topic, proportion) pairs >= MIN_TOPIC_PROB, largest first (always >= 1)."""
    n, k = theta.shape
    top = min(TOP_TOPICS, k)
    idx = np.argpartition(-theta, top - 1, axis=1)[:, :top] if top < k else np.tile(np.arange(k), (n, 1))
    vals = np.take_along_axis(theta, idx, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    idx = np.take_along_axis(idx, order, axis=1)
    vals = np.take_along_axis(vals, order, axis=1)
    out = []
    for r in range(n):
        row = [(int(idx[r, j]), float(vals[r, j])) for j in range(top) if j == 0 or vals[r, j] >= MIN_TOPIC_PROB]
        out.append(row)
    return out
