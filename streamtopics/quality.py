"""Topic quality on a stream: NPMI coherence of each topic's top words and topic diversity.

NPMI (Bouma 2009; the c_npmi confirmation measure of Röder et al. 2015) with **boolean
document** co-occurrence: for the top-N words of a topic and a reference set of D documents,

    P(w) = D(w) / D,  P(wi, wj) = D(wi, wj) / D             (D(.) = documents containing the words)
    NPMI(wi, wj) = log(P(wi, wj) / (P(wi) P(wj))) / -log P(wi, wj)
    coherence(topic) = mean over the N(N-1)/2 pairs

with no smoothing: a pair never seen together scores -1, a pair in every document +1.
Diversity = |union of all topics' top-25 words| / (25 K).  Exact definitions: docs/topic-quality.md.

``CoherenceMonitor`` keeps the reference as a **sliding window of the stream** (the documents
of the last batches) and counts only for the current top words: each has a bitset over the
window's document slots, set by entering batches and cleared for leaving ones; pair counts are
popcounts of ANDed rows, exact integers.  ``cooccurrence_counts`` is an independent from-scratch count (a dense
incidence matrix product) used by tests and benchmarks, e.g. on a held-out reference corpus.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .jit_cache import njit

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
        hits = 0
        for k in range(K):  # branch-free, so it vectorizes: most rows enter no top-n at all
            hits += row[k] > thr[k]
        if hits == 0:
            continue
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


@intrinsic
def _ctpop(typingctx, x):
    """Set bits of a uint64 (llvm.ctpop: one POPCNT instruction where the CPU has it)."""
    if not isinstance(x, types.Integer) or x.bitwidth != 64:
        return None

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64]), "llvm.ctpop.i64")
        return builder.call(fn, [args[0]])

    return types.uint64(x), codegen


@njit(cache=True, nogil=True)
def _set_postings(bits, row_of, ws, ds, start, cap):
    """Mark each posting (word ws[p] in document ds[p], documents numbered from ``start``) in the
    window slot of its document, for the words that have a bitset row (row_of >= 0)."""
    for p in range(ws.shape[0]):
        r = row_of[ws[p]]
        if r >= 0:
            s = (start + ds[p]) % cap
            bits[r, s >> 6] |= np.uint64(1) << np.uint64(s & 63)


@njit(cache=True, nogil=True)
def _set_words(bits, row_of, words, ws, ds, start, cap):
    """``_set_postings`` for the given ``words`` only, found by binary search in the word-sorted
    postings (filling the rows of words that just became top words from a stored batch)."""
    for w in words:
        lo = np.searchsorted(ws, w, side="left")
        hi = np.searchsorted(ws, w, side="right")
        _set_postings(bits, row_of, ws[lo:hi], ds[lo:hi], start, cap)


@njit(cache=True, nogil=True)
def _clear_slots(bits, first, n, cap):
    """Clear the slots of documents ``first .. first + n - 1`` (mod ``cap``) in every row."""
    i = 0
    while i < n:
        s = (first + i) % cap
        if (s & 63) == 0 and i + 64 <= n:  # a whole word of slots
            for r in range(bits.shape[0]):
                bits[r, s >> 6] = np.uint64(0)
            i += 64
        else:
            m = ~(np.uint64(1) << np.uint64(s & 63))
            for r in range(bits.shape[0]):
                bits[r, s >> 6] &= m
            i += 1


@njit(cache=True, nogil=True)
def _pair_counts(bits, rows, df, pair):
    """D(w) and D(wi, wj), i < j, of the top words whose bitset rows are ``rows`` (K, N)."""
    K, N = rows.shape
    nb = bits.shape[1]
    for k in range(K):
        for i in range(N):
            a = bits[rows[k, i]]
            c = np.uint64(0)
            for b in range(nb):
                c += _ctpop(a[b])
            df[k, i] = c
            for j in range(i + 1, N):
                o = bits[rows[k, j]]
                c = np.uint64(0)
                for b in range(nb):
                    c += _ctpop(a[b] & o[b])
                pair[k, i, j] = c


class QualityReport:
    """Immutable result of one monitor update (numpy arrays are read-only copies)."""

    __slots__ = ("npmi", "diversity", "window_docs", "top_ids", "changed_topics")

    def __init__(self, npmi, diversity, window_docs, top_ids, changed_topics):
        self.npmi = npmi
        self.diversity = diversity
        self.window_docs = window_docs
        self.top_ids = top_ids
        self.changed_topics = changed_topics  # topics whose top-N set changed with this update

    @property
    def mean_npmi(self) -> float:
        v = self.npmi[np.isfinite(self.npmi)]
        return float(v.mean()) if v.size else float("nan")


class CoherenceMonitor:
    """NPMI of each topic's top-``top_n`` words over the last ``window_docs`` documents of the
    stream (whole batches: the oldest batch leaves once the window holds ``window_docs``
    documents without it), plus diversity of the top-``diversity_n`` words.

    Call ``update(doc_ptr, word_ids, top_ids)`` once per learned batch with the batch's CSR
    arrays (word ids distinct per document, as ``Batch`` has them) and the model's current
    top words (K, >= top_n) after learning it.  ``evicted``: word ids the vocabulary recycled
    for this batch (their stored occurrences leave the window).

    Every current top word has a bitset over the window's document slots (a ring: document
    number mod the capacity).  A batch sets its documents' bits, a leaving batch clears its
    slots, a word that just became a top word is filled from the stored postings, and all
    K x N(N-1)/2 pair counts are popcounts of ANDed rows: exact integers, with no per-batch
    recount of the stored window.
    """

    def __init__(self, window_docs: int = 5000, top_n: int = 10, diversity_n: int = 25) -> None:
        if window_docs < 1 or top_n < 2 or diversity_n < 1:
            raise ValueError("window_docs >= 1, top_n >= 2 and diversity_n >= 1 are required")
        self.window_docs = int(window_docs)
        self.top_n = int(top_n)
        self.diversity_n = int(diversity_n)
        # each window batch: (postings words, postings docs, documents, number of its first document)
        self._window: deque[tuple[np.ndarray, np.ndarray, int, int]] = deque()
        self._n_docs = 0
        self._next = 0                          # number of the next document; its slot: number % cap
        self._cap = 0                           # slots per bitset (a multiple of 64)
        self._tw: np.ndarray | None = None      # (K, N) top words sorted by id (the counted sets)
        self._words = np.zeros(0, dtype=np.int64)     # words with a bitset row, ascending
        self._row_of = np.full(0, -1, dtype=np.int64)  # word id -> its bitset row, or -1
        self._bits = np.zeros((0, 0), dtype=np.uint64)
        self._df: np.ndarray | None = None      # (K, N)
        self._pair: np.ndarray | None = None    # (K, N, N), i < j used
        self.last: QualityReport | None = None

    @property
    def n_docs(self) -> int:
        return self._n_docs

    def window(self) -> list[list[np.ndarray]]:
        """The documents in the window, oldest batch first: per batch, each document's word ids."""
        out = []
        for ws, ds, n, _ in self._window:
            order = np.argsort(ds, kind="stable")
            ptr = np.zeros(n + 1, dtype=np.int64)
            np.cumsum(np.bincount(ds, minlength=n), out=ptr[1:])
            w = ws[order]
            out.append([w[ptr[d]:ptr[d + 1]] for d in range(n)])
        return out

    def _grow(self, n: int) -> None:
        if n > self._row_of.size:
            size = max(n, 2 * self._row_of.size, 1024)
            self._row_of = np.concatenate([self._row_of, np.full(size - self._row_of.size, -1, np.int64)])

    def _track(self, words: np.ndarray, fresh: bool) -> None:
        """Give ``words`` (ascending) the bitset rows: rows of words tracked already are kept
        (unless ``fresh``), the others are filled from the stored window."""
        old = np.full(words.size, -1, np.int64) if fresh else self._row_of[words]
        bits = np.zeros((words.size, self._cap // 64), dtype=np.uint64)
        keep = old >= 0
        if keep.any():
            bits[keep] = self._bits[old[keep]]
        self._row_of[self._words] = -1
        self._row_of[words] = np.arange(words.size)
        added = words[~keep]
        if added.size:
            for ws, ds, _, first in self._window:
                _set_words(bits, self._row_of, added, ws, ds, first, self._cap)
        self._bits, self._words = bits, words

    def update(self, doc_ptr: np.ndarray, word_ids: np.ndarray, top_ids: np.ndarray,
               evicted: np.ndarray | None = None) -> QualityReport:
        top_ids = np.asarray(top_ids, dtype=np.int64)
        doc_ptr = np.asarray(doc_ptr, dtype=np.int64)
        word_ids = np.asarray(word_ids, dtype=np.int64)
        K = top_ids.shape[0]
        self._grow(int(max(word_ids.max(initial=-1), top_ids.max(initial=-1))) + 1)
        rebuild = False
        if evicted is not None and len(evicted) and self._window:
            # recycled ids: their old occurrences leave the stored window; every row is rebuilt
            gone = np.asarray(evicted, dtype=np.int64)
            self._window = deque((ws[keep], ds[keep], n, first) for ws, ds, n, first in self._window
                                 for keep in [~np.isin(ws, gone)])
            rebuild = True
        new_tw = np.sort(top_ids[:, : self.top_n], axis=1)
        # 1. the batch enters and old batches leave (their slots are cleared)
        ws, ds = _postings(doc_ptr, word_ids)
        entering = (ws, ds, doc_ptr.size - 1, self._next)
        self._next += entering[2]
        self._window.append(entering)
        self._n_docs += entering[2]
        while len(self._window) > 1 and self._n_docs - self._window[0][2] >= self.window_docs:
            _, _, n_out, first = self._window.popleft()
            self._n_docs -= n_out
            if not rebuild:
                _clear_slots(self._bits, first, n_out, self._cap)
        live = self._next - self._window[0][3]
        if live > self._cap:  # more documents than slots: a larger ring, every row rebuilt
            self._cap = 64 * -(-max(live, self.window_docs + 2 * entering[2]) // 64)
            rebuild = True
        changed = (np.ones(K, dtype=np.bool_) if self._tw is None or self._tw.shape != new_tw.shape
                   else np.any(new_tw != self._tw, axis=1))
        words = _unique_small(new_tw)
        # 2. the batch's documents in the rows of the words tracked so far; new top words filled
        if rebuild:
            self._track(words, fresh=True)
        else:
            _set_postings(self._bits, self._row_of, ws, ds, entering[3], self._cap)
            if not np.array_equal(words, self._words):
                self._track(words, fresh=False)
        self._tw = new_tw
        # 3. counts of the current top-word sets, then NPMI
        N = new_tw.shape[1]
        self._df = np.zeros((K, N), dtype=np.int64)
        self._pair = np.zeros((K, N, N), dtype=np.int64)
        _pair_counts(self._bits, self._row_of[new_tw], self._df, self._pair)
        npmi = npmi_from_counts(self._df, self._pair, self._n_docs)
        npmi.flags.writeable = False
        tops = top_ids.copy()
        tops.flags.writeable = False
        self.last = QualityReport(npmi, topic_diversity(top_ids, self.diversity_n), self._n_docs,
                                  tops, int(changed.sum()))
        return self.last

    def counts(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(df (K, N), pair (K, N, N), D) of the counted top-word sets (sorted by id)."""
        return self._df.copy(), self._pair.copy(), self._n_docs

    def counted_top_words(self) -> np.ndarray:
        """The top-word sets the counts refer to, each sorted by word id (K, N)."""
        return self._tw.copy()


