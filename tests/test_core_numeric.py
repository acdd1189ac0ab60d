"""Core numeric kernels: digamma against scipy, top-L selection against brute force."""
from __future__ import annotations

import numpy as np
import pytest

from streamtopics._numeric import _quickselect_top, _scan_top, digamma, select_top

PSI_ROOT = 1.4616321449683622  # the only positive zero of digamma


def _grid() -> np.ndarray:
    return np.unique(np.concatenate([
        np.logspace(-4, 6, 4001),
        np.linspace(0.5, 12.0, 1151),
        [1.0, 2.0, 3.0, 5.999999, 6.0, 6.000001, 10.0, 100.0, 1e6],
    ]))


def _ours(xs: np.ndarray) -> np.ndarray:
    return np.array([digamma(float(x)) for x in xs])


def test_digamma_matches_scipy_over_wide_range():
    sp = pytest.importorskip("scipy.special")
    xs = _grid()
    ours, ref = _ours(xs), sp.digamma(xs)
    err = np.abs(ours - ref)
    # Relative error is ill-conditioned at the zero of psi (x ~ 1.4616), so it is checked
    # away from it; near it the absolute error bounds the result.
    away = np.abs(ref) >= 0.05
    assert away.sum() > 5000
    rel = err[away] / np.abs(ref[away])
    assert rel.max() < 1e-10, f"max rel err {rel.max():.3e} at x={xs[away][rel.argmax()]!r}"
    assert err.max() < 2e-11, f"max abs err {err.max():.3e} at x={xs[err.argmax()]!r}"
    # Sanity: the sign change really is at the known root.
    assert digamma(PSI_ROOT - 1e-6) < 0 < digamma(PSI_ROOT + 1e-6)


def test_digamma_absolute_error_within_documented_bound():
    sp = pytest.importorskip("scipy.special")
    xs = _grid()
    ref = sp.digamma(xs)
    err = np.abs(_ours(xs) - ref) / np.maximum(1.0, np.abs(ref))
    assert err.max() < 1e-12, f"max err {err.max():.3e} at x={xs[err.argmax()]!r}"


# -- top-L selection ---------------------------------------------------------------------

def _check_top(orig: np.ndarray, vals: np.ndarray, idx: np.ndarray, n: int, L: int, exact_set: bool) -> None:
    top_vals = vals[:L]
    top_idx = idx[:L]
    # idx travels with vals: each kept value is the original value at its index.
    np.testing.assert_array_equal(orig[top_idx], top_vals)
    assert len(set(top_idx.tolist())) == L, "an index was selected twice"
    assert np.all((top_idx >= 0) & (top_idx < n))
    # Multiset of kept values is the L largest.
    np.testing.assert_array_equal(np.sort(top_vals), np.sort(orig[:n])[n - L:])
    if exact_set:  # distinct values: the index set itself is determined
        assert set(top_idx.tolist()) == set(np.argsort(orig[:n])[n - L:].tolist())


NL_CASES = [(1, 1), (2, 1), (3, 1), (5, 2), (7, 3), (8, 2), (9, 2), (10, 9), (16, 4), (17, 4), (16, 5),
            (40, 1), (40, 10), (40, 11), (40, 39), (100, 8), (100, 25), (100, 26), (100, 60), (1000, 8),
            (1000, 249), (1000, 250), (1000, 251), (1000, 700), (5000, 16), (5000, 2500)]


def test_select_top_cases_cover_both_paths():
    scan = [(n, L) for n, L in NL_CASES if L < n and 4 * L <= n]
    quick = [(n, L) for n, L in NL_CASES if L < n and 4 * L > n]
    assert len(scan) >= 8 and len(quick) >= 8


@pytest.mark.parametrize("n,L", NL_CASES)
def test_select_top_matches_brute_force(n, L):
    rng = np.random.default_rng(1000 * n + L)
    for _ in range(20):
        orig = rng.standard_normal(n)
        vals = orig.copy()
        idx = np.arange(n, dtype=np.int32)
        select_top(vals, idx, n, L)
        _check_top(orig, vals, idx, n, min(L, n), exact_set=True)


@pytest.mark.parametrize("kernel", [_scan_top, _quickselect_top], ids=["scan", "quickselect"])
@pytest.mark.parametrize("n,L", [(n, L) for n, L in NL_CASES if L < n])
def test_each_selection_path_matches_brute_force(kernel, n, L):
    """Both branches are correct for any L < n, not only in the regime select_top routes to them."""
    rng = np.random.default_rng(7 * n + L)
    for _ in range(10):
        orig = rng.random(n) * 10 - 5
        vals = orig.copy()
        idx = np.arange(n, dtype=np.int32)
        kernel(vals, idx, n, L)
        _check_top(orig, vals, idx, n, L, exact_set=True)


@pytest.mark.parametrize("kernel", [select_top, _scan_top, _quickselect_top], ids=["select_top", "scan", "quickselect"])
def test_select_top_with_duplicates(kernel):
    rng = np.random.default_rng(3)
    for n in (2, 3, 5, 8, 13, 50, 200, 1000):
        for L in sorted({1, 2, n // 4, n // 2, n - 1}):
            if not 1 <= L < n:
                continue
            for levels in (1, 2, 3, 10):
                orig = rng.integers(0, levels, size=n).astype(np.float64)
                vals = orig.copy()
                idx = np.arange(n, dtype=np.int32)
                kernel(vals, idx, n, L)
                _check_top(orig, vals, idx, n, L, exact_set=False)


def test_select_top_L_at_least_n_is_a_no_op():
    rng = np.random.default_rng(4)
    for n in (1, 2, 5, 17):
        for L in (n, n + 1, 4 * n):
            orig = rng.standard_normal(n)
            vals = orig.copy()
            idx = np.arange(n, dtype=np.int32)
            select_top(vals, idx, n, L)
            np.testing.assert_array_equal(vals, orig)
            np.testing.assert_array_equal(idx, np.arange(n))


@pytest.mark.parametrize("n,L", [(20, 3), (20, 12)])
def test_select_top_ignores_entries_past_n(n, L):
    """Engines pass scratch buffers longer than n: only vals[:n] compete and the tail is untouched."""
    rng = np.random.default_rng(5)
    orig = rng.standard_normal(n + 30)
    orig[n:] = 1e9  # would win if the kernel looked past n
    vals = orig.copy()
    idx = np.arange(n + 30, dtype=np.int32)
    select_top(vals, idx, n, L)
    _check_top(orig, vals, idx, n, L, exact_set=True)
    np.testing.assert_array_equal(vals[n:], orig[n:])
    np.testing.assert_array_equal(idx[n:], np.arange(n, n + 30))


def test_block_prefilter_keeps_every_top_L_value():
    """select_top may first drop values that cannot be in the top L (block maxima bound)."""
    from streamtopics import _numeric

    prefilter = getattr(_numeric, "_block_prefilter", None)
    if prefilter is None:
        pytest.skip("no block prefilter in this version")
    rng = np.random.default_rng(6)
    for n, L in [(8, 1), (8, 2), (100, 1), (100, 8), (100, 25), (1000, 16), (5000, 3)]:
        for levels in (None, 2, 5):
            orig = rng.standard_normal(n) if levels is None else rng.integers(0, levels, n).astype(np.float64)
            vals = orig.copy()
            idx = np.arange(n, dtype=np.int32)
            c = prefilter(vals, idx, n, L)
            assert L <= c <= n
            np.testing.assert_array_equal(orig[idx[:c]], vals[:c])
            assert len(set(idx[:c].tolist())) == c
            # The L largest values all survive.
            np.testing.assert_array_equal(np.sort(vals[:c])[c - L:], np.sort(orig)[n - L:])


def test_digamma_below_two_is_the_rational_approximation_to_1e_13():
    """Below 2 psi is (x - x0) P/Q (x < 1 through psi(x + 1) - 1/x), fitted to 5e-15 on [1, 2]:
    far inside the 1e-12 the asymptotic branch promises, where E[log phi] and the local step
    evaluate it most (lambda < 1 for 90 % of a batch's touched entries)."""
    sp = pytest.importorskip("scipy.special")
    xs = np.concatenate([np.logspace(-10, 0, 2001), np.linspace(1.0, 2.0, 2001)[1:], [1.9999999999999998]])
    ours, ref = _ours(xs), sp.digamma(xs)
    assert (np.abs(ours - ref) / np.maximum(1.0, np.abs(ref))).max() < 1e-13
    assert abs(digamma(2.0) - sp.digamma(2.0)) < 1e-14  # the two branches meet
