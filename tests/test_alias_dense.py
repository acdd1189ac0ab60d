"""The alias engine's dense small-K kernel (``engines.alias_dense``, issue 18): exactness against
enumerated posteriors (chi-square, as tests/test_alias.py does for the MH kernel), the hand-over
into the engine's SamplerArrays, and the kernel choice of ``fit``."""
from __future__ import annotations

import itertools
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from streamtopics.engines import alias_dense  # noqa: E402
from streamtopics.engines.alias import AliasEngine, SamplerArrays, run_batch_sampler  # noqa: E402
from streamtopics.engines.alias_core import INIT_GIVEN  # noqa: E402
from streamtopics.engines.alias_dense import (DENSE_MAX_K, LANES, DenseArrays, choose_kernel,  # noqa: E402
                                              dense_sweeps)
from streamtopics.engines.walker import rng_state  # noqa: E402
from streamtopics.model import TopicModel  # noqa: E402
from test_alias import chi2_pvalue  # noqa: E402
from test_core_model import make_lda  # noqa: E402


def exact_joint(docs, K: int, V: int, alpha: float, beta: float):
    """(tok_w, tok_ptr, p over all K^N assignments) of collapsed LDA, enumerated."""
    tok_w = np.array([w for d in docs for w in d], dtype=np.int32)
    tok_ptr = np.cumsum([0] + [len(d) for d in docs]).astype(np.int64)
    states = np.array(list(itertools.product(range(K), repeat=tok_w.size)))
    lp = np.zeros(len(states))
    for s, e in zip(tok_ptr[:-1], tok_ptr[1:]):
        for k in range(K):
            lp += np.vectorize(lambda x: math.lgamma(x + alpha))((states[:, s:e] == k).sum(1))
    for k in range(K):
        at_k = states == k
        for w in range(V):
            lp += np.vectorize(lambda x: math.lgamma(x + beta))((at_k & (tok_w == w)).sum(1))
        lp -= np.vectorize(lambda x: math.lgamma(x + V * beta))(at_k.sum(1))
    p = np.exp(lp - lp.max())
    return tok_w, tok_ptr, p / p.sum()


def pooled_pvalue(counts, p, n):
    """Chi-square p-value with states of tiny expected count pooled into one cell."""
    order = np.argsort(p)
    small = order[np.cumsum(p[order]) < 20 / n]
    obs = np.append(np.delete(counts, small), counts[small].sum())
    exp = np.append(np.delete(p, small), p[small].sum())
    return chi2_pvalue(obs, exp)


@pytest.mark.parametrize("docs,K,V,alpha,beta", [
    ([[0, 1, 0], [1, 2]], 3, 3, 0.5, 0.3),   # the MH tests' joint model: one block, padding 13
    ([[0, 0], [1]], 20, 2, 0.1, 0.05),       # two blocks (K=20: the draw skips block 0 or not)
    ([[0, 0]], 40, 2, 0.05, 0.02),           # three blocks, peaked: one topic for both ~41x a split
])
def test_dense_chain_reproduces_exact_joint_posterior(docs, K, V, alpha, beta):
    """Independent chains (one per seed, 12 sweeps from a uniform start): their final states
    are draws of the joint posterior.  Checked by mutation: a kernel that leaves token i in its
    own counts fails the first case (p ~ 0), one whose block scan stops short fails the others."""
    tok_w, tok_ptr, p = exact_joint(docs, K, V, alpha, beta)
    n = 8000
    weights = K ** np.arange(tok_w.size - 1, -1, -1)
    finals = np.empty(n, dtype=np.int64)
    for c in range(n):
        a = DenseArrays(V, tok_w.size, K)
        a.run(500 + c, tok_w, tok_ptr, alpha, beta, V, 12, True)
        finals[c] = int(a.z @ weights)
    assert a.nwk.reshape(V, -1)[:, K:].sum() == 0  # padding topics never drawn
    counts = np.bincount(finals, minlength=p.size)
    assert pooled_pvalue(counts, p, n) > 1e-3
    if K > 3:  # and it is not just uniform over the states
        assert pooled_pvalue(counts, np.full(p.size, 1.0 / p.size), n) < 1e-12


def test_dense_counts_stay_exact_and_hand_over_to_sampler_arrays():
    """After sweeps at a K that is not a multiple of the lane width: n_wk, n_k agree with z; the
    SamplerArrays hand-over holds the same counts (hash rows for rare words) and the MH kernel
    continues from it (INIT_GIVEN) with consistent counts."""
    _, _, docs, _ = make_lda(n_docs=60, doc_len=40, seed=3)
    words = sorted({w for d in docs for w in d})
    ids = {w: i for i, w in enumerate(words)}
    tok_w = np.array([ids[w] for d in docs for w in d], dtype=np.int32)
    tok_ptr = np.cumsum([0] + [len(d) for d in docs]).astype(np.int64)
    U, K = len(words), 37
    assert K % LANES
    a = DenseArrays(U, tok_w.size, K)
    st = a.run(7, tok_w, tok_ptr, 0.1, 0.01, U, 6, True)
    ref = np.zeros((U, K), dtype=np.int64)
    np.add.at(ref, (tok_w, a.z), 1)
    assert np.array_equal(a.counts(), ref) and np.array_equal(a.nk, ref.sum(0))
    assert 0 < st[5] <= 6 * tok_w.size  # tokens moved
    arr = a.to_sampler_arrays(tok_w, None, np.bincount(tok_w, minlength=U))
    assert isinstance(arr, SamplerArrays) and np.array_equal(arr.counts(), ref) and np.array_equal(arr.z, a.z)
    assert (arr.meta.reshape(-1, 8)[:U, 1] < K).any()  # some rows are hash rows
    arr.run(3, tok_w, tok_ptr, np.full(K, U * 0.01), np.zeros((1, 1)), False, 0.01, 0.1, 3, 2, False, INIT_GIVEN)
    ref[:] = 0
    np.add.at(ref, (tok_w, arr.z), 1)
    assert np.array_equal(arr.counts(), ref) and np.array_equal(arr.nk, ref.sum(0))


def test_rounding_past_the_mass_falls_back_to_a_topic_with_mass():
    """u close to 1 with float32 sums: the draw never lands on a padding topic (zero mass)."""
    K = 5
    tok_w = np.zeros(3, dtype=np.int32)
    tok_ptr = np.array([0, 3])
    for seed in range(200):
        z = np.zeros(3, dtype=np.int32)
        nwk = np.zeros(LANES, dtype=np.int32)
        nk = np.zeros(K, dtype=np.int64)
        dense_sweeps(rng_state(seed), tok_w, tok_ptr, z, nwk, nk, 1e-3, 1e-3, 1e-3, 5, True)
        assert z.max() < K and nwk[K:].sum() == 0 and nk.sum() == 3


def test_auto_choice_and_one_form_of_results():
    """``fit`` runs the dense kernel at small K and alias-MH at large K; the model comes back in
    the same form either way (state, topics, transform, a later partial_fit)."""
    U = 1000
    assert choose_kernel("auto", 100, U) == "dense" and choose_kernel("auto", DENSE_MAX_K, U) == "dense"
    assert choose_kernel("auto", DENSE_MAX_K + 1, U) == "mh" and choose_kernel("auto", 4096, U) == "mh"
    assert choose_kernel("auto", 100, 10**7) == "mh"  # the dense rows would not fit the memory cap
    assert choose_kernel("mh", 10, U) == "mh" and choose_kernel("dense", 4096, U) == "dense"
    assert choose_kernel("auto", 10, U, supervised=True) == "mh"
    with pytest.raises(ValueError, match="unsupervised"):
        choose_kernel("dense", 10, U, supervised=True)
    with pytest.raises(ValueError, match="kernel"):
        AliasEngine(kernel="sparse")
    _, _, docs, _ = make_lda(n_docs=120, doc_len=30, seed=5)
    out = {}
    for K in (6, DENSE_MAX_K + 1):
        m = TopicModel(n_topics=K, engine="alias", alpha=0.1, beta=0.01, seed=1).fit(docs[:100], n_sweeps=3)
        out[K] = m
        assert m.last_stats["kernel"] == ("dense" if K == 6 else "mh")
        assert m.state.mu[: m.state.n_words].sum() == pytest.approx(m.state.tokens_seen)
        assert m.topic_word().shape == (K, len(m.vocab))
        theta = m.transform(docs[100:])
        assert theta.shape == (20, K) and np.allclose(theta.sum(1), 1.0)
        m.partial_fit(docs[100:])
        assert m.state.docs_seen == 120
    a, b = out[6].last_stats, out[DENSE_MAX_K + 1].last_stats
    assert set(a) == set(b)  # the same stats keys from either kernel


def test_forced_kernels_give_the_same_form_at_one_k():
    """At one small K, "dense" and "mh" fits leave states of one form (and both learn)."""
    phi, _, docs, words = make_lda(n_docs=200, doc_len=50, seed=9)
    states = {}
    for kern in ("dense", "mh"):
        m = TopicModel(n_topics=5, engine="alias", alpha=0.1, beta=0.01, seed=2)
        m.reset()
        batch = m.prepare(m.tokenize(docs), grow=True)
        m.local_step.kernel = kern
        st = m.local_step.fit_state(m.state, batch, 30, seed=4)
        assert st["kernel"] == kern
        states[kern] = m.state
    d, h = states["dense"], states["mh"]
    assert d.mu.shape == h.mu.shape and d.mu.dtype == h.mu.dtype and d.n_words == h.n_words
    assert d.mu[: d.n_words].sum() == h.mu[: h.n_words].sum()
    assert (d.scale, d.smoothing, d.n_updates, d.docs_seen) == (h.scale, h.smoothing, h.n_updates, h.docs_seen)


def test_run_batch_sampler_reports_the_kernel_and_calls_back_with_z():
    tok_w = np.array([0, 1, 1, 2, 0, 2], dtype=np.int32)
    tok_ptr = np.array([0, 3, 6])
    seen = []
    arr, st = run_batch_sampler(tok_w, tok_ptr, 3, 4, 0.1, 0.01, 3, 5, 1, callback=lambda s, a: seen.append(s),
                                callback_every=2)
    assert st["kernel"] == "dense" and isinstance(arr, SamplerArrays) and seen == [2, 4, 5]
    assert st["sweeps"] == 5 and math.isnan(st["mh_acceptance"]["word"])
    assert alias_dense.KERNELS == ("auto", "dense", "mh")
