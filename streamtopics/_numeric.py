"""Small numba kernels shared by the engines: special functions and top-L selection."""
from __future__ import annotations

import math

import numpy as np

from .jit_cache import njit


# psi on [1, 2] as (x - x0) P(x - 1) / Q(x - 1): x0 the positive zero of psi, P and Q of degree 6 fitted
# by iteratively reweighted least squares to mpmath's psi at 4,000 Chebyshev nodes (max |error| 5e-15
# on [1, 2], Q >= 1 there). Below 1, psi(x) = psi(x + 1) - 1/x. This is where E[log phi] spends its
# time: 90 % of a batch's touched entries have lambda < 1 (20NG), and the shift to x >= 6 below costs
# a log and three divisions (10.3 -> 6.5-7.8 ns a call). bench/fit_digamma.py reproduces the coefficients.
PSI_X0 = 1.4616321449683622
PSI_P = (1.250380137503395, 0.1610550249643051, -0.3992286703007355, 0.26633527272875146, 0.18701725446703504,
         0.02014790461888657, 0.00012321523570260533)
PSI_Q = (1.0, 0.8123516641836749, -0.36579705233256266, 0.04555639903436876, 0.30654640802254574,
         0.08810092287655648, 0.005277664718559787)


@njit(cache=True, nogil=True, fastmath=False)
def digamma(x: float) -> float:
    """psi(x) for x > 0: a rational approximation below 2, else a shift to x >= 6 and the asymptotic
    series (error < 1e-12 max(1, |psi|); below 2, < 1e-14 max(1, |psi|))."""
    if x < 2.0:
        r = 0.0
        if x < 1.0:
            r = -1.0 / x
            x += 1.0
        t = x - 1.0
        p = PSI_P[6]
        q = PSI_Q[6]
        for i in range(5, -1, -1):
            p = p * t + PSI_P[i]
            q = q * t + PSI_Q[i]
        return r + (x - PSI_X0) * (p / q)
    if x < 6.0:
        # psi(x) = psi(x + 6) - sum_{i<6} 1/(x + i); the sum is Q'(x)/Q(x) for Q = prod (x + i),
        # one division instead of six (this runs ~10^6 times per minibatch).
        q = 1.0
        dq = 0.0
        for i in range(6):
            dq = dq * (x + i) + q
            q = q * (x + i)
        r = -dq / q
        x += 6.0
    else:
        r = 0.0
    f = 1.0 / (x * x)
    t = f * (-1.0 / 12 + f * (1.0 / 120 + f * (-1.0 / 252 + f * (1.0 / 240 + f * (-1.0 / 132
             + f * (691.0 / 32760 + f * (-1.0 / 12)))))))
    return r + math.log(x) - 0.5 / x + t


@njit(cache=True, nogil=True)
def lgamma(x: float) -> float:
    return math.lgamma(x)


@njit(cache=True, nogil=True)
def select_top(vals: np.ndarray, idx: np.ndarray, n: int, L: int) -> None:
    """Make ``vals[:L]`` (and ``idx`` alongside) the L largest of ``vals[:n]``; later entries are scratch.

    SelectTopL of Hughes & Sudderth (Alg. 1, App. F): a selection in O(n), not a sort.
    For L much smaller than n a single scan that compares each value with the current
    L-th best wins: that branch is almost never taken, so it predicts well, and the
    expected number of insertions into the sorted top-L prefix is only L ln(n/L).
    Otherwise a quickselect partitions in place.
    """
    if L >= n:
        return
    if 4 * L <= n:
        n = _block_prefilter(vals, idx, n, L)
        if L >= n:
            return
        if 4 * L <= n:
            _scan_top(vals, idx, n, L)
            return
    _quickselect_top(vals, idx, n, L)


@njit(cache=True, nogil=True)
def _block_prefilter(vals, idx, n, L):
    """Keep only values that can be in the top L; returns how many were kept (>= L).

    Split into about 2L blocks: their maxima are distinct elements, so the L-th largest
    block maximum tau is <= the L-th largest value.  Block maxima are branch-free and
    the keep test ``v >= tau`` is almost always false, so both passes run at streaming
    speed; typically only a little more than L values survive.
    """
    nb = 2 * L
    bs = (n + nb - 1) // nb
    nb = (n + bs - 1) // bs
    bmax = np.empty(nb)
    for b in range(nb):
        lo = b * bs
        hi = min(n, lo + bs)
        m = vals[lo]
        for i in range(lo + 1, hi):
            m = max(m, vals[i])
        bmax[b] = m
    # tau = L-th largest of the block maxima (nb <= 2L + 1 values: insertion is cheap).
    for i in range(1, nb):
        x = bmax[i]
        j = i
        while j > 0 and bmax[j - 1] < x:
            bmax[j] = bmax[j - 1]
            j -= 1
        bmax[j] = x
    tau = bmax[L - 1] if L <= nb else -np.inf
    c = 0
    for i in range(n):
        v = vals[i]
        if v >= tau:
            vals[c] = v
            idx[c] = idx[i]
            c += 1
    return c


@njit(cache=True, nogil=True)
def _scan_top(vals, idx, n, L):
    # vals[:L] sorted descending, then every later value challenges the current minimum vals[L-1].
    for i in range(1, L):
        x = vals[i]
        xi = idx[i]
        j = i
        while j > 0 and vals[j - 1] < x:
            vals[j] = vals[j - 1]
            idx[j] = idx[j - 1]
            j -= 1
        vals[j] = x
        idx[j] = xi
    floor = vals[L - 1]
    for i in range(L, n):
        x = vals[i]
        if x > floor:
            xi = idx[i]
            j = L - 1
            while j > 0 and vals[j - 1] < x:
                vals[j] = vals[j - 1]
                idx[j] = idx[j - 1]
                j -= 1
            vals[j] = x
            idx[j] = xi
            floor = vals[L - 1]


@njit(cache=True, nogil=True)
def _quickselect_top(vals, idx, n, L):
    """Hoare-partition quickselect with a median-of-three pivot (expected O(n))."""
    lo = 0
    hi = n - 1
    t = L - 1
    while lo < hi:
        mid = (lo + hi) >> 1
        a = vals[lo]
        b = vals[mid]
        c = vals[hi]
        if a < b:
            if b < c:
                pivot = b
            elif a < c:
                pivot = c
            else:
                pivot = a
        else:
            if a < c:
                pivot = a
            elif b < c:
                pivot = c
            else:
                pivot = b
        i = lo
        j = hi
        while i <= j:
            while vals[i] > pivot:
                i += 1
            while vals[j] < pivot:
                j -= 1
            if i <= j:
                tv = vals[i]
                vals[i] = vals[j]
                vals[j] = tv
                ti = idx[i]
                idx[i] = idx[j]
                idx[j] = ti
                i += 1
                j -= 1
        if t <= j:
            hi = j
        elif t >= i:
            lo = i
        else:
            return


@njit(cache=True, nogil=True)
def log_sum_exp_rows(x: np.ndarray) -> np.ndarray:
    out = np.empty(x.shape[0])
    for i in range(x.shape[0]):
        m = -np.inf
        for k in range(x.shape[1]):
            if x[i, k] > m:
                m = x[i, k]
        s = 0.0
        for k in range(x.shape[1]):
            s += math.exp(x[i, k] - m)
        out[i] = m + math.log(s)
    return out
