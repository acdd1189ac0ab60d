"""Alias-MH engine: Walker tables, exactness of the MH correction, model integration.

Statistical tests use fixed seeds, so they are deterministic; their thresholds (p > 1e-3)
would fail a broken sampler by many orders of magnitude (e.g. a table holding the updated
token's own assignment gives p ~ 1e-300 on the tiny joint model below).
"""
from __future__ import annotations

import itertools
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from streamtopics.batch import batch_from_arrays  # noqa: E402
from streamtopics.engines.alias import SamplerArrays, alias_sample, batch_tokens  # noqa: E402
from streamtopics.engines.word_rows import M_PTR, M_VER, M_ZT  # noqa: E402
from streamtopics.engines.gibbs_ref import gibbs_fit, topic_word_from_counts  # noqa: E402
from streamtopics.evaluate import heldout_loglik_arrays  # noqa: E402
from streamtopics.model import TopicModel, load_snapshot  # noqa: E402
from test_core_model import aligned_topics, cosine, make_lda  # noqa: E402


# -- chi-square without scipy (the test extra does not ship it) ----------------------------
def _gammaincc(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) (Numerical Recipes gser/gcf)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(-x + a * math.log(x) - lg))
    b = x + 1 - a
    c = 1e300
    d = 1 / b
    h = d
    for i in range(1, 10000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1e-300 if abs(d) < 1e-300 else d
        c = b + an / c
        c = 1e-300 if abs(c) < 1e-300 else c
        d = 1 / d
        h *= d * c
        if abs(d * c - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - lg) * h


def chi2_pvalue(observed: np.ndarray, expected_p: np.ndarray) -> float:
    n = observed.sum()
    keep = expected_p > 0
    assert observed[~keep].sum() == 0, "draws of an outcome with probability 0"
    e = n * expected_p[keep]
    stat = float(((observed[keep] - e) ** 2 / e).sum())
    return _gammaincc((keep.sum() - 1) / 2.0, stat / 2.0)


def test_chi2_helper_matches_known_quantiles():
    # chi-square(10) upper 5% point is 18.307, chi-square(1) upper 1% point is 6.635
    assert _gammaincc(5.0, 18.307 / 2) == pytest.approx(0.05, abs=2e-4)
    assert _gammaincc(0.5, 6.635 / 2) == pytest.approx(0.01, abs=1e-4)


# -- Walker alias tables -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["skewed", "flat_with_zeros", "one_heavy"])
def test_alias_table_reproduces_its_distribution(kind):
    rng = np.random.default_rng(11)
    K = 64
    if kind == "skewed":
        w = rng.gamma(0.3, size=K)
    elif kind == "flat_with_zeros":
        w = np.ones(K)
        w[rng.choice(K, 10, replace=False)] = 0.0
    else:
        w = np.full(K, 1e-3)
        w[7] = 50.0
    n = 1_000_000
    draws = alias_sample(w, n, seed=5)
    counts = np.bincount(draws, minlength=K)
    p = w / w.sum()
    assert chi2_pvalue(counts, p) > 1e-3
    # and a wrong distribution is rejected by the same test (it has power)
    q = p * np.where(np.arange(K) % 2 == 1, 2.0, 1.0)
    q /= q.sum()
    assert chi2_pvalue(counts, q) < 1e-6


# -- exactness of the MH correction --------------------------------------------------------
def _stale_single_token(mixture: bool, word_prior: bool, tries: int, T: int = 3_000_000, S: int = 200_000):
    """One token in a streaming batch: target p(k) ∝ alpha * G_wk / G_k, exactly.

    The word table is replaced by a deliberately wrong ("stale") distribution that the
    kernel never rebuilds (T larger than all draws).
    """
    K = 6
    G = np.array([[0.5, 3.0, 0.2, 1.0, 2.0, 0.05]])  # lambda_wk of the only word
    Gk = np.array([40.0, 10.0, 5.0, 20.0, 8.0, 30.0])  # sum_v lambda_kv
    target = G[0] / Gk
    target /= target.sum()
    stale = np.array([0.3, 0.05, 0.25, 0.1, 0.1, 0.2])  # nothing like the target
    arr = SamplerArrays(1, 1, K, T)  # one dense row
    ent = arr.ent.reshape(K, 4)
    meta = arr.meta.reshape(-1, 8)
    arr.entf.reshape(K, 4)[:, 3] = stale.astype(np.float32)  # the table's weights A~
    arr.metaf.reshape(-1, 8)[0, M_ZT] = float(stale.astype(np.float32).astype(np.float64).sum())
    arr.samples[:] = alias_sample(stale.astype(np.float32).astype(np.float64), T, seed=3)
    meta[0, M_PTR] = 0
    meta[0, M_VER] = 1
    arr.tver[0] = 1
    arr.tb[0] = -1  # the token is not counted in the table
    arr.z[0] = 0
    ent[0, 1] = 1
    arr.nk[0] = 1
    z_rec = np.zeros((S, 1), dtype=np.int32)
    st = arr.run(9, np.zeros(1, np.int32), np.array([0, 1]), Gk, G, True, 0.01, 0.1, S, 2, mixture, 0, 0, z_rec,
                 word_prior=word_prior, tries=tries)
    assert st[4] == 0, "the stale table must not have been rebuilt"
    return z_rec[::4, 0], target  # thin: consecutive sweeps are (mildly) dependent


@pytest.mark.parametrize("mixture,word_prior,tries", [(False, True, 1), (True, True, 1), (False, False, 1),
                                                     (False, True, 3), (True, False, (1, 2))])
def test_mh_with_stale_proposal_reproduces_exact_conditional(mixture, word_prior, tries):
    z, target = _stale_single_token(mixture, word_prior, tries)
    counts = np.bincount(z, minlength=target.size)
    assert chi2_pvalue(counts, target) > 1e-3
    stale = np.array([0.3, 0.05, 0.25, 0.1, 0.1, 0.2])
    assert chi2_pvalue(counts, stale) < 1e-12  # it did not just follow the proposal


DOCS = [[0, 1, 0], [1, 2]]
KJ, VJ, AJ, BJ = 3, 3, 0.5, 0.3


def _exact_joint(K: int = KJ):
    tok_w = np.array([w for d in DOCS for w in d], dtype=np.int32)
    tok_ptr = np.array([0, 3, 5], dtype=np.int64)

    def logp(z):
        lp = 0.0
        for s, e in zip(tok_ptr[:-1], tok_ptr[1:]):
            nd = np.bincount(z[s:e], minlength=K)
            lp += sum(math.lgamma(x + AJ) for x in nd)
        nkw = np.zeros((K, VJ))
        np.add.at(nkw, (z, tok_w), 1)
        lp += sum(math.lgamma(x + BJ) for x in nkw.ravel()) - sum(math.lgamma(x + VJ * BJ) for x in nkw.sum(1))
        return lp

    states = list(itertools.product(range(K), repeat=tok_w.size))
    lp = np.array([logp(np.array(s)) for s in states])
    p = np.exp(lp - lp.max())
    return tok_w, tok_ptr, p / p.sum()


@pytest.mark.parametrize("K,rows,table_draws,mixture,word_prior,tries", [
    (KJ, "dense", 2000, False, True, 1),
    (KJ, "dense", 3, False, True, 1),
    (KJ, "dense", 3, True, True, (2, 1)),  # the default at large K: two word candidates, one doc
    (KJ, "dense", 3, False, False, 1),
    (6, "hash", 2000, False, True, 2),   # hash rows (cap 4 < K): inserts, deletions, stale entries
    (6, "hash", 3, True, True, (1, 3)),  # ... and compactions while tables are rebuilt all the time
    (5, "hash", 4, False, False, 2),
])
def test_whole_chain_reproduces_exact_joint_posterior(K, rows, table_draws, mixture, word_prior, tries):
    """5 tokens enumerated exactly (K^5 joint states).  Independent chains (one per seed) each
    run 25 sweeps from a uniform start; their final states are i.i.d. draws.
    table_draws=2000: every table is built once and then only goes stale (25 sweeps use
    fewer draws); 3: rebuilt all the time, while other tokens of the same word use it.
    Batch mode throughout: the shared prior table (self-excluded at s) is in every proposal."""
    tok_w, tok_ptr, p = _exact_joint(K)
    n_chains = 6000 if K == KJ else 12000
    finals = np.empty(n_chains, dtype=np.int64)
    weights = K ** np.arange(tok_w.size - 1, -1, -1)
    freq = np.bincount(tok_w, minlength=VJ) if rows == "hash" else None
    for c in range(n_chains):
        arr = SamplerArrays(VJ, tok_w.size, K, table_draws, freq)
        st = arr.run(1000 + c, tok_w, tok_ptr, np.full(K, VJ * BJ), np.zeros((1, 1)), False, BJ, AJ, 25, 2,
                     mixture, 1, word_prior=word_prior, tries=tries)
        if table_draws > 1000 and rows == "dense":
            assert st[4] <= VJ  # built once per word, never rebuilt
        finals[c] = int(arr.z @ weights)
    if rows == "hash":
        assert (arr.meta.reshape(-1, 8)[:VJ, 1] < K).all()  # the rows really were hash rows
    counts = np.bincount(finals, minlength=p.size)
    # pool states of tiny expected count so the chi-square approximation holds
    order = np.argsort(p)
    cum = np.cumsum(p[order])
    small = order[cum < 20 / n_chains]
    obs = np.append(np.delete(counts, small), counts[small].sum())
    exp = np.append(np.delete(p, small), p[small].sum())
    assert chi2_pvalue(obs, exp) > 1e-3


def test_hash_rows_hold_the_same_counts_as_dense_rows():
    """Random moves through the storage (inserts, deletions, compactions) keep n_wk and n_k exact."""
    rng = np.random.default_rng(0)
    K, U = 64, 40
    freq = rng.integers(1, 12, size=U)
    tok_w = np.repeat(np.arange(U, dtype=np.int32), freq)
    rng.shuffle(tok_w)
    tok_ptr = np.arange(0, tok_w.size + 1, 7, dtype=np.int64)
    tok_ptr[-1] = tok_w.size
    arr = SamplerArrays(U, tok_w.size, K, 8, freq)
    assert (arr.meta.reshape(-1, 8)[:U, 1] < K).all()
    st = arr.run(3, tok_w, tok_ptr, np.full(K, U * 0.01), np.zeros((1, 1)), False, 0.01, 0.1, 30, 2, False, 1,
                 tries=2)
    assert st[5] > 0  # tokens moved
    dense = np.zeros((U, K), dtype=np.int64)
    np.add.at(dense, (tok_w, arr.z), 1)
    assert np.array_equal(arr.counts(), dense)
    assert np.array_equal(arr.nk, dense.sum(axis=0))


# -- model integration ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def lda():
    return make_lda(seed=1)


def _stream(docs, batch=50, passes=2, **kw):
    params = dict(n_topics=5, engine="alias", alpha=0.1, beta=0.01, seed=0)
    params.update(kw)
    m = TopicModel(**params)
    for _ in range(passes):
        for b in range(0, len(docs), batch):
            m.partial_fit(docs[b:b + batch])
    return m


def test_streaming_alias_learns_planted_topics(lda):
    phi, _, docs, words = lda
    m = _stream(docs)
    sim = cosine(phi, aligned_topics(m, words))
    assert sim.max(axis=1).min() > 0.9, sim.max(axis=1)
    st = m.last_stats
    assert 0.0 < st["mh_acceptance"]["word"] <= 1.0 and 0.0 < st["mh_acceptance"]["doc"] <= 1.0
    assert st["alias_rebuilds"] > 0 and st["sweeps"] == 8


def test_alias_transform_leaves_learning_alone_and_repeats(lda):
    """transform drew its sampler seed from the model's learning generator: a user who looked
    at theta between batches got a different model than one who did not, and two calls on one
    model disagreed. The seed now comes from the model's state (``inference_seed``)."""
    _, _, docs, _ = lda

    def run(peek: bool):
        m = TopicModel(n_topics=5, engine="alias", seed=0)
        for b in range(0, 300, 100):
            m.partial_fit(docs[b:b + 100])
            if peek:
                m.transform(docs[250:270])
        return m
    quiet, peeked = run(False), run(True)
    assert np.array_equal(quiet.topic_word(), peeked.topic_word())
    assert np.array_equal(quiet.transform(docs[250:290]), quiet.transform(docs[250:290]))


def test_streaming_alias_memoized_update_runs(lda):
    _, _, docs, _ = lda
    m = TopicModel(n_topics=5, engine="alias", update="memoized", seed=0)
    for lap in range(2):
        for b in range(0, 300, 100):
            m.partial_fit(docs[b:b + 100], batch_key=b)
    assert m.last_stats["revisit"] and len(m.updater.cache) == 3
    assert np.isfinite(m.heldout_loglik(docs[:50]))


def test_alias_is_deterministic_given_the_seed_and_resumes_from_snapshots(lda, tmp_path):
    _, _, docs, _ = lda
    a = _stream(docs[:200], passes=1, seed=4)
    b = _stream(docs[:200], passes=1, seed=4)
    c = _stream(docs[:200], passes=1, seed=5)
    assert np.array_equal(a.topic_word(), b.topic_word())
    assert not np.allclose(a.topic_word(), c.topic_word())
    # stop after two batches, snapshot, resume: same as never stopping
    full = _stream(docs[:200], batch=50, passes=1, seed=4)
    part = TopicModel(n_topics=5, engine="alias", alpha=0.1, beta=0.01, seed=4)
    part.partial_fit(docs[:50]).partial_fit(docs[50:100])
    part.save(tmp_path / "mid.stsnap")
    resumed = load_snapshot(tmp_path / "mid.stsnap")
    resumed.partial_fit(docs[100:150]).partial_fit(docs[150:200])
    assert np.array_equal(resumed.topic_word(), full.topic_word())
    f1 = TopicModel(n_topics=5, engine="alias", seed=2).fit(docs, n_sweeps=20)
    f2 = TopicModel(n_topics=5, engine="alias", seed=2).fit(docs, n_sweeps=20)
    assert np.array_equal(f1.topic_word(), f2.topic_word())


def test_both_engines_snapshots_load_into_one_model_class_and_predict(lda, tmp_path):
    _, _, docs, _ = lda
    variational = TopicModel(n_topics=5, seed=0)
    for b in range(0, 300, 100):
        variational.partial_fit(docs[b:b + 100])
    batch_alias = TopicModel(n_topics=5, engine="alias", seed=0, burn_in=2, sample_sweeps=3,
                             tries=(2, 1)).fit(docs, n_sweeps=30)
    stream_alias = _stream(docs, batch=100, passes=1)
    for name, m in [("lsparse", variational), ("alias-fit", batch_alias), ("alias-stream", stream_alias)]:
        path = tmp_path / f"{name}.stsnap"
        m.save(path)
        before = m.transform(docs[:20])  # the snapshot holds the generator state before this call
        loaded = load_snapshot(path)
        assert type(loaded) is TopicModel and loaded.engine == m.engine
        assert loaded.get_params() == m.get_params()
        after = loaded.transform(docs[:20])
        assert after.shape == (20, 5) and np.allclose(after.sum(axis=1), 1.0)
        assert np.allclose(after, before), name  # same state, same generator: same predictions
        assert np.array_equal(loaded.topic_word(), m.topic_word())
        assert loaded.heldout_loglik(docs[:50]) == pytest.approx(m.heldout_loglik(docs[:50]))


def test_fit_then_heldout_matches_the_exact_gibbs_reference():
    """Same tokens, same sweeps, same scorer; medians over 3 seeds for both samplers, since a
    single collapsed chain (either sampler) can sit in a merged-topics local optimum."""
    phi, _, docs, words = make_lda(n_docs=400, doc_len=60, seed=7)
    train, test = docs[:320], docs[320:]
    ours, refs, recovered = [], [], []
    for seed in (1, 2, 3):
        m = TopicModel(n_topics=5, engine="alias", alpha=0.1, beta=0.01, seed=seed).fit(train, n_sweeps=60)
        assert m.state.scale == 1.0 and m.state.smoothing == 0.0 and m.state.docs_seen == 320
        assert m.state.mu[: m.state.n_words].sum() == pytest.approx(m.state.tokens_seen)
        ours.append(m.heldout_loglik(test))
        # the same tokens through the O(K) reference, scored by the same function
        batch = m.prepare(m.tokenize(train), grow=False)
        test_batch = m.prepare(m.tokenize(test), grow=False)
        tok_w, tok_ptr = batch_tokens(batch)
        nwk, *_ = gibbs_fit(tok_w, tok_ptr, batch.uniq.size, 5, 0.1, 0.01, len(m.vocab), 60, seed=seed)
        tw = np.zeros((5, len(m.vocab)))
        tw[:, batch.uniq] = topic_word_from_counts(nwk, 0.01)
        refs.append(heldout_loglik_arrays(tw, test_batch, 0.1))
        recovered.append(cosine(phi, aligned_topics(m, words)).max(axis=1).min())
    assert np.median(ours) == pytest.approx(np.median(refs), rel=0.01), (ours, refs)
    assert np.median(recovered) > 0.9, recovered


def test_alias_parameters_are_validated_and_fit_contract():
    with pytest.raises(ValueError, match="proposal"):
        TopicModel(engine="alias", proposal="both")
    with pytest.raises(ValueError, match="mh_steps"):
        TopicModel(engine="alias", mh_steps=0)
    with pytest.raises(ValueError, match="sample_sweeps"):
        TopicModel(engine="alias", sample_sweeps=0)
    with pytest.raises(ValueError, match="table_draws"):
        TopicModel(engine="alias", table_draws=0)
    with pytest.raises(ValueError, match="alpha_proposal"):
        TopicModel(engine="alias", alpha_proposal="flat")
    for bad in (0, True, 2.0, (2,), (1, 65), (2, 1, 1), "2"):
        with pytest.raises(ValueError, match="tries"):
            TopicModel(engine="alias", tries=bad)
    assert TopicModel(engine="alias", tries=2).tries == (2, 2)
    assert TopicModel(engine="alias", tries=[3, 1]).get_params()["tries"] == (3, 1)
    assert TopicModel(engine="alias").tries is None
    m = TopicModel(n_topics=3, engine="alias")
    with pytest.raises(ValueError, match="supervision"):
        m.fit([["a", "b"]], n_sweeps=2, labels=["x"])
    with pytest.raises(ValueError, match="disagree"):
        m.fit([["a", "b"]], n_iter=3, n_sweeps=2)
    with pytest.raises(ValueError, match="n_iter"):
        m.fit([["a", "b"]], n_iter=0)
    with pytest.raises(ValueError, match="whole numbers"):
        batch_tokens(batch_from_arrays(np.array([0, 1]), np.array([0]), np.array([1.5])))


def test_doc_candidates_scale_with_the_alpha_share_of_the_doc_proposal():
    """From MULTI_TRY_K topics on, the doc step draws about DOC_OWN_TRIES candidates from the
    document's own tokens: the more of q_d's mass K alpha takes (short documents, a large fixed
    alpha, many topics), the more candidates (alias_core docstring); runs report what they used."""
    from streamtopics.engines.alias_core import MAX_DOC_TRIES, MULTI_TRY_K, default_tries, own_share

    # the share, token-averaged: docs of 1, 3 and 6 tokens, K alpha = 2 (an empty doc counts nothing)
    ptr = np.array([0, 1, 1, 4, 10])
    want = (1 * 0 / 2 + 3 * 2 / 4 + 6 * 5 / 7) / 10
    assert own_share(ptr, 2.0) == pytest.approx(want)
    assert own_share(np.array([0]), 2.0) == 1.0
    # long documents / small K alpha: the measured default (2, 3); below MULTI_TRY_K: (1, 1)
    assert default_tries(1024, 1.0) == (2, 3) == default_tries(1024, 0.645)  # 20NG at K=1024, alpha=0.1
    assert default_tries(4096, 0.378) == (2, 5)                             # 20NG at K=4096, alpha=0.1
    assert default_tries(MULTI_TRY_K - 1, 0.01) == (1, 1)
    docs = [default_tries(512, s)[1] for s in (0.9, 0.5, 0.3, 0.2, 0.1, 0.01)]
    assert docs == sorted(docs) and docs[0] == 3 and docs[-1] == MAX_DOC_TRIES
    assert default_tries(512, 0.0) == (2, 3)  # single-token documents: no own tokens to draw

    # the batch fit and the streaming step resolve the rule on their own documents (kernel "mh": at
    # this K an unsupervised fit would run the dense exact kernel, which has no candidates)
    rng = np.random.default_rng(0)
    short = [[f"w{j}" for j in rng.integers(0, 40, size=4)] for _ in range(60)]
    m = TopicModel(n_topics=MULTI_TRY_K, engine="alias", kernel="mh", alpha=0.5, seed=1)  # K alpha = 128 >> 3
    m.fit(short, n_sweeps=2)
    assert m.last_stats["tries"] == [2, MAX_DOC_TRIES] and m.last_stats["mh_steps"] == 1
    m = TopicModel(n_topics=MULTI_TRY_K, engine="alias", kernel="mh", seed=1)  # alpha "auto": 1/K to start
    m.fit(short, n_sweeps=2)
    assert m.last_stats["tries"] == [2, 3]
    m = TopicModel(n_topics=MULTI_TRY_K, engine="alias", kernel="mh", alpha=0.5, seed=1, tries=(2, 2))
    m.fit(short, n_sweeps=2)
    assert m.last_stats["tries"] == [2, 2]
    m = TopicModel(n_topics=MULTI_TRY_K, engine="alias", kernel="mh", alpha=0.5, seed=1, tries=(3, None))
    m.fit(short, n_sweeps=2)  # the word kind by hand, the doc kind by the rule
    assert m.last_stats["tries"] == [3, MAX_DOC_TRIES] and m.last_stats["mh_steps"] == 2
    s = TopicModel(n_topics=MULTI_TRY_K, engine="alias", alpha=0.5, seed=1)  # streaming: per minibatch
    s.partial_fit(short)
    assert s.last_stats["tries"] == [2, MAX_DOC_TRIES] and s.last_stats["mh_steps"] == 1
    s = TopicModel(n_topics=MULTI_TRY_K, engine="alias", seed=1)
    s.partial_fit(short)
    assert s.last_stats["tries"] == [2, 3]
