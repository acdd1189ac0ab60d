"""What a local step hands to the global update, whatever the engine.

A ``Summary`` holds a batch's sufficient statistics S_kv (expected topic-word counts) as
CSR over the batch's word types, plus the local objective terms that do not depend on
the topics (entropy, allocation).  The memoized update caches these per batch; the
stochastic update scales and blends them in.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit


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


def summarize_sparse(batch, top_idx, top_r, top_n, n_topics: int) -> Summary:
    """Aggregate per-entry top-L responsibilities into topic-word statistics (Eq. 7)."""
    indptr, topics, values, totals = _summarize(
        batch.local, batch.counts, top_idx, top_r, top_n, batch.uniq.shape[0], n_topics)
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
