"""L-sparse local step (Hughes & Sudderth §5, Alg. 2, App. D): dense equivalence, invariants, restarts."""
from __future__ import annotations

import math

import numpy as np
import pytest

from streamtopics.batch import batch_from_arrays
from streamtopics.engines.lsparse import LSparseEngine, dense_doc_reference, lsparse_batch
from streamtopics.state import ModelState

ALPHA = 0.1


def _psi(x):
    from streamtopics._numeric import digamma

    return np.vectorize(lambda v: digamma(float(v)))(x)


def random_problem(seed: int, K: int, U: int = 60, D: int = 40, max_types: int = 25, shape: float = 0.3):
    """E[log phi] for U word types from a random lambda, plus D random documents as CSR arrays."""
    rng = np.random.default_rng(seed)
    lam = rng.gamma(shape, 1.0, size=(U, K)) + 0.01
    C = _psi(lam) - _psi(lam.sum(axis=0))
    lens = rng.integers(1, max_types + 1, size=D)
    ptr = np.zeros(D + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(lens)
    loc = np.concatenate([rng.choice(U, n, replace=False) for n in lens]).astype(np.int32)
    cnt = rng.integers(1, 6, size=loc.size).astype(np.float64)
    return np.ascontiguousarray(C), ptr, loc, cnt


def run(C, ptr, loc, cnt, L, max_iter=100, tol=0.05, eps=0.01, trials=0, iters=2, alpha=ALPHA):
    out = lsparse_batch(C, ptr, loc, cnt, alpha, L, max_iter, tol, eps, trials, iters)
    names = ("doc_topic", "top_idx", "top_r", "top_n", "iters", "n_active", "data", "ent", "alloc",
             "tried", "accepted")
    return dict(zip(names, out))


def doc_lengths(ptr, cnt):
    return np.array([cnt[ptr[d]:ptr[d + 1]].sum() for d in range(ptr.size - 1)])


# -- L = K is the dense algorithm -----------------------------------------------------------

@pytest.mark.parametrize("seed,K,tol", [(0, 5, 0.05), (1, 12, 0.05), (2, 12, 1e-8), (3, 30, 1e-6)])
def test_L_equals_K_reproduces_dense_exactly(seed, K, tol):
    C, ptr, loc, cnt = random_problem(seed, K)
    out = run(C, ptr, loc, cnt, L=K, max_iter=1000, tol=tol, eps=0.0, trials=0)
    for d in range(ptr.size - 1):
        s, e = ptr[d], ptr[d + 1]
        N, it = dense_doc_reference(np.ascontiguousarray(C[loc[s:e]]), cnt[s:e], ALPHA, 1000, tol)
        np.testing.assert_allclose(out["doc_topic"][d], N, rtol=0, atol=1e-9, err_msg=f"doc {d}")
        assert out["iters"][d] == it, f"doc {d}: {out['iters'][d]} vs dense {it} iterations"
    assert out["iters"].max() > 3  # the comparison exercised real iterations


@pytest.mark.parametrize("seed,K,tol", [(4, 5, 0.05), (5, 12, 0.05), (6, 40, 0.05), (7, 12, 1e-6)])
def test_L_equals_K_with_active_set_pruning_is_close_to_dense(seed, K, tol):
    C, ptr, loc, cnt = random_problem(seed, K)
    out = run(C, ptr, loc, cnt, L=K, max_iter=1000, tol=tol, eps=0.01, trials=0)
    worst = 0.0
    for d in range(ptr.size - 1):
        s, e = ptr[d], ptr[d + 1]
        N, _ = dense_doc_reference(np.ascontiguousarray(C[loc[s:e]]), cnt[s:e], ALPHA, 1000, tol)
        worst = max(worst, float(np.abs(out["doc_topic"][d] - N).max()))
    assert worst < 1e-2
    # Pruning did happen somewhere (otherwise this is the exact test again).
    assert (out["n_active"] < K).any()


# -- L-sparse invariants -------------------------------------------------------------------

@pytest.mark.parametrize("L", [1, 2, 4, 7])
@pytest.mark.parametrize("trials", [0, 4])
def test_sparse_invariants(L, trials):
    K = 20
    C, ptr, loc, cnt = random_problem(10 + L, K, D=60)
    out = run(C, ptr, loc, cnt, L=L, trials=trials)
    top_n, top_idx, top_r = out["top_n"], out["top_idx"], out["top_r"]
    assert top_idx.shape == (loc.size, L) and top_r.shape == (loc.size, L)
    assert np.all((top_n >= 1) & (top_n <= L))
    N_rebuilt = np.zeros((ptr.size - 1, K))
    for d in range(ptr.size - 1):
        for j in range(ptr[d], ptr[d + 1]):
            m = top_n[j]
            r = top_r[j, :m]
            ks = top_idx[j, :m]
            assert len(set(ks.tolist())) == m, f"entry {j}: a topic appears twice"
            assert np.all((ks >= 0) & (ks < K))
            assert np.all(r >= 0) and np.count_nonzero(r) <= L
            assert abs(r.sum() - 1.0) < 1e-12, f"entry {j}: responsibilities sum to {r.sum()}"
            np.add.at(N_rebuilt[d], ks, cnt[j] * r)
    # Doc-topic counts are exactly the aggregated responsibilities and sum to the doc length.
    np.testing.assert_allclose(out["doc_topic"], N_rebuilt, rtol=0, atol=1e-9)
    np.testing.assert_allclose(out["doc_topic"].sum(axis=1), doc_lengths(ptr, cnt), rtol=1e-12)
    assert np.all(out["doc_topic"] >= 0)
    # Active-set size counts the topics with mass.
    assert np.all(out["n_active"] >= (out["doc_topic"] > 0).sum(axis=1))
    if trials:
        assert out["tried"] > 0


def test_objective_terms_match_a_direct_computation():
    """data + entropy + alloc per document (App. C), recomputed from the returned r and N."""
    K, L = 15, 3
    C, ptr, loc, cnt = random_problem(21, K)
    out = run(C, ptr, loc, cnt, L=L, trials=4)
    for d in range(ptr.size - 1):
        data = ent = 0.0
        for j in range(ptr[d], ptr[d + 1]):
            m = out["top_n"][j]
            r = out["top_r"][j, :m]
            ks = out["top_idx"][j, :m]
            data += cnt[j] * float(np.dot(r, C[loc[j], ks]))
            pos = r > 0
            ent -= cnt[j] * float(np.dot(r[pos], np.log(r[pos])))
        N = out["doc_topic"][d]
        alloc = math.lgamma(K * ALPHA) - math.lgamma(N.sum() + K * ALPHA) + sum(
            math.lgamma(n + ALPHA) - math.lgamma(ALPHA) for n in N)
        assert out["data"][d] == pytest.approx(data, rel=1e-10, abs=1e-9)
        assert out["ent"][d] == pytest.approx(ent, rel=1e-10, abs=1e-9)
        assert out["alloc"][d] == pytest.approx(alloc, rel=1e-10, abs=1e-9)


@pytest.mark.parametrize("seed,K,L", [(30, 12, 3), (31, 40, 3), (32, 40, 8), (33, 8, 1)])
def test_restarts_never_lower_the_document_objective(seed, K, L):
    C, ptr, loc, cnt = random_problem(seed, K, D=80)
    off = run(C, ptr, loc, cnt, L=L, trials=0)
    on = run(C, ptr, loc, cnt, L=L, trials=4)
    obj_off = off["data"] + off["ent"] + off["alloc"]
    obj_on = on["data"] + on["ent"] + on["alloc"]
    assert np.all(obj_on >= obj_off - 1e-9), np.min(obj_on - obj_off)
    assert off["tried"] == 0 and off["accepted"] == 0
    assert on["tried"] > 0
    # An accepted proposal strictly improves its document; rejected ones leave it bit-identical.
    improved = obj_on > obj_off + 1e-9
    assert improved.sum() <= on["accepted"]
    same = ~improved
    np.testing.assert_array_equal(on["doc_topic"][same], off["doc_topic"][same])
    if L > 1 or K > 8:
        assert on["accepted"] > 0


def test_converges_before_max_iter_on_easy_documents():
    """Each word belongs to one topic: the local step must converge well before max_iter."""
    K, U, D = 6, 60, 50
    rng = np.random.default_rng(40)
    owner = np.arange(U) % K
    lam = np.full((U, K), 0.01)
    lam[np.arange(U), owner] = 50.0
    C = np.ascontiguousarray(_psi(lam) - _psi(lam.sum(axis=0)))
    ptr = np.zeros(D + 1, dtype=np.int64)
    locs = []
    for d in range(D):
        k = rng.integers(K)
        words = np.flatnonzero(owner == k)[: rng.integers(3, 10)]
        locs.append(words)
        ptr[d + 1] = ptr[d] + words.size
    loc = np.concatenate(locs).astype(np.int32)
    cnt = rng.integers(1, 5, size=loc.size).astype(np.float64)
    for L in (1, 2, K):
        out = run(C, ptr, loc, cnt, L=L, max_iter=10_000, tol=1e-6, trials=4)
        assert out["iters"].max() < 100, out["iters"].max()
        # Every document's mass sits on the topic that owns its words.
        assert np.all(out["doc_topic"].max(axis=1) > 0.99 * doc_lengths(ptr, cnt))


def test_max_iter_caps_iterations():
    C, ptr, loc, cnt = random_problem(41, 20)
    out = run(C, ptr, loc, cnt, L=4, max_iter=3, tol=1e-12, trials=0)
    assert out["iters"].max() == 3


def test_empty_documents_are_skipped():
    C, ptr, loc, cnt = random_problem(42, 6, D=3)
    ptr2 = np.concatenate([[0], ptr[:2], [ptr[1]], ptr[2:]])  # docs 0 and 2 empty
    out = run(C, ptr2, loc, cnt, L=2, trials=4)
    assert out["doc_topic"].shape == (5, 6)
    for d in (0, 2):
        assert np.all(out["doc_topic"][d] == 0) and out["iters"][d] == 0
        assert out["data"][d] == out["ent"][d] == out["alloc"][d] == 0
    np.testing.assert_allclose(out["doc_topic"].sum(axis=1), doc_lengths(ptr2, cnt))


def test_restart_iters_zero_keeps_invariants():
    C, ptr, loc, cnt = random_problem(43, 12)
    out = run(C, ptr, loc, cnt, L=3, trials=4, iters=0)
    np.testing.assert_allclose(out["doc_topic"].sum(axis=1), doc_lengths(ptr, cnt), rtol=1e-12)


# -- the engine wrapper: summaries ------------------------------------------------------------

def test_engine_summary_aggregates_responsibilities():
    K, V = 10, 80
    rng = np.random.default_rng(50)
    state = ModelState(K, alpha=ALPHA, beta=0.05)
    state.ensure_words(V)
    state.mu[:V] = rng.gamma(0.5, 2.0, size=(V, K))
    state.refresh_totals()
    D = 30
    lens = rng.integers(1, 15, size=D)
    ptr = np.zeros(D + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(lens)
    wid = np.concatenate([rng.choice(V, n, replace=False) for n in lens])
    cnt = rng.integers(1, 4, size=wid.size)
    batch = batch_from_arrays(ptr, wid, cnt)
    eng = LSparseEngine(sparsity=3)
    res = eng.infer(state, batch, summarize=True)
    raw = lsparse_batch(state.expected_log_phi(batch.uniq), batch.doc_ptr, batch.local, batch.counts, ALPHA, 3,
                        eng.max_iter, eng.tol, eng.active_eps, eng.restart_trials, eng.restart_iters)
    np.testing.assert_array_equal(res.doc_topic, raw[0])
    # Dense brute-force S[v, k] = sum over entries of count * r.
    S = np.zeros((V, K))
    for j in range(wid.size):
        m = raw[3][j]
        np.add.at(S[wid[j]], raw[1][j, :m], cnt[j] * raw[2][j, :m])
    s = res.summary
    got = np.zeros((V, K))
    np.add.at(got, (s.rows(), s.topics), s.values)
    np.testing.assert_allclose(got, S, rtol=0, atol=1e-10)
    np.testing.assert_allclose(s.topic_totals, S.sum(axis=0), rtol=1e-12)
    assert s.values.sum() == pytest.approx(cnt.sum(), rel=1e-12)
    np.testing.assert_array_equal(np.sort(s.word_ids), np.unique(wid))
    assert np.all(np.diff(s.indptr) >= 1)
    assert s.n_docs == D and s.n_tokens == cnt.sum()
    assert s.entropy == pytest.approx(raw[7].sum()) and s.alloc == pytest.approx(raw[8].sum())
    assert res.objective == pytest.approx(raw[6].sum() + raw[7].sum() + raw[8].sum())
    # Without summarize the engine skips the summary but computes the same doc-topic counts.
    res2 = eng.infer(state, batch, summarize=False)
    assert res2.summary is None
    np.testing.assert_array_equal(res2.doc_topic, res.doc_topic)
