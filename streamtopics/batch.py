"""Minibatches as flat CSR arrays: per document, its distinct word ids and their counts.

Built in one pass over the token lists.  Besides the global word ids, a batch carries a
batch-local numbering (``uniq``/``local``) so kernels can work on a dense
``(U, K)`` block of per-word quantities for just the words this batch uses.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .jit_cache import njit
from .text import Vocabulary
from .word_index import FirstSeen, first_sight


@dataclass
class Batch:
    doc_ptr: np.ndarray   # int64 (D+1): document d owns entries doc_ptr[d]:doc_ptr[d+1]
    word_ids: np.ndarray  # int64 (nnz): global vocabulary ids
    counts: np.ndarray    # float64 (nnz): occurrences of that word in that document
    uniq: np.ndarray      # int64 (U): the distinct global ids used by this batch
    local: np.ndarray     # int32 (nnz): index of each entry's word in ``uniq``
    n_tokens: int
    dropped_tokens: int = 0                       # tokens of words refused by the vocabulary cap
    evicted: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    @property
    def n_docs(self) -> int:
        return self.doc_ptr.shape[0] - 1

    def doc_lengths(self) -> np.ndarray:
        """Tokens per document (0 for empty documents)."""
        out = np.zeros(self.n_docs)
        nz = np.diff(self.doc_ptr) > 0
        if nz.any():
            out[nz] = np.add.reduceat(self.counts, self.doc_ptr[:-1][nz])
        return out


def build_batch(token_lists: list[list[str]], vocab: Vocabulary, grow: bool = True) -> Batch:
    """Count tokens per document and map words to ids (growing ``vocab`` when ``grow``).

    One dict pass finds the batch's distinct words; everything after is numpy: the
    (document, word) pairs are counted with one sort of integer keys.
    """
    D, words, pos, cnt, doc_of = _pairs(token_lists)
    if grow:
        totals = np.bincount(pos, weights=cnt, minlength=len(words))
        ids, evicted = vocab.add_batch(words, totals)
    else:
        ids, evicted = vocab.ids(words), np.empty(0, np.int64)
    return _assemble(D, ids, pos, cnt, doc_of, evicted)


def build_batch_provisional(token_lists: list[list[str]], vocab: Vocabulary) -> tuple[Batch, list[str]]:
    """``build_batch`` that leaves ``vocab`` as it is: unknown words get the ids that would
    follow it (``len(vocab)``, ``len(vocab) + 1``, ... in first-seen order, as far as its cap
    allows; the rest are dropped as by ``grow``). Returns the batch and those words, in id
    order. For a computation whose new words join the vocabulary later, or never (a replica
    computing an update record: docs/scale-out.md)."""
    D, words, pos, cnt, doc_of = _pairs(token_lists)
    ids = vocab.ids(words)
    new = np.flatnonzero(ids < 0)
    room = new.size if vocab.cap is None else max(min(vocab.cap - len(vocab), new.size), 0)
    ids[new[:room]] = len(vocab) + np.arange(room)
    take = new[:room]
    fresh = words.pick(take) if isinstance(words, FirstSeen) else [words[p] for p in take]
    return _assemble(D, ids, pos, cnt, doc_of, np.empty(0, np.int64)), fresh


def _pairs(token_lists: list[list[str]]):
    """(D, the batch's distinct words, and its (document, word position) pairs with counts).

    A document's pairs come in the order the batch first saw its words (position order).  The
    local step's cold start is sequential (``engines.lsparse._cold_start``), so this order
    matters: words seen earlier in the batch, mostly the frequent ones with well-estimated topic
    rows, set the document's direction first.  Measured against a document's own text order,
    its counts (highest first) and global word ids (one pass, K=100, mean of seeds): 20NG
    -8.173 against -8.188 / -8.177 / -8.182, R8 -6.172 against -6.171 / -6.192 / -6.174, 20NG
    subject lines -6.749 against -6.801 / -6.803.  The price: a document's result depends
    slightly on its batch-mates (as it always did here)."""
    D = len(token_lists)
    lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=D)
    words, pos = first_sight(token_lists, int(lengths.sum()))
    doc_of, pos, cnt = count_pairs(pos, lengths, len(words))
    return D, words, pos, cnt, doc_of


@njit(cache=True, nogil=True)
def count_pairs(pos, lengths, W):
    """Per document, its distinct word positions (ascending) and their counts: (document of each
    pair, position, count), O(tokens + words) with one slot per word and two counting passes
    (what ``np.unique`` of document * W + position gave, without sorting)."""
    n = pos.shape[0]
    slot = np.full(max(W, 1), -1, dtype=np.int64)
    doc_of = np.empty(n, dtype=np.int64)
    out_pos = np.empty(n, dtype=np.int64)
    cnt = np.empty(n, dtype=np.float64)
    e = 0
    t = 0
    for d in range(lengths.shape[0]):
        first = e  # a slot below ``first`` belongs to an earlier document
        for _ in range(lengths[d]):
            p = pos[t]
            t += 1
            s = slot[p]
            if s >= first:
                cnt[s] += 1.0
            else:
                slot[p] = e
                doc_of[e] = d
                out_pos[e] = p
                cnt[e] = 1.0
                e += 1
    # Each document's pairs in ascending position: a stable counting sort of all pairs by
    # position, then dealt back to their documents in that order (no comparison sort per document).
    by_pos = np.zeros(max(W, 1) + 1, dtype=np.int64)
    for i in range(e):
        by_pos[out_pos[i] + 1] += 1
    for p in range(max(W, 1)):
        by_pos[p + 1] += by_pos[p]
    order = np.empty(e, dtype=np.int64)
    for i in range(e):
        p = out_pos[i]
        order[by_pos[p]] = i
        by_pos[p] += 1
    fill = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    for i in range(e):
        fill[doc_of[i] + 1] += 1
    for d in range(lengths.shape[0]):
        fill[d + 1] += fill[d]
    pos_sorted = np.empty(e, dtype=np.int64)
    cnt_sorted = np.empty(e, dtype=np.float64)
    for q in range(e):
        i = order[q]
        f = fill[doc_of[i]]
        pos_sorted[f] = out_pos[i]
        cnt_sorted[f] = cnt[i]
        fill[doc_of[i]] = f + 1
    return doc_of[:e], pos_sorted, cnt_sorted


def _assemble(D: int, ids: np.ndarray, pos: np.ndarray, cnt: np.ndarray, doc_of: np.ndarray,
              evicted: np.ndarray) -> Batch:
    """The CSR batch of the (document, word position) pairs, words numbered ``ids`` (-1: dropped)."""
    keep_word = ids >= 0
    keep = keep_word[pos]
    dropped = int(cnt[~keep].sum())
    if not keep.all():
        pos, cnt, doc_of = pos[keep], cnt[keep], doc_of[keep]
    # Compact batch-local numbering over the words that survived.
    compact = np.cumsum(keep_word) - 1
    uniq = ids[keep_word].astype(np.int64)
    local = compact[pos].astype(np.int32)
    doc_ptr = np.zeros(D + 1, dtype=np.int64)
    if doc_of.size:
        np.cumsum(np.bincount(doc_of, minlength=D), out=doc_ptr[1:])
    return Batch(
        doc_ptr=doc_ptr,
        word_ids=uniq[local] if local.size else np.empty(0, np.int64),
        counts=cnt,
        uniq=uniq,
        local=local,
        n_tokens=int(cnt.sum()),
        dropped_tokens=dropped,
        evicted=evicted,
    )


def batch_from_arrays(doc_ptr: np.ndarray, word_ids: np.ndarray, counts: np.ndarray) -> Batch:
    """A batch over already-numbered words (tests, benchmarks, held-out splits)."""
    word_ids = np.asarray(word_ids, dtype=np.int64)
    uniq, local = np.unique(word_ids, return_inverse=True)
    counts = np.asarray(counts, dtype=np.float64)
    return Batch(
        doc_ptr=np.asarray(doc_ptr, dtype=np.int64),
        word_ids=word_ids,
        counts=counts,
        uniq=uniq.astype(np.int64),
        local=local.astype(np.int32).reshape(-1),
        n_tokens=int(counts.sum()),
    )
