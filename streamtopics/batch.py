"""Minibatches as flat CSR arrays: per document, its distinct word ids and their counts.

Built in one pass over the token lists.  Besides the global word ids, a batch carries a
batch-local numbering (``uniq``/``local``) so kernels can work on a dense
``(U, K)`` block of per-word quantities for just the words this batch uses.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .text import Vocabulary


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
        return np.add.reduceat(self.counts, self.doc_ptr[:-1]) if self.counts.size else np.zeros(self.n_docs)

    def doc_lengths_safe(self) -> np.ndarray:
        out = np.zeros(self.n_docs)
        nz = np.diff(self.doc_ptr) > 0
        if nz.any():
            out[nz] = np.add.reduceat(self.counts, self.doc_ptr[:-1][nz])
        return out


def build_batch(token_lists: list[list[str]], vocab: Vocabulary, grow: bool = True) -> Batch:
    """Count tokens per document and map words to ids (growing ``vocab`` when ``grow``)."""
    counters = [Counter(toks) for toks in token_lists]
    position: dict[str, int] = {}
    for c in counters:
        for w in c:
            if w not in position:
                position[w] = len(position)
    words = list(position)
    flat_pos: list[int] = []
    flat_cnt: list[int] = []
    lengths = np.empty(len(counters), dtype=np.int64)
    for d, c in enumerate(counters):
        flat_pos.extend(map(position.__getitem__, c))
        flat_cnt.extend(c.values())
        lengths[d] = len(c)
    pos = np.asarray(flat_pos, dtype=np.int64)
    cnt = np.asarray(flat_cnt, dtype=np.float64)
    if grow:
        totals = np.bincount(pos, weights=cnt, minlength=len(words)) if pos.size else np.zeros(len(words))
        ids, evicted = vocab.add_batch(words, totals)
    else:
        ids, evicted = vocab.ids(words), np.empty(0, np.int64)

    keep_word = ids >= 0
    keep = keep_word[pos] if pos.size else np.zeros(0, bool)
    dropped = int(cnt[~keep].sum()) if pos.size else 0
    doc_of = np.repeat(np.arange(len(counters)), lengths)
    if not keep.all():
        pos, cnt, doc_of = pos[keep], cnt[keep], doc_of[keep]
    # Compact batch-local numbering over the words that survived.
    compact = np.cumsum(keep_word) - 1
    uniq = ids[keep_word].astype(np.int64)
    local = compact[pos].astype(np.int32)
    doc_ptr = np.zeros(len(counters) + 1, dtype=np.int64)
    if doc_of.size:
        np.cumsum(np.bincount(doc_of, minlength=len(counters)), out=doc_ptr[1:])
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
