"""ModelState: the global topic statistics every engine reads and every update writes.

The variational topic-word parameter is stored as ``lambda[v, k] = beta + scale * mu[v, k]``
(word-major, so one word's K values are contiguous for the local step).  The scalar
``scale`` makes the stochastic update's decay ``lambda <- (1 - rho) lambda + ...`` cost
O(entries touched by the batch) instead of O(V K); it is folded back into ``mu`` when it
gets small.  For the memoized update scale stays 1 and ``mu`` is exactly the sum of the
cached batch summaries.

Rows for new words are appended with amortized capacity doubling; a new word starts at
the prior (mu = 0) and existing rows are never touched by growth.
"""
from __future__ import annotations

import logging
import math

import numpy as np

from ._numeric import digamma
from .jit_cache import njit
from .parallel import claim_range, flag_read

_RESCALE_BELOW = 1e-60
log = logging.getLogger(__name__)


@njit(cache=True, nogil=True)
def _expected_log_phi(mu, scale, beta, rows, psi_tot, common):
    out = np.empty((rows.shape[0], mu.shape[1]))
    expected_log_phi_rows(mu, scale, beta, rows, psi_tot, common, out, 0, rows.shape[0])
    return out


@njit(cache=True, nogil=True, inline="always")
def _psi_lam(m, scale, beta, common, psi_common):
    """psi(lambda) of one entry mu = m. Entries no batch summary has touched still hold the initial
    pseudo-count ``common`` (most of a rare word's K entries): their digamma is computed once."""
    return psi_common if m == common else digamma(beta + scale * m)


@njit(cache=True, nogil=True)
def expected_log_phi_rows(mu, scale, beta, rows, psi_tot, common, out, u0, u1):
    """Rows u0..u1-1 of E[log phi] into ``out`` (each row independent: safe to split over threads)."""
    K = mu.shape[1]
    psi_common = digamma(beta + scale * common)
    for u in range(u0, u1):
        v = rows[u]
        for k in range(K):
            out[u, k] = _psi_lam(mu[v, k], scale, beta, common, psi_common) - psi_tot[k]


@njit(cache=True, nogil=True)
def _common_log_phi(scale, beta, common, psi_tot):
    psi_common = digamma(beta + scale * common)
    out = np.empty(psi_tot.shape[0])
    for k in range(psi_tot.shape[0]):
        out[k] = _psi_lam(common, scale, beta, common, psi_common) - psi_tot[k]
    return out


@njit(cache=True, nogil=True)
def psi_lam_ahead(stop, mu, scale, beta, rows, common):
    """psi(lambda) of the rows ``rows`` in order, until ``stop[0]`` is set (``ModelState.read_ahead``);
    returns (rows done, their values)."""
    K = mu.shape[1]
    out = np.empty((rows.shape[0], K))
    psi_common = digamma(beta + scale * common)
    for u in range(rows.shape[0]):
        if flag_read(stop):
            return u, out
        v = rows[u]
        for k in range(K):
            out[u, k] = _psi_lam(mu[v, k], scale, beta, common, psi_common)
    return rows.shape[0], out


@njit(cache=True, nogil=True)
def expected_log_phi_claimed(counter, bounds, mu, scale, beta, rows, psi_tot, common, out, slot, ahead):
    """``expected_log_phi_rows`` over the ranges this thread claims (``parallel.claim_range``); a row
    with ``slot[u] >= 0`` takes its psi(lambda) values from row ``slot[u]`` of ``ahead`` (read
    ahead: the same values) instead of computing them."""
    K = mu.shape[1]
    while True:
        lo, hi = claim_range(counter, bounds)
        if lo < 0:
            break
        for u in range(lo, hi):
            s = slot[u] if slot.shape[0] else -1
            if s < 0:
                expected_log_phi_rows(mu, scale, beta, rows, psi_tot, common, out, u, u + 1)
            else:
                for k in range(K):
                    out[u, k] = ahead[s, k] - psi_tot[k]
    return 0


@njit(cache=True, nogil=True)
def scatter_claimed(counter, bounds, mu, word_ids, indptr, topics, values, factor):
    """``scatter_rows`` over the ranges this thread claims."""
    while True:
        lo, hi = claim_range(counter, bounds)
        if lo < 0:
            break
        scatter_rows(mu, word_ids, indptr, topics, values, factor, lo, hi)
    return 0


@njit(cache=True, nogil=True)
def scatter_rows(mu, word_ids, indptr, topics, values, factor, u0, u1):
    """mu[v, k] += factor * S_kv for the rows u0..u1-1 (distinct words: ranges touch disjoint rows)."""
    for u in range(u0, u1):
        v = word_ids[u]
        for p in range(indptr[u], indptr[u + 1]):
            mu[v, topics[p]] += factor * values[p]


@njit(cache=True, nogil=True)
def add_totals(totals, topics, values, factor):
    """totals[k] += factor * S_kv in entry order (the order ``_scatter_add`` adds them)."""
    for p in range(topics.shape[0]):
        totals[topics[p]] += factor * values[p]


@njit(cache=True, nogil=True)
def distinct_rows(word_ids, n_words):
    seen = np.zeros(max(n_words, 1), dtype=np.uint8)
    for v in word_ids:
        if v < 0 or v >= n_words or seen[v]:
            return False
        seen[v] = 1
    return True


@njit(cache=True, nogil=True)
def _scatter_add(mu, totals, word_ids, indptr, topics, values, factor):
    for u in range(word_ids.shape[0]):
        v = word_ids[u]
        for p in range(indptr[u], indptr[u + 1]):
            k = topics[p]
            x = factor * values[p]
            mu[v, k] += x
            totals[k] += x


class NotFittedError(RuntimeError):
    """Inference asked of a model that has learned no topics yet."""


def require_topics(state) -> None:
    """Raise ``NotFittedError`` unless the model has topics: a local step needs them, and a
    model gets them from its first documents with words (fit, partial_fit, the daemon's stream)."""
    if not state.initialized and state.n_words == 0:  # (a state filled by hand, as tests do, has words)
        raise NotFittedError("the model has no topics yet: it learns them from its first documents with words "
                             "(fit or partial_fit)")


class ModelState:
    """Topic-word statistics, hyperparameters and counters shared by all engines."""

    def __init__(self, n_topics: int, alpha: float, beta: float, capacity: int = 1024):
        self.n_topics = int(n_topics)
        self.alpha = float(alpha)
        self.beta = float(beta)
        self.mu = np.zeros((max(int(capacity), 16), self.n_topics))
        self.mu_totals = np.zeros(self.n_topics)
        self.scale = 1.0
        self.n_words = 0
        self.docs_seen = 0
        self.tokens_seen = 0.0
        self.n_updates = 0
        # position of the stochastic step schedule: updates, a batch under STEP_DOCS documents
        # counting as its fraction of one (updates.schedule_step)
        self.steps = 0.0
        self.version = 0
        self.initialized = False
        # Topics 0..n_seeded-1 hold a seed; the rest are at the prior until a batch seeds them
        # (a first batch with fewer distinct documents than topics: seeding.continue_seeding).
        self.n_seeded = self.n_topics
        # Pseudo-count every (word, topic) starts with, in mu units: like Hoffman et al.'s
        # Gamma(100, 1/100) initialisation it decays with the stochastic scale, and a word
        # that joins later starts where it would stand had it been there from the start.
        self.smoothing = 0.0
        # the threads of the model's local step (the runner its last ``expected_log_phi`` call
        # got): ``add_summary`` splits its rows over them too.  Never persisted.
        self.runner = None
        self._ahead = None  # a read-ahead of psi(lambda) rows in progress (``read_ahead``)
        self.rows_read_ahead = 0  # rows ``expected_log_phi`` took from read-aheads (not persisted)
        self._where = None

    # -- vocabulary growth --------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return self.mu.shape[0]

    def ensure_words(self, n_words: int) -> None:
        """Make room for ids < n_words; new rows start at the prior."""
        if n_words > self.capacity:
            cap = self.capacity
            while cap < n_words:
                cap *= 2
            grown = np.zeros((cap, self.n_topics))
            grown[: self.n_words] = self.mu[: self.n_words]
            self.mu = grown
        if n_words > self.n_words and self.smoothing > 0.0:
            self.mu[self.n_words:n_words] = self.smoothing
            self.mu_totals += (n_words - self.n_words) * self.smoothing
        self.n_words = max(self.n_words, int(n_words))

    def shrink_words(self, n_words: int) -> None:
        """Drop rows ``>= n_words`` that were only grown (still at the prior): undoes ``ensure_words``."""
        self.drop_ahead()
        n_words = int(n_words)
        if n_words >= self.n_words:
            return
        if self.smoothing > 0.0:
            self.mu_totals -= (self.n_words - n_words) * self.smoothing
        self.mu[n_words:self.n_words] = 0.0
        self.n_words = n_words

    def reset_words(self, ids: np.ndarray) -> None:
        """Return the rows of ``ids`` to the prior (their word was evicted from the vocabulary)."""
        if self._ahead is not None:  # those rows' read-ahead values are stale; the others stand
            self._ahead[-1].append(np.asarray(ids, dtype=np.int64))
        if len(ids):
            self.mu_totals -= self.mu[ids].sum(axis=0)
            self.mu[ids] = self.smoothing
            self.mu_totals += len(ids) * self.smoothing

    # -- reads ------------------------------------------------------------------------
    def lam(self) -> np.ndarray:
        """lambda as a (V, K) array (a copy)."""
        return self.beta + self.scale * self.mu[: self.n_words]

    def lam_totals(self) -> np.ndarray:
        return self.n_words * self.beta + self.scale * self.mu_totals

    def expected_log_phi(self, rows: np.ndarray, runner=None) -> np.ndarray:
        """E[log phi_kv] = psi(lambda_kv) - psi(sum_v lambda_kv) for the given word ids, shape (U, K).

        ``runner`` (a ``parallel.ThreadRunner``) splits the rows over threads; the values are
        the same whatever the split, and whatever ``read_ahead`` computed before."""
        if runner is not None:
            self.runner = runner
        slot, ahead = self.take_ahead(rows)
        psi_tot = _psi_vec(self.lam_totals())
        rows = np.asarray(rows, dtype=np.int64)
        if runner is None or runner.threads == 1 or rows.shape[0] < 64:
            return _expected_log_phi(self.mu, self.scale, self.beta, rows, psi_tot, self.smoothing)
        out = np.empty((rows.shape[0], self.n_topics))
        mu, scale, beta, common = self.mu, self.scale, self.beta, self.smoothing
        bounds = runner.row_bounds(rows.shape[0])
        runner.run_claimed(lambda ctr: expected_log_phi_claimed(ctr, bounds, mu, scale, beta, rows, psi_tot, common,
                                                                out, slot, ahead))
        return out

    def common_log_phi(self) -> np.ndarray:
        """E[log phi_kv] of every entry still at the initial pseudo-count (mu_vk == smoothing), per
        topic: the value ``expected_log_phi`` gives such entries, bit for bit."""
        return _common_log_phi(self.scale, self.beta, self.smoothing, _psi_vec(self.lam_totals()))

    def read_ahead(self, rows: np.ndarray, runner) -> None:
        """Start computing psi(lambda) of the word ids ``rows`` (likeliest first) on a helper of
        ``runner`` while the caller builds the next batch (serial work that leaves the other cores
        idle); the next ``expected_log_phi`` takes the rows done by then. Only psi(lambda) is read
        ahead: the topic totals change when new words join. Any write to the rows drops it."""
        self.drop_ahead()
        if runner is None or runner.threads == 1 or not self.initialized or len(rows) == 0:
            return
        mu, scale, beta, common = self.mu, self.scale, self.beta, self.smoothing
        rows = np.asarray(rows, dtype=np.int64)
        rows = rows[(rows >= 0) & (rows < self.n_words)]  # a replica's last batch had provisional ids past them
        aside = runner.aside(lambda stop: psi_lam_ahead(stop, mu, scale, beta, rows, common))
        if aside is not None:
            self._ahead = (aside, rows, scale, beta, common, [])  # last: rows written since

    def take_ahead(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """(for each of ``rows``: its row in the read-ahead values or -1, the values); empty arrays
        when nothing valid was read ahead."""
        ahead, self._ahead = self._ahead, None
        none = np.empty(0, dtype=np.int64), np.empty((0, self.n_topics))
        if ahead is None:
            return none
        aside, done_rows, scale, beta, common, stale = ahead
        try:
            done, values = aside.result()
        except Exception as exc:  # an optimisation only: the rows are computed as without it
            log.warning("read-ahead of word rows failed; computing them in the local step", extra={"error": repr(exc)})
            return none
        if done == 0 or (scale, beta, common) != (self.scale, self.beta, self.smoothing):
            return none
        if self._where is None or self._where.shape[0] < self.mu.shape[0]:  # word id -> read-ahead row
            self._where = np.full(self.mu.shape[0], -1, dtype=np.int64)  # kept all -1 between calls: O(done) each
        where, got = self._where, done_rows[:done]
        where[got] = np.arange(done)
        for ids in stale:
            where[ids[ids < where.shape[0]]] = -1
        rows = np.asarray(rows, dtype=np.int64)
        slot = np.where(rows < where.shape[0], where[np.minimum(rows, where.shape[0] - 1)], -1)
        where[got] = -1
        self.rows_read_ahead += int(np.count_nonzero(slot >= 0))
        return slot, values

    def drop_ahead(self) -> None:
        """Stop and forget any read-ahead (its rows are about to change, or nobody will take it)."""
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            ahead[0].stop()

    def topic_word(self) -> np.ndarray:
        """Posterior mean E[phi] as (K, V); rows sum to one."""
        lam = self.lam().T
        return lam / lam.sum(axis=1, keepdims=True)

    # -- writes -----------------------------------------------------------------------
    def add_summary(self, summary, factor: float) -> None:
        """mu += factor * S (factor may be negative: exact subtraction for memoized updates).

        With the local step's threads (``self.runner``) the rows are split over them (each (v, k)
        gets one addition, whichever thread makes it) and the topic totals are added in entry
        order by one thread: the same floats as one thread's pass."""
        self.drop_ahead()
        runner, w = self.runner, summary.word_ids
        if runner is None or runner.threads == 1 or w.shape[0] < 256 or not distinct_rows(w, self.mu.shape[0]):
            _scatter_add(self.mu, self.mu_totals, w, summary.indptr, summary.topics, summary.values, float(factor))
            return
        mu, ptr, top, val, f = self.mu, summary.indptr, summary.topics, summary.values, float(factor)
        bounds = runner.bounds(ptr)
        runner.run_claimed(lambda ctr: scatter_claimed(ctr, bounds, mu, w, ptr, top, val, f))
        add_totals(self.mu_totals, top, val, f)

    def decay(self, keep: float) -> None:
        """lambda - beta <- keep * (lambda - beta), in O(1) via the scale."""
        self.drop_ahead()
        self.scale *= keep
        if self.scale < _RESCALE_BELOW:
            self.mu[: self.n_words] *= self.scale
            self.mu_totals = self.mu[: self.n_words].sum(axis=0)
            self.smoothing *= self.scale
            self.scale = 1.0

    def fold_scale(self) -> None:
        """Multiply the scale into mu so that scale == 1 (exact arithmetic for memoized updates)."""
        self.drop_ahead()
        if self.scale != 1.0:
            self.mu[: self.n_words] *= self.scale
            self.smoothing *= self.scale
            self.scale = 1.0
            self.refresh_totals()

    def lgamma_row_sums(self) -> np.ndarray:
        """sum_v lgamma(lambda_kv) per topic (for the ELBO's Dirichlet normalisers), shape (K,)."""
        return _lgamma_sums(self.mu, self.scale, self.beta, self.n_words)

    def clear(self) -> None:
        self.drop_ahead()
        self.mu[:] = 0.0
        self.mu_totals[:] = 0.0
        self.scale = 1.0
        self.smoothing = 0.0

    def reset_topics(self, topics: list[int]) -> None:
        """Columns ``topics`` back to the prior (every word at the init smoothing), their totals
        set to match: O(V |topics|), where recomputing every total would be O(V K)."""
        self.drop_ahead()
        _reset_columns(self.mu, self.n_words, np.asarray(topics, dtype=np.int64), self.smoothing)
        for k in topics:
            self.mu_totals[k] = self.n_words * self.smoothing

    @property
    def topics_seeded(self) -> int:
        """Topics holding a seed: none before the first batch, then ``n_seeded``."""
        return self.n_seeded if self.initialized else 0

    @property
    def fully_seeded(self) -> bool:
        """Every topic has its seed (``seeding.seed_topics`` / ``continue_seeding``)."""
        return self.topics_seeded >= self.n_topics

    def count_update(self, n_docs: int, n_tokens: float, steps: float) -> None:
        """Count an update that learned ``n_docs`` documents of ``n_tokens`` tokens, ``steps`` of the schedule."""
        self.docs_seen += n_docs
        self.tokens_seen += n_tokens
        self.n_updates += 1
        self.steps += steps
        self.version += 1

    def refresh_totals(self) -> None:
        """Recompute the running topic totals exactly (bounds drift from many small adds)."""
        self.mu_totals = self.mu[: self.n_words].sum(axis=0)

    # -- persistence ------------------------------------------------------------------
    def header(self) -> dict:
        return {
            "n_topics": self.n_topics, "alpha": self.alpha, "beta": self.beta, "scale": self.scale,
            "n_words": self.n_words, "docs_seen": self.docs_seen, "tokens_seen": self.tokens_seen,
            "n_updates": self.n_updates, "version": self.version, "initialized": self.initialized,
            "smoothing": self.smoothing, "steps": self.steps, "n_seeded": self.n_seeded,
        }

    def arrays(self) -> dict[str, np.ndarray]:
        return {"mu": self.mu[: self.n_words], "mu_totals": self.mu_totals}

    @classmethod
    def restore(cls, header: dict, arrays: dict[str, np.ndarray]) -> "ModelState":
        """The state a snapshot holds; ValueError names what is out of range (a checksummed file
        can still have been written wrong: alpha < 0 made every theta -inf/inf, a NaN in mu
        failed only later, in an export)."""
        for name in ("alpha", "beta", "scale"):
            v = header.get(name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"snapshot state: {name} must be a finite number > 0 (got {v!r})")
        s = cls(header["n_topics"], header["alpha"], header["beta"])
        n = int(header["n_words"])
        mu = arrays["mu"]
        if mu.shape != (n, s.n_topics):
            raise ValueError(f"snapshot array mu has shape {mu.shape}, expected {(n, s.n_topics)}")
        totals = np.asarray(arrays["mu_totals"])
        if totals.shape != (s.n_topics,):
            raise ValueError(f"snapshot array mu_totals has shape {totals.shape}, expected {(s.n_topics,)}")
        if not (np.isfinite(mu).all() and np.isfinite(totals).all()):
            raise ValueError("snapshot state: the topic-word statistics hold NaN or infinite values")
        s.ensure_words(max(n, 1))
        s.n_words = n
        s.mu[:n] = mu
        s.mu_totals = np.array(arrays["mu_totals"], dtype=np.float64)
        s.scale = float(header["scale"])
        s.docs_seen = int(header["docs_seen"])
        s.tokens_seen = float(header["tokens_seen"])
        s.n_updates = int(header["n_updates"])
        s.steps = float(header.get("steps", s.n_updates))  # snapshots before it: every update was one step
        s.version = int(header["version"])
        s.initialized = bool(header["initialized"])
        s.smoothing = float(header.get("smoothing", 0.0))
        s.n_seeded = int(header.get("n_seeded", s.n_topics))  # snapshots before it: every topic was seeded at once
        if not 0 <= s.n_seeded <= s.n_topics:
            raise ValueError(f"snapshot state: n_seeded must be in 0..{s.n_topics} (got {s.n_seeded})")
        return s


@njit(cache=True, nogil=True)
def _lgamma_sums(mu, scale, beta, n):
    K = mu.shape[1]
    out = np.zeros(K)
    for v in range(n):
        for k in range(K):
            out[k] += math.lgamma(beta + scale * mu[v, k])
    return out


@njit(cache=True, nogil=True)
def _reset_columns(mu, n, topics, value):
    for v in range(n):
        for k in topics:
            mu[v, k] = value


@njit(cache=True, nogil=True)
def _psi_vec(x):
    out = np.empty(x.shape[0])
    for i in range(x.shape[0]):
        out[i] = digamma(x[i])
    return out
