"""Global updates: one ``Summary`` in, the shared ``ModelState`` updated (Hughes & Sudderth §3.4).

* ``StochasticUpdate`` (SVI, Hoffman et al.):
  lambda <- (1 - rho_t) lambda + rho_t (beta + (D/|B|) S_B),  rho_t = max(rho_min, (delay + t)^-kappa).
  D is an effective corpus size; ``None`` means "documents seen so far, this batch
  included", which for a
  finite stream read once grows to the true corpus size.  A positive ``rho_min`` keeps
  a never-ending stream adapting (forgetting old data geometrically).

* ``MemoizedUpdate`` (MVI, Hughes & Sudderth 2013): lambda = beta + sum_b S_b over the
  cached batch summaries.  A revisited batch key has its old summary subtracted and the
  new one added exactly; the first lap is streaming variational Bayes.  At most
  ``window`` summaries are cached: past that the oldest batch is subtracted and
  forgotten (a sliding window, which is also how the memoized model follows drift).
  A new local solution for a revisited batch is kept only if it raises the batch's
  objective under the current topics, so the whole-data ELBO never decreases.
"""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from .summary import Summary


class StochasticUpdate:
    name = "stochastic"

    def __init__(self, delay: float = 1.0, forgetting_rate: float = 0.6, rho_min: float = 0.0,
                 corpus_size: int | None = None):
        if delay < 0:
            raise ValueError(f"delay must be >= 0 (got {delay})")
        if not 0.5 < forgetting_rate <= 1.0:
            raise ValueError(f"forgetting_rate (kappa) must be in (0.5, 1] (got {forgetting_rate})")
        if not 0.0 <= rho_min < 1.0:
            raise ValueError(f"rho_min must be in [0, 1) (got {rho_min})")
        if corpus_size is not None and corpus_size < 1:
            raise ValueError(f"corpus_size must be >= 1 or None (got {corpus_size})")
        self.delay = float(delay)
        self.forgetting_rate = float(forgetting_rate)
        self.rho_min = float(rho_min)
        self.corpus_size = corpus_size

    def rho(self, t: int) -> float:
        """Step size of update number t (1-based)."""
        return max(self.rho_min, (self.delay + t) ** -self.forgetting_rate)

    def apply(self, state, summary: Summary, key=None) -> dict:
        if summary.n_docs == 0:
            return {"rho": 0.0}
        t = state.n_updates + 1
        rho = self.rho(t)
        D = self.corpus_size if self.corpus_size is not None else state.docs_seen + summary.n_docs
        # lambda - beta <- (1-rho)(lambda - beta) + rho (D/|B|) S
        state.decay(1.0 - rho)
        if state.scale <= 0.0:  # rho == 1: everything before is forgotten
            state.clear()
        state.add_summary(summary, rho * D / summary.n_docs / state.scale)
        return {"rho": rho, "corpus_size": D}

    def forget_words(self, ids: np.ndarray) -> None:
        pass

    def config(self) -> dict:
        return {"delay": self.delay, "forgetting_rate": self.forgetting_rate, "rho_min": self.rho_min,
                "corpus_size": self.corpus_size}

    def cache_items(self):
        return []

    def restore_cache(self, items) -> None:
        pass


class MemoizedUpdate:
    name = "memoized"

    def __init__(self, window: int | None = None):
        if window is not None and window < 1:
            raise ValueError(f"memoized window must be >= 1 batches or None (got {window})")
        self.window = window
        self.cache: OrderedDict[object, Summary] = OrderedDict()
        self.rejected = 0

    def apply(self, state, summary: Summary, key=None, new_objective: float | None = None) -> dict:
        if key is None:
            raise ValueError("memoized updates need a stable batch key")
        if state.scale != 1.0:  # a state that came from a stochastic run
            state.fold_scale()
        if not self.cache and state.n_updates == 0:
            # The initial pseudo-counts only served the first local step: from here on
            # lambda = beta + sum of cached summaries, exactly (bnpy does the same).
            state.clear()
        old = self.cache.pop(key, None)
        accepted = True
        if old is not None:
            if new_objective is not None and self.batch_objective(state, old) > new_objective:
                # Cold start landed in a worse local optimum: keep the cached solution.
                summary, accepted = old, False
                self.rejected += 1
            else:
                state.add_summary(old, -1.0)
        if accepted:
            state.add_summary(summary, 1.0)
        self.cache[key] = summary
        forgotten = 0
        while self.window is not None and len(self.cache) > self.window:
            _, oldest = self.cache.popitem(last=False)
            state.add_summary(oldest, -1.0)
            forgotten += 1
        return {"revisit": old is not None, "accepted": accepted, "forgotten": forgotten,
                "cached_batches": len(self.cache)}

    @staticmethod
    def batch_objective(state, summary: Summary) -> float:
        """Local objective of a cached batch under the current topics: <S, E log phi> + entropy + alloc."""
        if summary.word_ids.size == 0:
            return summary.entropy + summary.alloc
        elog = state.expected_log_phi(summary.word_ids)
        rows = np.repeat(np.arange(summary.word_ids.size), np.diff(summary.indptr))
        data = float(np.dot(summary.values, elog[rows, summary.topics]))
        return data + summary.entropy + summary.alloc

    def forget_words(self, ids: np.ndarray) -> None:
        for k in list(self.cache):
            self.cache[k] = self.cache[k].drop_words(ids)

    def elbo(self, state) -> float:
        """Whole-data ELBO of the cached batches (App. C), lambda at its optimum beta + S."""
        V, beta = state.n_words, state.beta
        # sum_k c_Dir(beta 1_V) - c_Dir(lambda_k); the (S + beta - lambda) E[log phi] term is 0 here.
        c_prior = math.lgamma(V * beta) - V * math.lgamma(beta)
        tot = state.lam_totals()
        c_post = np.array([math.lgamma(t) for t in tot]) - state.lgamma_row_sums()
        local = sum(s.entropy + s.alloc for s in self.cache.values())
        return float(state.n_topics * c_prior - c_post.sum() + local)

    def config(self) -> dict:
        return {"window": self.window}

    def cache_items(self):
        return list(self.cache.items())

    def restore_cache(self, items) -> None:
        self.cache = OrderedDict(items)
