"""The tokenizer's GIL-free word scan gives exactly the regular expression's tokens."""
from __future__ import annotations

import random

import pytest

from streamtopics.corpora import load_reuters_r8
from streamtopics.text import Tokenizer


def _random_text(rng: random.Random, n: int) -> str:
    """Letters of many scripts (astral ones too), digits of several scripts, marks, underscores,
    lone surrogates, characters whose lower case is longer (U+0130), punctuation and spaces."""
    pools = ["abcdefghijklmnopqrstuvwxyzABCXYZ", "0123456789_-'. \n\t", "éÉßÆøÅçÑİıΣσςΑΩЖжЯя",
             "\u0301\u0308\u0663\u0966\u00b2\u2163\u00aa\u00ba", "中文字日本語한국어ไทย",
             "\U0001d400\U0001d41a\U00010400\U00010428\U0001f600", "\ud800\udfff", "\u00a0\u2028\u3000"]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


@pytest.mark.parametrize("kw", [{}, {"stopwords": None}, {"min_len": 1, "max_len": 3},
                                {"min_len": 3, "max_len": 8, "stopwords": ["the", "ÉCOLE", "a-b", "x1", "σς", "中文"]},
                                {"stopwords": ["über", "\U0001d41a\U0001d41a", "İi"]}])
def test_scan_equals_regex_on_random_unicode(kw):
    tok = Tokenizer(**kw)
    rng = random.Random(7)
    for _ in range(400):
        text = _random_text(rng, rng.randint(0, 120))
        assert tok(text) == tok.regex_tokens(text), repr(text)


def test_scan_equals_regex_on_a_corpus_and_edge_cases():
    tok = Tokenizer()
    docs = [d.text for d in load_reuters_r8("train")[:1500]]
    docs += ["", " ", "a", "the", "The cat", "x" * 31, "y" * 30, "İstanbul İİ", "naïve café", "\ud800ab",
             "abc\U0001d400def", "snake_case2camel", "ＡＢＣ full width"]
    for text in docs:
        assert tok(text) == tok.regex_tokens(text), repr(text)


def test_stopwords_changed_after_construction_are_honoured():
    tok = Tokenizer()
    assert tok("the cat sat") == ["cat", "sat"]
    tok.stopwords = frozenset({"cat"})
    assert tok("the cat sat") == ["the", "sat"]
    tok.min_len = 4
    assert tok("the cat sat") == []
