"""The ``whitespace`` tokenizer's word scan as a GIL-free kernel over a text's code points.

``Tokenizer`` keeps the words of ``text.lower()`` that match ``[^\\W\\d_]+`` (maximal runs of
letters), have ``min_len <= len <= max_len`` and are not stopwords.  With the ``re`` module that
costs ~90 us per 20NG document, all of it under the GIL: in the daemon it is most of the
read-ahead thread's CPU, taken from the cores the model's threads want (issue 18).  Here:

* which code points are letters is read from a table made once per process *by the same regular
  expression* over every code point (the class is a per-character test, so runs of table letters
  are exactly the regex's matches);
* one pass over the lowered text's code points (``word_index.encode``: bytes for ASCII text,
  32-bit units otherwise, one unit per code point) finds the runs, applies the length window and
  looks each candidate up in a hash set of the stopwords (64-bit FNV-1a over code points, every
  hash hit confirmed by comparing the code points);
* the kernel writes the kept words joined by spaces, and ``str.split`` (C) makes the strings.

So the tokens are the very strings the regex path gives, in the same order.
"""
from __future__ import annotations

import re
import threading

import numpy as np
from numba import njit

from .word_index import encode

__all__ = ["StopSet", "letter_table", "scan_words"]

_TABLE: np.ndarray | None = None
_TABLE_LOCK = threading.Lock()
_FNV0 = np.uint64(14695981039346656037)
_FNV1 = np.uint64(1099511628211)


def letter_table(word: re.Pattern) -> np.ndarray:
    """uint8 per code point 0..0x10FFFF: 1 where ``word`` (a class of single characters followed
    by ``+``) matches the character.  Built once per process (~0.1 s) from the pattern itself."""
    global _TABLE
    if _TABLE is not None:
        return _TABLE
    with _TABLE_LOCK:
        if _TABLE is None:
            table = np.zeros(0x110000, dtype=np.uint8)
            every = "".join(map(chr, range(0x110000)))
            for m in word.finditer(every):
                table[m.start():m.end()] = 1
            _TABLE = table
        return _TABLE


class StopSet:
    """The stopwords a token could equal (letters only, within the length window) as an
    open-addressing hash table over their code points, for ``scan_words``."""

    def __init__(self, stopwords, table: np.ndarray, min_len: int, max_len: int) -> None:
        words = sorted(w for w in stopwords if min_len <= len(w) <= max_len
                       and all(table[ord(c)] for c in w))
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        self.codes = encode("".join(words)).astype(np.uint32) if words else np.zeros(1, dtype=np.uint32)
        self.start = np.cumsum(lengths) - lengths
        self.length = lengths
        size = 16
        while size < 2 * max(len(words), 1):
            size *= 2
        self.slots = np.full(size, -1, dtype=np.int64)
        self.hashes = np.zeros(max(len(words), 1), dtype=np.uint64)
        stop_fill(self.slots, self.hashes, self.codes, self.start, self.length)


@njit(cache=True, nogil=True)
def stop_fill(slots, hashes, codes, start, length):
    mask = slots.shape[0] - 1
    for i in range(start.shape[0]):
        h = _FNV0
        for j in range(start[i], start[i] + length[i]):
            h = (h ^ np.uint64(codes[j])) * _FNV1
        hashes[i] = h
        s = np.int64(h & np.uint64(mask))
        while slots[s] >= 0:
            s = (s + 1) & mask
        slots[s] = i


@njit(cache=True, nogil=True)
def scan_words(text, table, lo, hi, slots, hashes, s_codes, s_start, s_length):
    """The kept words of ``text`` (code points, lowered) joined by single spaces, in text order, and
    that string's length: maximal runs of ``table`` letters with lo <= length <= hi that are not in
    the stop set.  (A space is no letter, so splitting at spaces gives the words back.)"""
    n = text.shape[0]
    out = np.empty_like(text)  # words plus one separator each fit: the text separates its runs too
    k = 0
    mask = slots.shape[0] - 1
    i = 0
    while i < n:
        if table[text[i]] == 0:
            i += 1
            continue
        a = i
        h = _FNV0
        while i < n and table[text[i]] != 0:
            h = (h ^ np.uint64(text[i])) * _FNV1
            i += 1
        ln = i - a
        if ln < lo or ln > hi:
            continue
        s = np.int64(h & np.uint64(mask))
        stop = False
        while slots[s] >= 0:
            w = slots[s]
            if hashes[w] == h and s_length[w] == ln:
                same = True
                b = s_start[w]
                for j in range(ln):
                    if s_codes[b + j] != text[a + j]:
                        same = False
                        break
                if same:
                    stop = True
                    break
            s = (s + 1) & mask
        if not stop:
            if k:
                out[k] = 32
                k += 1
            for j in range(a, i):
                out[k] = text[j]
                k += 1
    return out, k


def words_of(low: str, table: np.ndarray, lo: int, hi: int, stop: StopSet) -> list[str]:
    """The kept words of the lowered text ``low``."""
    codes = encode(low)
    out, k = scan_words(codes, table, lo, hi, stop.slots, stop.hashes, stop.codes, stop.start, stop.length)
    if not k:
        return []
    if codes.dtype == np.uint8:
        return out[:k].tobytes().decode("ascii").split(" ")
    return out[:k].tobytes().decode("utf-32-le", "surrogatepass").split(" ")
