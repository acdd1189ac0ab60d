"""Topic quality: the incremental NPMI monitor against a from-scratch count and against gensim."""

from __future__ import annotations

import numpy as np
import pytest

from streamtopics.batch import build_batch
from streamtopics.quality import (
    CoherenceMonitor,
    cooccurrence_counts,
    npmi_from_counts,
    npmi_reference,
    topic_diversity,
    top_word_ids,
)
from streamtopics.text import Tokenizer, Vocabulary


def _random_batch(rng, n_docs, V):
    ptr = [0]
    ids = []
    for _ in range(n_docs):
        n = int(rng.integers(0, 12))
        # a skewed vocabulary so that top words co-occur often, some never
        w = np.unique(np.minimum(rng.zipf(1.3, size=n), V) - 1)
        ids.extend(w.tolist())
        ptr.append(len(ids))
    return np.array(ptr, np.int64), np.array(ids, np.int64)


def test_incremental_npmi_equals_from_scratch_exactly():
    rng = np.random.default_rng(3)
    V, K, N = 60, 7, 10
    mon = CoherenceMonitor(window_docs=150, top_n=N)
    top = np.stack([rng.permutation(V)[:25] for _ in range(K)])
    changed, streamed = [], 0
    for step in range(40):
        # one batch larger than the window's ring so far (it grows and every bitset is rebuilt)
        ptr, ids = _random_batch(rng, 400 if step == 30 else int(rng.integers(5, 60)), V)
        if step % 3 == 0:  # a few topics change some top words, others only their order
            k = int(rng.integers(K))
            top[k, :N] = rng.permutation(V)[:N] if step % 2 else top[k, rng.permutation(N)]
        evicted = np.array([int(rng.integers(V))]) if step == 25 else None
        rep = mon.update(ptr, ids, top, evicted=evicted)
        streamed += ptr.size - 1
        changed.append(rep.changed_topics)
        window = [doc for batch in mon.window() for doc in batch]
        assert rep.window_docs == len(window)
        tw = mon.counted_top_words()
        assert np.array_equal(np.sort(top[:, :N], axis=1), tw)
        df, pair, D = cooccurrence_counts(window, tw)
        df_i, pair_i, D_i = mon.counts()
        assert D == D_i
        assert np.array_equal(df, df_i)
        iu = np.triu_indices(N, 1)
        assert np.array_equal(pair[:, iu[0], iu[1]], pair_i[:, iu[0], iu[1]])
        scratch = npmi_from_counts(df, pair, D)
        assert np.array_equal(rep.npmi, scratch)  # exact, not approximately
        np.testing.assert_allclose(npmi_reference(window, top[:, :N]), rep.npmi, rtol=0, atol=1e-12)
    # the window's ring of document slots wrapped many times (~1,500 documents through 150)
    assert sum(changed) > 0 and streamed > 5 * mon.window_docs


def test_npmi_definition_edge_cases():
    docs = [[0, 1], [0, 1], [2], [0, 3]]
    top = np.array([[0, 1], [0, 2], [0, 3]])
    got = npmi_reference(docs, top)
    p01, p0, p1 = 2 / 4, 3 / 4, 2 / 4
    assert got[0] == pytest.approx(np.log(p01 / (p0 * p1)) / -np.log(p01))
    assert got[1] == -1.0  # never together
    assert -1 < got[2] < 1
    assert npmi_reference([[0, 1], [1, 0, 0]], np.array([[0, 1]]))[0] == 1.0  # always together
    assert topic_diversity(np.array([[0, 1], [1, 2]])) == 0.75
    w = np.array([[0.1, 5.0], [0.3, 0.0], [0.2, 1.0]])
    assert top_word_ids(w, 2).tolist() == [[1, 2], [0, 2]]


def _reference_corpus():
    """A fixed small reference: 400 Reuters R8 test documents (shipped with the package)."""
    from streamtopics.corpora import load_reuters_r8

    docs = load_reuters_r8("test", order="shuffled", seed=0)[:400]
    tok = Tokenizer()
    return [t for t in (tok(d.text) for d in docs) if t]


def test_npmi_agrees_with_gensim_c_npmi():
    gensim = pytest.importorskip("gensim", reason="gensim (test extra) is not installed")
    from gensim.corpora import Dictionary
    from gensim.models.coherencemodel import CoherenceModel

    texts = _reference_corpus()
    # topics: 4 x 10 of the 150 words in most documents, chosen greedily (most frequent first)
    # so that every pair of a topic co-occurs in some document
    vocab = Vocabulary()
    batch = build_batch(texts, vocab, grow=True)
    df = np.bincount(batch.word_ids, minlength=len(vocab))
    frequent = np.argsort(-df, kind="stable")[:150]
    X = np.zeros((batch.n_docs, len(vocab)))
    X[np.repeat(np.arange(batch.n_docs), np.diff(batch.doc_ptr)), batch.word_ids] = 1
    C = X.T @ X
    used: set[int] = set()
    top_ids = []
    for _ in range(4):
        topic: list[int] = []
        for w in frequent.tolist():
            if w not in used and all(0 < C[w, u] < batch.n_docs for u in topic):
                topic.append(w)
                if len(topic) == 10:
                    break
        used.update(topic)
        top_ids.append(topic)
    top_ids = np.array(top_ids)
    ours = npmi_reference([batch.word_ids[batch.doc_ptr[d]:batch.doc_ptr[d + 1]]
                           for d in range(batch.n_docs)], top_ids)
    # pinned: gensim adds eps=1e-12 inside the logs and scores a never-seen pair about -0.7, not
    # -1; the comparison uses topics whose pairs all co-occur and none in every document
    dfc, pair, D = cooccurrence_counts([set(t) for t in texts], [[vocab.words[i] for i in r] for r in top_ids])
    iu = np.triu_indices(10, 1)
    assert pair[:, iu[0], iu[1]].min() > 0 and pair.max() < D
    topics = [[vocab.words[i] for i in row] for row in top_ids]
    dictionary = Dictionary(texts)
    # c_npmi counts sliding windows of window_size tokens; a window as long as the longest
    # document makes every document exactly one window: boolean-document co-occurrence
    cm = CoherenceModel(topics=topics, texts=texts, dictionary=dictionary, coherence="c_npmi",
                        window_size=max(map(len, texts)), processes=1, topn=10)
    theirs = np.array(cm.get_coherence_per_topic())
    np.testing.assert_allclose(ours, theirs, atol=0.01, rtol=0)
    assert np.abs(ours - theirs).max() < 1e-6  # in fact equal up to gensim's epsilon
    assert float(np.mean(ours)) == pytest.approx(cm.get_coherence(), abs=0.01)
