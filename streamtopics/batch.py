"""Minibatches as flat CSR arrays: per document, its distinct word ids and their counts.

Built in one pass over the token lists.  Besides the global word ids, a batch carries a
batch-local numbering (``uniq``/``local``) so kernels can work on a dense
``(U, K)`` block of per-word quantities for just the words this batch uses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

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
    fresh: np.ndarray = field(default_factory=lambda: np.empty(0, bool))  # per ``uniq``: new to the vocabulary with this batch (empty: none)

    @property
    def n_docs(self) -> int:
        return self.doc_ptr.shape[0] - 1

    @cached_property
    def unknown_docs(self) -> np.ndarray:
        """(D,) bool: documents with words, none of which the vocabulary held before this batch.
        The model before the batch knows nothing of them (``transform`` and ``predict`` of the
        same text see no word: uniform proportions, no label). Computed once per batch (the
        prediction's features and its proportions both read it)."""
        out = np.zeros(self.n_docs, dtype=bool)
        if self.fresh.size and self.fresh.any():
            known = np.bincount(np.repeat(np.arange(self.n_docs), np.diff(self.doc_ptr)),
                                weights=~self.fresh[self.local], minlength=self.n_docs)
            out = (known == 0) & (np.diff(self.doc_ptr) > 0)
        return out

    def doc_lengths(self) -> np.ndarray:
        """Tokens per document (0 for empty documents)."""
        out = np.zeros(self.n_docs)
        nz = np.diff(self.doc_ptr) > 0
        if nz.any():
            out[nz] = np.add.reduceat(self.counts, self.doc_ptr[:-1][nz])
        return out


def build_batch(token_lists: list[list[str]], vocab: Vocabulary, grow: bool = True) -> Batch:
    """Count tokens per document and map words to ids (growing ``vocab`` when ``grow``).

    One hashing pass finds the batch's distinct words (``word_index``); the (document, word)
    pairs are counted and ordered by ``entry_rank`` in two counting passes (``count_pairs``).
    """
    D, words, ids, doc_of, pos, cnt = _ranked_pairs(token_lists, vocab)
    evicted = np.empty(0, np.int64)
    fresh = ids < 0
    if grow:
        totals = np.bincount(pos, weights=cnt, minlength=len(words))
        ids, evicted = vocab.add_rows(ids, words, totals)
    return _assemble(D, ids, pos, cnt, doc_of, evicted, fresh)


def entry_rank(ids: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each batch word's place in its documents' entry order: the vocabulary's most frequent
    words first (its decayed counts before this batch, as float32), ties by word id, then the words new to
    the vocabulary in the order the batch first saw them.

    The local step's cold start is sequential (``engines.lsparse._cold_start``), so this order
    matters: the frequent words, whose topic rows are well estimated, set a document's direction
    first, and a new word (a prior-only row) follows it instead of leading it.  The order was
    the batch's first-seen one until 2026-11-29, a proxy for the same idea, but it made a
    document's topics depend on its batch-mates: 20NG (df >= 5, K = 100, one pass), 200 test
    documents in one ``transform`` call against one call each differed by more than 0.01 for
    55 % of them (max 0.545), R8 32 % (0.406). Now the order is a function of the word and the
    model, so they are equal bit for bit. Held-out, one pass, mean of seeds 0-2, first-seen ->
    frequency: 20NG -8.1634 -> -8.1597, R8 -6.1895 -> -6.1883, 20NG subject lines -6.6819 ->
    -6.6741, 20NG joined in fours -8.3701 -> -8.3700 (docs/defaults.md §7)."""
    return _entry_rank(ids, counts)


@njit(cache=True, nogil=True)
def _entry_rank(ids, counts):
    """``entry_rank`` by one LSD radix sort (11-bit digits) of uint64 keys: high half the count
    descending (its float32 bits, monotonic for counts >= 0: rounding to float32 is a function
    of the count, so still of the model), low half the id, or for a new word its first-seen place
    after every id. (np.lexsort of (id, -count) cost 32 ns/token of serial batch building on
    20NG, np.argsort of these keys 8; this ~3.)"""
    W = ids.shape[0]
    V = counts.shape[0]
    keys = np.empty(W, dtype=np.uint64)
    c32 = np.empty(1, dtype=np.float32)  # only the batch's words' counts are rounded (not all V)
    bits = c32.view(np.uint32)
    for p in range(W):
        i = ids[p]
        if i >= 0:
            c32[0] = counts[i]
            c = np.uint64(bits[0])
            keys[p] = ((np.uint64(0xFFFFFFFE) - c) << np.uint64(32)) | np.uint64(i)
        else:
            keys[p] = (np.uint64(0xFFFFFFFF) << np.uint64(32)) | np.uint64(V + p)
    idx = np.arange(W)
    tmp = np.empty(W, dtype=np.int64)
    cnt = np.empty(2049, dtype=np.int64)
    for shift in range(0, 66, 11):
        cnt[:] = 0
        for q in range(W):
            cnt[((keys[idx[q]] >> np.uint64(shift)) & np.uint64(2047)) + 1] += 1
        if cnt[1] == W:  # this digit is 0 in every key: the order stands
            continue
        for b in range(2048):
            cnt[b + 1] += cnt[b]
        for q in range(W):
            j = idx[q]
            d = (keys[j] >> np.uint64(shift)) & np.uint64(2047)
            tmp[cnt[d]] = j
            cnt[d] += 1
        idx, tmp = tmp, idx
    rank = np.empty(W, dtype=np.int64)
    for q in range(W):
        rank[idx[q]] = q
    return rank


def build_batch_provisional(token_lists: list[list[str]], vocab: Vocabulary) -> tuple[Batch, list[str]]:
    """``build_batch`` that leaves ``vocab`` as it is: unknown words get the ids that would
    follow it (``len(vocab)``, ``len(vocab) + 1``, ... in first-seen order, as far as its cap
    allows; the rest are dropped as by ``grow``). Returns the batch and those words, in id
    order. For a computation whose new words join the vocabulary later, or never (a replica
    computing an update record: docs/scale-out.md)."""
    D, words, ids, doc_of, pos, cnt = _ranked_pairs(token_lists, vocab)
    new = np.flatnonzero(ids < 0)
    fresh = ids < 0
    room = new.size if vocab.cap is None else max(min(vocab.cap - len(vocab), new.size), 0)
    ids[new[:room]] = len(vocab) + np.arange(room)
    take = new[:room]
    new_words = words.pick(take) if isinstance(words, FirstSeen) else [words[p] for p in take]
    return _assemble(D, ids, pos, cnt, doc_of, np.empty(0, np.int64), fresh), new_words


def _ranked_pairs(token_lists: list[list[str]], vocab: Vocabulary):
    """(D, the batch's distinct words in first-seen order, their vocabulary ids (-1: new), and the
    (document, word position) pairs with counts, each document's in ``entry_rank`` order)."""
    D = len(token_lists)
    lengths = np.fromiter(map(len, token_lists), dtype=np.int64, count=D)
    words, tok_pos = first_sight(token_lists, int(lengths.sum()))
    ids = vocab.ids(words)
    doc_of, pos, cnt = count_pairs(tok_pos, lengths, len(words), entry_rank(ids, vocab.counts))
    return D, words, ids, doc_of, pos, cnt


@njit(cache=True, nogil=True)
def count_pairs(pos, lengths, W, rank):
    """Per document, its distinct word positions in ascending ``rank[position]`` (``entry_rank``)
    and their counts: (document of each pair, position, count), O(tokens + words) with one slot
    per word and two counting passes (no comparison sort)."""
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
    # Each document's pairs in ascending rank (``entry_rank``): a stable counting sort of all pairs
    # by rank, then dealt back to their documents in that order (no comparison sort per document).
    by_pos = np.zeros(max(W, 1) + 1, dtype=np.int64)
    for i in range(e):
        by_pos[rank[out_pos[i]] + 1] += 1
    for p in range(max(W, 1)):
        by_pos[p + 1] += by_pos[p]
    order = np.empty(e, dtype=np.int64)
    for i in range(e):
        p = rank[out_pos[i]]
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
              evicted: np.ndarray, fresh: np.ndarray) -> Batch:
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
        fresh=fresh[keep_word],
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
