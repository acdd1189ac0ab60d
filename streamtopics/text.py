"""Tokenizer and a vocabulary that grows with the stream.

The vocabulary hands out dense integer ids.  It never renumbers existing words, so
topic-word statistics indexed by id stay valid as it grows.  When a cap is set, the
policy decides what happens to words that arrive once the cap is reached:

* ``"ignore"``: unseen words are dropped (ids stay stable forever);
* ``"evict"``: the rarest words by an exponentially decayed count make room; the
  freed id is reused by the new word and the caller resets that id's statistics to
  the prior (``Vocabulary.add_batch`` returns the evicted ids for that purpose).
"""
from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from itertools import repeat

import numpy as np

from .word_index import FirstSeen, WordIndex
from .word_scan import StopSet, letter_table, words_of

# A compact English stop list (function words and mail boilerplate common in news text).
ENGLISH_STOPWORDS = frozenset(
    """
    a about above after again against all almost also although always am among an and
    another any anybody anyone anything anyway anywhere are aren around as at back be
    became because become becomes been before behind being below beside besides between
    beyond both but by can cannot could couldn did didn do does doesn doing don done down
    during each either else elsewhere enough etc even ever every everyone everything
    everywhere except few for former formerly from further get gets getting give given
    go goes going gone got had hadn has hasn have haven having he hence her here hers
    herself him himself his how however i ie if in indeed instead into is isn it its
    itself just keep last least less let like ll made many may me meanwhile might mine
    more moreover most mostly much must my myself namely neither never nevertheless next
    no nobody none noone nor not nothing now nowhere of off often on once one only onto
    or other others otherwise our ours ourselves out over own per perhaps please put
    quite rather re really s said same say says see seem seemed seeming seems several
    shall she should shouldn since so some somehow someone something sometime sometimes
    somewhere still such t than that the their theirs them themselves then thence there
    thereafter thereby therefore therein thereupon these they thing things this those
    though through throughout thru thus to together too toward towards under until up
    upon us use used using ve very via was wasn way we well were weren what whatever
    when whence whenever where whereafter whereas whereby wherein whereupon wherever
    whether which while whither who whoever whole whom whose why will with within
    without won would wouldn yet you your yours yourself yourselves d m o y
    subject lines organization writes wrote article re edu com
    """.split()
)


def _mark_class() -> str:
    """A regex class body of every combining mark (Unicode categories Mn, Mc, Me): the vowel signs
    and viramas of Indic scripts, Arabic and Hebrew points, the accents of decomposed Latin. They
    are ``\\W`` to ``re``, so ``[^\\W\\d_]+`` alone cut ``हिन्दी`` into 3 fragments and NFD ``café``
    into ``cafe``. Marks live below U+20000 and in the variation selectors at U+E0100 (~0.04 s)."""
    cps = [cp for block in (range(0x20000), range(0xE0000, 0xE1000))
           for cp in block if unicodedata.category(chr(cp))[0] == "M"]
    ranges, start = [], None
    for i, cp in enumerate(cps):
        start = cp if start is None else start
        if i + 1 == len(cps) or cps[i + 1] != cp + 1:
            ranges.append(f"\\U{start:08x}-\\U{cp:08x}")
            start = None
    return "".join(ranges)


_MARKS = _mark_class()
# A word: a run of letters and combining marks (in NFC, ``normal_text``).
_WORD = re.compile(f"(?:[^\\W\\d_]|[{_MARKS}])+")


def normal_text(text: str) -> str:
    """Lower case in Unicode normal form C: a word is one token whether its accents came
    precomposed or as combining marks (NFD input: macOS file names, some editors and OCR)."""
    low = text.lower()
    return low if low.isascii() else unicodedata.normalize("NFC", low)

SEGMENTATIONS = ("whitespace", "cjk_bigrams")
# Scripts written without spaces between words: CJK ideographs (with extensions and
# compatibility forms), Hiragana, Katakana (with the phonetic extensions and half-width
# forms), Hangul syllables, Thai, Lao, Khmer, Myanmar; the Thai-family ranges include
# their combining vowel and tone marks, which are not letters to ``\w``.
_NOSPACE = ("\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f"
            "\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9f\uac00-\ud7af"
            "\u0e00-\u0e7f\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f")
# group 1: a run of no-space script; otherwise a run of other letters
_WORD_CJK = re.compile(f"([{_NOSPACE}]+)|(?:[^\\W\\d_{_NOSPACE}]|[{_MARKS}])+")


def _cjk_tokens(text: str, lo: int, hi: int, stop: frozenset) -> list[str]:
    """``cjk_bigrams``: runs of no-space scripts become overlapping character bigrams (a lone
    character stays a unigram; the length window does not apply to them, a CJK character is
    a word); other letter runs are words as in ``whitespace`` mode."""
    out = []
    for m in _WORD_CJK.finditer(text):
        run = m.group(1)
        if run is None:
            w = m.group(0)
            if lo <= len(w) <= hi and w not in stop:
                out.append(w)
        elif len(run) == 1:
            out.append(run)
        else:
            out.extend(run[i:i + 2] for i in range(len(run) - 1))
    return out


class Tokenizer:
    """Lowercase, unicode-aware word tokenizer with a length window and a stop list.

    ``segmentation``: ``"whitespace"`` (words are runs of letters and combining marks, in NFC) or
    ``"cjk_bigrams"`` (also cut text without spaces - Chinese, Japanese, Korean, Thai - into
    character bigrams).
    """

    def __init__(self, min_len: int = 2, max_len: int = 30, stopwords: Iterable[str] | str | None = "english",
                 segmentation: str = "whitespace"):
        if min_len < 1 or max_len < min_len:
            raise ValueError(f"tokenizer lengths must satisfy 1 <= min_len <= max_len (got {min_len}, {max_len})")
        if segmentation not in SEGMENTATIONS:
            raise ValueError(f"segmentation must be one of {SEGMENTATIONS} (got {segmentation!r})")
        self.segmentation = segmentation
        self.min_len = int(min_len)
        self.max_len = int(max_len)
        if stopwords == "english":
            self.stopwords = ENGLISH_STOPWORDS
        elif stopwords is None or stopwords == "none":
            self.stopwords = frozenset()
        elif isinstance(stopwords, str):
            raise ValueError(f"stopwords must be 'english', 'none' or a collection of words (got {stopwords!r})")
        else:
            self.stopwords = frozenset(w.lower() for w in stopwords)
        self._fast = None  # (stopwords, min_len, max_len, StopSet) of the fast scan

    def __call__(self, text: str) -> list[str]:
        lo, hi, stop = self.min_len, self.max_len, self.stopwords
        if self.segmentation == "cjk_bigrams":
            return _cjk_tokens(normal_text(text), lo, hi, stop)
        # the words of ``_WORD.findall(normal_text(text))`` in the window and not stopwords, found by a
        # GIL-free scan of the code points (word_scan.py: the same strings, ~10x faster)
        table = letter_table(_WORD)  # one per process, not copied with the tokenizer
        fast = getattr(self, "_fast", None)  # (absent on a tokenizer made without __init__)
        if fast is None or fast[0] is not stop or fast[1] != lo or fast[2] != hi:
            fast = self._fast = (stop, lo, hi, StopSet(stop, table, lo, hi))
        return words_of(normal_text(text), table, lo, hi, fast[3])

    def regex_tokens(self, text: str) -> list[str]:
        """The ``whitespace`` tokens by the regular expression (what ``__call__`` must equal)."""
        lo, hi, stop = self.min_len, self.max_len, self.stopwords
        return [w for w in _WORD.findall(normal_text(text)) if lo <= len(w) <= hi and w not in stop]

    def config(self) -> dict:
        sw = "english" if self.stopwords is ENGLISH_STOPWORDS else sorted(self.stopwords)
        return {"min_len": self.min_len, "max_len": self.max_len, "stopwords": sw, "segmentation": self.segmentation}


class Vocabulary:
    """word <-> id map with decayed counts, a cap and a policy for words past the cap."""

    POLICIES = ("ignore", "evict")

    def __init__(self, cap: int | None = None, policy: str = "ignore", decay: float = 0.999):
        if policy not in self.POLICIES:
            raise ValueError(f"vocabulary policy must be one of {self.POLICIES} (got {policy!r})")
        if cap is not None and cap < 1:
            raise ValueError(f"vocabulary cap must be >= 1 (got {cap})")
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"vocabulary decay must be in (0, 1] (got {decay})")
        self.cap = cap
        self.policy = policy
        self.decay = float(decay)
        self._index: dict[str, int] = {}
        self._words: list[str] = []
        self._counts = np.zeros(1024, dtype=np.float64)  # decayed counts, capacity doubles
        self.n_evicted = 0
        # _index for numba (``ids`` of a batch's ``FirstSeen`` words without a dict lookup each);
        # built on first use, extended with every new word, dropped when ids are reused or removed
        self._fast: WordIndex | None = None

    def __len__(self) -> int:
        return len(self._words)

    def __contains__(self, word: str) -> bool:
        return word in self._index

    @property
    def words(self) -> list[str]:
        return list(self._words)

    @property
    def counts(self) -> np.ndarray:
        return self._counts[: len(self._words)]

    def get(self, word: str, default: int = -1) -> int:
        return self._index.get(word, default)

    def ids(self, words: Sequence[str]) -> np.ndarray:
        """Ids of known words, -1 for unknown ones; never grows."""
        if isinstance(words, FirstSeen) and self.policy != "evict":  # (evicting reuses ids: dict only)
            if self._fast is None:
                self._fast = WordIndex(self._words)
            return self._fast.lookup(words)
        return np.fromiter(map(self._index.get, words, repeat(-1)), dtype=np.int64, count=len(words))

    def add_batch(self, words: Sequence[str], counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Map the distinct ``words`` of one minibatch to ids, growing the vocabulary.

        ``counts`` (same length) feeds the decayed frequency used by eviction.  Returns
        ``(ids, evicted)``: ids of -1 mark words that were dropped under the cap, and
        ``evicted`` lists ids whose old word was evicted and which now belong to a new
        word (the caller must reset their statistics to the prior).
        """
        return self.add_rows(self.ids(words), words, counts)

    def add_rows(self, ids: np.ndarray, words, counts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``add_batch`` for rows whose ids were looked up already: ``ids`` holds -1 where the
        word is not in the vocabulary (filled in place), and ``words[p]`` is read only for those
        rows (a sequence, or a mapping from row to word)."""
        new_pos = np.flatnonzero(ids < 0)
        evicted = np.empty(0, dtype=np.int64)
        if new_pos.size:
            room = new_pos.size if self.cap is None else max(self.cap - len(self._words), 0)
            take = new_pos[:room]
            if take.size:
                new = words.pick(take) if isinstance(words, FirstSeen) else [words[p] for p in take]
                ids[take] = self._extend(new)
            rest = new_pos[room:]
            if rest.size and self.policy == "evict":
                evicted = self._evict_for(words, ids, rest)
        if self.decay < 1.0:
            self._counts[: len(self._words)] *= self.decay
        known = ids >= 0
        # ids of distinct words are distinct, so plain fancy-index addition is exact here.
        self._counts[ids[known]] += 1.0 if counts is None else np.asarray(counts, dtype=np.float64)[known]
        return ids, evicted

    def _extend(self, new: list[str]) -> np.ndarray:
        """Append distinct unknown words in one step; their ids."""
        start, end = len(self._words), len(self._words) + len(new)
        if end > self._counts.shape[0]:
            cap = self._counts.shape[0]
            while cap < end:
                cap *= 2
            grown = np.zeros(cap, dtype=np.float64)
            grown[:start] = self._counts[:start]
            self._counts = grown
        self._words.extend(new)
        self._index.update(zip(new, range(start, end)))
        if self._fast is not None:
            self._fast.extend(new)
        self._counts[start:end] = 0.0
        return np.arange(start, end, dtype=np.int64)

    def _evict_for(self, words: Sequence[str], ids: np.ndarray, positions: np.ndarray) -> np.ndarray:
        # Candidates: words not used by this batch; evict the rarest by decayed count.
        counts = self._counts[: len(self._words)].copy()
        counts[ids[ids >= 0]] = np.inf
        n = min(positions.size, int(np.isfinite(counts).sum()))
        if n == 0:
            return np.empty(0, dtype=np.int64)
        victims = np.argpartition(counts, n - 1)[:n] if n < counts.size else np.arange(counts.size)
        victims = victims[np.isfinite(counts[victims])][:n]
        self._fast = None
        for p, v in zip(positions[: victims.size], victims):
            del self._index[self._words[v]]
            self._words[v] = words[p]
            self._index[words[p]] = int(v)
            self._counts[v] = 0.0
            ids[p] = v
        self.n_evicted += int(victims.size)
        return victims.astype(np.int64)

    # -- transactions ------------------------------------------------------------------
    def mark(self) -> tuple:
        """A restore point for ``rollback``: size, decayed counts and evictions so far."""
        n = len(self._words)
        return n, self._counts[:n].copy(), self.n_evicted

    def rollback(self, mark: tuple) -> bool:
        """Undo ``add_batch`` calls made since ``mark`` (new words and count updates).

        Returns False, changing nothing, when words were evicted since (an eviction reuses
        an id and cannot be undone here)."""
        n, counts, evicted = mark
        if self.n_evicted != evicted or len(self._words) < n:
            return False
        for w in self._words[n:]:
            del self._index[w]
        self._fast = None
        del self._words[n:]
        self._counts[n:] = 0.0
        self._counts[:n] = counts
        return True

    # -- persistence -------------------------------------------------------------------
    def state(self) -> dict:
        return {"cap": self.cap, "policy": self.policy, "decay": self.decay, "n_evicted": self.n_evicted}

    @classmethod
    def restore(cls, state: dict, words: list[str], counts: np.ndarray) -> "Vocabulary":
        v = cls(cap=state["cap"], policy=state["policy"], decay=state["decay"])
        v._words = list(words)
        v._index = {w: i for i, w in enumerate(words)}
        if len(v._index) != len(words):
            raise ValueError("vocabulary has duplicate words")
        cap = max(1024, 1 << max(len(words) - 1, 1).bit_length())
        v._counts = np.zeros(cap, dtype=np.float64)
        v._counts[: len(words)] = counts
        v.n_evicted = int(state.get("n_evicted", 0))
        return v
