"""Exact string lookups without per-token Python: a batch's words in first-seen order, and a
word -> id index for the vocabulary, both as numba kernels over the strings' code points.

Building a minibatch used to cost a dict lookup per token and one per distinct word, all
under the GIL: serial time that caps what threads can gain (issue 18).  Here the tokens are
joined and encoded once (C speed), and a GIL-free kernel hashes them (64-bit FNV-1a over the
code points) into an open-addressing table.  A hash match is always confirmed by comparing
the code points, so results are exactly those of the dicts they replace: the same words (the
first occurrences themselves), the same positions, the same ids.
"""
from __future__ import annotations

from collections.abc import Sequence
from itertools import chain

import numpy as np

from .jit_cache import njit

_EMPTY = np.empty(0, dtype=np.int64)
FNV_OFFSET = np.uint64(14695981039346656037)  # 64-bit FNV-1a over code points
FNV_PRIME = np.uint64(1099511628211)


def encode(joined: str) -> np.ndarray:
    """One code unit per code point: bytes for ASCII text, 32-bit units otherwise (lone
    surrogates included), so equal units <=> equal strings."""
    if joined.isascii():
        return np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
    return np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


class FirstSeen(Sequence):
    """The distinct words of a batch in first-seen order (a sequence of str, cut from the joined
    text: equal to the first occurrences), with their code points for ``WordIndex.lookup``."""

    __slots__ = ("joined", "codes", "start", "length", "hashes")

    def __init__(self, joined, codes, start, length, hashes):
        self.joined, self.codes = joined, codes
        self.start, self.length, self.hashes = start, length, hashes

    def __len__(self) -> int:
        return self.start.shape[0]

    def __getitem__(self, p):
        if isinstance(p, slice):
            return self.pick(np.arange(len(self))[p])
        a = int(self.start[p])  # code units are code points: indices into ``joined``
        return self.joined[a:a + int(self.length[p])]

    def pick(self, positions) -> list[str]:
        """The words at ``positions``."""
        j = self.joined
        return [j[a:a + n] for a, n in zip(self.start[positions].tolist(), self.length[positions].tolist())]

    def __iter__(self):
        return iter(self.pick(slice(None)))


def first_sight(token_lists: list[list[str]], n_tokens: int) -> tuple[Sequence, np.ndarray]:
    """(the distinct words of the batch in first-seen order, each token's index among them): what
    ``dict.fromkeys`` of the flat token list plus a lookup per token give.  The words come as a
    ``FirstSeen``, or as a list when a token holds NUL itself (the join's separator; then the
    dicts do it)."""
    if n_tokens:
        joined = "\0".join(["\0".join(d) for d in token_lists if d])  # no per-token list: ~7 ns/token less
        codes = encode(joined)
        pos, first, start, length, hashes = first_sight_codes(codes, n_tokens)
        if first.size:
            return FirstSeen(joined, codes, start, length, hashes), pos
    flat = list(chain.from_iterable(token_lists))
    position = {w: i for i, w in enumerate(dict.fromkeys(flat))}
    return list(position), np.fromiter(map(position.__getitem__, flat), dtype=np.int64, count=n_tokens)


@njit(cache=True, nogil=True, inline="always")
def _fnv(codes, a, b):
    h = FNV_OFFSET
    for i in range(a, b):
        h = (h ^ np.uint64(codes[i])) * FNV_PRIME
    return h


@njit(cache=True, nogil=True, inline="always")
def _slot(h, mask):
    return np.int64((h ^ (h >> np.uint64(29))) & np.uint64(mask))  # high bits into the index


@njit(cache=True, nogil=True, inline="always")
def _same(x, a, y, b, n):
    for i in range(n):
        if x[a + i] != y[b + i]:
            return False
    return True


@njit(cache=True, nogil=True)
def _rehash(table, hashes, W):
    """``table`` at twice the size, words 0..W-1 placed again."""
    out = np.full((2 * table.shape[0], 2), -1, dtype=np.int64)
    mask = out.shape[0] - 1
    for w in range(W):
        slot = _slot(hashes[w], mask)
        while out[slot, 0] >= 0:
            slot = (slot + 1) & mask
        out[slot, 0] = w
        out[slot, 1] = np.int64(hashes[w])
    return out


@njit(cache=True, nogil=True)
def first_sight_codes(codes, n):
    """``codes`` holds ``n`` tokens separated by 0: (index of each token's word in first-seen
    order, and per word: its first token, start and length in ``codes``, hash).  No words when
    a token holds a 0 itself (the separators do not count n - 1).  One pass over the codes
    hashes each token as it goes."""
    empty = np.empty(0, dtype=np.uint64)
    size = 1024  # slots: word, hash; doubled while more than half full (a batch has far fewer words than tokens)
    while size < n // 2:
        size *= 2
    table = np.full((size, 2), -1, dtype=np.int64)
    hashes = np.empty(n, dtype=np.uint64)
    wstart = np.empty(n, dtype=np.int64)
    wlen = np.empty(n, dtype=np.int64)
    first = np.empty(n, dtype=np.int64)
    pos = np.empty(n, dtype=np.int64)
    W = 0
    t = 0
    a = 0
    L = codes.shape[0]
    h = FNV_OFFSET
    for i in range(L + 1):
        if i < L and codes[i] != 0:
            h = (h ^ np.uint64(codes[i])) * FNV_PRIME
            continue
        if t >= n:  # more separators than tokens: a token holds a 0
            return _EMPTY, _EMPTY, _EMPTY, _EMPTY, empty
        ln = i - a
        hs = np.int64(h)
        mask = table.shape[0] - 1
        slot = _slot(h, mask)
        while True:
            w = table[slot, 0]
            if w < 0:
                table[slot, 0] = W
                table[slot, 1] = hs
                hashes[W] = h
                wstart[W] = a
                wlen[W] = ln
                first[W] = t
                pos[t] = W
                W += 1
                if 2 * W > table.shape[0]:
                    table = _rehash(table, hashes, W)
                break
            if table[slot, 1] == hs and wlen[w] == ln and _same(codes, wstart[w], codes, a, ln):
                pos[t] = w
                break
            slot = (slot + 1) & mask
        t += 1
        a = i + 1
        h = FNV_OFFSET
    if t != n:
        return _EMPTY, _EMPTY, _EMPTY, _EMPTY, empty
    return pos, first[:W].copy(), wstart[:W].copy(), wlen[:W].copy(), hashes[:W].copy()


class WordIndex:
    """word -> id for ids 0..n-1 (appended in order): a copy of a vocabulary's dict that numba
    can read.  Its owner appends every new word and drops the index when ids are reused."""

    def __init__(self, words: Sequence[str] = ()):
        self.codes = np.empty(4096, dtype=np.uint32)
        self.n_codes = 0
        self.start = np.empty(1024, dtype=np.int64)
        self.length = np.empty(1024, dtype=np.int64)
        self.hashes = np.empty(1024, dtype=np.uint64)
        self.n = 0
        self.table = np.full((2048, 4), -1, dtype=np.int64)  # per slot: id, hash, start, length
        if len(words):
            self.extend(list(words))

    def extend(self, words: list[str]) -> None:
        """Append ``words`` (new, distinct) as ids n, n+1, ..."""
        if not words:
            return
        codes = encode("".join(words)).astype(np.uint32, copy=False)
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        n0, c0 = self.n, self.n_codes
        self.codes = _room(self.codes, c0 + codes.size)
        self.codes[c0:c0 + codes.size] = codes
        for name in ("start", "length", "hashes"):
            setattr(self, name, _room(getattr(self, name), n0 + lengths.size))
        self.start[n0:n0 + lengths.size] = c0 + np.cumsum(lengths) - lengths
        self.length[n0:n0 + lengths.size] = lengths
        self.n_codes, self.n = c0 + codes.size, n0 + lengths.size
        if 2 * self.n > self.table.shape[0]:
            size = self.table.shape[0]
            while 2 * self.n > size:
                size *= 2
            self.table = np.full((size, 4), -1, dtype=np.int64)
            index_insert(self.table, self.codes, self.start, self.length, self.hashes, n0, 0, self.n)  # rehash all
        else:
            index_insert(self.table, self.codes, self.start, self.length, self.hashes, n0, n0, self.n)

    def lookup(self, words: FirstSeen) -> np.ndarray:
        """Ids of a batch's distinct words, -1 for unknown ones."""
        return index_lookup(self.table, self.codes, words.codes, words.start, words.length, words.hashes)


def _room(a: np.ndarray, n: int) -> np.ndarray:
    if n <= a.shape[0]:
        return a
    cap = a.shape[0]
    while cap < n:
        cap *= 2
    out = np.empty(cap, dtype=a.dtype)
    out[: a.shape[0]] = a
    return out


@njit(cache=True, nogil=True)
def index_insert(table, codes, start, length, hashes, new0, i0, i1):
    """Put ids i0..i1-1 in ``table``, hashing those from ``new0`` on (distinct words: no comparison needed)."""
    mask = table.shape[0] - 1
    for i in range(i0, i1):
        if i >= new0:
            hashes[i] = _fnv(codes, start[i], start[i] + length[i])
        slot = _slot(hashes[i], mask)
        while table[slot, 0] >= 0:
            slot = (slot + 1) & mask
        table[slot, 0] = i
        table[slot, 1] = np.int64(hashes[i])
        table[slot, 2] = start[i]
        table[slot, 3] = length[i]


@njit(cache=True, nogil=True)
def index_lookup(table, codes, q_codes, q_start, q_length, q_hashes):
    out = np.empty(q_start.shape[0], dtype=np.int64)
    for j in range(q_start.shape[0]):
        out[j] = index_probe(table, codes, q_hashes[j], q_codes, q_start[j], q_length[j])
    return out


@njit(cache=True, nogil=True, inline="always")
def index_probe(table, codes, h, q_codes, a, ln):
    """The id of the word q_codes[a:a + ln] (FNV-1a hash ``h``) in a ``WordIndex`` table, or -1."""
    mask = table.shape[0] - 1
    hs = np.int64(h)
    slot = _slot(h, mask)
    while True:
        i = table[slot, 0]
        if i < 0:
            return -1
        if table[slot, 1] == hs and table[slot, 3] == ln and _same(codes, table[slot, 2], q_codes, a, ln):
            return i
        slot = (slot + 1) & mask
