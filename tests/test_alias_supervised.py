"""Supervised Alias-MH (LightMedLDA): exactness of the word/doc/exp-proposal MH against the
regularised conditional, supervised batch mode, streaming use, determinism.

The statistical tests have fixed seeds (deterministic); thresholds p > 1e-3 against the exact
target, and the same draws must reject the unsupervised target (so the supervised factor is
really being sampled, the test has power).
"""
from __future__ import annotations

import itertools
import math
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from streamtopics.engines import alias_supervised as sup  # noqa: E402
from streamtopics.engines.alias import AliasEngine, SamplerArrays  # noqa: E402
from streamtopics.batch_ops import normalise_rows  # noqa: E402
from streamtopics.engines.alias_core import S_EXP_DOCS, S_EXP_PROP  # noqa: E402
from streamtopics.engines.lsparse import LSparseEngine  # noqa: E402
from streamtopics.model import TopicModel, load_snapshot  # noqa: E402
from test_alias import chi2_pvalue  # noqa: E402
from test_supervised_var_binary import logistic_regression  # noqa: E402

# -- exact regularised joint of a tiny model ------------------------------------------------
DOCS = [[0, 1, 0], [1, 2]]
KJ, VJ, AJ, BJ = 3, 3, 0.5, 0.3
ETA = np.array([[2.0, -1.5, 0.5], [-1.0, 1.0, 2.5]])       # (L=2, K=3), fixed sample
RHO = np.array([[1.5, 0.7], [0.8, 2.0]])                    # (D, L) augmentation
KAPPA = np.array([[2.0, -1.0], [-0.5, 1.5]])
TOK_W = np.array([w for d in DOCS for w in d], dtype=np.int32)
TOK_PTR = np.array([0, 3, 5], dtype=np.int64)


ETA5 = np.array([[2.0, -1.5, 0.5, 1.0, -0.5], [-1.0, 1.0, 2.5, -2.0, 0.3]])  # K=5 (hash rows)


def _joint(sup_doc, K=KJ):
    """p(z) ∝ LDA(z) prod_d psi_d(zbar_d), log psi_d = kappa_d^T omega_d - rho_d^T omega_d^2 / 2."""
    eta = ETA if K == KJ else ETA5

    def logp(z):
        lp = 0.0
        for d, (s, e) in enumerate(zip(TOK_PTR[:-1], TOK_PTR[1:])):
            nd = np.bincount(z[s:e], minlength=K)
            lp += sum(math.lgamma(x + AJ) for x in nd)
            if sup_doc[d]:
                om = eta @ (nd / (e - s))
                lp += float(KAPPA[d] @ om - 0.5 * RHO[d] @ (om * om))
        nkw = np.zeros((K, VJ))
        np.add.at(nkw, (z, TOK_W), 1)
        lp += sum(math.lgamma(x + BJ) for x in nkw.ravel()) - sum(math.lgamma(x + VJ * BJ) for x in nkw.sum(1))
        return lp

    lp = np.array([logp(np.array(s)) for s in itertools.product(range(K), repeat=TOK_W.size)])
    p = np.exp(lp - lp.max())
    return p / p.sum()


def _pooled_pvalue(counts, p, n):
    order = np.argsort(p)
    small = order[np.cumsum(p[order]) < 20 / n]  # pool rare states (chi-square approximation)
    obs = np.append(np.delete(counts, small), counts[small].sum())
    exp = np.append(np.delete(p, small), p[small].sum())
    return chi2_pvalue(obs, exp)


@pytest.mark.parametrize("table_draws,mixture,sup_doc,K", [
    (2000, 0, (True, True), KJ),   # word tables built once, then only stale; cycle word/doc/exp
    (3, 0, (True, True), KJ),      # tables rebuilt all the time
    (3, 1, (True, True), KJ),      # mixture of the three proposals
    (3, 2, (True, True), KJ),      # exp proposals only: the exp kernel alone keeps the target
    (3, 1, (True, False), KJ),     # an unlabelled document is sampled unsupervised
    (4, 0, (True, True), 5),       # hash rows (cap 4 < K = 5) with the shared prior table
])
def test_supervised_chain_reproduces_exact_regularised_joint(table_draws, mixture, sup_doc, K):
    """5 tokens, K=3: all 243 states enumerated.  6000 independent chains x 25 sweeps from a
    uniform start with a fixed (eta, rho, kappa); their final states are i.i.d. draws.  The
    exp proposal's table holds each token's own build-time topic and goes stale within a
    document (M - M~), the word tables are stale by construction (table_draws=2000)."""
    sup_doc = np.array(sup_doc)
    p = _joint(sup_doc, K)
    n_chains = 6000 if K == KJ else 12000
    weights = K ** np.arange(TOK_W.size - 1, -1, -1)
    finals = np.empty(n_chains, dtype=np.int64)
    n_exp = 0
    freq = np.bincount(TOK_W, minlength=VJ) if K > 4 else None
    for c in range(n_chains):
        arr = SamplerArrays(VJ, TOK_W.size, K, table_draws, freq)
        st = sup.run_sweeps(arr, 1000 + c, TOK_W, TOK_PTR, np.full(K, VJ * BJ), np.zeros((1, 1)), False, BJ, AJ,
                            25, 2, mixture, 1, ETA if K == KJ else ETA5, RHO, KAPPA, sup_doc, exp_gate=1e9)
        n_exp += st[S_EXP_PROP]
        finals[c] = int(arr.z @ weights)
    counts = np.bincount(finals, minlength=p.size)
    assert _pooled_pvalue(counts, p, n_chains) > 1e-3
    assert _pooled_pvalue(counts, _joint(np.zeros(2, bool), K), n_chains) < 1e-6  # power: not plain LDA
    assert n_exp > 0


def test_exp_proposal_is_gated_per_document_and_counted():
    """A document whose supervised term is too strong for the rejection bound uses doc
    proposals in the exp slots (the gate depends on rho and eta only, not on the topics)."""
    arr = SamplerArrays.allocate(VJ, TOK_W.size, KJ, 3)
    st = sup.run_sweeps(arr, 1, TOK_W, TOK_PTR, np.full(KJ, VJ * BJ), np.zeros((1, 1)), False, BJ, AJ, 10, 2, 0, 1,
                        ETA, RHO, KAPPA, np.ones(2, bool), exp_gate=0.0)
    assert st[S_EXP_PROP] == 0 and st[S_EXP_DOCS] == 0
    arr = SamplerArrays.allocate(VJ, TOK_W.size, KJ, 3)
    st = sup.run_sweeps(arr, 1, TOK_W, TOK_PTR, np.full(KJ, VJ * BJ), np.zeros((1, 1)), False, BJ, AJ, 10, 2, 0, 1,
                        ETA, RHO * 1e-3, KAPPA, np.ones(2, bool))
    assert st[S_EXP_DOCS] == 20 and st[S_EXP_PROP] == 10 * 5 * 2


# -- model level ---------------------------------------------------------------------------
def make_binary(n, seed, doc_len=40, w_lab=0.15):
    """3 large label-free topics and two small label topics A (pos) / B (neg) sharing a word.

    Unsupervised LDA with K=3 spends its topics on the large ones and merges A and B, so its
    theta carries almost nothing about the label; supervised topics must separate them."""
    rng = np.random.default_rng(seed)
    big = [np.arange(15 * j, 15 * j + 15) for j in range(3)]
    A, B = np.arange(45, 53), np.arange(52, 60)
    docs, labels = [], []
    for _ in range(n):
        y = rng.integers(2)
        cth = np.cumsum(rng.dirichlet(np.full(3, 0.5)))
        toks = []
        for _ in range(doc_len):
            if rng.random() < w_lab:
                ws = A if y else B
            else:
                ws = big[min(int(np.searchsorted(cth, rng.random())), 2)]
            toks.append(f"w{rng.choice(ws)}")
        docs.append(toks)
        labels.append("pos" if y else "neg")
    return docs, labels


@pytest.fixture(scope="module")
def binary():
    return make_binary(300, 1), make_binary(300, 2)


def _acc(pred, y):
    return float(np.mean([a == b for a, b in zip(pred, y)]))


@pytest.mark.parametrize("loss", ["hinge", "logistic"])
def test_supervised_fit_beats_two_stage_baseline(binary, loss):
    (tr, ytr), (te, yte) = binary
    m = TopicModel(n_topics=3, engine="alias", supervision=loss, seed=0).fit(tr, labels=ytr, n_sweeps=40, tol=0)
    sup_acc = _acc(m.predict(te), yte)
    u = TopicModel(n_topics=3, engine="alias", seed=0).fit(tr, n_sweeps=40)
    Ztr, Zte = u.transform(tr), u.transform(te)
    w = logistic_regression(Ztr, np.array([y == "pos" for y in ytr], dtype=float), 0.1)  # L2, C=10
    base = np.hstack([Zte, np.ones((len(Zte), 1))]) @ w > 0
    base_acc = _acc(["pos" if b else "neg" for b in base], yte)
    assert sup_acc > 0.85 and sup_acc > base_acc + 0.2, (sup_acc, base_acc)
    st = m.last_stats
    assert st["supervised_docs"] == 300 and st["eta_retained"] == 20
    assert 0 < st["mh_acceptance"]["exp"] <= 1 and st["exp_proposal_docs_per_sweep"] > 0
    scores = m.predict_scores(te[:5])
    assert scores.shape == (5, 2) and sorted(m.label_names) == ["neg", "pos"]


def test_supervised_fit_is_deterministic_and_snapshots_predict_identically(binary, tmp_path):
    (tr, ytr), (te, _) = binary
    fit = lambda seed, **kw: TopicModel(n_topics=3, engine="alias", supervision="hinge", seed=seed,  # noqa: E731
                                        **kw).fit(tr[:150], labels=ytr[:150], n_sweeps=15)
    a, b, c = fit(3), fit(3), fit(4)
    assert np.array_equal(a.head.eta_mean, b.head.eta_mean) and np.array_equal(a.topic_word(), b.topic_word())
    assert not np.array_equal(a.head.eta_mean, c.head.eta_mean)
    a.save(tmp_path / "sup.stsnap")
    before = a.predict_scores(te[:30])
    loaded = load_snapshot(tmp_path / "sup.stsnap")
    assert np.allclose(loaded.predict_scores(te[:30]), before)
    # the chain's eta is kept with sup_features="supervised" (no refit): a different classifier
    d = fit(3, sup_features="supervised")
    assert "refit_seconds" not in d.last_stats and "refit_seconds" in a.last_stats
    assert np.array_equal(d.topic_word(), a.topic_word()) and not np.allclose(d.head.eta_mean, a.head.eta_mean)


def test_the_classifier_reads_mean_field_features_of_the_alias_topics_by_default(binary):
    """sup_features="auto" on the sampler means "mean-field": fit's refit and predict use the
    variational label-free step at alpha = 1 on the Alias-MH topics (docs/supervised.md §10), so
    prediction draws nothing; "unsupervised" keeps the sampler's own (drawn) features."""
    (tr, ytr), (te, _) = binary
    fit = lambda **kw: TopicModel(n_topics=3, engine="alias", supervision="hinge", seed=0,  # noqa: E731
                                  **kw).fit(tr[:150], labels=ytr[:150], n_sweeps=10)
    m, u = fit(), fit(sup_features="unsupervised")
    assert (m.features, u.features) == ("mean-field", "unsupervised") and u.feature_step is None
    assert np.array_equal(m.topic_word(), u.topic_word())  # same chain: only the classifier's features differ
    batch = m.prepare(m.tokenize(te[:40]), grow=False)
    mean_field = LSparseEngine().infer(m.state, batch, summarize=False, alpha=1.0).doc_topic
    assert np.allclose(m.predict_scores(te[:40]), m.head.scores(normalise_rows(mean_field)))
    assert np.array_equal(m.predict_scores(te[:40]), m.predict_scores(te[:40]))
    # the sampler's features are seeded from the model's state (engines.alias.inference_seed): two
    # calls on one model agree, and neither changes what the model learns next
    assert np.array_equal(u.predict_scores(te[:40]), u.predict_scores(te[:40]))
    assert TopicModel(n_topics=3, supervision="hinge").features == "unsupervised"  # variational: its own step


def test_fit_labels_none_entries_and_validation(binary):
    (tr, ytr), _ = binary
    labels = [y if i % 3 else None for i, y in enumerate(ytr[:120])]
    m = TopicModel(n_topics=3, engine="alias", supervision="hinge", seed=0).fit(tr[:120], labels=labels, n_sweeps=6)
    assert m.last_stats["supervised_docs"] == sum(t is not None for t in labels)
    with pytest.raises(ValueError, match="supervis"):
        TopicModel(n_topics=3, engine="alias").fit(tr[:10], labels=ytr[:10], n_sweeps=2)
    with pytest.raises(ValueError, match="labels for"):
        TopicModel(n_topics=3, engine="alias", supervision="hinge").fit(tr[:10], labels=ytr[:9], n_sweeps=2)


def test_streaming_supervised_alias_learns_labels_and_unsupervised_path_is_unchanged(binary):
    (tr, ytr), (te, yte) = binary
    m = TopicModel(n_topics=3, engine="alias", supervision="hinge", seed=0, sup_c=4.0)
    for lap in range(3):
        for lo in range(0, 300, 50):
            labs = [y if (i + lo) % 5 else None for i, y in enumerate(ytr[lo:lo + 50])]
            m.partial_fit(tr[lo:lo + 50], labels=labs)
    st = m.last_stats
    assert st["supervised_docs"] == 40 and st["sweeps"] == 8 and "exp" in st["mh_acceptance"]
    assert _acc(m.predict(te), yte) > 0.8
    # head=None: the unsupervised kernel, same draws as a plain call
    batch = m.prepare(m.tokenize(te[:40]), grow=False)
    e1 = AliasEngine(seed=5)
    e2 = AliasEngine(seed=5)
    r1 = e1.infer(m.state, batch, summarize=True)
    r2 = e2.infer(m.state, batch, summarize=True, head=None, targets=None)
    assert np.array_equal(r1.doc_topic, r2.doc_topic) and r1.stats == r2.stats


# -- issue 14: tries on the supervised paths ------------------------------------------------
@pytest.mark.parametrize("table_draws,mixture,word_prior,tries,K", [
    (3, 0, True, (3, 1), KJ),      # multiple-try word steps, tables rebuilt often
    (2000, 0, True, (1, 3), KJ),   # multiple-try doc steps over stale tables
    (3, 1, False, (2, 2), KJ),     # mixture, uniform alpha part of the doc proposal
    (4, 0, True, (2, 3), 5),       # hash rows with the shared prior table
])
def test_supervised_multiple_try_chain_reproduces_exact_regularised_joint(table_draws, mixture, word_prior, tries, K):
    """The supervised kernel with tries != (1, 1) (I-MTM word step + delayed acceptance, I-MTM
    doc step on the regularised target) keeps the exact joint of the tiny model."""
    sup_doc = np.array((True, True))
    p = _joint(sup_doc, K)
    n_chains = 5000 if K == KJ else 10000
    weights = K ** np.arange(TOK_W.size - 1, -1, -1)
    finals = np.empty(n_chains, dtype=np.int64)
    freq = np.bincount(TOK_W, minlength=VJ) if K > 4 else None
    for c in range(n_chains):
        arr = SamplerArrays(VJ, TOK_W.size, K, table_draws, freq)
        sup.run_sweeps(arr, 7000 + c, TOK_W, TOK_PTR, np.full(K, VJ * BJ), np.zeros((1, 1)), False, BJ, AJ,
                       20, 2, mixture, 1, ETA if K == KJ else ETA5, RHO, KAPPA, sup_doc, exp_gate=1e9,
                       word_prior=word_prior, tries=tries)
        finals[c] = int(arr.z @ weights)
    counts = np.bincount(finals, minlength=p.size)
    assert _pooled_pvalue(counts, p, n_chains) > 1e-3
    assert _pooled_pvalue(counts, _joint(np.zeros(2, bool), K), n_chains) < 1e-6


def test_tries_reach_the_supervised_streaming_and_batch_paths(binary):
    """Before issue 14 ``tries`` was silently ignored when labels were present: the same seed
    gave the same chain whatever tries said."""
    (tr, ytr), _ = binary
    m = TopicModel(n_topics=3, engine="alias", supervision="hinge", seed=0, sup_c=4.0)
    m.partial_fit(tr[:100], labels=ytr[:100])
    batch = m.prepare(m.tokenize(tr[100:160]), grow=False)
    targets = m.head.encode_targets(ytr[100:160], grow=False)
    runs = {}
    for t in [(1, 1), (3, 2)]:
        r = AliasEngine(seed=5, tries=t).infer(m.state, batch, summarize=True, head=m.head, targets=targets)
        runs[t] = r
        assert r.stats["tries"] == list(t)
    # the same seed runs a different chain, and multiple tries accept more doc proposals
    acc1, acc3 = runs[(1, 1)].stats["mh_acceptance"], runs[(3, 2)].stats["mh_acceptance"]
    assert acc3["doc"] > acc1["doc"], (acc1, acc3)
    fits = {}
    for t in [(1, 1), (3, 2)]:
        f = TopicModel(n_topics=3, engine="alias", supervision="hinge", seed=0, sup_c=4.0, tries=t)
        f.fit(tr[:200], n_sweeps=6, labels=ytr[:200])
        assert f.last_stats["tries"] == list(t)
        fits[t] = f.topic_word()
    assert not np.array_equal(fits[(1, 1)], fits[(3, 2)])
