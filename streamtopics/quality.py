"""Topic quality on a stream: NPMI coherence of each topic's top words and topic diversity.

NPMI (Bouma 2009; the c_npmi confirmation measure of Röder et al. 2015) with **boolean
document** co-occurrence: for the top-N words of a topic and a reference set of D documents,

    P(w) = D(w) / D,  P(wi, wj) = D(wi, wj) / D             (D(.) = documents containing the words)
    NPMI(wi, wj) = log(P(wi, wj) / (P(wi) P(wj))) / -log P(wi, wj)
    coherence(topic) = mean over the N(N-1)/2 pairs

with no smoothing: a pair never seen together scores -1, a pair in every document +1.
Diversity = |union of all topics' top-25 words| / (25 K).  Exact definitions: docs/topic-quality.md.

``CoherenceMonitor`` keeps the reference as a **sliding window of the stream** (the documents
of the last batches) and maintains the document counts incrementally, only for the current top
words: each batch adds its documents, the batches that fall out of the window are subtracted,
and only topics whose top-N *set* changed (plus words that newly became top words) are recounted
from the stored window.  ``cooccurrence_counts`` is an independent from-scratch count (a dense
incidence matrix product) used by tests and benchmarks, e.g. on a held-out reference corpus.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np
from numba import njit

__all__ = [
    "CoherenceMonitor",
    "QualityReport",
    "cooccurrence_counts",
    "npmi_from_counts",
    "npmi_reference",
    "topic_diversity",
    "top_word_ids",
]


def top_word_ids(weights: np.ndarray, n: int) -> np.ndarray:
    """(K, n) ids of the n largest entries of each column of ``weights`` (V, K), descending
    (ties: lower id first).  One row-major pass (numba) instead of K strided partitions."""
    V, K = weights.shape
    n = min(n, V)
    if n <= 0:
        return np.zeros((K, 0), dtype=np.int64)
    w = weights if weights.flags.c_contiguous and weights.dtype == np.float64 else \
        np.ascontiguousarray(weights, dtype=np.float64)
    return _top_n(w, n)


@njit(cache=True, nogil=True)
def _top_n(w, n):
    """Per column, keep the n best (value desc, id asc) in a sorted buffer; rows are read in order."""
    V, K = w.shape
    ids = np.full((K, n), -1, dtype=np.int64)
    vals = np.full((K, n), -np.inf)
    filled = np.zeros(K, dtype=np.int64)
    for v in range(V):
        for k in range(K):
            x = w[v, k]
            f = filled[k]
            if f == n and x <= vals[k, n - 1]:   # ties keep the lower id (seen first)
                continue
            j = f if f < n else n - 1
            while j > 0 and vals[k, j - 1] < x:
                if j < n:
                    vals[k, j] = vals[k, j - 1]
                    ids[k, j] = ids[k, j - 1]
                j -= 1
            vals[k, j] = x
            ids[k, j] = v
            if f < n:
                filled[k] = f + 1
    return ids


def topic_diversity(top_ids: np.ndarray, n: int = 25) -> float:
    """Share of unique words among all topics' top-n words (Dieng et al. 2020): 1 = disjoint topics."""
    top = np.asarray(top_ids)[:, :n]
    if top.size == 0:
        return float("nan")
    return float(np.unique(top).size / top.size)


def npmi_from_counts(df: np.ndarray, pair: np.ndarray, n_docs: int) -> np.ndarray:
    """Per-topic mean NPMI from document counts.

    ``df`` (K, N): documents containing each top word; ``pair`` (K, N, N): documents containing
    both words i < j (upper triangle used); ``n_docs``: documents in the reference.
    Returns (K,) float64 (NaN without documents).  No smoothing: D(wi, wj) = 0 -> -1,
    D(wi, wj) = D -> +1.
    """
    K, N = df.shape
    if n_docs <= 0 or N < 2:
        return np.full(K, np.nan)
    iu, ju = np.triu_indices(N, 1)
    co = pair[:, iu, ju].astype(np.float64)                               # (K, P)
    pi = df[:, iu].astype(np.float64) / n_docs
    pj = df[:, ju].astype(np.float64) / n_docs
    pij = co / n_docs
    out = np.full(co.shape, -1.0)
    full = co >= n_docs
    out[full] = 1.0
    mid = (co > 0) & ~full
    out[mid] = np.log(pij[mid] / (pi[mid] * pj[mid])) / -np.log(pij[mid])
    return out.mean(axis=1)


def cooccurrence_counts(docs: Iterable, top_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """From scratch: (df (K, N), pair (K, N, N) upper triangle, D) of the top words over ``docs``.

    ``docs``: iterables of word ids (or of any hashable tokens when ``top_ids`` holds the same
    kind); repeated words in a document count once (boolean documents).
    """
    top = np.asarray(top_ids)
    K, N = top.shape
    words = list(dict.fromkeys(top.ravel().tolist()))
    col = {w: i for i, w in enumerate(words)}
    rows: list[int] = []
    cols: list[int] = []
    D = 0
    for d, doc in enumerate(docs):
        D += 1
        for w in set(np.asarray(doc).tolist() if isinstance(doc, np.ndarray) else doc):
            c = col.get(w)
            if c is not None:
                rows.append(d)
                cols.append(c)
    X = np.zeros((D, len(words)), dtype=np.float64)
    X[np.asarray(rows, dtype=np.int64), np.asarray(cols, dtype=np.int64)] = 1.0
    C = np.rint(X.T @ X).astype(np.int64)                               # exact below 2**53
    idx = np.array([[col[w] for w in row] for row in top.tolist()], dtype=np.int64).reshape(K, N)
    df = C[idx, idx]
    pair = np.zeros((K, N, N), dtype=np.int64)
    iu, ju = np.triu_indices(N, 1)
    pair[:, iu, ju] = C[idx[:, iu], idx[:, ju]]
    return df, pair, D


def npmi_reference(docs: Iterable, top_ids: np.ndarray) -> np.ndarray:
    """Per-topic NPMI of ``top_ids`` (K, N) against a reference corpus ``docs`` (boolean documents)."""
    df, pair, D = cooccurrence_counts(docs, top_ids)
    return npmi_from_counts(df, pair, D)


@njit(cache=True, nogil=True)
def _accumulate(doc_ptr, word_ids, tw, inv_ptr, inv_k, inv_i, topic_sel, word_sel, mark, df, pair, sign):
    """Add ``sign`` x the boolean-document counts of the documents in CSR (doc_ptr, word_ids):
    df[w] for words with word_sel[w], pair[k, i, j] (i < j) for topics with topic_sel[k].
    tw (K, N): each topic's top words sorted by id; inv_*: for a word, its (topic, position)s."""
    N = tw.shape[1]
    W = inv_ptr.shape[0] - 1
    for d in range(doc_ptr.shape[0] - 1):
        s, e = doc_ptr[d], doc_ptr[d + 1]
        for p in range(s, e):
            w = word_ids[p]
            if w < W and inv_ptr[w + 1] > inv_ptr[w]:
                mark[w] = 1
        for p in range(s, e):
            w = word_ids[p]
            if w >= W or mark[w] != 1:
                continue
            mark[w] = 2  # counted once even if the document repeats it
            if word_sel[w]:
                df[w] += sign
            for o in range(inv_ptr[w], inv_ptr[w + 1]):
                k = inv_k[o]
                if topic_sel[k]:
                    i = inv_i[o]
                    for j in range(i + 1, N):
                        if mark[tw[k, j]] > 0:
                            pair[k, i, j] += sign
        for p in range(s, e):
            w = word_ids[p]
            if w < W:
                mark[w] = 0


class QualityReport:
    """Immutable result of one monitor update (numpy arrays are read-only copies)."""

    __slots__ = ("npmi", "diversity", "window_docs", "top_ids", "recounted_topics")

    def __init__(self, npmi, diversity, window_docs, top_ids, recounted_topics):
        self.npmi = npmi
        self.diversity = diversity
        self.window_docs = window_docs
        self.top_ids = top_ids
        self.recounted_topics = recounted_topics

    @property
    def mean_npmi(self) -> float:
        v = self.npmi[np.isfinite(self.npmi)]
        return float(v.mean()) if v.size else float("nan")


class CoherenceMonitor:
    """Incremental NPMI of each topic's top-``top_n`` words over the last ``window_docs``
    documents of the stream (whole batches: the oldest batch leaves once the window holds
    ``window_docs`` documents without it), plus diversity of the top-``diversity_n`` words.

    Call ``update(doc_ptr, word_ids, top_ids)`` once per learned batch with the batch's CSR
    arrays (word ids distinct per document, as ``Batch`` has them) and the model's current
    top words (K, >= top_n) after learning it.  ``evicted``: word ids the vocabulary recycled
    for this batch (their stored occurrences leave the window).
    """

    def __init__(self, window_docs: int = 5000, top_n: int = 10, diversity_n: int = 25) -> None:
        if window_docs < 1 or top_n < 2 or diversity_n < 1:
            raise ValueError("window_docs >= 1, top_n >= 2 and diversity_n >= 1 are required")
        self.window_docs = int(window_docs)
        self.top_n = int(top_n)
        self.diversity_n = int(diversity_n)
        self._window: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._n_docs = 0
        self._tw: np.ndarray | None = None      # (K, N) top words sorted by id (the counted sets)
        self._df = np.zeros(0, dtype=np.int64)  # by word id; valid for tracked words
        self._pair: np.ndarray | None = None    # (K, N, N)
        self._mark = np.zeros(0, dtype=np.int8)
        self._inv = None
        self.last: QualityReport | None = None

    @property
    def n_docs(self) -> int:
        return self._n_docs

    def window(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The stored window batches (doc_ptr, word_ids), oldest first (copies are not made)."""
        return list(self._window)

    def _grow(self, n: int) -> None:
        if n > self._df.size:
            size = max(n, 2 * self._df.size, 1024)
            self._df = np.concatenate([self._df, np.zeros(size - self._df.size, np.int64)])
            self._mark = np.zeros(size, dtype=np.int8)
            self._inv = None

    def _index(self, tw: np.ndarray):
        """Inverted index word -> (topic, position) over the counted top words."""
        K, N = tw.shape
        flat = tw.ravel()
        order = np.argsort(flat, kind="stable")
        inv_ptr = np.zeros(self._df.size + 1, dtype=np.int64)
        np.add.at(inv_ptr, flat + 1, 1)
        np.cumsum(inv_ptr, out=inv_ptr)
        return inv_ptr, (order // N).astype(np.int64), (order % N).astype(np.int64)

    def _run(self, doc_ptr, word_ids, topic_sel, word_sel, sign: int) -> None:
        inv_ptr, inv_k, inv_i = self._inv
        _accumulate(doc_ptr, word_ids, self._tw, inv_ptr, inv_k, inv_i, topic_sel, word_sel,
                    self._mark, self._df, self._pair, sign)

    def update(self, doc_ptr: np.ndarray, word_ids: np.ndarray, top_ids: np.ndarray,
               evicted: np.ndarray | None = None) -> QualityReport:
        top_ids = np.asarray(top_ids, dtype=np.int64)
        doc_ptr = np.ascontiguousarray(doc_ptr, dtype=np.int64)
        word_ids = np.ascontiguousarray(word_ids, dtype=np.int64)
        K = top_ids.shape[0]
        hi = int(max(word_ids.max(initial=-1), top_ids.max(initial=-1))) + 1
        self._grow(hi)
        if evicted is not None and len(evicted) and self._window:
            # recycled ids: drop their old occurrences from the stored window, then recount all
            gone = np.asarray(evicted, dtype=np.int64)
            self._window = deque(_drop_words(p, w, gone) for p, w in self._window)
            self._tw = None
        new_tw = np.sort(top_ids[:, : self.top_n], axis=1)
        # 1. the batch enters and old batches leave, counted for the current top words
        self._window.append((doc_ptr.copy(), word_ids.copy()))
        self._n_docs += doc_ptr.size - 1
        leaving = []
        while len(self._window) > 1 and self._n_docs - (self._window[0][0].size - 1) >= self.window_docs:
            leaving.append(self._window.popleft())
            self._n_docs -= leaving[-1][0].size - 1
        if self._tw is not None and self._tw.shape == new_tw.shape and self._inv is not None:
            all_topics = np.ones(K, dtype=np.bool_)
            tracked = np.zeros(self._df.size, dtype=np.bool_)
            tracked[self._tw.ravel()] = True
            self._run(doc_ptr, word_ids, all_topics, tracked, 1)
            for p, w in leaving:
                self._run(p, w, all_topics, tracked, -1)
            changed = np.any(new_tw != self._tw, axis=1)
        else:
            changed = np.ones(K, dtype=np.bool_)
            tracked = np.zeros(self._df.size, dtype=np.bool_)
            self._pair = np.zeros((K, new_tw.shape[1], new_tw.shape[1]), dtype=np.int64)
        # 2. topics whose top-word set changed, and newly tracked words, are recounted
        n_changed = int(changed.sum())
        if n_changed:
            self._tw = new_tw
            self._inv = self._index(new_tw)
            new_words = np.zeros(self._df.size, dtype=np.bool_)
            new_words[new_tw.ravel()] = True
            new_words &= ~tracked
            self._df[new_words] = 0
            self._pair[changed] = 0
            for p, w in self._window:
                self._run(p, w, changed, new_words, 1)
        npmi = npmi_from_counts(self._df[self._tw], self._pair, self._n_docs)
        npmi.flags.writeable = False
        tops = top_ids.copy()
        tops.flags.writeable = False
        self.last = QualityReport(npmi, topic_diversity(top_ids, self.diversity_n), self._n_docs,
                                  tops, n_changed)
        return self.last

    def counts(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(df (K, N), pair (K, N, N), D) as maintained, for the counted top-word sets (sorted by id)."""
        return self._df[self._tw].copy(), self._pair.copy(), self._n_docs

    def counted_top_words(self) -> np.ndarray:
        """The top-word sets the counts refer to, each sorted by word id (K, N)."""
        return self._tw.copy()


def _drop_words(doc_ptr: np.ndarray, word_ids: np.ndarray, gone: np.ndarray):
    keep = ~np.isin(word_ids, gone)
    if keep.all():
        return doc_ptr, word_ids
    D = doc_ptr.size - 1
    doc_of = np.repeat(np.arange(D, dtype=np.int64), np.diff(doc_ptr))
    lengths = np.bincount(doc_of[keep], minlength=D)
    ptr = np.zeros_like(doc_ptr)
    np.cumsum(lengths, out=ptr[1:])
    return ptr, word_ids[keep]
