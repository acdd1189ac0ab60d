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
    "top_word_ids_rows",
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
    return _top_n_rows(w, np.arange(w.shape[0]), n)


def top_word_ids_rows(weights: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """``top_word_ids`` restricted to the candidate ``rows`` (ids, any order) of ``weights``."""
    rows = _unique_small(np.asarray(rows, dtype=np.int64))
    V, K = weights.shape
    n = min(n, rows.size)
    if n <= 0:
        return np.zeros((K, 0), dtype=np.int64)
    w = weights if weights.flags.c_contiguous and weights.dtype == np.float64 else \
        np.ascontiguousarray(weights, dtype=np.float64)
    return _top_n_rows(w, rows, n)


@njit(cache=True, nogil=True)
def _top_n_rows(w, rows, n):
    """Per column, keep the n best (value desc, id asc) of the given rows in a sorted buffer; rows
    are read in order and compared with a contiguous array of the columns' current n-th best values
    (ties keep the lower id, seen first, when rows are ascending)."""
    K = w.shape[1]
    ids = np.full((K, n), -1, dtype=np.int64)
    vals = np.full((K, n), -np.inf)
    thr = np.full(K, -np.inf)
    for v in rows:
        row = w[v]
        for k in range(K):
            x = row[k]
            if x <= thr[k]:
                continue
            j = n - 1
            while j > 0 and vals[k, j - 1] < x:
                vals[k, j] = vals[k, j - 1]
                ids[k, j] = ids[k, j - 1]
                j -= 1
            vals[k, j] = x
            ids[k, j] = v
            thr[k] = vals[k, n - 1]
    return ids




def topic_diversity(top_ids: np.ndarray, n: int = 25) -> float:
    """Share of unique words among all topics' top-n words (Dieng et al. 2020): 1 = disjoint topics."""
    top = np.asarray(top_ids)[:, :n]
    if top.size == 0:
        return float("nan")
    uniq = _unique_small(top) if top.dtype.kind in "iu" else np.unique(top)
    return float(uniq.size / top.size)


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
    return _npmi(np.ascontiguousarray(df, dtype=np.int64), np.ascontiguousarray(pair, dtype=np.int64),
                 float(n_docs))


@njit(cache=True, nogil=True)
def _npmi(df, pair, D):
    K, N = df.shape
    out = np.empty(K)
    for k in range(K):
        total = 0.0
        for i in range(N):
            for j in range(i + 1, N):
                c = pair[k, i, j]
                if c <= 0:
                    total += -1.0
                elif c >= D:
                    total += 1.0
                else:
                    pij = c / D
                    total += np.log(pij / ((df[k, i] / D) * (df[k, j] / D))) / -np.log(pij)
        out[k] = total / (N * (N - 1) / 2)
    return out


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


def _unique_small(a: np.ndarray) -> np.ndarray:
    s = np.sort(a, axis=None)
    return s[np.r_[True, s[1:] != s[:-1]]] if s.size else s


def _postings(doc_ptr: np.ndarray, word_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A batch as (word, doc) pairs sorted by word then document, each pair once."""
    if word_ids.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return _postings_nb(doc_ptr, word_ids, int(word_ids.max()) + 1)


@njit(cache=True, nogil=True)
def _postings_nb(doc_ptr, word_ids, V):
    # counting sort by word id, documents visited in order (so ascending within a word)
    start = np.zeros(V + 1, dtype=np.int64)
    for p in range(word_ids.shape[0]):
        start[word_ids[p] + 1] += 1
    for v in range(V):
        start[v + 1] += start[v]
    fill = start[:-1].copy()
    ws = np.empty(word_ids.shape[0], dtype=np.int64)
    ds = np.empty(word_ids.shape[0], dtype=np.int64)
    for d in range(doc_ptr.shape[0] - 1):
        for p in range(doc_ptr[d], doc_ptr[d + 1]):
            w = word_ids[p]
            f = fill[w]
            if f > start[w] and ds[f - 1] == d:   # a word repeated in a document counts once
                continue
            ws[f] = w
            ds[f] = d
            fill[w] = f + 1
    # compact away the slots left by repeats
    n = 0
    for v in range(V):
        for f in range(start[v], fill[v]):
            ws[n] = ws[f]
            ds[n] = ds[f]
            n += 1
    return ws[:n].copy(), ds[:n].copy()


@njit(cache=True, nogil=True)
def _popcount(x):
    # SWAR bit count of a uint64
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    return (x * np.uint64(0x0101010101010101)) >> np.uint64(56)


@njit(cache=True, nogil=True)
def _count(ws, ds, n_docs, tw, topic_sel, df_words, df, pair, sign):
    """Add ``sign`` x the boolean-document counts of one batch of ``n_docs`` documents given as
    postings (ws, ds): D(w) for the ids in ``df_words``, and D(wi, wj), i < j, of the top words
    tw[k] of every topic with topic_sel[k] (document sets as bitsets, pairs by AND + popcount)."""
    K, N = tw.shape
    for w in df_words:
        df[w] += sign * (np.searchsorted(ws, w, side="right") - np.searchsorted(ws, w, side="left"))
    nb = (n_docs + 63) // 64
    bits = np.zeros((N, nb), dtype=np.uint64)
    present = np.zeros(N, dtype=np.bool_)
    for k in range(K):
        if not topic_sel[k]:
            continue
        for i in range(N):
            lo = np.searchsorted(ws, tw[k, i], side="left")
            hi = np.searchsorted(ws, tw[k, i], side="right")
            present[i] = hi > lo
            if present[i]:
                bits[i, :] = 0
                for p in range(lo, hi):
                    d = ds[p]
                    bits[i, d >> 6] |= np.uint64(1) << np.uint64(d & 63)
        for i in range(N):
            if not present[i]:
                continue
            for j in range(i + 1, N):
                if not present[j]:
                    continue
                c = 0
                for b in range(nb):
                    c += _popcount(bits[i, b] & bits[j, b])
                pair[k, i, j] += sign * c


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
        # each window batch: (postings words, postings docs, documents); oldest first
        self._window: deque[tuple[np.ndarray, np.ndarray, int]] = deque()
        self._n_docs = 0
        self._tw: np.ndarray | None = None      # (K, N) top words sorted by id (the counted sets)
        self._df = np.zeros(0, dtype=np.int64)  # by word id; valid for the counted top words
        self._pair: np.ndarray | None = None    # (K, N, N), i < j used
        self.last: QualityReport | None = None

    @property
    def n_docs(self) -> int:
        return self._n_docs

    def window(self) -> list[list[np.ndarray]]:
        """The documents in the window, oldest batch first: per batch, each document's word ids."""
        out = []
        for ws, ds, n in self._window:
            order = np.argsort(ds, kind="stable")
            ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(ds, minlength=n), out=ptr[1:])
            w = ws[order]
            out.append([w[ptr[d]:ptr[d + 1]] for d in range(n)])
        return out

    def _grow(self, n: int) -> None:
        if n > self._df.size:
            size = max(n, 2 * self._df.size, 1024)
            self._df = np.concatenate([self._df, np.zeros(size - self._df.size, np.int64)])

    def update(self, doc_ptr: np.ndarray, word_ids: np.ndarray, top_ids: np.ndarray,
               evicted: np.ndarray | None = None) -> QualityReport:
        top_ids = np.asarray(top_ids, dtype=np.int64)
        doc_ptr = np.asarray(doc_ptr, dtype=np.int64)
        word_ids = np.asarray(word_ids, dtype=np.int64)
        K = top_ids.shape[0]
        self._grow(int(max(word_ids.max(initial=-1), top_ids.max(initial=-1))) + 1)
        if evicted is not None and len(evicted) and self._window:
            # recycled ids: their old occurrences leave the stored window; everything is recounted
            gone = np.asarray(evicted, dtype=np.int64)
            self._window = deque((ws[keep], ds[keep], n) for ws, ds, n in self._window
                                 for keep in [~np.isin(ws, gone)])
            self._tw = None
        new_tw = np.sort(top_ids[:, : self.top_n], axis=1)
        # 1. the batch enters and old batches leave, counted for the current top-word sets
        ws, ds = _postings(doc_ptr, word_ids)
        entering = (ws, ds, doc_ptr.size - 1)
        self._window.append(entering)
        self._n_docs += entering[2]
        leaving = []
        while len(self._window) > 1 and self._n_docs - self._window[0][2] >= self.window_docs:
            leaving.append(self._window.popleft())
            self._n_docs -= leaving[-1][2]
        incremental = self._tw is not None and self._tw.shape == new_tw.shape
        if incremental:
            all_topics = np.ones(K, dtype=np.bool_)
            tracked = _unique_small(self._tw)
            _count(ws, ds, entering[2], self._tw, all_topics, tracked, self._df, self._pair, 1)
            for lw, ld, ln in leaving:
                _count(lw, ld, ln, self._tw, all_topics, tracked, self._df, self._pair, -1)
            changed = np.any(new_tw != self._tw, axis=1)
        else:
            tracked = np.zeros(0, dtype=np.int64)
            changed = np.ones(K, dtype=np.bool_)
            self._pair = np.zeros((K, new_tw.shape[1], new_tw.shape[1]), dtype=np.int64)
        # 2. topics whose top-word set changed, and newly tracked words, are recounted
        n_changed = int(changed.sum())
        if n_changed:
            new_words = np.setdiff1d(_unique_small(new_tw), tracked, assume_unique=True)
            self._df[new_words] = 0
            self._pair[changed] = 0
            self._tw = new_tw
            for bw, bd, bn in self._window:
                _count(bw, bd, bn, new_tw, changed, new_words, self._df, self._pair, 1)
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


