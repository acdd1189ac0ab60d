"""Empirical-Bayes learning of the symmetric document-topic concentration alpha, online.

With ``alpha="auto"`` the model maximises the ELBO over alpha as well (Blei et al. 2003,
App. A.4.2; the online form is gensim's ``alpha='auto'``, Hoffman et al. 2010 §3.3): the
alpha-dependent part of the ELBO of a batch of M documents is

    f(alpha) = M [log Gamma(K alpha) - K log Gamma(alpha)] + (alpha - 1) sum_dk E[log pi_dk],
    E[log pi_dk] = psi(alpha + N_dk) - psi(K alpha + N_d),

whose Newton step is  -f'/f''  with
    f'  = M K [psi(K alpha) - psi(alpha)] + sum_dk E[log pi_dk],
    f'' = M K [K psi'(K alpha) - psi'(alpha)]   (< 0: f is concave in alpha).

The stochastic version takes a fraction rho_t of that step per minibatch, the same step
size as the topics' update, so alpha converges with them.  The step is taken on log alpha
(alpha stays positive) and bounded to a factor of two per batch, which only matters in
the first few batches.
"""
from __future__ import annotations

import math

import numpy as np

from ._numeric import digamma
from .jit_cache import njit

ALPHA_MIN = 1e-4
ALPHA_MAX = 10.0


@njit(cache=True, nogil=True)
def trigamma(x: float) -> float:
    """psi'(x) for x > 0: shift to x >= 6, then the asymptotic series."""
    r = 0.0
    while x < 6.0:
        r += 1.0 / (x * x)
        x += 1.0
    f = 1.0 / (x * x)
    return r + 1.0 / x + f / 2.0 + f / x * (1.0 / 6 + f * (-1.0 / 30 + f * (1.0 / 42 + f * (-1.0 / 30))))


@njit(cache=True, nogil=True)
def alpha_gradient(doc_topic, alpha):
    """(f', f'') of the alpha objective above over the documents with at least one token."""
    M, K = doc_topic.shape
    s = 0.0
    m = 0
    for d in range(M):
        nd = 0.0
        for k in range(K):
            nd += doc_topic[d, k]
        if nd <= 0.0:
            continue
        m += 1
        psi_a = digamma(alpha)
        for k in range(K):
            x = doc_topic[d, k]
            s += psi_a if x == 0.0 else digamma(alpha + x)
        s -= K * digamma(K * alpha + nd)
    g = m * K * (digamma(K * alpha) - digamma(alpha)) + s
    h = m * K * (K * trigamma(K * alpha) - trigamma(alpha))
    return g, h


def alpha_step(alpha: float, doc_topic: np.ndarray, rho: float) -> float:
    """alpha after a fraction ``rho`` of the Newton step on this batch's documents."""
    g, h = alpha_gradient(np.ascontiguousarray(doc_topic, dtype=np.float64), float(alpha))
    if h >= 0.0 or not math.isfinite(g) or not math.isfinite(h):
        return alpha
    # Newton on log alpha: d f / d log a = a f', d2 f / d log a^2 = a^2 f'' + a f'.
    hl = alpha * alpha * h + alpha * g
    step = -(alpha * g) / hl if hl < 0.0 else (math.log(2.0) if g > 0 else -math.log(2.0))
    step = max(-math.log(2.0), min(math.log(2.0), step))
    return float(min(ALPHA_MAX, max(ALPHA_MIN, alpha * math.exp(rho * step))))
