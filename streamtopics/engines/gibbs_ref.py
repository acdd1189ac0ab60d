"""Plain collapsed Gibbs sampler for LDA, O(K) per token: the reference for tests and benchmarks.

Not a user-facing engine.  Each token is drawn exactly from

    p(z_i = k | rest) ∝ (n_dk + alpha) (n_wk + beta) / (n_k + V beta)     (counts ¬i)

(Griffiths & Steyvers; AliasLDA Eq. 5) by accumulating the K unnormalised masses and
inverting the CDF with one uniform number.  It uses the same token layout as the alias
engine (``alias.batch_tokens``) and the same uniform random start, so both samplers can be
compared sweep for sweep.
"""
from __future__ import annotations

import time

import numpy as np

from ..jit_cache import njit


@njit(cache=True, nogil=True)
def gibbs_sweeps(seed, tok_w, tok_ptr, z, nwk, nk, alpha, beta, n_vocab, n_sweeps, init):
    """``n_sweeps`` exact Gibbs sweeps; ``init`` draws z uniformly first (and counts it)."""
    np.random.seed(seed)
    K = nk.shape[0]
    D = tok_ptr.shape[0] - 1
    Vb = n_vocab * beta
    if init:
        for i in range(tok_w.shape[0]):
            t = int(np.random.random() * K)
            if t >= K:
                t = K - 1
            z[i] = t
            nwk[tok_w[i], t] += 1
            nk[t] += 1
    rk = np.empty(K)
    for k in range(K):
        rk[k] = 1.0 / (nk[k] + Vb)
    nd = np.zeros(K, dtype=np.int32)
    cdf = np.empty(K)
    for _ in range(n_sweeps):
        for d in range(D):
            s0 = tok_ptr[d]
            e0 = tok_ptr[d + 1]
            for i in range(s0, e0):
                nd[z[i]] += 1
            for i in range(s0, e0):
                w = tok_w[i]
                s = z[i]
                nd[s] -= 1
                nwk[w, s] -= 1
                nk[s] -= 1
                rk[s] = 1.0 / (nk[s] + Vb)
                c = 0.0
                for k in range(K):
                    c += (nd[k] + alpha) * (nwk[w, k] + beta) * rk[k]
                    cdf[k] = c
                x = np.random.random() * c
                # binary search of the CDF
                lo = 0
                hi = K - 1
                while lo < hi:
                    mid = (lo + hi) >> 1
                    if cdf[mid] > x:
                        hi = mid
                    else:
                        lo = mid + 1
                t = lo
                z[i] = t
                nd[t] += 1
                nwk[w, t] += 1
                nk[t] += 1
                rk[t] = 1.0 / (nk[t] + Vb)
            for i in range(s0, e0):
                nd[z[i]] = 0


def gibbs_fit(tok_w, tok_ptr, U: int, n_topics: int, alpha: float, beta: float, n_vocab: int, n_sweeps: int,
              seed: int = 0, callback=None, callback_every: int = 0):
    """Run the reference sampler from a uniform start; returns (n_wk (U, K) int32, n_k, z, seconds).

    ``callback(sweep, nwk, z)`` runs every ``callback_every`` sweeps, outside the clock.
    """
    K = int(n_topics)
    nwk = np.zeros((U, K), dtype=np.int32)
    nk = np.zeros(K, dtype=np.int64)
    z = np.zeros(tok_w.shape[0], dtype=np.int32)
    seeds = np.random.SeedSequence(seed).generate_state(max(n_sweeps, 1) + 1, dtype=np.uint32)
    step = callback_every if callback and callback_every > 0 else max(n_sweeps, 1)
    done = 0
    elapsed = 0.0
    first = True
    while done < n_sweeps or first:
        chunk = min(step, n_sweeps - done)
        t0 = time.perf_counter()
        gibbs_sweeps(int(seeds[done]), tok_w, tok_ptr, z, nwk, nk, float(alpha), float(beta), int(n_vocab), chunk,
                     first)
        elapsed += time.perf_counter() - t0
        done += chunk
        first = False
        if callback and chunk > 0:
            callback(done, nwk, z)
    return nwk, nk, z, elapsed


def topic_word_from_counts(nwk: np.ndarray, beta: float) -> np.ndarray:
    """phi_hat_kw = (n_wk + beta) / (n_k + V beta) as (K, U) from word-major counts (U, K)."""
    lam = nwk.T.astype(np.float64) + beta
    return lam / lam.sum(axis=1, keepdims=True)
