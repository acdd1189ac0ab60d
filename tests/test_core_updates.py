"""Global updates (Hughes & Sudderth §3.4): stochastic (SVI) and memoized (MVI)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from streamtopics.model import TopicModel
from streamtopics.state import ModelState
from streamtopics.summary import Summary
from streamtopics.updates import STEP_DOCS, MemoizedUpdate, StochasticUpdate, schedule_advance

K = 3
V = 8
BETA = 0.05


def make_summary(rng, word_ids, n_docs=4, density=0.6, entropy=0.0, alloc=0.0) -> Summary:
    """A Summary over ``word_ids`` with random sparse S (every row keeps at least one topic)."""
    word_ids = np.asarray(word_ids, dtype=np.int64)
    indptr = [0]
    topics, values = [], []
    for _ in word_ids:
        ks = np.flatnonzero(rng.random(K) < density)
        if ks.size == 0:
            ks = np.array([rng.integers(K)])
        topics.extend(ks.tolist())
        values.extend(rng.uniform(0.1, 5.0, size=ks.size).tolist())
        indptr.append(len(topics))
    topics = np.array(topics, dtype=np.int32)
    values = np.array(values, dtype=np.float64)
    return Summary(word_ids=word_ids, indptr=np.array(indptr, dtype=np.int64), topics=topics, values=values,
                   topic_totals=np.bincount(topics, weights=values, minlength=K), n_docs=n_docs,
                   n_tokens=float(values.sum()), entropy=entropy, alloc=alloc)


def dense(s: Summary, n_words: int = V) -> np.ndarray:
    out = np.zeros((n_words, K))
    np.add.at(out, (s.rows(), s.topics), s.values)
    return out


def make_state(rng, scale=0.7) -> ModelState:
    st = ModelState(K, alpha=0.1, beta=BETA)
    st.ensure_words(V)
    st.mu[:V] = rng.gamma(1.0, 2.0, size=(V, K))
    st.scale = scale
    st.refresh_totals()
    return st


# -- stochastic -----------------------------------------------------------------------------

def test_rho_schedule():
    u = StochasticUpdate(delay=1.0, forgetting_rate=0.6)
    for t in (1, 2, 10, 1000):
        assert u.rho(t) == (1.0 + t) ** -0.6
    assert all(u.rho(t) > u.rho(t + 1) for t in range(1, 50))
    u = StochasticUpdate(delay=10.0, forgetting_rate=0.9, rho_min=0.05)
    assert u.rho(1) == 11.0 ** -0.9 > 0.05
    t_floor = math.ceil(0.05 ** (-1 / 0.9) - 10.0)
    assert u.rho(t_floor - 1) > 0.05
    assert all(u.rho(t) == 0.05 for t in (t_floor, t_floor + 1, 10 ** 6))
    assert StochasticUpdate(delay=0.0, forgetting_rate=1.0).rho(1) == 1.0


@pytest.mark.parametrize("kwargs,name", [
    ({"delay": -1}, "delay"), ({"forgetting_rate": 0.5}, "forgetting_rate"),
    ({"forgetting_rate": 1.01}, "forgetting_rate"), ({"rho_min": 1.0}, "rho_min"),
    ({"rho_min": -0.1}, "rho_min"), ({"corpus_size": 0}, "corpus_size")])
def test_stochastic_rejects_bad_parameters(kwargs, name):
    with pytest.raises(ValueError, match=name):
        StochasticUpdate(**kwargs)


def test_a_small_batch_is_a_fraction_of_a_step():
    """A batch of STEP_DOCS documents or more takes rho(t) at t = its position + 1; a batch of b < STEP_DOCS
    advances the schedule by b / STEP_DOCS and takes that fraction of the step, so eight batches of 32
    keep what one batch of 256 keeps (to first order in the schedule's slope)."""
    u = StochasticUpdate(delay=10.0, forgetting_rate=0.7)
    for t in (1, 2, 30):
        assert u.step(t - 1, STEP_DOCS) == u.rho(t) == u.step(t - 1, 4 * STEP_DOCS)
    assert u.step(1.0, 32) == pytest.approx(1.0 - (1.0 - u.rho(1.125)) ** 0.125, rel=1e-14)
    assert schedule_advance(32) == 0.125 and schedule_advance(STEP_DOCS) == schedule_advance(10**6) == 1.0
    kept8 = np.prod([1.0 - u.step(10 + j / 8, 32) for j in range(8)])
    assert kept8 == pytest.approx(1.0 - u.rho(11), rel=0.01)
    assert u.step(0.0, 0) == 0.0
    assert StochasticUpdate(delay=0.0, forgetting_rate=0.6).step(0.0, 1) == 1.0  # rho(t) > 1 at t < 1: capped
    floor = StochasticUpdate(delay=1.0, forgetting_rate=0.6, rho_min=0.2)
    assert floor.step(10**7, STEP_DOCS) == 0.2 and floor.step(10**7, 64) == pytest.approx(1.0 - 0.8 ** 0.25)


def test_the_schedule_position_counts_fractions_and_is_saved():
    """TopicModel.learn advances ``state.steps`` by min(1, |B| / STEP_DOCS) (``partial_fit`` cuts a longer
    call into even parts of at most STEP_DOCS first); a snapshot keeps it, and a
    snapshot written before the field restores it as the update count (every update was one step)."""
    docs = [[f"w{i % 30}", f"w{(i * 7) % 30}", "x"] for i in range(600)]
    m = TopicModel(n_topics=4, seed=0)
    for lo, hi in ((0, 64), (64, 96)):
        m.partial_fit(docs[lo:hi])
    m.process(m.prepare(m.tokenize(docs[96:396])))  # a batch of 300 (the daemon's, fit's) is one step
    assert m.state.n_updates == 3 and m.state.steps == 0.25 + 0.125 + 1.0
    m.partial_fit(docs[:300])  # partial_fit cuts a call of 300 into two steps of 150
    assert m.state.n_updates == 5 and m.state.steps == pytest.approx(0.25 + 0.125 + 1.0 + 2 * 150 / 256)
    header = m.state.header()
    back = ModelState.restore(header, m.state.arrays())
    assert back.steps == m.state.steps
    del header["steps"]
    assert ModelState.restore(header, m.state.arrays()).steps == 5.0


@pytest.mark.parametrize("n_updates,rho_min", [(0, 0.0), (4, 0.0), (500, 0.2)])
def test_stochastic_update_matches_hand_computation(n_updates, rho_min):
    rng = np.random.default_rng(n_updates)
    st = make_state(rng)
    st.n_updates = n_updates
    st.steps = float(n_updates)
    lam_old = st.lam().copy()
    s = make_summary(rng, [0, 2, 3, 7], n_docs=5)
    upd = StochasticUpdate(delay=2.0, forgetting_rate=0.7, rho_min=rho_min, corpus_size=100)
    info = upd.apply(st, s)
    rho = 1.0 - (1.0 - max(rho_min, (2.0 + n_updates + 5 / STEP_DOCS) ** -0.7)) ** (5 / STEP_DOCS)
    assert info["rho"] == pytest.approx(rho, rel=1e-14) and info["corpus_size"] == 100
    expected = (1 - rho) * lam_old + rho * (BETA + 100 / 5 * dense(s))
    np.testing.assert_allclose(st.lam(), expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(st.lam_totals(), expected.sum(axis=0), rtol=1e-12)
    np.testing.assert_allclose(st.topic_word(), (expected / expected.sum(axis=0)).T, rtol=1e-12)


def test_stochastic_seen_corpus_size_is_batch_on_first_update():
    rng = np.random.default_rng(1)
    st = make_state(rng, scale=1.0)
    lam_old = st.lam().copy()
    s = make_summary(rng, [1, 4], n_docs=7)
    info = StochasticUpdate(delay=1.0, forgetting_rate=0.6, corpus_size="seen").apply(st, s)
    assert info["corpus_size"] == 7
    rho = 1.0 - (1.0 - (1.0 + 7 / STEP_DOCS) ** -0.6) ** (7 / STEP_DOCS)
    np.testing.assert_allclose(st.lam(), (1 - rho) * lam_old + rho * (BETA + dense(s)), rtol=1e-12)


def test_stochastic_decay_is_lazy():
    """The decay touches only the scale: rows of words outside the batch keep their mu bit-for-bit."""
    rng = np.random.default_rng(2)
    st = make_state(rng)
    mu_before = st.mu[:V].copy()
    s = make_summary(rng, [3], n_docs=2)
    StochasticUpdate(corpus_size=10).apply(st, s)
    others = np.setdiff1d(np.arange(V), [3])
    np.testing.assert_array_equal(st.mu[others], mu_before[others])
    assert st.scale < 0.7


def test_stochastic_scale_renormalisation_keeps_lambda():
    rng = np.random.default_rng(3)
    st = make_state(rng, scale=1.2e-60)  # one decay by (1 - rho) ~ 0.76 drops it below 1e-60
    st.smoothing = 1.5
    st.n_updates = 9
    st.steps = 9.0
    lam_old = st.lam().copy()
    s = make_summary(rng, [0, 5, 6], n_docs=STEP_DOCS)
    upd = StochasticUpdate(delay=1.0, forgetting_rate=0.6, corpus_size=30 * STEP_DOCS // 3)
    upd.apply(st, s)
    assert st.scale == 1.0  # the tiny scale was folded into mu
    rho = 11.0 ** -0.6
    expected = (1 - rho) * lam_old + rho * (BETA + 10 * dense(s))
    np.testing.assert_allclose(st.lam(), expected, rtol=1e-12, atol=0)
    np.testing.assert_allclose(st.mu_totals, st.mu[:V].sum(axis=0), rtol=1e-12)
    # The smoothing pseudo-count decays with lambda: a word joining now starts where it would
    # stand had it been there from the start.
    assert st.smoothing == pytest.approx(1.5 * 1.2e-60 * (1 - rho), rel=1e-12)
    st.ensure_words(V + 1)
    assert st.scale * st.mu[V] == pytest.approx(np.full(K, 1.5 * 1.2e-60 * (1 - rho)), rel=1e-12)


def test_decay_fold_is_exact_without_update():
    rng = np.random.default_rng(4)
    st = make_state(rng, scale=1e-59)
    lam_minus_beta = st.scale * st.mu[:V].copy()
    st.decay(0.05)
    assert st.scale == 1.0
    np.testing.assert_allclose(st.scale * st.mu[:V], 0.05 * lam_minus_beta, rtol=1e-12, atol=0)
    np.testing.assert_allclose(st.mu_totals, st.mu[:V].sum(axis=0), rtol=1e-12)


def test_stochastic_rho_one_forgets_everything():
    rng = np.random.default_rng(5)
    st = make_state(rng)
    st.smoothing = 1.0
    s = make_summary(rng, [2, 3], n_docs=4)
    StochasticUpdate(delay=0.0, forgetting_rate=1.0, corpus_size=8).apply(st, s)
    np.testing.assert_allclose(st.lam(), BETA + 2.0 * dense(s), rtol=1e-12, atol=1e-15)
    assert st.smoothing == 0.0


def test_stochastic_empty_batch_is_a_no_op():
    rng = np.random.default_rng(6)
    st = make_state(rng)
    lam = st.lam().copy()
    s = make_summary(rng, [], n_docs=0)
    assert StochasticUpdate().apply(st, s) == {"rho": 0.0}
    np.testing.assert_array_equal(st.lam(), lam)


# -- memoized -------------------------------------------------------------------------------

def fresh_state() -> ModelState:
    st = ModelState(K, alpha=0.1, beta=BETA)
    st.ensure_words(V)
    return st


def assert_state_is_cache_sum(st: ModelState, upd: MemoizedUpdate) -> None:
    total = np.zeros((V, K))
    for _, s in upd.cache_items():
        total += dense(s)
    np.testing.assert_allclose(st.mu[:V], total, rtol=0, atol=1e-9)
    np.testing.assert_allclose(st.lam(), BETA + total, rtol=0, atol=1e-9)
    np.testing.assert_allclose(st.mu_totals, total.sum(axis=0), rtol=0, atol=1e-9)


def test_memoized_revisit_replaces_the_batch_summary_exactly():
    rng = np.random.default_rng(10)
    st, upd = fresh_state(), MemoizedUpdate()
    first = {}
    for key, words in (("a", [0, 1, 2]), ("b", [2, 3, 4, 5]), ("c", [5, 6, 7])):
        first[key] = make_summary(rng, words)
        info = upd.apply(st, first[key], key)
        assert info["revisit"] is False and info["cached_batches"] == len(first)
    assert_state_is_cache_sum(st, upd)
    new_b = make_summary(rng, [1, 3, 7])  # different rows than the old b
    info = upd.apply(st, new_b, "b")
    assert info["revisit"] is True and info["accepted"] is True
    assert upd.cache["b"] is new_b
    expected = dense(first["a"]) + dense(new_b) + dense(first["c"])
    np.testing.assert_allclose(st.mu[:V], expected, rtol=0, atol=1e-9)
    assert_state_is_cache_sum(st, upd)
    # Revisiting with the same summary is a no-op on lambda.
    before = st.mu[:V].copy()
    upd.apply(st, new_b, "b")
    np.testing.assert_allclose(st.mu[:V], before, rtol=0, atol=1e-12)


def test_memoized_folds_a_stochastic_scale_first():
    rng = np.random.default_rng(11)
    st = make_state(rng, scale=0.25)
    st.n_updates = 7  # a state that came from a stochastic run (not a fresh initialisation)
    lam_old = st.lam().copy()
    s = make_summary(rng, [0, 4])
    MemoizedUpdate().apply(st, s, 0)
    assert st.scale == 1.0
    np.testing.assert_allclose(st.lam(), lam_old + dense(s), rtol=1e-12)


def test_memoized_window_forgets_the_oldest_batch():
    rng = np.random.default_rng(12)
    st, upd = fresh_state(), MemoizedUpdate(window=2)
    s = {k: make_summary(rng, rng.choice(V, 3, replace=False)) for k in "abcd"}
    upd.apply(st, s["a"], "a")
    upd.apply(st, s["b"], "b")
    info = upd.apply(st, s["c"], "c")
    assert info["forgotten"] == 1 and list(upd.cache) == ["b", "c"]
    assert_state_is_cache_sum(st, upd)
    # A revisit makes b the most recent, so the next new batch pushes out c, not b.
    upd.apply(st, s["b"], "b")
    info = upd.apply(st, s["d"], "d")
    assert info["forgotten"] == 1 and list(upd.cache) == ["b", "d"]
    assert_state_is_cache_sum(st, upd)
    np.testing.assert_allclose(st.mu[:V], dense(s["b"]) + dense(s["d"]), atol=1e-9)


def test_memoized_forget_words_drops_rows():
    rng = np.random.default_rng(13)
    st, upd = fresh_state(), MemoizedUpdate()
    upd.apply(st, make_summary(rng, [0, 1, 2, 3]), "a")
    upd.apply(st, make_summary(rng, [2, 3, 4, 6]), "b")
    gone = np.array([2, 6])
    # The order Model.prepare uses for evicted ids: reset the state rows, then forget the cache rows.
    st.reset_words(gone)
    upd.forget_words(gone)
    for _, s in upd.cache_items():
        assert not np.isin(s.word_ids, gone).any()
        np.testing.assert_allclose(s.topic_totals, np.bincount(s.topics, weights=s.values, minlength=K), atol=1e-12)
        assert s.indptr[-1] == s.topics.size == s.values.size
    assert np.all(st.mu[gone] == 0.0)
    assert_state_is_cache_sum(st, upd)
    # Revisiting a batch after the forget subtracts only the surviving rows.
    upd.apply(st, make_summary(rng, [0, 2]), "a")
    assert_state_is_cache_sum(st, upd)
    assert st.mu[4].sum() > 0


def test_memoized_rejects_a_worse_revisit():
    rng = np.random.default_rng(14)
    st, upd = fresh_state(), MemoizedUpdate()
    old = make_summary(rng, [0, 1, 2], entropy=3.0, alloc=-2.0)
    upd.apply(st, old, "a")
    upd.apply(st, make_summary(rng, [3, 4]), "b")
    before = st.mu[:V].copy()
    old_obj = MemoizedUpdate.batch_objective(st, old)
    info = upd.apply(st, make_summary(rng, [5, 6]), "a", new_objective=old_obj - 1.0)
    assert info["accepted"] is False and upd.rejected == 1 and upd.cache["a"] is old
    np.testing.assert_array_equal(st.mu[:V], before)
    better = make_summary(rng, [5, 6])
    info = upd.apply(st, better, "a", new_objective=old_obj + 1.0)
    assert info["accepted"] is True and upd.cache["a"] is better
    assert_state_is_cache_sum(st, upd)


def test_memoized_batch_objective_matches_direct_computation():
    rng = np.random.default_rng(15)
    st = make_state(rng, scale=1.0)
    s = make_summary(rng, [1, 3, 5], entropy=4.5, alloc=-7.25)
    lam = st.lam()
    elog = np.array([[_psi(x) for x in row] for row in lam]) - np.array([_psi(x) for x in lam.sum(axis=0)])
    direct = float((dense(s) * elog).sum()) + 4.5 - 7.25
    assert MemoizedUpdate.batch_objective(st, s) == pytest.approx(direct, rel=1e-12)


def test_memoized_needs_a_key():
    with pytest.raises(ValueError, match="key"):
        MemoizedUpdate().apply(fresh_state(), make_summary(np.random.default_rng(0), [0]), None)
    with pytest.raises(ValueError, match="window"):
        MemoizedUpdate(window=0)


def _psi(x):
    from streamtopics._numeric import digamma

    return digamma(float(x))


def full_elbo(st: ModelState, summaries) -> float:
    """The whole-data objective of App. C written out term by term, for any lambda."""
    lam = st.lam()
    tot = lam.sum(axis=0)
    elog = np.array([[_psi(x) for x in row] for row in lam]) - np.array([_psi(x) for x in tot])
    local = sum(float((dense(s, st.n_words) * elog).sum()) + s.entropy + s.alloc for s in summaries)
    Vn = st.n_words
    c_prior = math.lgamma(Vn * BETA) - Vn * math.lgamma(BETA)
    glob = 0.0
    for k in range(K):
        c_post = math.lgamma(tot[k]) - sum(math.lgamma(x) for x in lam[:, k])
        glob += c_prior - c_post + float(((BETA - lam[:, k]) * elog[:, k]).sum())
    return local + glob


def test_memoized_elbo_equals_the_full_objective():
    rng = np.random.default_rng(16)
    st, upd = fresh_state(), MemoizedUpdate()
    for key in range(3):
        upd.apply(st, make_summary(rng, rng.choice(V, 5, replace=False), entropy=rng.uniform(1, 5),
                                   alloc=-rng.uniform(1, 5)), key)
    want = full_elbo(st, [s for _, s in upd.cache_items()])
    assert upd.elbo(st) == pytest.approx(want, rel=1e-10)


# -- memoized on a synthetic corpus -----------------------------------------------------------

def make_lda_docs(n_topics=4, n_words=60, n_docs=240, doc_len=60, alpha=0.05, seed=0):
    rng = np.random.default_rng(seed)
    block = n_words // n_topics
    phi = np.full((n_topics, n_words), 0.05 / (n_words - block))
    for k in range(n_topics):
        phi[k, k * block:(k + 1) * block] = 0.95 * rng.dirichlet(np.ones(block))
    phi /= phi.sum(axis=1, keepdims=True)
    theta = rng.dirichlet(np.full(n_topics, alpha), size=n_docs)
    words = [f"w{v:03d}" for v in range(n_words)]
    docs = []
    for d in range(n_docs):
        ids = rng.choice(n_words, size=rng.poisson(doc_len) + 5, p=theta[d] @ phi)
        docs.append([words[i] for i in ids])
    return phi, docs, words


BATCH = 40


def test_memoized_elbo_never_decreases_across_laps():
    _, docs, _ = make_lda_docs(seed=1)
    m = TopicModel(n_topics=4, sparsity=2, update="memoized", alpha=0.1, beta=0.01, seed=0)
    trace = []
    for lap in range(3):
        for b in range(0, len(docs), BATCH):
            m.partial_fit(docs[b:b + BATCH], batch_key=b)
            trace.append((lap, m.elbo()))
    # Within lap 1 the cache grows (more data, lower ELBO); from the end of lap 1 on the ELBO covers
    # the whole corpus and must not decrease.
    n_batches = len(docs) // BATCH
    tail = np.array([e for _, e in trace[n_batches - 1:]])
    drops = (tail[:-1] - tail[1:]) / np.abs(tail[:-1])
    assert drops.max() <= 1e-6, drops
    assert tail[-1] > tail[0]  # and it actually improved
    assert np.isfinite(tail).all()


def test_memoized_first_lap_accumulates_summaries():
    """During lap 1 every update only adds its batch summary (streaming VB): after the first
    update, lambda grows by exactly sum_{b >= 2} S_b (new words join at the smoothing row)."""
    _, docs, _ = make_lda_docs(seed=2)
    for b in range(BATCH, len(docs), BATCH):
        docs[b + 1] = docs[b + 1] + [f"late{b}", f"late{b}"]  # a word that only joins in batch b
    m = TopicModel(n_topics=4, sparsity=2, update="memoized", alpha=0.1, beta=0.01, seed=0)
    m.partial_fit(docs[:BATCH], batch_key=0)
    V1 = m.state.n_words
    after_first = m.state.mu[:V1].copy()
    acc = np.zeros((m.state.capacity, 4))
    for b in range(BATCH, len(docs), BATCH):
        s = m.process(m.prepare(m.tokenize(docs[b:b + BATCH])), learn=True, batch_key=b).summary
        np.add.at(acc, (s.rows(), s.topics), s.values)
    n = m.state.n_words
    assert n == V1 + len(docs) // BATCH - 1  # later batches brought new words
    start = np.full((n, 4), m.state.smoothing)
    start[:V1] = after_first
    np.testing.assert_allclose(m.state.lam(), m.state.beta + start + acc[:n], rtol=1e-12, atol=1e-9)
    assert len(m.updater.cache_items()) == len(docs) // BATCH


def test_memoized_lambda_after_first_lap_is_beta_plus_cached_summaries():
    _, docs, _ = make_lda_docs(seed=2)
    m = TopicModel(n_topics=4, sparsity=2, update="memoized", alpha=0.1, beta=0.01, seed=0)
    for b in range(0, len(docs), BATCH):
        m.partial_fit(docs[b:b + BATCH], batch_key=b)
    n = m.state.n_words
    total = np.zeros((n, 4))
    for _, s in m.updater.cache_items():
        np.add.at(total, (s.rows(), s.topics), s.values)
    np.testing.assert_allclose(m.state.lam(), m.state.beta + total, rtol=1e-9, atol=1e-9)
