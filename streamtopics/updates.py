"""Global updates: one ``Summary`` in, the shared ``ModelState`` updated (Hughes & Sudderth §3.4).

* ``StochasticUpdate`` (SVI, Hoffman et al.):
  lambda <- (1 - rho_t) lambda + rho_t (beta + (D_t/|B|) S_B),  rho_t = max(rho_min, (delay + t)^-kappa).
  t is the schedule's position (``ModelState.steps``), in batches of STEP_DOCS = 256 documents: a
  batch of |B| < STEP_DOCS documents is that fraction of one, advances t by |B|/STEP_DOCS and takes
  1 - (1 - rho_t)^(|B|/STEP_DOCS), so a stream cut by time into small batches learns as one cut into
  batches of 256; a larger batch is one step (``schedule_step``, docs/defaults.md §5).
  D_t is the effective corpus size.  ``corpus_size=None`` (the default) needs no knowledge
  of the stream and does not depend on K (docs/defaults.md derives it):

      D_t = max(n_t, min(c H(V_t) V_t / Lbar_t, (c/2) |B| / rho_t)),
      c = RARE_WORD_COUNTS = 20, H(V) = ln V + 0.5772

  (with rho_min > 0: n_t capped at the window |B|(2 - rho_min)/rho_min).  n_t documents seen
  (this batch included), V_t the vocabulary size, Lbar_t the mean document length so far.
  The floor keeps rare words out of digamma's zero-forcing regime: VB's digamma locks a word
  in (early) or zero-forces it (later) when its occupied entries hold under a few expected
  counts, and log x - psi(x) ~ 1/(2x) is 0.05 nats at x = 10.  Two arguments each say how
  much claim is enough, and the rule takes the smaller, because over-claiming costs too
  (steeply on short documents, docs/defaults.md):
  - per word (the vocabulary): under Zipf's law the rarest of V words holds 1/H(V) of the
    mean word's count, so a mean of c H(V) counts per word keeps the rarest words at about
    c = 20 counts, ~10 in each of the ~2 topics a word occupies;
  - per occurrence (the step): an occurrence learned at step t adds rho_t D_t/|B| counts to
    its entry, which is c/2 = 10 when D_t = (c/2)|B|/rho_t.
  Past the floor, D grows with the data like the exact posterior; the step's term falls
  below n_t after about (c/2)^(1/(1-kappa)) batches.  ``corpus_size="seen"`` is D_t = n_t alone; an integer fixes D.  A positive
  ``rho_min`` keeps a never-ending stream adapting (forgetting old data geometrically).

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

from .options import CORPUS_SIZE_RULES, Memoized, Stochastic, check_corpus_size
from .summary import Summary

__all__ = ["CORPUS_SIZE_RULES", "RARE_WORD_COUNTS", "STEP_DOCS", "MemoizedUpdate", "StochasticUpdate",
           "check_corpus_size", "corpus_size_floor", "fraction_of_step", "schedule_advance", "schedule_rho", "schedule_step",
           "step_size_floor"]

# The unit of the step schedule: delay and forgetting_rate count steps of this many documents (the
# default minibatch); a smaller batch is a fraction of a step (docs/defaults.md §5).
STEP_DOCS = 256

# Expected counts the rarest word of the vocabulary should hold under the default D_t
# (docs/defaults.md §1): ~2 occupied topics x ~10 counts each (digamma bias 1/(2x) ~ 0.05 nats).
RARE_WORD_COUNTS = 20.0
_EULER_GAMMA = 0.5772156649015329


def corpus_size_floor(n_words: int, mean_len: float) -> float:
    """c H(V) V / Lbar: documents whose tokens give a Zipfian vocabulary of V words a mean of
    c H(V) expected counts per word, so its rarest words hold about c (H: harmonic number)."""
    V = max(int(n_words), 1)
    return RARE_WORD_COUNTS * (math.log(V) + _EULER_GAMMA) * V / max(float(mean_len), 1.0)


def schedule_rho(delay: float, forgetting_rate: float, rho_min: float, t: float) -> float:
    """The schedule max(rho_min, (delay + t)^-forgetting_rate) at position t, at most 1."""
    return min(1.0, max(rho_min, (delay + t) ** -forgetting_rate))


def schedule_advance(n_docs: int) -> float:
    """How far a batch of ``n_docs`` documents moves the schedule: min(1, n_docs / STEP_DOCS) steps."""
    return min(1.0, max(int(n_docs), 0) / STEP_DOCS)


def schedule_step(delay: float, forgetting_rate: float, rho_min: float, steps_before: float, n_docs: int) -> float:
    """Step of a batch of ``n_docs`` documents learned at schedule position ``steps_before``: with
    m = ``schedule_advance``, 1 - (1 - rho(steps_before + m))^m, the composition of the m-steps a
    batch of m STEP_DOCS documents stands for; rho(t) itself for a batch of STEP_DOCS or more, so
    a stream of such batches steps exactly as t = the update number."""
    m = schedule_advance(n_docs)
    if m <= 0.0:
        return 0.0
    return fraction_of_step(schedule_rho(delay, forgetting_rate, rho_min, steps_before + m), m)


def fraction_of_step(rate: float, m: float) -> float:
    """1 - (1 - rate)^m: the weight m of a step of size ``rate`` moves (m steps compose to it); ``rate``
    itself for m >= 1 or rate >= 1.  The stochastic step's and the trends' share of a small batch."""
    if m >= 1.0 or rate >= 1.0:
        return rate
    return -math.expm1(max(m, 0.0) * math.log1p(-rate))


def step_size_floor(batch_docs: int, rho: float) -> float:
    """(c/2) |B| / rho: the corpus size at which one occurrence learned with step ``rho`` adds
    c/2 = 10 expected counts to its (word, topic) entry (the ~10 per occupied entry of
    ``corpus_size_floor``, reached at the step that learns it instead of on average)."""
    return 0.5 * RARE_WORD_COUNTS * max(int(batch_docs), 1) / max(float(rho), 1e-12)


class StochasticUpdate:
    name = "stochastic"

    def __init__(self, delay: float = 1.0, forgetting_rate: float = 0.6, rho_min: float = 0.0,
                 corpus_size: int | None = None):
        Stochastic(delay, forgetting_rate, rho_min, corpus_size)  # the option's rules: ValueError naming the field
        self.delay = float(delay)
        self.forgetting_rate = float(forgetting_rate)
        self.rho_min = float(rho_min)
        self.corpus_size = corpus_size

    def rho(self, t: float) -> float:
        """The schedule at position t (the update number t when every batch holds STEP_DOCS documents)."""
        return schedule_rho(self.delay, self.forgetting_rate, self.rho_min, t)

    def step(self, steps_before: float, n_docs: int) -> float:
        """Step of a batch of ``n_docs`` documents learned at position ``steps_before`` (``schedule_step``)."""
        return schedule_step(self.delay, self.forgetting_rate, self.rho_min, steps_before, n_docs)

    def apply(self, state, summary: Summary, key=None) -> dict:
        if summary.n_docs == 0:
            return {"rho": 0.0}
        rho = self.step(state.steps, summary.n_docs)
        D = self.effective_corpus_size(state, summary, rho)
        # lambda - beta <- (1-rho)(lambda - beta) + rho (D/|B|) S
        state.decay(1.0 - rho)
        if state.scale <= 0.0:  # rho == 1: everything before is forgotten
            state.clear()
        state.add_summary(summary, rho * D / summary.n_docs / state.scale)
        return {"rho": rho, "corpus_size": D}

    def effective_corpus_size(self, state, summary: Summary, rho: float) -> float:
        """D_t of the update that is about to learn ``summary`` (see the module docstring)."""
        if isinstance(self.corpus_size, (int, float)):
            return float(self.corpus_size)
        seen = state.docs_seen + summary.n_docs
        if self.rho_min > 0.0:  # bounded memory: the window the floor step averages over
            seen = min(seen, max(summary.n_docs, STEP_DOCS) * (2.0 - self.rho_min) / self.rho_min)
        if self.corpus_size == "seen":
            return float(seen)
        mean_len = (state.tokens_seen + summary.n_tokens) / max(state.docs_seen + summary.n_docs, 1)
        floor = min(corpus_size_floor(state.n_words, mean_len), step_size_floor(summary.n_docs, rho))
        return float(max(seen, floor))

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
        Memoized(window)  # the option's rules: ValueError naming the field
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


def classifier_decay(updater, steps_before: float, n_docs: int, override: float | None = None) -> float:
    """Weight a supervised head's carried statistics keep when it learns the batch of ``n_docs``
    documents the topics just learned at schedule position ``steps_before``: ``override``
    (``sup_decay``) if set, else the topics' own 1 - rho_t under the stochastic update and 1 under
    the memoized one.  Its features
    were computed with topics that update has since moved by that step (docs/supervised.md §4,
    "The classifier forgets at the topics' rate")."""
    if override is not None:
        return float(override)
    if isinstance(updater, StochasticUpdate) and n_docs > 0:
        return 1.0 - updater.step(steps_before, n_docs)
    return 1.0

