"""Pólya-Gamma and inverse-Gaussian samplers against their known moments.

Every Monte Carlo check uses a fixed seed and a tolerance of Z_TOL standard errors,
the standard error computed from the *known* distribution (its variance, and its
fourth cumulant for the sample variance), so a correct sampler fails a check with
probability ~1e-6 and the seeds make the outcome reproducible.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from streamtopics.supervised import samplers as S

Z_TOL = 5.0
N = 200_000
ZS = [0.0, 0.5, 3.0, 20.0]
BS = [1.0, 3.0, 2.5, 50.0]


def _check_moments(x: np.ndarray, b: float, z: float, what: str) -> None:
    n = x.size
    k1, k2 = S.pg_mean(b, z), S.pg_var(b, z)
    k4 = S.pg_cumulant(b, z, 4)
    # the series cumulants agree with the closed forms
    assert S.pg_cumulant(b, z, 1, n_terms=2_000_000) == pytest.approx(k1, rel=1e-6)
    assert S.pg_cumulant(b, z, 2) == pytest.approx(k2, rel=1e-9)
    se_mean = math.sqrt(k2 / n)
    assert abs(x.mean() - k1) <= Z_TOL * se_mean, f"{what} mean {x.mean()} vs {k1} (se {se_mean})"
    se_var = math.sqrt((k4 + 2.0 * k2 * k2) / n)
    assert abs(x.var() - k2) <= Z_TOL * se_var, f"{what} var {x.var()} vs {k2} (se {se_var})"
    # third statistic: the Laplace transform at t = 1/E X, E exp(-tX) = cosh^b(z/2)/cosh^b(sqrt(z^2/4 + t/2))
    t = 1.0 / k1
    lt, lt2 = S.pg_laplace(b, z, t), S.pg_laplace(b, z, 2.0 * t)
    se_lt = math.sqrt((lt2 - lt * lt) / n)
    est = np.exp(-t * x).mean()
    assert abs(est - lt) <= Z_TOL * se_lt, f"{what} Laplace {est} vs {lt} (se {se_lt})"


@pytest.mark.parametrize("b", BS)
@pytest.mark.parametrize("z", ZS)
def test_pg_exact_moments(b, z):
    seed = 1000 + int(10 * b) * 97 + int(10 * z)
    x = S.draw_pg(b, np.full(N, z), seed=seed)
    assert np.all(x > 0)
    _check_moments(x, b, z, f"PG({b}, {z}) exact")


@pytest.mark.parametrize("b", [1.0, 3.0])
@pytest.mark.parametrize("z", ZS)
def test_pg_devroye_sum_moments(b, z):
    """Integer b as a sum of b Devroye PG(1, z) draws (the dispatcher uses the alternate for b = 3)."""
    x = S.draw_pg(b, np.full(N, z), seed=77 + int(b) + int(10 * z), method="devroye")
    _check_moments(x, b, z, f"PG({b}, {z}) Devroye sum")


@pytest.mark.parametrize("z", [0.5, 3.0])
def test_pg_alternate_and_devroye_same_law(z):
    """Two-sample Kolmogorov-Smirnov: alternate PG(3, z) vs 3 x Devroye PG(1, z)."""
    n = 100_000
    a = np.sort(S.draw_pg(3.0, np.full(n, z), seed=5, method="exact"))
    d = np.sort(S.draw_pg(3.0, np.full(n, z), seed=6, method="devroye"))
    grid = np.concatenate([a, d])
    ks = np.max(np.abs(np.searchsorted(a, grid, side="right") - np.searchsorted(d, grid, side="right"))) / n
    assert ks < 1.95 * math.sqrt(2.0 / n)  # alpha = 0.001 critical value


@pytest.mark.parametrize("b", [0.5, 2.5, 250.0])
@pytest.mark.parametrize("z", [0.0, 3.0, 20.0])
def test_pg_gamma_sum_moments_and_bound(b, z):
    """The approximate sampler: exact mean and variance, W2 error bound <= tol sd."""
    tol = 1e-2
    x = S.draw_pg(b, np.full(N, z), seed=31 + int(b) + int(z), method="gamma_sum", tol=tol)
    _check_moments(x, b, z, f"PG({b}, {z}) gamma-sum")
    # the stopping rule's bound, checked against an independent computation of the tail T2
    K = S.gamma_sum_terms(z, tol)
    k = np.arange(K + 1, 2_000_000, dtype=np.float64)
    t2 = np.sum((1.0 / (2 * math.pi ** 2 * (k - 0.5) ** 2 + z * z / 2))[::-1] ** 2)
    assert math.sqrt(2.0 * t2 / S.pg_var(1.0, z)) <= tol * (1 + 1e-6)
    assert K <= 100


def test_pg_alternate_large_b_uses_chunks():
    """b = 250 (a large regularisation constant) is exact via 62 chunks of 4 plus a remainder."""
    assert S._alt_plan(250.0)[:3] == (62, 2.0, 1)
    assert S._alt_plan(7.0)[:3] == (1, 3.0, 1)
    assert S._alt_plan(4.5)[:3] == (0, 2.25, 2)
    x = S.draw_pg(250.0, np.full(20_000, 1.0), seed=9)
    se = math.sqrt(S.pg_var(250.0, 1.0) / x.size)
    assert abs(x.mean() - S.pg_mean(250.0, 1.0)) <= Z_TOL * se


def test_alternate_truncation_points():
    assert S.alt_truncation(4.0) == S.T4
    assert S.alt_truncation(1.0) == pytest.approx(0.64, abs=5e-3)  # Devroye's t at h = 1
    for h in np.linspace(1.0, 4.0, 13):
        t = S.alt_truncation(h)
        assert 0 < t <= 2 * (1 + h) / math.log(2 + h)
        # the left series starts decreasing at n = 0 for x <= t: a_1 / a_0 <= 1
        assert (2 + h) * math.exp(-2 * (1 + h) / t) <= 1.0


def _jh_density(h: float, x: float, digits: int = 60):
    """Density of J(h) at x from the left series, summed in `digits`-digit decimal arithmetic.

    f(x|h) = 2^h sum_n (-1)^n Gamma(n+h)/(Gamma(h) n!) (2n+h)/sqrt(2 pi x^3) exp(-(2n+h)^2/(2x));
    the terms cancel heavily for large x, hence the extended precision.
    """
    from decimal import Decimal, localcontext
    with localcontext() as ctx:
        ctx.prec = digits
        X, H = Decimal(repr(x)), Decimal(repr(h))
        pi = Decimal("3.14159265358979323846264338327950288419716939937510582097494459")
        pref = (Decimal(2) ** H) / (2 * pi * X ** 3).sqrt()
        total, coef, n = Decimal(0), Decimal(1), 0
        while True:
            if n:
                coef *= (n - 1 + H) / n
            d = 2 * n + H
            term = coef * d * (-(d * d) / (2 * X)).exp()
            total += term if n % 2 == 0 else -term
            if n > 5 and term < total.copy_abs() * Decimal(10) ** (-digits + 5):
                break
            n += 1
        return float(pref * total)


def test_envelope_bounds_density():
    """The left envelope (x <= t) and the right envelope (all x) dominate the J(h) density."""
    for h in [1.0, 1.5, 2.5, 4.0]:
        t = S.alt_truncation(h)
        for x in [0.05, 0.3, 0.9 * t, t, 1.3 * t, 3.0, 8.0, 15.0]:
            dens = _jh_density(h, x)
            assert dens > 0
            right = math.exp(h * math.log(math.pi / 2) + (h - 1) * math.log(x) - math.pi ** 2 * x / 8 - math.lgamma(h))
            assert dens <= right * (1 + 1e-12), (h, x, dens, right)
            if x <= t:
                left = h * 2 ** h / math.sqrt(2 * math.pi * x ** 3) * math.exp(-h * h / (2 * x))
                assert dens <= left * (1 + 1e-12), (h, x, dens, left)
        if h == 1.0:  # J(1) right series: sum (-1)^n pi (n + 1/2) exp(-(n + 1/2)^2 pi^2 x / 2)
            x = 2.0
            ref = sum((-1) ** n * math.pi * (n + 0.5) * math.exp(-((n + 0.5) ** 2) * math.pi ** 2 * x / 2)
                      for n in range(50))
            assert _jh_density(1.0, x) == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("mu,lam", [(0.1, 1.0), (1.0, 1.0), (2.0, 0.5), (5.0, 20.0)])
def test_ig_moments(mu, lam):
    x = S.draw_ig(np.full(N, mu), lam, seed=int(100 * mu + lam))
    assert np.all(x > 0)
    k2 = mu ** 3 / lam
    k4 = 15.0 * mu ** 7 / lam ** 3  # IG cumulants: (2n-3)!! mu^(2n-1) / lam^(n-1)
    assert abs(x.mean() - mu) <= Z_TOL * math.sqrt(k2 / N)
    assert abs(x.var() - k2) <= Z_TOL * math.sqrt((k4 + 2 * k2 * k2) / N)
    inv_mean = 1.0 / mu + 1.0 / lam
    inv_var = 1.0 / (mu * lam) + 2.0 / lam ** 2
    assert abs((1.0 / x).mean() - inv_mean) <= Z_TOL * math.sqrt(inv_var / N)


def test_ig_levy_limit():
    """mu = inf (zeta = 0 in the hinge augmentation): 1/X = N(0,1)^2 / lam."""
    lam = 2.0
    x = S.draw_ig(np.full(N, np.inf), lam, seed=4)
    inv = 1.0 / x
    assert abs(inv.mean() - 1 / lam) <= Z_TOL * math.sqrt(2 / lam ** 2 / N)
    assert abs(inv.var() - 2 / lam ** 2) <= Z_TOL * math.sqrt((48 / lam ** 4 + 2 * 4 / lam ** 4) / N)


def test_ig_large_mean_is_stable():
    x = S.draw_ig(np.full(N, 1e8), 1.0, seed=12)
    assert np.all(np.isfinite(x)) and np.all(x > 0)
    inv = 1.0 / x  # ~ 1/mu + N^2: mean 1 + 1e-8
    assert abs(inv.mean() - (1.0 + 1e-8)) <= Z_TOL * math.sqrt(2.0 / N)


def test_special_functions():
    for x in [0.1, 1.0, 2.5, 10.0, 60.0]:
        assert S.log_gammaq(1.0, x) == pytest.approx(-x, rel=1e-12)
        assert S.log_gammaq(0.5, x) == pytest.approx(math.log(math.erfc(math.sqrt(x))), rel=1e-10)
        assert S.log_gammaq(3.0, x) == pytest.approx(-x + math.log(1 + x + x * x / 2), rel=1e-10)
    for x in [-35.0, -30.0, -29.9, -5.0, 0.0]:
        assert S.log_ndtr(x) == pytest.approx(math.log(0.5 * math.erfc(-x / math.sqrt(2))), rel=1e-12)
    for x in [0.5, 3.0, 10.0]:
        assert S.log_ndtr(x) == pytest.approx(math.log1p(-0.5 * math.erfc(x / math.sqrt(2))), rel=1e-12)
    for x in [31.0, 40.0, 100.0]:  # far tail: Mills ratio by its continued fraction (independent method)
        cf = x
        for k in range(200, 0, -1):
            cf = x + k / cf
        ref = -0.5 * x * x - 0.5 * math.log(2 * math.pi) - math.log(cf)
        assert S.log_ndtr(-x) == pytest.approx(ref, rel=1e-14)


def test_determinism_and_validation():
    z = np.linspace(-5, 5, 1000)
    a = S.draw_pg(2.5, z, seed=3)
    assert np.array_equal(a, S.draw_pg(2.5, z, seed=3))
    assert not np.array_equal(a, S.draw_pg(2.5, z, seed=4))
    assert np.array_equal(S.draw_ig(1.0, 1.0, seed=1), S.draw_ig(1.0, 1.0, seed=1))
    with pytest.raises(ValueError):
        S.draw_pg(0.5, z, seed=1)  # exact needs b >= 1
    with pytest.raises(ValueError):
        S.draw_pg(2.5, z, seed=1, method="devroye")
    with pytest.raises(ValueError):
        S.draw_pg(1.0, np.array([np.nan]), seed=1)
    with pytest.raises(ValueError):
        S.draw_ig(-1.0, 1.0, seed=1)
    assert S.draw_pg(np.array([1.0, 2.0]), 0.0, seed=1).shape == (2,)
