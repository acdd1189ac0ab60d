"""What a local step hands to the global update, whatever the engine.

A ``Summary`` holds a batch's sufficient statistics S_kv (expected topic-word counts) as
CSR over the batch's word types, plus the local objective terms that do not depend on
the topics (entropy, allocation).  The memoized update caches these per batch; the
stochastic update scales and blends them in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .jit_cache import njit
from .parallel import claim_range


@dataclass
class Summary:
    word_ids: np.ndarray      # int64 (U): global vocabulary ids of the rows
    indptr: np.ndarray        # int64 (U+1)
    topics: np.ndarray        # int32 (nnz)
    values: np.ndarray        # float64 (nnz): expected counts S_kv
    topic_totals: np.ndarray  # float64 (K): sum_v S_kv
    n_docs: int
    n_tokens: float
    entropy: float = 0.0      # L_entropy of the batch (App. C, Eq. 24)
    alloc: float = 0.0        # L_alloc of the batch at the optimal theta
    key: object = None
    extra: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return int(self.word_ids.nbytes + self.indptr.nbytes + self.topics.nbytes + self.values.nbytes
                   + self.topic_totals.nbytes)

    def rows(self) -> np.ndarray:
        """Global word id of every stored entry."""
        return np.repeat(self.word_ids, np.diff(self.indptr))

    def drop_words(self, ids: np.ndarray) -> "Summary":
        """This summary without the rows of ``ids`` (used when the vocabulary evicts words)."""
        keep_row = ~np.isin(self.word_ids, ids)
        if keep_row.all():
            return self
        keep = np.repeat(keep_row, np.diff(self.indptr))
        removed = np.bincount(self.topics[~keep], weights=self.values[~keep], minlength=self.topic_totals.size)
        lengths = np.diff(self.indptr)[keep_row]
        indptr = np.zeros(lengths.size + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        return Summary(
            word_ids=self.word_ids[keep_row], indptr=indptr, topics=self.topics[keep], values=self.values[keep],
            topic_totals=self.topic_totals - removed, n_docs=self.n_docs, n_tokens=self.n_tokens,
            entropy=self.entropy, alloc=self.alloc, key=self.key, extra=self.extra,
        )


@dataclass
class LocalResult:
    doc_topic: np.ndarray          # (D, K) expected topic counts N_dk per document
    summary: Summary | None
    iterations: np.ndarray         # (D,) local iterations (or sweeps) per document
    objective: float = 0.0         # sum of per-document local objectives at the current topics
    restarts_tried: int = 0
    restarts_accepted: int = 0
    stats: dict = field(default_factory=dict)
    alpha: float | None = None     # the alpha the local step used (theta of these counts); alpha="auto" moves it


@njit(cache=True, nogil=True)
def _summarize(local, cnt, top_idx, top_r, top_n, U, K):
    nnz = local.shape[0]
    start = np.zeros(U + 1, dtype=np.int64)
    for j in range(nnz):
        start[local[j] + 1] += 1
    for u in range(U):
        start[u + 1] += start[u]
    fill = start[:-1].copy()
    order = np.empty(nnz, dtype=np.int64)
    for j in range(nnz):
        u = local[j]
        order[fill[u]] = j
        fill[u] += 1
    total = 0
    for j in range(nnz):
        total += top_n[j]
    topics = np.empty(total, dtype=np.int32)
    values = np.empty(total)
    indptr = np.zeros(U + 1, dtype=np.int64)
    acc = np.zeros(K)
    owner = np.full(K, -1, dtype=np.int64)
    totals = np.zeros(K)
    pos = 0
    for u in range(U):
        first = pos
        for q in range(start[u], start[u + 1]):
            j = order[q]
            c = cnt[j]
            for l in range(top_n[j]):
                k = top_idx[j, l]
                if owner[k] != u:
                    owner[k] = u
                    acc[k] = 0.0
                    topics[pos] = k
                    pos += 1
                acc[k] += c * top_r[j, l]
        for p in range(first, pos):
            k = topics[p]
            values[p] = acc[k]
            totals[k] += acc[k]
        indptr[u + 1] = pos
    return indptr, topics[:pos].copy(), values[:pos].copy(), totals


@njit(cache=True, nogil=True)
def summary_order(local, top_n, U, K):
    """The entries grouped by word, in entry order within a word (``start``, ``order``), and
    ``bound``: where each word's rows may start in a scratch buffer (a word has at most
    min(K, sum of its entries' top_n) distinct topics)."""
    nnz = local.shape[0]
    start = np.zeros(U + 1, dtype=np.int64)
    bound = np.zeros(U + 1, dtype=np.int64)
    for j in range(nnz):
        start[local[j] + 1] += 1
        bound[local[j] + 1] += top_n[j]
    for u in range(U):
        start[u + 1] += start[u]
        bound[u + 1] = bound[u] + min(bound[u + 1], K)
    fill = start[:-1].copy()
    order = np.empty(nnz, dtype=np.int64)
    for j in range(nnz):
        u = local[j]
        order[fill[u]] = j
        fill[u] += 1
    return start, order, bound


@njit(cache=True, nogil=True)
def summary_words(u0, u1, start, order, cnt, top_idx, top_r, top_n, bound, K, tmp_topics, tmp_values, count):
    """S_kv of words u0..u1-1 (Eq. 7) into the scratch rows from ``bound[u]``: topics in the order
    the word's entries first give them, values summed in entry order (as ``_summarize``)."""
    acc = np.zeros(K)
    owner = np.full(K, -1, dtype=np.int64)
    for u in range(u0, u1):
        pos = bound[u]
        for q in range(start[u], start[u + 1]):
            j = order[q]
            c = cnt[j]
            for l in range(top_n[j]):
                k = top_idx[j, l]
                if owner[k] != u:
                    owner[k] = u
                    acc[k] = 0.0
                    tmp_topics[pos] = k
                    pos += 1
                acc[k] += c * top_r[j, l]
        for p in range(bound[u], pos):
            tmp_values[p] = acc[tmp_topics[p]]
        count[u] = pos - bound[u]


@njit(cache=True, nogil=True)
def summary_words_claimed(counter, bounds, start, order, cnt, top_idx, top_r, top_n, bound, K, tmp_topics, tmp_values,
                          count):
    """``summary_words`` over the word ranges this thread claims (``parallel.claim_range``)."""
    while True:
        lo, hi = claim_range(counter, bounds)
        if lo < 0:
            break
        summary_words(lo, hi, start, order, cnt, top_idx, top_r, top_n, bound, K, tmp_topics, tmp_values, count)
    return 0


@njit(cache=True, nogil=True)
def summary_compact(bound, count, tmp_topics, tmp_values, K):
    """The words' scratch rows packed into CSR, topic totals summed in row order (as ``_summarize``)."""
    U = count.shape[0]
    indptr = np.zeros(U + 1, dtype=np.int64)
    for u in range(U):
        indptr[u + 1] = indptr[u] + count[u]
    topics = np.empty(indptr[U], dtype=np.int32)
    values = np.empty(indptr[U])
    totals = np.zeros(K)
    for u in range(U):
        p = indptr[u]
        for i in range(bound[u], bound[u] + count[u]):
            topics[p] = tmp_topics[i]
            values[p] = tmp_values[i]
            totals[tmp_topics[i]] += tmp_values[i]
            p += 1
    return indptr, topics, values, totals


def summarize_sparse(batch, top_idx, top_r, top_n, n_topics: int, runner=None) -> Summary:
    """Aggregate per-entry top-L responsibilities into topic-word statistics (Eq. 7).

    ``runner`` (a ``parallel.ThreadRunner``) splits the words over threads; every word's row
    and the topic totals are summed in the same order whatever the split, so the summary is
    the same bit for bit."""
    U = batch.uniq.shape[0]
    if runner is None or runner.threads == 1 or U < 64:
        indptr, topics, values, totals = _summarize(batch.local, batch.counts, top_idx, top_r, top_n, U, n_topics)
    else:
        start, order, bound = summary_order(batch.local, top_n, U, n_topics)
        tmp_topics, tmp_values = np.empty(bound[U], dtype=np.int32), np.empty(bound[U])
        count = np.empty(U, dtype=np.int64)
        bounds = runner.bounds(bound)
        runner.run_claimed(lambda ctr: summary_words_claimed(ctr, bounds, start, order, batch.counts, top_idx, top_r,
                                                             top_n, bound, n_topics, tmp_topics, tmp_values, count))
        indptr, topics, values, totals = summary_compact(bound, count, tmp_topics, tmp_values, n_topics)
    return Summary(word_ids=batch.uniq.copy(), indptr=indptr, topics=topics, values=values, topic_totals=totals,
                   n_docs=batch.n_docs, n_tokens=float(batch.n_tokens))


def summarize_dense(batch, word_topic: np.ndarray, n_docs: int | None = None) -> Summary:
    """Summary from a dense (U, K) block of topic-word counts over ``batch.uniq`` (sampling engines)."""
    rows, cols = np.nonzero(word_topic)
    indptr = np.zeros(word_topic.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=word_topic.shape[0]), out=indptr[1:])
    return Summary(word_ids=batch.uniq.copy(), indptr=indptr, topics=cols.astype(np.int32),
                   values=word_topic[rows, cols].astype(np.float64), topic_totals=word_topic.sum(axis=0).astype(np.float64),
                   n_docs=batch.n_docs if n_docs is None else n_docs, n_tokens=float(batch.n_tokens))


def check_finite(summary: Summary | None, doc_topic: np.ndarray | None = None) -> None:
    """Raise FloatingPointError when a batch's expected counts (or its ``doc_topic``) hold NaN or
    inf: a local step that broke down numerically must not reach the topics, where one NaN spreads
    to every later prediction. O(nnz), called before the update (``TopicModel.process``) or before a
    replica's record is built; None: nothing to check."""
    if summary is None:
        return
    for name, arr in (("expected counts", summary.values), ("topic totals", summary.topic_totals),
                      ("document-topic counts", doc_topic)):
        if arr is not None and not np.isfinite(arr).all():
            bad = int(arr.size - np.count_nonzero(np.isfinite(arr)))
            raise FloatingPointError(f"the local step produced {bad} non-finite {name} in a batch of "
                                     f"{summary.n_docs} documents; the batch is not learned")
