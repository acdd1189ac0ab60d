"""Augmentation-variable samplers in numba: Polya-Gamma PG(b, z) and inverse Gaussian IG(mu, lam).

All randomness comes from numba's own generator (thread-local Mersenne Twister inside
nopython code).  Call :func:`seed` (or pass ``seed=`` to the vectorised helpers) with
an explicit integer before drawing: the same seed gives the same draws on every run.

What is exact and what is approximate
-------------------------------------
* ``ig(mu, lam)``: exact (Michael, Schucany & Haas 1976, transformation with multiple
  roots).  ``mu = inf`` is the Levy limit ``lam / N(0,1)^2``, also exact.
* ``pg1(z)``: exact PG(1, z) by Devroye's alternating-series method for the Jacobi
  J*(1, z/2) as in Polson, Scott & Windle (2013), PG = J*/4.
* ``pg_devroye(n, z)``: exact PG(n, z) for integer n >= 1 as a sum of n PG(1, z).
* ``pg_alternate(b, z)``: exact PG(b, z) for every real b >= 1 by Windle, Polson &
  Scott's (2014) "alternate" series method for J*(h, z/2), applied to chunks
  h in [1, 4] whose sum is b (PG(b1, z) + PG(b2, z) = PG(b1 + b2, z) in law).
  Correctness rests on two envelope facts, both proved in docs/supervised.md §1:
  (i) for x <= t_max(h) = 2(1+h)/log(2+h) the left series of the J(h) density
  alternates with decreasing terms from n = 0, so its first term bounds the density;
  (ii) for every x > 0 and h >= 1 the density of J(h) is below
  (pi/2)^h x^(h-1) exp(-pi^2 x/8) / Gamma(h) (J(h) = Gamma(h, pi^2/8) + an independent
  positive remainder whose Laplace transform at -pi^2/8 is (4/pi)^h).  Any truncation
  point t <= t_max gives an exact sampler; we use the envelope intersection (the
  optimum), which is 0.64 at h = 1 like Devroye's.  The acceptance test walks the
  alternating series and only decides once its terms have started to decrease (after
  which they decrease for good when h >= 1), so the partial sums bracket the density.
  "Exact" means up to floating-point rounding in evaluating those series (as for every
  series-method sampler); the mixture weights use a log-space normal CDF and a
  regularised incomplete gamma accurate to about 1e-15.
* ``pg_exact(b, z)``: b = 1 -> Devroye; every other b >= 1 -> alternate (integer b too:
  one h = 4 chunk costs about as much as 1.5 Devroye draws but covers 4 units of b).
  b < 1 is rejected (no exact method here; regularisation constants are >= 1).
* ``pg_gamma_sum(b, z, tol)``: APPROXIMATE, any b > 0, cost independent of b.  Uses the
  series X = sum_k g_k w_k, g_k ~ Gamma(b, 1), w_k = 1 / (2 pi^2 (k-1/2)^2 + z^2/2)
  (Polson et al. 2013, eq. 1).  The first K terms are drawn; the tail R_K is replaced
  by a Gamma variable with the tail's exact mean b*T1 and variance b*T2
  (T1 = sum_{k>K} w_k, T2 = sum_{k>K} w_k^2, from the closed forms of E and Var of
  PG(1, z) minus the head).  Hence mean and variance of the draw are exact, and the
  Wasserstein-2 distance to PG(b, z) is at most sqrt(2 b T2) (couple the heads; the two
  tails have equal means).  K is the smallest number of terms with
  sqrt(2 T2 / Var PG(1, z)) <= tol, i.e. the W2 error is at most ``tol`` standard
  deviations of the exact law (default 1e-2; K ~ 8..65 for |z| <= 20, 1000 at most).
"""
from __future__ import annotations

import math

import numpy as np

from ..jit_cache import njit

PI = math.pi
PI2 = PI * PI
PI2_8 = PI2 / 8.0
LOG2 = math.log(2.0)
LOG_PI_2 = math.log(PI / 2.0)
HALF_LOG_2PI = 0.5 * math.log(2.0 * PI)
SQRT2 = math.sqrt(2.0)
TRUNC = 0.64  # Devroye/PSW truncation point for J*(1, z)

METHOD_EXACT = 0
METHOD_GAMMA_SUM = 1
METHOD_DEVROYE = 2  # integer b only: sum of b Devroye PG(1, z)
METHODS = {"exact": METHOD_EXACT, "gamma_sum": METHOD_GAMMA_SUM, "devroye": METHOD_DEVROYE}
GAMMA_SUM_MAX_TERMS = 1000


# --------------------------------------------------------------------------- utilities
@njit(cache=True, nogil=True)
def seed(s: int) -> None:
    """Seed numba's generator for the calling thread (nopython code only)."""
    np.random.seed(s)


@njit(cache=True, nogil=True)
def log_ndtr(x: float) -> float:
    """log Phi(x) for the standard normal CDF, accurate in both tails."""
    if x >= 0.0:
        return math.log1p(-0.5 * math.erfc(x / SQRT2))
    if x > -30.0:
        return math.log(0.5 * math.erfc(-x / SQRT2))
    # Mills-ratio asymptotic series; the next term is < 1e-14 relative for x <= -30.
    r = 1.0 / (x * x)
    s = 1.0 + r * (-1.0 + r * (3.0 + r * (-15.0 + r * (105.0 + r * (-945.0 + r * 10395.0)))))
    return -0.5 * x * x - math.log(-x) - HALF_LOG_2PI + math.log(s)


@njit(cache=True, nogil=True)
def log_gammaq(a: float, x: float) -> float:
    """log Q(a, x), the regularised upper incomplete gamma function (a > 0, x >= 0)."""
    if x <= 0.0:
        return 0.0
    lg = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:  # series for P(a, x)
        ap = a
        d = 1.0 / a
        s = d
        for _ in range(100000):
            ap += 1.0
            d *= x / ap
            s += d
            if abs(d) < abs(s) * 1e-17:
                break
        return math.log1p(-math.exp(math.log(s) + lg))
    # continued fraction for Q(a, x) (modified Lentz)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 100000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        if abs(d) < tiny:
            d = tiny
        c = b + an / c
        if abs(c) < tiny:
            c = tiny
        d = 1.0 / d
        dl = d * c
        h *= dl
        if abs(dl - 1.0) < 1e-16:
            break
    return math.log(h) + lg


@njit(cache=True, nogil=True)
def _logaddexp(a: float, b: float) -> float:
    if a < b:
        a, b = b, a
    if b == -np.inf:
        return a
    return a + math.log1p(math.exp(b - a))


# --------------------------------------------------------------------------- inverse Gaussian
@njit(cache=True, nogil=True)
def ig(mu: float, lam: float) -> float:
    """One draw of IG(mu, lam) (mean mu, shape lam) by Michael-Schucany-Haas (exact).

    The smaller root is written mu / (1 + r + sqrt(r^2 + 2r)), r = mu y / (2 lam), which
    has no cancellation for large mu.  mu = inf gives the Levy limit lam / y.
    """
    n = np.random.standard_normal()
    y = n * n
    if not (mu < np.inf):
        return lam / y
    r = mu * y / (2.0 * lam)
    x = mu / (1.0 + r + math.sqrt(r * (r + 2.0)))
    if np.random.random() * (mu + x) <= mu:
        return x
    return mu * mu / x


@njit(cache=True, nogil=True)
def _rt_levy(h2: float, t: float) -> float:
    """Levy(scale h2) truncated to (0, t]: h2 / N^2 with N | N >= a, a = sqrt(h2 / t).

    N is drawn from the normal tail by the exponential proposal a + E1/a accepted when
    E1^2 <= 2 a^2 E2 (exact; Devroye 1986, IX.1).
    """
    a = math.sqrt(h2 / t)
    while True:
        e1 = np.random.standard_exponential()
        e2 = np.random.standard_exponential()
        if e1 * e1 <= 2.0 * a * a * e2:
            n = a + e1 / a
            return h2 / (n * n)


# --------------------------------------------------------------------------- PG(1, z): Devroye
@njit(cache=True, nogil=True)
def _devroye_coef(n: int, x: float) -> float:
    """a_n(x) of the J*(1) density: right series for x > 0.64, left series below (PSW 2013 §4)."""
    k = (n + 0.5) * PI
    if x > TRUNC:
        return k * math.exp(-0.5 * k * k * x)
    if x > 0.0:
        return math.exp(-1.5 * (LOG_PI_2 + math.log(x)) + math.log(k) - 2.0 * (n + 0.5) * (n + 0.5) / x)
    return 0.0


@njit(cache=True, nogil=True)
def _rtigauss1(zz: float) -> float:
    """IG(1/zz, 1) truncated to (0, 0.64]."""
    t = TRUNC
    if zz < 1.0 / t:  # mean above t: truncated Levy proposal, accept with exp(-zz^2 x / 2)
        while True:
            x = _rt_levy(1.0, t)
            if np.random.random() <= math.exp(-0.5 * zz * zz * x):
                return x
    mu = 1.0 / zz
    while True:
        x = ig(mu, 1.0)
        if x <= t:
            return x


@njit(cache=True, nogil=True)
def _devroye_p_right(zz: float) -> float:
    """Mass of the exponential (right) envelope piece for J*(1, zz): p / (p + q).

    p = pi/(2 f) e^{-f t} (right piece), q = 2 e^{-zz} IG-cdf(t; 1/zz, 1) (left piece),
    f = pi^2/8 + zz^2/2, t = 0.64 (PSW 2013 §4; computed as log(q/p) to survive large zz).
    """
    t = TRUNC
    fz = PI2_8 + 0.5 * zz * zz
    st = math.sqrt(t)
    x0 = math.log(fz) + fz * t
    xb = x0 - zz + log_ndtr((t * zz - 1.0) / st)
    xa = x0 + zz + log_ndtr(-(t * zz + 1.0) / st)
    log_qdivp = math.log(4.0 / PI) + _logaddexp(xb, xa)
    if log_qdivp > 700.0:
        return 0.0
    return 1.0 / (1.0 + math.exp(log_qdivp))


@njit(cache=True, nogil=True)
def _jstar1(zz: float, p_right: float) -> float:
    """One exact draw of J*(1, zz) (Devroye; PSW 2013 Alg. 1); PG(1, z) = J*(1, |z|/2) / 4."""
    t = TRUNC
    fz = PI2_8 + 0.5 * zz * zz
    while True:
        if np.random.random() < p_right:
            x = t + np.random.standard_exponential() / fz
        else:
            x = _rtigauss1(zz)
        s = _devroye_coef(0, x)
        y = np.random.random() * s
        n = 0
        while True:
            n += 1
            if n & 1:
                s -= _devroye_coef(n, x)
                if y <= s:
                    return x
            else:
                s += _devroye_coef(n, x)
                if y > s:
                    break


@njit(cache=True, nogil=True)
def pg1(z: float) -> float:
    """One exact draw of PG(1, z) (Devroye's method, Polson-Scott-Windle 2013 Alg. 1)."""
    zz = 0.5 * abs(z)
    return 0.25 * _jstar1(zz, _devroye_p_right(zz))


@njit(cache=True, nogil=True)
def pg_devroye(n: int, z: float) -> float:
    """Exact PG(n, z), integer n >= 1, as a sum of n independent PG(1, z)."""
    zz = 0.5 * abs(z)
    p = _devroye_p_right(zz)
    s = 0.0
    for _ in range(n):
        s += _jstar1(zz, p)
    return 0.25 * s


# --------------------------------------------------------------------------- PG(b, z): alternate
@njit(cache=True, nogil=True)
def _alt_log_gap(h: float, t: float) -> float:
    """log(left envelope) - log(right envelope) of the J(h) density at t."""
    left = math.log(h) + h * LOG2 - HALF_LOG_2PI - 1.5 * math.log(t) - 0.5 * h * h / t
    right = h * LOG_PI_2 + (h - 1.0) * math.log(t) - PI2_8 * t - math.lgamma(h)
    return left - right


@njit(cache=True, nogil=True)
def alt_truncation(h: float) -> float:
    """Truncation point t(h) for the alternate sampler (h >= 1).

    The envelope intersection minimises the envelope mass; the log gap is increasing in t
    for h >= 1 (its derivative's discriminant (h+1/2)^2 - pi^2 h^2 / 4 is negative), so
    bisection finds the unique root.  Clamped to t_max = 2(1+h)/log(2+h), beyond which
    the left series no longer starts decreasing at n = 0.
    """
    tmax = 2.0 * (1.0 + h) / math.log(2.0 + h)
    if _alt_log_gap(h, tmax) <= 0.0:
        return tmax
    lo = 1e-3
    hi = tmax
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _alt_log_gap(h, mid) > 0.0:
            hi = mid
        else:
            lo = mid
    return lo


T4 = 4.1279413654776445  # alt_truncation(4.0); tests check this constant


@njit(cache=True, nogil=True)
def alt_prob_right(h: float, zz: float, t: float) -> float:
    """Probability of the right (gamma) piece of the J*(h, zz) envelope (zz = |z|/2).

    left mass  = 2^h [e^{-h zz} Phi((t zz - h)/sqrt t) + e^{h zz} Phi(-(t zz + h)/sqrt t)]
                 (= 2^h e^{-h zz} IG-cdf(t; h/zz, h^2), and 2^h erfc(h/sqrt(2t)) at zz = 0)
    right mass = (pi/2)^h lambda_z^-h Q(h, lambda_z t),  lambda_z = pi^2/8 + zz^2/2;
    both without the common factor cosh^h(zz).
    """
    lam_z = PI2_8 + 0.5 * zz * zz
    st = math.sqrt(t)
    lb = -h * zz + log_ndtr((t * zz - h) / st)
    la = h * zz + log_ndtr(-(t * zz + h) / st)
    log_left = h * LOG2 + _logaddexp(lb, la)
    log_right = h * (LOG_PI_2 - math.log(lam_z)) + log_gammaq(h, lam_z * t)
    d = log_left - log_right
    if d > 700.0:
        return 0.0
    return 1.0 / (1.0 + math.exp(d))


@njit(cache=True, nogil=True)
def _lt_gamma(h: float, rate: float, t: float) -> float:
    """Gamma(h, rate) truncated to (t, inf), h >= 1: shifted-exponential rejection.

    In y = rate * x the target is y^(h-1) e^-y on (tau, inf); the proposal tau + E/beta
    with Dagpunar's beta = (tau - h + sqrt((tau - h)^2 + 4 tau)) / (2 tau) (< 1 for h > 1)
    is accepted with (y/y*)^(h-1) exp(-(1-beta)(y - y*)) <= 1, y* the maximiser on y >= tau.
    """
    tau = rate * t
    if h == 1.0:
        return t + np.random.standard_exponential() / rate
    beta = (tau - h + math.sqrt((tau - h) * (tau - h) + 4.0 * tau)) / (2.0 * tau)
    ystar = max(tau, (h - 1.0) / (1.0 - beta))
    while True:
        y = tau + np.random.standard_exponential() / beta
        log_acc = (h - 1.0) * math.log(y / ystar) - (1.0 - beta) * (y - ystar)
        if math.log(np.random.random()) <= log_acc:
            return y / rate


@njit(cache=True, nogil=True)
def _rt_left(h: float, zz: float, t: float) -> float:
    """Left proposal: density prop. to x^-3/2 exp(-h^2/(2x) - zz^2 x/2) on (0, t].

    That is IG(h/zz, h^2) truncated to (0, t].  If its mean h/zz exceeds t, draw the
    truncated Levy(h^2) and accept with exp(-zz^2 x / 2); otherwise draw IG until <= t.
    """
    h2 = h * h
    if zz * t < h:
        while True:
            x = _rt_levy(h2, t)
            if np.random.random() <= math.exp(-0.5 * zz * zz * x):
                return x
    mu = h / zz
    while True:
        x = ig(mu, h2)
        if x <= t:
            return x


@njit(cache=True, nogil=True)
def _jstar_alternate(h: float, zz: float, t: float, p_right: float) -> float:
    """One exact draw of J*(h, zz), h >= 1, by the alternate series method (see module doc)."""
    lam_z = PI2_8 + 0.5 * zz * zz
    h2 = h * h
    log_c = h * LOG2 - HALF_LOG_2PI
    lgh = math.lgamma(h)
    while True:
        if np.random.random() < p_right:
            x = _lt_gamma(h, lam_z, t)
        else:
            x = _rt_left(h, zz, t)
        logx = math.log(x)
        if x > t:
            env = math.exp(h * LOG_PI_2 + (h - 1.0) * logx - PI2_8 * x - lgh)
        else:
            env = math.exp(log_c + math.log(h) - 1.5 * logx - 0.5 * h2 / x)
        y = np.random.random() * env
        # left series a_n = 2^h Gamma(n+h)/(Gamma(h) n!) (2n+h) / sqrt(2 pi x^3) exp(-(2n+h)^2/(2x))
        s = math.exp(log_c + math.log(h) - 1.5 * logx - 0.5 * h2 / x)
        prev = s
        coef = 1.0
        n = 0
        while True:
            n += 1
            coef *= (n - 1.0 + h) / n
            dn = 2.0 * n + h
            an = coef * math.exp(log_c + math.log(dn) - 1.5 * logx - 0.5 * dn * dn / x)
            decreasing = an <= prev
            prev = an
            if n & 1:
                s -= an
                if decreasing and y <= s:
                    return x
            else:
                s += an
                if decreasing and y > s:
                    break


@njit(cache=True, nogil=True)
def _alt_plan(b: float):
    """Split b >= 1 into chunks: n4 chunks of h = 4 and n_rem chunks of h_rem in [1, 4].

    Returns (n4, h_rem, n_rem, t_rem); the truncation point of h = 4 is the constant T4.
    """
    if b <= 4.0:
        return 0, b, 1, alt_truncation(b)
    n4 = int(math.floor((b - 1.0) / 4.0))
    rem = b - 4.0 * n4  # in [1, 5)
    if rem > 4.0:
        h = 0.5 * rem
        return n4, h, 2, alt_truncation(h)
    if rem == 4.0:
        return n4 + 1, 4.0, 0, T4
    return n4, rem, 1, alt_truncation(rem)


@njit(cache=True, nogil=True)
def _pg_alt_planned(zz: float, n4: int, h_rem: float, n_rem: int, t_rem: float) -> float:
    out = 0.0
    if n4 > 0:
        p4 = alt_prob_right(4.0, zz, T4)
        for _ in range(n4):
            out += _jstar_alternate(4.0, zz, T4, p4)
    if n_rem > 0:
        p = alt_prob_right(h_rem, zz, t_rem)
        for _ in range(n_rem):
            out += _jstar_alternate(h_rem, zz, t_rem, p)
    return 0.25 * out


@njit(cache=True, nogil=True)
def pg_alternate(b: float, z: float) -> float:
    """Exact PG(b, z) for real b >= 1: J*(h, |z|/2)/4 summed over chunks h in [1, 4]."""
    if not (b >= 1.0):
        raise ValueError("pg_alternate needs b >= 1")
    n4, h_rem, n_rem, t_rem = _alt_plan(b)
    return _pg_alt_planned(0.5 * abs(z), n4, h_rem, n_rem, t_rem)


@njit(cache=True, nogil=True)
def pg_exact(b: float, z: float) -> float:
    """Exact PG(b, z), b >= 1: Devroye for b = 1, alternate otherwise (see module doc)."""
    if not (b >= 1.0):
        raise ValueError("exact Polya-Gamma sampling needs b >= 1")
    if b == 1.0:
        return pg1(z)
    return pg_alternate(b, z)


# --------------------------------------------------------------------------- PG moments
@njit(cache=True, nogil=True)
def pg_mean(b: float, z: float) -> float:
    """E PG(b, z) = b tanh(z/2) / (2z)  (b/4 at z = 0)."""
    z = abs(z)
    if z < 1e-6:
        return b * (0.25 - z * z / 48.0)
    return b * math.tanh(0.5 * z) / (2.0 * z)


@njit(cache=True, nogil=True)
def pg_var(b: float, z: float) -> float:
    """Var PG(b, z) = b (sinh z - z) / (4 z^3 cosh^2(z/2))  (b/24 at z = 0)."""
    z = abs(z)
    if z < 0.1:
        z2 = z * z
        # (sinh z - z)/z^3 = 1/6 + z^2/120 + z^4/5040 + z^6/362880 + ...
        g = 1.0 / 6.0 + z2 * (1.0 / 120.0 + z2 * (1.0 / 5040.0 + z2 / 362880.0))
        ch = math.cosh(0.5 * z)
        return b * g / (4.0 * ch * ch)
    if z > 700.0:
        return b / (z * z * z)  # sinh z / cosh^2(z/2) -> 2 for large z
    ch = math.cosh(0.5 * z)
    return b * (math.sinh(z) - z) / (4.0 * z * z * z * ch * ch)


# --------------------------------------------------------------------------- PG: gamma-sum approx
@njit(cache=True, nogil=True)
def gamma_sum_terms(z: float, tol: float) -> int:
    """Number of series terms K with sqrt(2 T2(K) / Var PG(1, z)) <= tol (<= 1000)."""
    zh = 0.5 * z * z
    v1 = pg_var(1.0, z)
    head2 = 0.0
    for k in range(1, GAMMA_SUM_MAX_TERMS + 1):
        w = 1.0 / (2.0 * PI2 * (k - 0.5) * (k - 0.5) + zh)
        head2 += w * w
        t2 = v1 - head2
        if t2 <= 0.0 or 2.0 * t2 <= tol * tol * v1:
            return k
    return GAMMA_SUM_MAX_TERMS


@njit(cache=True, nogil=True)
def pg_gamma_sum(b: float, z: float, tol: float) -> float:
    """APPROXIMATE PG(b, z), b > 0: K gamma-series terms + a moment-matched gamma tail.

    Mean and variance are exact; W2 distance to PG(b, z) <= sqrt(2 b T2) <= tol * sd.
    """
    zh = 0.5 * z * z
    v1 = pg_var(1.0, z)
    m1 = pg_mean(1.0, z)
    x = 0.0
    head1 = 0.0
    head2 = 0.0
    for k in range(1, GAMMA_SUM_MAX_TERMS + 1):
        w = 1.0 / (2.0 * PI2 * (k - 0.5) * (k - 0.5) + zh)
        x += np.random.gamma(b, 1.0) * w
        head1 += w
        head2 += w * w
        t2 = v1 - head2
        if t2 <= 0.0 or 2.0 * t2 <= tol * tol * v1:
            break
    t1 = m1 - head1
    if t1 > 0.0 and t2 > 0.0:
        # tail ~ Gamma(shape = b T1^2 / T2, scale = T2 / T1): mean b T1, variance b T2
        x += np.random.gamma(b * t1 * t1 / t2, t2 / t1)
    elif t1 > 0.0:
        x += b * t1
    return x


# --------------------------------------------------------------------------- dispatch + arrays
@njit(cache=True, nogil=True)
def pg(b: float, z: float, method: int, tol: float) -> float:
    """PG(b, z) by ``method`` (METHOD_EXACT or METHOD_GAMMA_SUM)."""
    if method == METHOD_GAMMA_SUM:
        return pg_gamma_sum(b, z, tol)
    return pg_exact(b, z)


@njit(cache=True, nogil=True)
def pg_fill(b: np.ndarray, z: np.ndarray, out: np.ndarray, method: int, tol: float) -> None:
    """out[i] ~ PG(b[i], z[i]) (1-d arrays of equal length).

    With the exact method the chunk plan (truncation points) is reused while b repeats,
    so a constant b (one regularisation constant for all documents) is planned once.
    """
    n = z.shape[0]
    if method == METHOD_GAMMA_SUM:
        for i in range(n):
            out[i] = pg_gamma_sum(b[i], z[i], tol)
        return
    if method == METHOD_DEVROYE:
        for i in range(n):
            out[i] = pg_devroye(int(b[i]), z[i])
        return
    last_b = -1.0
    n4, h_rem, n_rem, t_rem = 0, 1.0, 0, TRUNC
    for i in range(n):
        bi = b[i]
        if bi == 1.0:
            out[i] = pg1(z[i])
            continue
        if bi != last_b:
            if not (bi >= 1.0):
                raise ValueError("exact Polya-Gamma sampling needs b >= 1")
            n4, h_rem, n_rem, t_rem = _alt_plan(bi)
            last_b = bi
        out[i] = _pg_alt_planned(0.5 * abs(z[i]), n4, h_rem, n_rem, t_rem)


@njit(cache=True, nogil=True)
def ig_fill(mu: np.ndarray, lam: np.ndarray, out: np.ndarray) -> None:
    for i in range(mu.shape[0]):
        out[i] = ig(mu[i], lam[i])


@njit(cache=True, nogil=True)
def _seeded_pg_fill(s, b, z, out, method, tol):
    np.random.seed(s)
    pg_fill(b, z, out, method, tol)


@njit(cache=True, nogil=True)
def _seeded_ig_fill(s, mu, lam, out):
    np.random.seed(s)
    ig_fill(mu, lam, out)


def _as_seed(seed_value) -> int:
    s = int(seed_value)
    if not 0 <= s < 2**32:
        s = int(np.random.SeedSequence(abs(s)).generate_state(1)[0])
    return s


def draw_pg(b, z, seed: int, method: str = "exact", tol: float = 1e-2) -> np.ndarray:
    """Vectorised PG(b, z): one draw per element of the broadcast of ``b`` and ``z``.

    method: "exact" (b >= 1), "devroye" (integer b, sum of PG(1, z)), "gamma_sum" (approximate,
    any b > 0, W2 error <= tol standard deviations).  Same seed -> same draws.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {sorted(METHODS)} (got {method!r})")
    bb, zz = np.broadcast_arrays(np.asarray(b, dtype=np.float64), np.asarray(z, dtype=np.float64))
    shape = bb.shape
    bb = np.ascontiguousarray(bb).ravel()
    zz = np.ascontiguousarray(zz).ravel()
    if bb.size and (not np.all(np.isfinite(zz)) or not np.all(bb > 0)):
        raise ValueError("PG(b, z) needs b > 0 and finite z")
    if method == "exact" and bb.size and bb.min() < 1.0:
        raise ValueError("exact PG sampling needs b >= 1 (use method='gamma_sum' for b < 1)")
    if method == "devroye" and bb.size and not np.all(bb == np.floor(bb)):
        raise ValueError("method='devroye' needs integer b (a sum of b PG(1, z) draws)")
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tol must be in (0, 1) (got {tol})")
    out = np.empty(bb.size)
    _seeded_pg_fill(_as_seed(seed), bb, zz, out, METHODS[method], float(tol))
    return out.reshape(shape)


def draw_ig(mu, lam, seed: int) -> np.ndarray:
    """Vectorised IG(mu, lam) (mu may be inf: Levy limit)."""
    mm, ll = np.broadcast_arrays(np.asarray(mu, dtype=np.float64), np.asarray(lam, dtype=np.float64))
    shape = mm.shape
    mm = np.ascontiguousarray(mm).ravel()
    ll = np.ascontiguousarray(ll).ravel()
    if mm.size and (not np.all(mm > 0) or not np.all(ll > 0) or not np.all(np.isfinite(ll))):
        raise ValueError("IG(mu, lam) needs mu > 0 and finite lam > 0")
    out = np.empty(mm.size)
    _seeded_ig_fill(_as_seed(seed), mm, ll, out)
    return out.reshape(shape)


def pg_laplace(b: float, z: float, t: float) -> float:
    """E exp(-t X) for X ~ PG(b, z): cosh^b(z/2) / cosh^b(sqrt(z^2/4 + t/2))."""
    s = math.sqrt(0.25 * z * z + 0.5 * t)
    h = 0.5 * abs(z)
    # log cosh(u) = u + log1p(exp(-2u)) - log 2, stable for large u
    lc = lambda u: u + math.log1p(math.exp(-2.0 * u)) - LOG2  # noqa: E731
    return math.exp(b * (lc(h) - lc(s)))


def pg_cumulant(b: float, z: float, m: int, n_terms: int = 200000) -> float:
    """m-th cumulant of PG(b, z) from the series: b (m-1)! sum_k w_k^m (+ integral tail)."""
    k = np.arange(1, n_terms + 1, dtype=np.float64)
    c2 = z * z / (4.0 * PI2)
    w = 1.0 / (2.0 * PI2 * ((k - 0.5) ** 2 + c2))
    s = float(np.sum(w[::-1] ** m))
    # tail beyond n_terms: integral of (2 pi^2 x^2)^-m from n_terms to inf
    s += (2.0 * PI2) ** (-m) * n_terms ** (1 - 2 * m) / (2 * m - 1)
    return b * math.factorial(m - 1) * s
