"""Tokenizer, growing vocabulary (cap, eviction, capacity doubling) and CSR minibatches."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from streamtopics.batch import batch_from_arrays, build_batch
from streamtopics.corpora import load_reuters_r8
from streamtopics.model import TopicModel
from streamtopics.text import ENGLISH_STOPWORDS, Tokenizer, Vocabulary

# -- tokenizer -------------------------------------------------------------------------------


def test_tokenizer_lowercases_and_keeps_unicode_letters():
    tok = Tokenizer(stopwords=None)
    assert tok("Über café naïve") == ["über", "café", "naïve"]
    assert tok("ΑΘΗΝΑ Straße ÉCOLE") == ["αθηνα", "straße", "école"]
    assert tok("Hello, World! (hello)") == ["hello", "world", "hello"]


def test_a_word_is_one_token_with_its_combining_marks_in_either_normal_form():
    """Combining marks are \\W to ``re``: Hindi and pointed Arabic fell apart into letters and NFD
    accents were lost or split words (``résumé`` -> ``sume``), in both tokenizer paths."""
    import unicodedata

    tok = Tokenizer(stopwords=None)
    text = "café résumé Ångström München İstanbul हिन्दी भाषा العَرَبِيَّة"
    want = ["café", "résumé", "ångström", "münchen", "i\u0307stanbul", "हिन्दी", "भाषा", "العَرَبِيَّة"]
    for form in ("NFC", "NFD", "NFKC"):
        t = unicodedata.normalize(form, text)
        assert tok(t) == want and tok.regex_tokens(t) == want, form
    cjk = Tokenizer(stopwords=None, segmentation="cjk_bigrams")
    assert cjk(unicodedata.normalize("NFD", "naïve 東京都")) == ["naïve", "東京", "京都"]
    assert tok("e\u0301t\u00e9") == ["été"]
    assert Tokenizer(min_len=3)("x\u0301") == []  # a mark is a code point of the word's length


def test_tokenizer_splits_on_digits_underscores_and_punctuation():
    tok = Tokenizer(stopwords=None)
    assert tok("foo_bar abc123def x2y snake_case_name") == ["foo", "bar", "abc", "def", "snake", "case", "name"]
    assert tok("e-mail co-op it's") == ["mail", "co", "op", "it"]
    assert tok("1234 5_6 __ --") == []


def test_tokenizer_length_window():
    tok = Tokenizer(min_len=3, max_len=5, stopwords=None)
    assert tok("a an ant ants antsy antsier") == ["ant", "ants", "antsy"]
    assert Tokenizer(stopwords=None)("a b cd") == ["cd"]  # default min_len=2
    with pytest.raises(ValueError, match="min_len"):
        Tokenizer(min_len=0)
    with pytest.raises(ValueError, match="max_len"):
        Tokenizer(min_len=4, max_len=3)


def test_tokenizer_stop_lists():
    text = "The cat and THE dog said hello"
    assert Tokenizer()(text) == ["cat", "dog", "hello"]  # english by default
    assert {"the", "and", "said"} <= ENGLISH_STOPWORDS
    assert Tokenizer(stopwords="none")(text) == ["the", "cat", "and", "the", "dog", "said", "hello"]
    assert Tokenizer(stopwords=["CAT", "hello"])(text) == ["the", "and", "the", "dog", "said"]
    with pytest.raises(ValueError, match="stopwords"):
        Tokenizer(stopwords="french")


def test_model_tokenize_accepts_text_and_pretokenized_docs():
    m = TopicModel(n_topics=2)
    out = m.tokenize(["The Über-café", ["The", "x", "A_B", "42"], ("tuple", "ok"), ""])
    assert out == [["über", "café"], ["The", "x", "A_B", "42"], ["tuple", "ok"], []]


@pytest.mark.parametrize("docs,pattern", [
    ("just one string", "not one str"),
    (b"bytes", "not one str"),
    ([1, "ok"], r"document 0: expected str or list\[str\], got int"),
    (["ok", b"raw"], "document 1: expected str or list.*got bytes"),
    (["ok", None], "document 1: .*got NoneType"),
    ([["fine"], ["tok", 3]], "document 1: a token list must contain only str"),
    ([{"a": 1}], "document 0: .*got dict"),
])
def test_model_tokenize_rejects_wrong_types(docs, pattern):
    m = TopicModel(n_topics=2)
    with pytest.raises(TypeError, match=pattern):
        m.tokenize(docs)
    with pytest.raises(TypeError):
        m.partial_fit(docs)


# -- CSR batches -----------------------------------------------------------------------------

def check_batch(batch, token_lists, vocab):
    assert batch.doc_ptr.dtype == np.int64 and batch.word_ids.dtype == np.int64
    assert batch.local.dtype == np.int32 and batch.counts.dtype == np.float64
    assert batch.n_docs == len(token_lists)
    assert batch.doc_ptr[0] == 0 and np.all(np.diff(batch.doc_ptr) >= 0)
    assert batch.doc_ptr[-1] == batch.word_ids.size == batch.counts.size == batch.local.size
    words = vocab.words
    for d, toks in enumerate(token_lists):
        s, e = batch.doc_ptr[d], batch.doc_ptr[d + 1]
        got = {words[w]: c for w, c in zip(batch.word_ids[s:e], batch.counts[s:e])}
        assert e - s == len(got), f"doc {d}: a word id appears twice"
        want = {w: c for w, c in Counter(toks).items() if w in vocab}
        assert got == want, f"doc {d}"
    np.testing.assert_array_equal(batch.uniq[batch.local], batch.word_ids)
    assert np.unique(batch.uniq).size == batch.uniq.size
    assert set(batch.uniq.tolist()) == set(batch.word_ids.tolist())
    assert batch.n_tokens == int(batch.counts.sum())
    np.testing.assert_allclose(batch.doc_lengths(), [sum(Counter(t)[w] for w in set(t) if w in vocab)
                                                          for t in token_lists])


def test_batch_csr_matches_counter_on_synthetic_tokens():
    rng = np.random.default_rng(0)
    pool = [f"t{i}" for i in range(50)]
    docs = [[pool[i] for i in rng.integers(0, 50, size=rng.integers(0, 40))] for _ in range(60)]
    docs[3] = []
    vocab = Vocabulary()
    batch = build_batch(docs, vocab)
    check_batch(batch, docs, vocab)
    assert batch.dropped_tokens == 0 and batch.evicted.size == 0
    # A second batch reuses ids and only adds its new words.
    docs2 = [["t1", "t1", "new1"], ["new2", "t49"], []]
    before = {w: vocab.get(w) for w in vocab.words}
    batch2 = build_batch(docs2, vocab)
    check_batch(batch2, docs2, vocab)
    assert all(vocab.get(w) == i for w, i in before.items())
    assert {vocab.get("new1"), vocab.get("new2")} == {len(before), len(before) + 1}


def test_a_documents_pairs_come_in_the_order_the_batch_first_saw_its_words():
    """The local step's cold start reads a document's entries in order; the order is the
    batch's first sight of each word (docs in batch.py's _pairs say why)."""
    rng = np.random.default_rng(1)
    pool = [f"t{i}" for i in range(30)]
    docs = [[pool[i] for i in rng.zipf(1.5, size=rng.integers(0, 80)) % 30] for _ in range(40)]
    vocab = Vocabulary()
    batch = build_batch(docs, vocab)
    first_seen = list(dict.fromkeys(w for d in docs for w in d))
    for d, doc in enumerate(docs):
        want = sorted(set(doc), key=first_seen.index)
        s, e = batch.doc_ptr[d], batch.doc_ptr[d + 1]
        assert [vocab.words[i] for i in batch.word_ids[s:e]] == want
        assert batch.counts[s:e].tolist() == [float(doc.count(w)) for w in want]


def test_batch_csr_on_reuters_text():
    docs = load_reuters_r8("train", seed=0)[:200]
    m = TopicModel(n_topics=2)
    toks = m.tokenize([d.text for d in docs])
    batch = m.prepare(toks)
    check_batch(batch, toks, m.vocab)
    assert batch.n_tokens == sum(len(t) for t in toks) > 10_000
    assert len(m.vocabulary) == batch.uniq.size == len({w for t in toks for w in t})


def test_batch_without_growth_drops_unknown_words():
    vocab = Vocabulary()
    build_batch([["a1", "b1"]], vocab)
    docs = [["a1", "zz", "zz", "b1"], ["zz"]]
    batch = build_batch(docs, vocab, grow=False)
    assert len(vocab) == 2
    check_batch(batch, docs, vocab)
    assert batch.dropped_tokens == 3 and batch.n_tokens == 2
    assert np.diff(batch.doc_ptr).tolist() == [2, 0]


def test_batch_from_arrays_local_numbering():
    b = batch_from_arrays([0, 2, 2, 5], [9, 3, 3, 7, 9], [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(b.uniq, [3, 7, 9])
    np.testing.assert_array_equal(b.uniq[b.local], b.word_ids)
    assert b.n_docs == 3 and b.n_tokens == 15
    np.testing.assert_array_equal(b.doc_lengths(), [3, 0, 12])


# -- vocabulary growth and caps -----------------------------------------------------------------

def _trained_model(n_words=1200, **kw):
    rng = np.random.default_rng(1)
    pool = [f"w{i:05d}" for i in range(n_words)]
    docs = [[pool[i] for i in rng.integers(0, n_words, size=80)] for _ in range(60)]
    m = TopicModel(n_topics=4, sparsity=2, seed=0, **kw)
    m.partial_fit(docs)
    m.partial_fit(docs[:30])
    return m


@pytest.mark.parametrize("update", ["stochastic", "memoized"])
def test_growth_keeps_ids_and_rows(update):
    m = _trained_model(update=update)
    st = m.state
    V0 = st.n_words
    old_words = m.vocabulary
    mu0 = st.mu[:V0].copy()
    totals0 = st.mu_totals.copy()
    cap0 = st.capacity
    if update == "stochastic":
        assert st.smoothing > 0  # the initialisation's pseudo-count, which new rows must take too
    new = [f"fresh{i:05d}" for i in range(3000)]  # forces a reallocation of mu
    st_scale = st.scale
    batch = m.prepare([new[:1500] + old_words[:50], new[1500:] + old_words[10:20]], grow=True)
    assert st.capacity > cap0
    assert m.vocabulary[:V0] == old_words
    assert all(m.vocab.get(w) == i for i, w in enumerate(old_words))
    assert st.n_words == V0 + 3000 == len(m.vocabulary)
    np.testing.assert_array_equal(st.mu[:V0], mu0)  # bit-for-bit
    assert np.all(st.mu[V0:V0 + 3000] == st.smoothing)
    assert st.scale == st_scale
    np.testing.assert_allclose(st.mu_totals, totals0 + 3000 * st.smoothing, rtol=1e-12)
    np.testing.assert_allclose(st.mu_totals, st.mu[: st.n_words].sum(axis=0), rtol=1e-9)
    assert batch.n_tokens == 3060 and batch.dropped_tokens == 0


def test_capacity_doubles_geometrically():
    m = TopicModel(n_topics=3)
    st = m.state
    reallocs = 0
    buf = st.mu
    for start in range(0, 10_000, 100):
        m.prepare([[f"v{i}" for i in range(start, start + 100)]])
        if st.mu is not buf:
            reallocs += 1
            buf = st.mu
        cap = st.capacity
        assert cap >= st.n_words
        ratio = cap // 1024
        assert cap % 1024 == 0 and ratio & (ratio - 1) == 0, cap  # 1024 * 2^k
    assert st.n_words == 10_000 and st.capacity == 16_384
    assert reallocs == 4  # 1024 -> 2048 -> 4096 -> 8192 -> 16384


def test_cap_with_ignore_policy_drops_new_words():
    m = TopicModel(n_topics=2, vocab_cap=5, vocab_policy="ignore")
    b1 = m.prepare([["a1", "b1", "c1", "a1"], ["d1", "e1", "f1", "g1", "g1"]])
    assert m.vocabulary == ["a1", "b1", "c1", "d1", "e1"]  # first come, first served
    assert b1.dropped_tokens == 3 and b1.n_tokens == 6
    assert m.state.n_words == 5
    b2 = m.prepare([["h1", "a1", "h1", "i1", "e1"]])
    assert m.vocabulary == ["a1", "b1", "c1", "d1", "e1"]
    assert b2.dropped_tokens == 3 and b2.n_tokens == 2 and b2.evicted.size == 0
    np.testing.assert_array_equal(np.sort(b2.uniq), [0, 4])
    m.partial_fit([["h1", "a1", "zz"]])
    assert m.last_stats["dropped_tokens"] == 2


def test_cap_with_evict_policy_evicts_the_rarest_not_in_batch():
    m = TopicModel(n_topics=3, sparsity=2, vocab_cap=5, vocab_policy="evict", vocab_decay=0.9, seed=0)
    counts = {"aa": 9, "bb": 7, "cc": 5, "dd": 3, "ee": 1}
    m.partial_fit([[w for w, c in counts.items() for _ in range(c)], ["aa", "bb", "cc", "dd", "ee"]])
    ids = {w: m.vocab.get(w) for w in counts}
    st = m.state
    assert not np.all(st.mu[ids["dd"]] == st.smoothing)  # learned something
    np.testing.assert_allclose(m.vocab.counts[[ids[w] for w in counts]], [10, 8, 6, 4, 2])
    mu_other = st.mu[[ids["aa"], ids["bb"], ids["cc"], ids["ee"]]].copy()
    # "ee" is the rarest word but occurs in this batch, so "dd" must go.
    batch = m.prepare([["ee", "ff", "ff"]])
    assert "dd" not in m.vocab and m.vocab.get("ff") == ids["dd"]
    assert m.vocab.get("ee") == ids["ee"]
    np.testing.assert_array_equal(batch.evicted, [ids["dd"]])
    assert batch.dropped_tokens == 0 and batch.n_tokens == 3
    assert len(m.vocabulary) == 5 and m.vocab.n_evicted == 1
    assert np.all(st.mu[ids["dd"]] == st.smoothing)  # the reused row is back at the prior
    np.testing.assert_array_equal(st.mu[[ids["aa"], ids["bb"], ids["cc"], ids["ee"]]], mu_other)
    np.testing.assert_allclose(st.mu_totals, st.mu[:5].sum(axis=0), rtol=1e-12)
    # Decayed counts: the new word starts from its own batch count.
    assert m.vocab.counts[ids["dd"]] == 2.0
    assert m.vocab.counts[ids["aa"]] == pytest.approx(10 * 0.9)


def test_evict_never_takes_words_of_the_current_batch():
    v = Vocabulary(cap=3, policy="evict", decay=1.0)
    ids, ev = v.add_batch(["a", "b", "c"], np.array([1.0, 1.0, 1.0]))
    assert ids.tolist() == [0, 1, 2] and ev.size == 0
    # Five new words and the whole vocabulary in use: nothing can be evicted, extras are dropped.
    ids, ev = v.add_batch(["a", "b", "c", "x", "y"], np.ones(5))
    assert ids.tolist() == [0, 1, 2, -1, -1] and ev.size == 0
    # Two new words, one old word in use: the two others go, ids reused.
    ids, ev = v.add_batch(["b", "x", "y"], np.ones(3))
    assert ids[0] == 1 and sorted(ids[1:].tolist()) == [0, 2] and sorted(ev.tolist()) == [0, 2]
    assert sorted(v.words) == ["b", "x", "y"] and "a" not in v and "c" not in v


def test_vocabulary_rejects_bad_settings():
    with pytest.raises(ValueError, match="policy"):
        Vocabulary(policy="lru")
    with pytest.raises(ValueError, match="cap"):
        Vocabulary(cap=0)
    with pytest.raises(ValueError, match="decay"):
        Vocabulary(decay=0.0)


# --------------------------------------------------------------------------- issue 14: text without spaces
ZH_LONG = "机器学习是人工智能的一个分支，研究计算机怎样模拟或实现人类的学习行为以获取新的知识或技能并重新组织已有的知识结构使之不断改善自身的性能"
JA_LONG = "東京都に住んでいる研究者たちは自然言語処理と機械学習の新しい手法について毎日のように議論しています"


def test_whitespace_segmentation_drops_cjk_sentences_as_one_overlong_word():
    """The failure mode issue 14 reports: a sentence without spaces is one 'word' > max_len."""
    tok = Tokenizer()
    assert tok(ZH_LONG.replace("，", "")) == [] and tok(JA_LONG) == []


def test_cjk_bigrams_cut_chinese_japanese_thai_and_keep_other_words():
    tok = Tokenizer(segmentation="cjk_bigrams")
    zh = tok("机器学习是人工智能")
    assert zh == ["机器", "器学", "学习", "习是", "是人", "人工", "工智", "智能"]
    ja = tok(JA_LONG)
    assert "東京" in ja and "機械" in ja and "学習" in ja and all(len(w) == 2 for w in ja)
    assert len(ja) == len(JA_LONG) - 1
    th = tok("ภาษาไทย")  # Thai with its combining marks stays one run
    assert th == ["ภา", "าษ", "ษา", "าไ", "ไท", "ทย"]
    mixed = tok("Topic models like LDA 猫 and 机器学习 in the news")
    assert mixed == ["topic", "models", "lda", "猫", "机器", "器学", "学习", "news"]
    assert Tokenizer(segmentation="cjk_bigrams").config()["segmentation"] == "cjk_bigrams"
    with pytest.raises(ValueError, match="segmentation"):
        Tokenizer(segmentation="icu")


def test_model_segmentation_keyword_learns_cjk_documents_and_round_trips(tmp_path):
    from streamtopics.model import load_snapshot

    docs = [ZH_LONG, JA_LONG, ZH_LONG[10:] + "深度学习", JA_LONG[5:] + "機械学習"] * 3
    m = TopicModel(n_topics=3, seed=0, segmentation="cjk_bigrams")
    m.partial_fit(docs)
    assert m.state.tokens_seen > 300 and "学习" in m.vocabulary and "機械" in m.vocabulary
    m.save(tmp_path / "m.snap")
    back = load_snapshot(tmp_path / "m.snap")
    assert back.segmentation == "cjk_bigrams" and back.tokenize([ZH_LONG]) == m.tokenize([ZH_LONG])
    plain = TopicModel(n_topics=3, seed=0)
    plain.partial_fit(docs)
    # whitespace mode: at most one sentence-long "word" per short clause, the rest dropped as over-long
    assert plain.state.tokens_seen <= len(docs) and "学习" not in plain.vocabulary
    with pytest.raises(ValueError, match="segmentation"):
        TopicModel(segmentation="spaces")
