"""Topic trends: per-topic prevalence over the stream, rising/fading topics, change events.

Prevalence of topic k in a batch = its share of the batch's token mass (sum over documents of the
expected topic counts N_dk, divided by the batch's tokens).  The tracker smooths it with an
exponential moving average s_t = (1 - a) s_{t-1} + a p_t (a = ``smoothing`` for a batch of 256
documents or more; a smaller batch, a fraction m of one, weighs 1 - (1 - a)^m, as the stochastic
update's step does (docs/defaults.md §5), so a slow stream cut into small batches by time does not
make noise of its trend; the first batch sets s_1 = p_1) and keeps the last ``history`` values as a bounded time series, stored in the
model's snapshots.  A topic's recent change is s_now - s_(now - lag); "rising" topics are the
top-n by change, "fading" the bottom-n.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .updates import fraction_of_step

__all__ = ["PrevalenceTracker", "TopicEvents"]


class PrevalenceTracker:
    """Bounded time series of smoothed per-topic prevalence (one point per learned batch)."""

    def __init__(self, n_topics: int, history: int = 256, smoothing: float = 0.2, lag: int = 20) -> None:
        if n_topics < 1 or history < 2 or not 0 < smoothing <= 1 or lag < 1:
            raise ValueError("n_topics >= 1, history >= 2, 0 < smoothing <= 1 and lag >= 1 are required")
        self.n_topics = int(n_topics)
        self.history = int(history)
        self.smoothing = float(smoothing)
        self.lag = int(lag)
        self._values = np.zeros((self.history, self.n_topics))
        self._versions = np.zeros(self.history, dtype=np.int64)
        self._count = 0  # points ever observed (the ring holds the last min(count, history))

    def __len__(self) -> int:
        return min(self._count, self.history)

    def observe(self, topic_mass: np.ndarray, version: int, weight: float = 1.0) -> np.ndarray:
        """Add one batch's token mass per topic (K,), the batch ``weight`` (in (0, 1]) of a full one;
        returns the smoothed prevalence."""
        mass = np.asarray(topic_mass, dtype=np.float64)
        if mass.shape != (self.n_topics,):
            raise ValueError(f"topic mass must have shape ({self.n_topics},), got {mass.shape}")
        total = mass.sum()
        if not total > 0 or not math.isfinite(total):
            return self.current()
        p = mass / total
        if self._count:
            a = fraction_of_step(self.smoothing, weight)
            p = (1.0 - a) * self._values[(self._count - 1) % self.history] + a * p
        i = self._count % self.history
        self._values[i] = p
        self._versions[i] = int(version)
        self._count += 1
        return p.copy()

    def series(self) -> tuple[np.ndarray, np.ndarray]:
        """(model versions (T,), smoothed prevalence (T, K)), oldest first (copies)."""
        n = len(self)
        if self._count <= self.history:
            return self._versions[:n].copy(), self._values[:n].copy()
        start = self._count % self.history
        order = np.r_[start:self.history, 0:start]
        return self._versions[order], self._values[order]

    def current(self) -> np.ndarray:
        if not self._count:
            return np.full(self.n_topics, np.nan)
        return self._values[(self._count - 1) % self.history].copy()

    def change(self, lag: int | None = None) -> np.ndarray:
        """s_now - s_(now - lag) per topic (the oldest point kept when fewer; zeros before 2 points)."""
        n = len(self)
        if n < 2:
            return np.zeros(self.n_topics)
        lag = min(self.lag if lag is None else int(lag), n - 1)
        now = (self._count - 1) % self.history
        then = (self._count - 1 - lag) % self.history
        return self._values[now] - self._values[then]

    def rising(self, n: int = 5) -> list[tuple[int, float]]:
        """The n topics whose prevalence grew most recently, as (topic, change), largest first."""
        ch = self.change()
        return [(int(k), float(ch[k])) for k in np.argsort(-ch, kind="stable")[:n] if ch[k] > 0]

    def fading(self, n: int = 5) -> list[tuple[int, float]]:
        """The n topics whose prevalence fell most recently, as (topic, change), largest fall first."""
        ch = self.change()
        return [(int(k), float(ch[k])) for k in np.argsort(ch, kind="stable")[:n] if ch[k] < 0]

    # -- snapshots: one header and two arrays ----------------------------------------------
    def state(self) -> tuple[dict, dict[str, np.ndarray]]:
        versions, values = self.series()
        header = {"n_topics": self.n_topics, "history": self.history, "smoothing": self.smoothing,
                  "lag": self.lag, "count": self._count}
        return header, {"trend_versions": versions, "trend_values": values}

    @classmethod
    def restore(cls, header: dict, arrays: dict[str, np.ndarray]) -> "PrevalenceTracker":
        t = cls(header["n_topics"], header["history"], header["smoothing"], header["lag"])
        versions, values = arrays["trend_versions"], arrays["trend_values"]
        n = versions.shape[0]
        if n > t.history or values.shape != (n, t.n_topics):
            raise ValueError("trend arrays do not match their header")
        t._values[:n] = values
        t._versions[:n] = versions
        t._count = n  # the ring restarts oldest-first at slot 0; the next point overwrites the oldest
        return t


class TopicEvents:
    """A record when a topic's prevalence or its top words changed beyond a threshold since the
    topic's last record (the first call sets the baseline and emits nothing).

    prevalence_change : relative change |s - s_ref| / s_ref that fires (0.5 = grew or fell by half);
        changes smaller than ``min_prevalence`` in absolute terms never fire.
    words_changed : how many of the top-``top_n`` words must have been replaced.
    """

    def __init__(self, prevalence_change: float = 0.5, words_changed: int = 3, top_n: int = 10,
                 min_prevalence: float = 0.002) -> None:
        self.prevalence_change = float(prevalence_change)
        self.words_changed = int(words_changed)
        self.top_n = int(top_n)
        self.min_prevalence = float(min_prevalence)
        self._ref_prev: np.ndarray | None = None
        self._ref_words: list[list[str]] | None = None

    def detect(self, version: int, prevalence: np.ndarray, top_words: Sequence[Sequence[str]],
               ts: float | None = None) -> list[dict]:
        prev = np.asarray(prevalence, dtype=np.float64)
        words = [list(w[: self.top_n]) for w in top_words]
        if self._ref_prev is None or self._ref_prev.shape != prev.shape:
            self._ref_prev, self._ref_words = prev.copy(), words
            return []
        out = []
        for k in range(prev.size):
            before, now = self._ref_prev[k], prev[k]
            reasons = []
            delta = now - before
            if (math.isfinite(now) and abs(delta) >= self.min_prevalence
                    and abs(delta) > self.prevalence_change * max(before, 1e-12)):
                reasons.append("rising" if delta > 0 else "fading")
            replaced = len(set(words[k]) - set(self._ref_words[k]))
            if self.words_changed > 0 and replaced >= self.words_changed:
                reasons.append("top_words")
            if reasons:
                ev = {"topic": k, "reasons": reasons, "model_version": int(version),
                      "prevalence": float(now), "prevalence_before": float(before),
                      "top_words": words[k], "top_words_before": self._ref_words[k],
                      "words_replaced": replaced}
                if ts is not None:
                    ev["ts"] = float(ts)
                out.append(ev)
                self._ref_prev[k] = now
                self._ref_words[k] = words[k]
        return out
