"""The ``whitespace`` tokenizer's word scan as a GIL-free kernel over a text's code points.

``Tokenizer`` keeps the words of ``normal_text(text)`` (lower case, NFC) that match its ``_WORD``
(maximal runs of letters and combining marks), have ``min_len <= len <= max_len`` and are not
stopwords.  With the ``re`` module that costs ~90 us per 20NG document, all of it under the GIL: in the daemon it is most of the
read-ahead thread's CPU, taken from the cores the model's threads want (issue 18).  Here:

* which code points are letters is read from a table made once per process *by the same regular
  expression* over every code point (the class is a per-character test, so runs of table letters
  are exactly the regex's matches);
* one pass over the lowered text's code points (``word_index.encode``: bytes for ASCII text,
  32-bit units otherwise, one unit per code point) finds the runs, applies the length window and
  looks each candidate up among the stopwords, held in a ``word_index.WordIndex`` (the
  vocabulary's own exact string index: FNV-1a over code points, hits confirmed by comparing
  them), with the hash computed as the run is scanned;
* the kernel writes the kept words joined by spaces, and ``str.split`` (C) makes the strings.

So the tokens are the very strings the regex path gives, in the same order.
"""
from __future__ import annotations

import re
import threading

import numpy as np

from .jit_cache import njit
from .word_index import FNV_OFFSET, FNV_PRIME, WordIndex, encode, index_probe

__all__ = ["StopSet", "letter_table", "scan_words"]

_TABLE: np.ndarray | None = None
_TABLE_LOCK = threading.Lock()


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


class StopSet(WordIndex):
    """The stopwords a token could equal (letters only, within the length window), indexed for
    ``scan_words``."""

    def __init__(self, stopwords, table: np.ndarray, min_len: int, max_len: int) -> None:
        super().__init__(sorted(w for w in stopwords if min_len <= len(w) <= max_len
                                and all(table[ord(c)] for c in w)))


@njit(cache=True, nogil=True)
def scan_words(text, table, lo, hi, s_table, s_codes):
    """The kept words of ``text`` (code points, lowered) joined by single spaces, in text order, and
    that string's length: maximal runs of ``table`` letters with lo <= length <= hi that are not in
    the stop set (a ``WordIndex``'s ``table`` and ``codes``).  (A space is no letter, so splitting
    at spaces gives the words back.)"""
    n = text.shape[0]
    out = np.empty_like(text)  # words plus one separator each fit: the text separates its runs too
    k = 0
    i = 0
    while i < n:
        if table[text[i]] == 0:
            i += 1
            continue
        a = i
        h = FNV_OFFSET
        while i < n and table[text[i]] != 0:
            h = (h ^ np.uint64(text[i])) * FNV_PRIME
            i += 1
        ln = i - a
        if ln < lo or ln > hi or index_probe(s_table, s_codes, h, text, a, ln) >= 0:
            continue
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
    out, k = scan_words(codes, table, lo, hi, stop.table, stop.codes)
    if not k:
        return []
    if codes.dtype == np.uint8:
        return out[:k].tobytes().decode("ascii").split(" ")
    return out[:k].tobytes().decode("utf-32-le", "surrogatepass").split(" ")
