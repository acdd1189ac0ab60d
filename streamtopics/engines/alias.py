"""Alias-MH local step: Metropolis-Hastings-Walker sampling with amortized O(1) cost per token.

References: Li, Ahmed, Ravi, Smola, "Reducing the sampling complexity of topic models"
(AliasLDA, KDD'14, §3-4) and Zheng/Chen/Zhu, "Linear time samplers for supervised topic
models" (Light-MedLDA, §2.3, §3.3), whose doc/word proposal split is LightLDA's.

Target (one token i of document d, word w; every count excludes the token itself, "¬i"):

    p(z_i = k | rest) ∝ (n_dk + alpha) (g_wk + n_wk) / (G_k + n_k)          (AliasLDA Eq. 5)

* batch mode (``fit``): g_wk = beta, G_k = V beta, n = the corpus' integer counts:
  exactly the collapsed Gibbs conditional (Light-MedLDA Eq. 11).
* streaming (``AliasEngine.infer``): g_wk = lambda_kw and G_k = sum_v lambda_kv, the
  global variational parameter (lambda = beta + expected counts, fixed during the
  minibatch), and n = the minibatch's own integer counts, maintained incrementally.
  This is the collapsed conditional of LDA whose topics have the prior
  phi_k ~ Dir(lambda_k) ("what we knew before this batch"); the Dirichlet-multinomial
  integrates phi out for the batch tokens exactly as in the batch sampler, so the same
  kernel runs both modes.  The averaged batch counts are the sufficient statistics the
  stochastic / memoized updates blend into lambda, as for the variational engine.

Proposals (independent Metropolis-Hastings, Light-MedLDA Eq. 1):

* word proposal q_w(k) ∝ (g_wk + n~_wk) / (G_k + n~_k) with counts n~ frozen when word w's
  Walker alias table was built in O(K) (AliasLDA §3.1, §4 q_w).  As AliasLDA §4 suggests,
  the table is used at once to draw ``table_draws`` (default K) samples and discarded;
  the samples, the build-time counts n~_wk and the weights q~_wk (float32) are kept.
  When a token needs more samples than are left, the table is rebuilt from the current
  counts (``alias_rebuilds``), so each table serves ~K draws: amortized O(1).
* The table a token sees usually contains that token's *own* assignment from build time;
  a proposal built from it depends on the current state (for a word seen once, most of
  the table's mass is that one token's topic) and biases the chain - measurably on the
  tiny exact model in the tests.  So token i uses the table with its own build-time
  contribution removed (numerator and denominator),
      q_i(k) = q~(k) for k != b,  q_i(b) = (n~_wb - 1 + g) / (G_b + n~_b - 1)   (b: its topic then),
  which is <= q~ pointwise and is drawn exactly by redrawing a draw of b with probability
  1 - q_i(b)/q~(b) (rejection).  Acceptance s -> t (Light-MedLDA's A_w, AliasLDA §4):
      A = min(1, [(n_dt+a)(g_wt+n_wt)/(G_t+n_t) q_i(s)] / [(n_ds+a)(g_ws+n_ws)/(G_s+n_s) q_i(t)]).
* doc proposal q_d(k) ∝ n_dk + alpha (¬i): with probability (N_d-1)/(N_d-1+K alpha) the
  topic of a uniformly random *other* token of the document, else a uniform topic (the
  alpha part: alpha is symmetric, so the shared table is the uniform one); both choices
  come from one uniform number.  Acceptance (n_dk cancels, Light-MedLDA §3.3):
      A = min(1, [(g_wt+n_wt)/(G_t+n_t)] / [(g_ws+n_ws)/(G_s+n_s)]).
* ``mh_steps`` MH steps per token and sweep (default 2).  As in LightLDA a step is one word
  and one doc proposal with ``proposal="cycle"``; with ``"mixture"`` it is two proposals,
  each the word or the doc one with probability 1/2.  Both compositions keep p stationary
  (Light-MedLDA Theorem 1).

Exactness: each MH step uses the exact target and the exact density of the proposal it
draws from, so for any proposal fixed in advance the conditional p is invariant whatever
the proposal's staleness (tests: a deliberately wrong, never rebuilt table reproduces the
exact conditional and the exact joint posterior of a tiny model).  What no stale-table
sampler removes is the weak dependence of a table on *other* tokens' past topics, which
are correlated with the current state; with the token's own contribution excluded it is
below what 6000 independent chains resolve on a 5-token model (and ~1/(n_k + V beta) on
real corpora).

Layout: all per-word arrays are flat.  Entry (w, k) is [n_wk, n~_wk, q~_wk] (int32, int32,
float32 bits; one cache line serves the target and the proposal of a topic); document
counts are a dense K-vector scratch filled from the document's assignments and cleared
after it (the per-document state is just z); 1/(G_k + n_k) is kept per topic.  All
proposals of a token are drawn before any is judged (they do not depend on its state) so
their cache misses overlap, and the next tokens' rows are prefetched.

Randomness: each call draws one seed (from the model's ``numpy.random.Generator`` via
``seed_source``) and seeds the kernel's own generator with it (an explicit SplitMix64 state
rather than numba's global np.random, which costs ~9x more per draw), so a run is a function
of the model seed and the call sequence, and snapshots (which save the Generator) resume it.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..summary import LocalResult, Summary

PROPOSALS = ("cycle", "mixture")
ALPHA_PROPOSALS = ("word", "uniform")

# Slots of the statistics vector the kernels fill.
_S_WORD_PROP, _S_WORD_ACC, _S_DOC_PROP, _S_DOC_ACC, _S_REBUILDS, _S_CHANGED = range(6)


# --------------------------------------------------------------------------------------------
# Random numbers: SplitMix64 (Steele, Lea & Flood 2014), one uint64 of state per kernel call.
# numba's np.random.random() costs ~18 ns a call here against ~2 ns for this inline stream,
# which matters at ~5 uniforms per token; the state is explicit, so kernels are thread-safe.
# --------------------------------------------------------------------------------------------
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_TO_UNIT = 1.0 / 9007199254740992.0  # 2^-53


@njit(cache=True, nogil=True, inline="always")
def _next(x):
    """Advance the SplitMix64 state x; returns (new state, uniform double in [0, 1)).

    Scalars only, inlined at the numba IR level: the hot loops keep the state in a register
    (a call taking an array would pass it as a struct on the stack each time).
    """
    x = x + _GOLDEN
    y = (x ^ (x >> np.uint64(30))) * _MIX1
    y = (y ^ (y >> np.uint64(27))) * _MIX2
    y = y ^ (y >> np.uint64(31))
    return x, (y >> np.uint64(11)) * _TO_UNIT


def _rng_state(seed: int) -> np.uint64:
    # Spread the seed once through SeedSequence so nearby seeds give unrelated streams.
    return np.random.SeedSequence(int(seed) & ((1 << 64) - 1)).generate_state(1, dtype=np.uint64)[0]


# --------------------------------------------------------------------------------------------
# Walker alias tables (Vose's O(K) construction; AliasLDA §3.1 GenerateAlias / SampleAlias)
# --------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def alias_build(w, prob, alias, small, large):
    """Fill (prob, alias) so that bin j yields j w.p. prob[j], else alias[j]; O(K).

    Vose's construction; the first split into short and tall bins is branch-free (a coin
    flip for the branch predictor): indices go to both stacks, one stack pointer advances.
    """
    K = w.shape[0]
    total = 0.0
    for k in range(K):
        total += w[k]
    scale = K / total
    ns = 0
    nl = 0
    for k in range(K):
        p = w[k] * scale
        prob[k] = p
        alias[k] = k
        short = p < 1.0
        small[ns] = k
        large[nl] = k
        ns += short
        nl += 1 - short
    while ns > 0 and nl > 0:
        ns -= 1
        s = small[ns]
        l = large[nl - 1]
        alias[s] = l
        pl = prob[l] + prob[s] - 1.0  # l gives bin s the mass it lacks (Robin Hood)
        prob[l] = pl
        if pl < 1.0:
            nl -= 1
            small[ns] = l
            ns += 1
    # Leftovers are 1 up to rounding.
    for a in range(nl):
        prob[large[a]] = 1.0
    for a in range(ns):
        prob[small[a]] = 1.0


@njit(cache=True, nogil=True)
def _alias_fill(prob, alias, out, lo, n, rs):
    """out[lo:lo+n] = draws from a built table (SampleAlias): one uniform picks the bin and, by
    its fractional part, the bin's biased coin (a select, not a branch).  Returns the state."""
    K = prob.shape[0]
    for i in range(lo, lo + n):
        rs, x = _next(rs)
        x *= K
        j = min(int(x), K - 1)
        other = alias[j]
        out[i] = j if x - j < prob[j] else other
    return rs


@njit(cache=True, nogil=True)
def _alias_sample(weights, n, rs):
    K = weights.shape[0]
    prob = np.empty(K)
    alias = np.empty(K, dtype=np.int32)
    small = np.empty(K, dtype=np.int32)
    large = np.empty(K, dtype=np.int32)
    alias_build(weights.astype(np.float64), prob, alias, small, large)
    out = np.empty(n, dtype=np.int64)
    _alias_fill(prob, alias, out, 0, n, rs)
    return out


def alias_sample(weights, n: int, seed: int) -> np.ndarray:
    """n draws from the distribution ∝ weights through one Walker table (for tests and callers)."""
    return _alias_sample(np.asarray(weights, dtype=np.float64), int(n), _rng_state(seed))


@intrinsic
def _prefetch(typingctx, arr, idx):
    """Hint the cache line holding arr[idx] (1-D array) into all cache levels (llvm.prefetch)."""
    if not isinstance(arr, types.Array) or arr.ndim != 1 or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, i32, i32, i32]),
                                            "llvm.prefetch.p0")
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return types.void(arr, idx), codegen


# --------------------------------------------------------------------------------------------
# The sampler.  All per-word arrays are flat: entry (u, k) of the counts lives at
# nq[3 (u K + k) + 0..2] = [n_wk, n~_wk, q~_wk as float32 bits] (one cache line serves the
# target and the proposal of a topic), word u's pre-drawn samples at samples[u T : u T + T].
# --------------------------------------------------------------------------------------------
@njit(cache=True, nogil=True)
def _rebuild(u, x, K, nq, qt, zt, samples, ptr, ver, G, dense_prior, beta, nk, Gk, rk, wbuf, prob, alias, small,
             large, rs):
    """Word u's proposal from the current counts, q~_wk = (g_wk + n_wk) / (G_k + n_k), O(K).

    ``x`` >= 0 is the topic of a token under update that is still counted: it is left out,
    so the table is built from its ¬i counts.  Returns the new random state.
    """
    base = u * K
    total = 0.0
    for k in range(K):
        e = 3 * (base + k)
        g = G[base + k] if dense_prior else beta
        c = nq[e]
        r = rk[k]
        if k == x:
            c -= 1
            r = 1.0 / (Gk[k] + nk[k] - 1)
        nq[e + 1] = c  # n~_wk: the counts this table was built from
        w = np.float32((g + c) * r)
        qt[e + 2] = w
        wbuf[k] = w  # the table samples exactly the stored float32 weights
        total += wbuf[k]
    zt[u] = total
    alias_build(wbuf, prob, alias, small, large)
    T = samples.shape[0] // ptr.shape[0]
    rs = _alias_fill(prob, alias, samples, u * T, T, rs)
    ptr[u] = 0
    ver[u] += 1
    return rs


@njit(cache=True, nogil=True)
def _refill(u, K, qt, samples, ptr, wbuf, prob, alias, small, large, rs):
    """More samples from the *same* stored weights (a rejection loop ran past the buffer)."""
    for k in range(K):
        wbuf[k] = qt[3 * (u * K + k) + 2]
    alias_build(wbuf, prob, alias, small, large)
    T = samples.shape[0] // ptr.shape[0]
    rs = _alias_fill(prob, alias, samples, u * T, T, rs)
    ptr[u] = 0
    return rs


@njit(cache=True, nogil=True, inline="always")
def _self_factor(q_b, c_b, g):
    """q_i(b) / q~(b) when token i was counted at topic b in the table (always <= 1).

    q~(b) = (c + g) r with r = 1/(G_b + n~_b); without the token: (c - 1 + g) / (1/r - 1),
    and c + g <= G_b + n~_b makes the ratio <= 1.
    """
    x = c_b + g
    y = x / q_b  # = G_b + n~_b at the build
    return (x - 1.0) / x * (y / (y - 1.0))


@njit(cache=True, nogil=True)
def mh_sweeps(rs, tok_w, tok_ptr, z, tver, tb, nq, qt, zt, nk, Gk, G, dense_prior, beta, alpha, samples, ptr, ver,
              n_sweeps, mh_steps, mixture, word_prior, init, record_from, z_rec, doc_acc):
    """Run ``n_sweeps`` sweeps of Alias-MH over the documents; returns the statistics vector.

    rs: uint64 random state (SplitMix64).  tok_w (N,) int32 batch-local word of each token,
    documents contiguous (tok_ptr (D+1,)); z (N,) int32 assignments.  nq (3 U K,) int32 flat
    [n_wk, n~_wk, q~_wk] entries and qt, the same memory as float32; nk (K,) int64; Gk (K,)
    prior totals; G (U K,) prior pseudo-counts if ``dense_prior`` else ``beta``.  samples
    (U T,) pre-drawn draws of each word's table, read pointers ptr (U,) (ptr == T: rebuild
    before the token's next word proposal); ver (U,) table versions.

    tver/tb (N,) remember, per token, the version of its word's table it last saw and its
    own topic when that table was built (-1: not counted in it).  The word proposal used for
    token i is that table *without token i's own contribution*,

        q_i(k) ∝ (n~_wk - [k = b] + g_wk) / (G_k + n~_k - [k = b])   (AliasLDA §4 q_w, ¬i),

    which is <= q~ pointwise: a draw of b is kept with probability q_i(b)/q~(b), otherwise
    redrawn (exact rejection sampling).  With the token's own assignment left in, the
    proposal would depend on the current state (for a word seen once, the table is mostly
    that one token's topic) and the chain would be biased.

    Speed: the 2 mh_steps proposals of a token do not depend on its state, so all are drawn
    first and their count lines loaded before any accept/reject branch (the loads overlap);
    the next tokens' rows are prefetched ahead of those hard-to-predict branches; a token
    whose topic does not change is never removed and re-added (its ¬i counts are formed on
    the fly).

    ``init`` 0: z is given and already counted; 1: uniform random z; 2: z drawn from each
    word's proposal.  Sweeps >= ``record_from`` store z in z_rec[sweep - record_from] and
    add the document counts to doc_acc (D, K) when doc_acc has D rows.
    """
    K = nk.shape[0]
    D = tok_ptr.shape[0] - 1
    U = ptr.shape[0]
    T = samples.shape[0] // U if U > 0 else 1
    N = tok_w.shape[0]
    stats = np.zeros(6, dtype=np.int64)
    rk = np.empty(K)
    wbuf = np.empty(K)
    prob = np.empty(K)
    alias = np.empty(K, dtype=np.int32)
    small = np.empty(K, dtype=np.int32)
    large = np.empty(K, dtype=np.int32)
    nd = np.zeros(K, dtype=np.int32)
    P = 2 * mh_steps
    p_t = np.zeros(P, dtype=np.int64)
    p_word = np.zeros(P, dtype=np.bool_)
    p_b = np.zeros(P)
    p_a = np.zeros(P)
    Ka = K * alpha
    inv_alpha = 1.0 / alpha
    record_docs = doc_acc.shape[0] == D and D > 0
    for k in range(K):
        rk[k] = 1.0 / (Gk[k] + nk[k])

    if init > 0:
        for i in range(N):
            u = tok_w[i]
            if init == 1:
                rs, x = _next(rs)
                t = int(x * K)
                if t >= K:
                    t = K - 1
            else:
                if ptr[u] >= T:
                    rs = _rebuild(u, -1, K, nq, qt, zt, samples, ptr, ver, G, dense_prior, beta, nk, Gk, rk, wbuf,
                                  prob, alias, small, large, rs)
                    stats[_S_REBUILDS] += 1
                t = np.int64(samples[u * T + ptr[u]])
                ptr[u] += 1
            z[i] = t
            nq[3 * (u * K + t)] += 1
            nk[t] += 1
            rk[t] = 1.0 / (Gk[t] + nk[t])
            # Counted after the current table was built: not part of it.
            tver[i] = ver[u]
            tb[i] = -1

    for p in range(P):
        p_word[p] = (p & 1) == 0  # cycle: word, doc, word, doc, ...
    n_wp = 0
    n_wa = 0
    n_dp = 0
    n_da = 0
    n_changed = 0
    for sweep in range(n_sweeps):
        for d in range(D):
            s0 = tok_ptr[d]
            e0 = tok_ptr[d + 1]
            if e0 == s0:
                continue
            others = e0 - s0 - 1  # tokens of d other than the current one
            d_mass = others + Ka
            for i in range(s0, e0):
                nd[z[i]] += 1
            for i in range(s0, e0):
                # Prefetch: token i+2's count line and sample buffer, token i+1's first word
                # proposal (its sample buffer was prefetched one token ago).
                if i + 2 < N:
                    u2 = tok_w[i + 2]
                    _prefetch(nq, 3 * (u2 * K + z[i + 2]))
                    _prefetch(samples, u2 * T + min(ptr[u2], T - 1))
                if i + 1 < N:
                    u1 = tok_w[i + 1]
                    p1 = ptr[u1]
                    if p1 < T:
                        _prefetch(nq, 3 * (u1 * K + samples[u1 * T + p1]))
                u = tok_w[i]
                s = np.int64(z[i])
                ub = u * K
                if tver[i] != ver[u]:
                    # Rebuilt after this token's last update, so it was counted there at s.
                    tver[i] = ver[u]
                    tb[i] = s
                if mixture:
                    n_word = 0
                    for p in range(P):
                        rs, x = _next(rs)
                        p_word[p] = x < 0.5
                        n_word += p_word[p]
                else:
                    n_word = mh_steps
                # table draws this token may need (doc proposals draw their alpha part from it too)
                n_draw = P if word_prior else n_word
                b = np.int64(-1)
                fb = 1.0
                z_i = 1.0
                if n_draw > 0:
                    if ptr[u] + n_draw > T:
                        # Samples left cannot serve this token: rebuild from fresh counts.
                        rs = _rebuild(u, s, K, nq, qt, zt, samples, ptr, ver, G, dense_prior, beta, nk, Gk, rk,
                                      wbuf, prob, alias, small, large, rs)
                        stats[_S_REBUILDS] += 1
                        tver[i] = ver[u]
                        tb[i] = -1  # built from ¬i counts
                    b = np.int64(tb[i])
                    z_i = zt[u]
                    if b >= 0:
                        eb = 3 * (ub + b)
                        fb = _self_factor(qt[eb + 2], nq[eb + 1], G[ub + b] if dense_prior else beta)
                        z_i -= qt[eb + 2] * (1.0 - fb)  # total mass of q_i
                ka_z = Ka / z_i  # alpha part of the doc proposal: K alpha q_i(k) / Z_i
                # Draw every proposal of the token (none depends on its state).
                for p in range(P):
                    from_table = p_word[p]
                    if not from_table:
                        # doc: q_d ∝ n_dk(¬i) + (alpha part): a random other token's topic, or
                        # for the alpha part a uniform topic / a draw from the word's table
                        rs, x = _next(rs)
                        x *= d_mass
                        if x < others:
                            j = s0 + int(x)
                            if j >= i:
                                j += 1
                            t = np.int64(z[j])
                        elif word_prior:
                            from_table = True
                        else:
                            t = int((x - others) * inv_alpha)
                            if t >= K:
                                t = K - 1
                    if from_table:
                        # a draw from q_i: the table's draws, a draw of b kept w.p. fb
                        while True:
                            if ptr[u] >= T:
                                rs = _refill(u, K, qt, samples, ptr, wbuf, prob, alias, small, large, rs)
                            t = np.int64(samples[u * T + ptr[u]])
                            ptr[u] += 1
                            if t != b:
                                break
                            rs, x = _next(rs)
                            if x < fb:
                                break
                    p_t[p] = t
                # ¬i factors of the starting topic s (the token stays counted unless it moves)
                es = 3 * (ub + s)
                g_s = G[ub + s] if dense_prior else beta
                b_s = (g_s + nq[es] - 1) / (Gk[s] + nk[s] - 1)
                a_s = nd[s] - 1 + alpha
                # Fetch every candidate's factors before any accept/reject branch.
                for p in range(P):
                    t = p_t[p]
                    if t == s:
                        p_b[p] = b_s
                        p_a[p] = a_s
                    else:
                        p_b[p] = ((G[ub + t] if dense_prior else beta) + nq[3 * (ub + t)]) * rk[t]
                        p_a[p] = nd[t] + alpha
                cur = s
                b_cur = b_s
                a_cur = a_s
                for p in range(P):
                    t = p_t[p]
                    b_t = p_b[p]
                    if p_word[p]:
                        n_wp += 1
                        if t == cur:
                            n_wa += 1
                            continue
                        a_t = p_a[p]
                        # q_i at t and at the current state (stale weights, token i excluded)
                        q_t = qt[3 * (ub + t) + 2] * (fb if t == b else 1.0)
                        q_c = qt[3 * (ub + cur) + 2] * (fb if cur == b else 1.0)
                        # A_w = p(t) q_i(cur) / (p(cur) q_i(t))
                        num = a_t * b_t * q_c
                        den = a_cur * b_cur * q_t
                        if num < den:
                            rs, x = _next(rs)
                            if x * den >= num:
                                continue
                        n_wa += 1
                    else:
                        n_dp += 1
                        if t == cur:
                            n_da += 1
                            continue
                        if word_prior:
                            # q_d(k) ∝ n_dk + K alpha q_i(k) / Z_i; A_d = p(t) q_d(cur) / (p(cur) q_d(t))
                            a_t_ = p_a[p]
                            qd_t = a_t_ - alpha + ka_z * qt[3 * (ub + t) + 2] * (fb if t == b else 1.0)
                            qd_c = a_cur - alpha + ka_z * qt[3 * (ub + cur) + 2] * (fb if cur == b else 1.0)
                            num = a_t_ * b_t * qd_c
                            den = a_cur * b_cur * qd_t
                            if num < den:
                                rs, x = _next(rs)
                                if x * den >= num:
                                    continue
                        # uniform alpha part: (n_dk + alpha) cancels against the proposal
                        elif b_t < b_cur:
                            rs, x = _next(rs)
                            if x * b_cur >= b_t:
                                continue
                        n_da += 1
                    cur = t
                    b_cur = b_t
                    a_cur = p_a[p]
                if cur != s:
                    z[i] = cur
                    nd[s] -= 1
                    nq[es] -= 1
                    nk[s] -= 1
                    rk[s] = 1.0 / (Gk[s] + nk[s])
                    nd[cur] += 1
                    nq[3 * (ub + cur)] += 1
                    nk[cur] += 1
                    rk[cur] = 1.0 / (Gk[cur] + nk[cur])
                    n_changed += 1
            if sweep >= record_from and record_docs:
                for i in range(s0, e0):
                    doc_acc[d, z[i]] += 1.0
            for i in range(s0, e0):
                nd[z[i]] = 0
        if sweep >= record_from and z_rec.shape[0] > sweep - record_from:
            z_rec[sweep - record_from, :] = z
    stats[_S_WORD_PROP] = n_wp
    stats[_S_WORD_ACC] = n_wa
    stats[_S_DOC_PROP] = n_dp
    stats[_S_DOC_ACC] = n_da
    stats[_S_CHANGED] = n_changed
    return stats


@njit(cache=True, nogil=True)
def _word_loglik(tok_w, z, nq, nk, Gk, G, dense_prior, beta):
    """sum_i log phi_hat(w_i | z_i) at the current counts (a cheap per-batch fit score)."""
    K = nk.shape[0]
    total = 0.0
    for i in range(tok_w.shape[0]):
        e = tok_w[i] * K + z[i]
        g = G[e] if dense_prior else beta
        total += math.log((g + nq[3 * e]) / (Gk[z[i]] + nk[z[i]]))
    return total


# --------------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------------
def batch_tokens(batch) -> tuple[np.ndarray, np.ndarray]:
    """Expand a CSR batch into tokens: (batch-local word of each token, token offsets per document)."""
    cnt = np.rint(batch.counts)
    if cnt.size and not np.allclose(cnt, batch.counts, rtol=0, atol=1e-9):
        raise ValueError("the alias engine samples tokens: batch counts must be whole numbers")
    cnt = cnt.astype(np.int64)
    if cnt.size and cnt.min() < 0:
        raise ValueError("negative word count in batch")
    tok_w = np.repeat(batch.local.astype(np.int32), cnt)
    per_doc = np.zeros(batch.n_docs, dtype=np.int64)
    if cnt.size:
        doc_of = np.repeat(np.arange(batch.n_docs), np.diff(batch.doc_ptr))
        per_doc = np.bincount(doc_of, weights=cnt, minlength=batch.n_docs).astype(np.int64)
    tok_ptr = np.zeros(batch.n_docs + 1, dtype=np.int64)
    np.cumsum(per_doc, out=tok_ptr[1:])
    return tok_w, tok_ptr


def _sample_dtype(K: int):
    return np.uint16 if K <= np.iinfo(np.uint16).max else np.int32


@dataclass
class SamplerArrays:
    """Everything one sampler run keeps between kernel calls (U word types, N tokens, K topics)."""

    nq: np.ndarray        # (U, K, 3) int32: [..., 0] = n_wk, [..., 1] = n~_wk, [..., 2] = q~_wk (float32 bits)
    qt: np.ndarray        # float32 view of nq
    nk: np.ndarray        # (K,) int64
    samples: np.ndarray   # (U, T) pre-drawn word-proposal samples
    ptr: np.ndarray       # (U,) int32 next unread sample (T = exhausted)
    ver: np.ndarray       # (U,) int64 table version
    zt: np.ndarray        # (U,) float64 total weight of each table
    z: np.ndarray         # (N,) int32
    tver: np.ndarray      # (N,) int64
    tb: np.ndarray        # (N,) int32

    @classmethod
    def allocate(cls, U: int, N: int, K: int, table_draws: int) -> "SamplerArrays":
        T = max(int(table_draws), 1)
        nq = np.zeros((U, K, 3), dtype=np.int32)
        return cls(nq=nq, qt=nq.view(np.float32), nk=np.zeros(K, dtype=np.int64),
                   samples=np.zeros((U, T), dtype=_sample_dtype(K)), ptr=np.full(U, T, dtype=np.int32),
                   ver=np.zeros(U, dtype=np.int64), zt=np.ones(U), z=np.zeros(N, dtype=np.int32),
                   tver=np.zeros(N, dtype=np.int64), tb=np.full(N, -1, dtype=np.int32))

    def counts(self) -> np.ndarray:
        """n_wk as a (U, K) int32 view."""
        return self.nq[:, :, 0]

    def run(self, seed, tok_w, tok_ptr, Gk, G, dense_prior, beta, alpha, n_sweeps, mh_steps, mixture, init,
            record_from=None, z_rec=None, doc_acc=None, word_prior=False) -> np.ndarray:
        K = self.nk.shape[0]
        return mh_sweeps(_rng_state(seed), tok_w, tok_ptr, self.z, self.tver, self.tb, self.nq.reshape(-1),
                         self.qt.reshape(-1), self.zt, self.nk, Gk, np.ascontiguousarray(G).reshape(-1),
                         bool(dense_prior), float(beta), float(alpha), self.samples.reshape(-1), self.ptr, self.ver,
                         int(n_sweeps), int(mh_steps), bool(mixture), bool(word_prior), int(init),
                         n_sweeps if record_from is None else int(record_from),
                         np.zeros((0, 0), dtype=np.int32) if z_rec is None else z_rec,
                         np.zeros((0, K)) if doc_acc is None else doc_acc)


def _acceptance(stats: np.ndarray) -> dict:
    return {
        "word": float(stats[_S_WORD_ACC] / stats[_S_WORD_PROP]) if stats[_S_WORD_PROP] else float("nan"),
        "doc": float(stats[_S_DOC_ACC] / stats[_S_DOC_PROP]) if stats[_S_DOC_PROP] else float("nan"),
    }


def run_batch_sampler(tok_w, tok_ptr, U: int, n_topics: int, alpha: float, beta: float, n_vocab: int,
                      n_sweeps: int, seed: int, mh_steps: int = 2, proposal: str = "cycle",
                      table_draws: int | None = None, callback: Callable | None = None,
                      callback_every: int = 0, alpha_proposal: str = "word") -> tuple[SamplerArrays, dict]:
    """Batch mode: collapsed LDA over tokens held in memory (g = beta, G_k = V beta), uniform start.

    Returns the sampler arrays (final counts and z) and stats including ``sampling_seconds``
    (kernel time: allocation and token expansion excluded).  ``callback(sweep, arrays)``
    runs every ``callback_every`` sweeps, outside the clock.
    """
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS} (got {proposal!r})")
    if alpha_proposal not in ALPHA_PROPOSALS:
        raise ValueError(f"alpha_proposal must be one of {ALPHA_PROPOSALS} (got {alpha_proposal!r})")
    K = int(n_topics)
    T = K if table_draws is None else int(table_draws)
    arr = SamplerArrays.allocate(U, tok_w.shape[0], K, T)
    Gk = np.full(K, n_vocab * beta)
    G = np.zeros((1, 1))
    seeds = np.random.SeedSequence(seed).generate_state(max(n_sweeps, 1) + 1, dtype=np.uint32)
    total = np.zeros(6, dtype=np.int64)
    elapsed = 0.0
    done = 0
    step = callback_every if callback and callback_every > 0 else n_sweeps
    first = True
    while done < n_sweeps or first:
        chunk = min(step, n_sweeps - done)
        t0 = time.perf_counter()
        total += arr.run(seeds[done], tok_w, tok_ptr, Gk, G, False, beta, alpha, chunk, mh_steps,
                         proposal == "mixture", 1 if first else 0, word_prior=alpha_proposal == "word")
        elapsed += time.perf_counter() - t0
        done += chunk
        first = False
        if callback and chunk > 0:
            callback(done, arr)
    stats = {"mh_acceptance": _acceptance(total), "alias_rebuilds": int(total[_S_REBUILDS]),
             "sweeps": int(n_sweeps), "sampling_seconds": elapsed,
             "changed_per_sweep": float(total[_S_CHANGED]) / max(n_sweeps, 1)}
    return arr, stats


def _acceptance_sup(stats: np.ndarray) -> dict:
    out = _acceptance(stats)
    n = stats[6]
    out["exp"] = float(stats[7] / n) if n else float("nan")
    return out


class _SupervisedSweeps:
    """Per-sweep augmentation of the labelled documents (engine side of the supervised contract).

    Holds the (D, L) coefficient arrays the kernel reads; ``augment(z)`` redraws them exactly
    from the documents' current zbar with the head's current eta sample (IG for the hinge,
    PG for the logistic loss; docs/supervised.md §2) and keeps them for the eta step.
    """

    def __init__(self, head, targets, tok_ptr, K: int):
        self.head = head
        self.K = K
        self.tok_ptr = tok_ptr
        D = tok_ptr.shape[0] - 1
        L = head.n_labels
        if targets.y.shape != (D, L):
            raise ValueError(f"targets encode {targets.y.shape}, expected ({D}, {L}) (encode them with the same head)")
        lengths = np.diff(tok_ptr)
        self.rows = np.flatnonzero(targets.mask.any(axis=1) & (lengths > 0)) if L > 0 else np.zeros(0, np.int64)
        self.sup_doc = np.zeros(D, dtype=np.bool_)
        self.sup_doc[self.rows] = True
        self.targets = type(targets)(np.ascontiguousarray(targets.y[self.rows]),
                                     np.ascontiguousarray(targets.mask[self.rows]))
        self.inv_len = 1.0 / np.maximum(lengths, 1).astype(np.float64)
        self.rho = np.zeros((D, max(L, 1)))
        self.kappa = np.zeros((D, max(L, 1)))
        self.counts = np.zeros((D, K))
        self.eta = head.eta if L > 0 else np.zeros((1, K))

    def zbar(self, z) -> np.ndarray:
        from .alias_supervised import doc_topic_counts

        doc_topic_counts(z, self.tok_ptr, self.K, self.counts)
        return self.counts[self.rows] * self.inv_len[self.rows, None]

    def augment(self, z) -> None:
        if self.rows.size == 0:
            return
        rho, kappa = self.head.sample_augmentation(self.zbar(z), self.targets)
        self.rho[self.rows] = rho
        self.kappa[self.rows] = kappa
        self.eta = self.head.eta


def run_batch_sampler_supervised(tok_w, tok_ptr, U: int, n_topics: int, alpha: float, beta: float, n_vocab: int,
                                 n_sweeps: int, seed: int, head, targets, mh_steps: int = 2, proposal: str = "cycle",
                                 table_draws: int | None = None, callback: Callable | None = None,
                                 callback_every: int = 0, alpha_proposal: str = "word", eta_sweeps: int = 1,
                                 eta_burn_in: int | None = None) -> tuple[SamplerArrays, dict]:
    """Supervised batch mode (LightMedLDA §3): from a uniform start, each sweep draws the
    augmentation given (Z, eta), then Z by word/doc/exp-proposal MH given (augmentation, eta),
    then ``eta_sweeps`` coordinate-wise Gibbs sweeps of eta given (Z, augmentation).  eta
    samples of the sweeps >= ``eta_burn_in`` (default n_sweeps // 2) are averaged into
    ``head.eta_mean`` (prediction), and the batch is folded into the head's carried statistics
    with the retained sweeps' average augmentation (``head.end_batch``).
    """
    from . import alias_supervised as sup

    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS} (got {proposal!r})")
    if alpha_proposal not in ALPHA_PROPOSALS:
        raise ValueError(f"alpha_proposal must be one of {ALPHA_PROPOSALS} (got {alpha_proposal!r})")
    K = int(n_topics)
    T = K if table_draws is None else int(table_draws)
    n_sweeps = int(n_sweeps)
    burn = n_sweeps // 2 if eta_burn_in is None else min(int(eta_burn_in), n_sweeps - 1)
    arr = SamplerArrays.allocate(U, tok_w.shape[0], K, T)
    Gk = np.full(K, n_vocab * beta)
    G = np.zeros((1, 1))
    seeds = np.random.SeedSequence(seed).generate_state(n_sweeps + 1, dtype=np.uint32)
    sv = _SupervisedSweeps(head, targets, tok_ptr, K)
    mixture = proposal == "mixture"
    word_prior = alpha_proposal == "word"
    total = np.zeros(sup.N_STATS, dtype=np.int64)
    t_kernel = t_head = 0.0
    t0 = time.perf_counter()
    total += sup.run_sweeps(arr, seeds[0], tok_w, tok_ptr, Gk, G, False, beta, alpha, 0, mh_steps, mixture, 1,
                            sv.eta, sv.rho, sv.kappa, sv.sup_doc, word_prior=word_prior)
    t_kernel += time.perf_counter() - t0
    head.begin_batch(None)
    Lr = sv.rows.size
    rho_sum = np.zeros((Lr, head.n_labels))
    kappa_sum = np.zeros_like(rho_sum)
    kept = 0
    zb = None
    for sweep in range(n_sweeps):
        t0 = time.perf_counter()
        sv.augment(arr.z)
        t1 = time.perf_counter()
        total += sup.run_sweeps(arr, seeds[sweep + 1], tok_w, tok_ptr, Gk, G, False, beta, alpha, 1, mh_steps,
                                mixture, 0, sv.eta, sv.rho, sv.kappa, sv.sup_doc, word_prior=word_prior)
        t2 = time.perf_counter()
        if Lr:
            zb = sv.zbar(arr.z)
            retain = sweep >= burn
            head.sample_eta(zb, sv.rho[sv.rows], sv.kappa[sv.rows], n_sweeps=int(eta_sweeps), retain=retain)
            if retain:
                rho_sum += sv.rho[sv.rows]
                kappa_sum += sv.kappa[sv.rows]
                kept += 1
        t_kernel += t2 - t1
        t_head += (t1 - t0) + (time.perf_counter() - t2)
        if callback and callback_every > 0 and (sweep + 1) % callback_every == 0:
            callback(sweep + 1, arr)
    if Lr and kept:
        head.end_batch(zb, rho_sum / kept, kappa_sum / kept)
    stats = {"mh_acceptance": _acceptance_sup(total), "alias_rebuilds": int(total[_S_REBUILDS]),
             "sweeps": n_sweeps, "sampling_seconds": t_kernel + t_head, "kernel_seconds": t_kernel,
             "supervised_seconds": t_head, "changed_per_sweep": float(total[_S_CHANGED]) / max(n_sweeps, 1),
             "exp_proposal_docs_per_sweep": float(total[sup._S_EXP_DOCS]) / max(n_sweeps, 1),
             "supervised_docs": int(Lr), "eta_retained": kept}
    return arr, stats


@dataclass
class AliasEngine:
    """Alias-MH local step; ``infer`` has the interface of ``LSparseEngine.infer``.

    burn_in : sweeps over the minibatch before statistics are collected.
    sample_sweeps : sweeps whose assignments are averaged into doc_topic and the summary.
    mh_steps : MH steps per token per sweep (default 2); as in LightLDA a step is one word and
        one doc proposal ("cycle"), or two proposals each picked at random ("mixture").
    proposal : "cycle" or "mixture" composition of the two kernels (Light-MedLDA Theorem 1).
    alpha_proposal : where the doc proposal's alpha part comes from: "word" (the word's own
        alias table, matching the target's alpha term) or "uniform" (LightLDA's shared table).
    table_draws : samples drawn from each alias table before it is rebuilt (None: K).
    seed_source : callable returning a fresh seed per call (the model's Generator); without
        it the engine uses its own ``numpy.random.Generator(seed)``.
    """

    burn_in: int = 4
    sample_sweeps: int = 4
    mh_steps: int = 2
    proposal: str = "cycle"
    table_draws: int | None = None
    alpha_proposal: str = "word"
    seed: int = 0
    seed_source: Callable[[], int] | None = field(default=None, repr=False)
    name: str = "alias"

    def __post_init__(self):
        if self.proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS} (got {self.proposal!r})")
        if self.alpha_proposal not in ALPHA_PROPOSALS:
            raise ValueError(f"alpha_proposal must be one of {ALPHA_PROPOSALS} (got {self.alpha_proposal!r})")
        self._rng = np.random.default_rng(self.seed)

    def _next_seed(self) -> int:
        if self.seed_source is not None:
            return int(self.seed_source())
        return int(self._rng.integers(1 << 62))

    def infer(self, state, batch, summarize: bool = True, head=None, targets=None) -> LocalResult:
        if head is not None and targets is not None:
            return self._infer_supervised(state, batch, summarize, head, targets)
        K = state.n_topics
        D = batch.n_docs
        U = batch.uniq.shape[0]
        seed = self._next_seed()
        tok_w, tok_ptr = batch_tokens(batch)
        N = tok_w.shape[0]
        n_burn = max(int(self.burn_in), 0)
        n_samp = max(int(self.sample_sweeps), 1)
        T = K if self.table_draws is None else int(self.table_draws)
        arr = SamplerArrays.allocate(U, N, K, T)
        # lambda for the batch's words and all-vocabulary totals: the prior of this batch's topics
        G = state.beta + state.scale * state.mu[batch.uniq]
        Gk = state.lam_totals().astype(np.float64)
        z_rec = np.zeros((n_samp if summarize else 0, N), dtype=np.int32)
        doc_acc = np.zeros((D, K))
        stats = arr.run(seed, tok_w, tok_ptr, Gk, G, True, state.beta, state.alpha, n_burn + n_samp, self.mh_steps,
                        self.proposal == "mixture", 2, n_burn, z_rec, doc_acc,
                        word_prior=self.alpha_proposal == "word")
        z = arr.z
        objective = _word_loglik(tok_w, z, arr.nq.reshape(-1), arr.nk, Gk, G.reshape(-1), True, float(state.beta)) if N else 0.0
        doc_topic = doc_acc / n_samp
        summary = None
        if summarize:
            summary = _summary_from_samples(batch, tok_w, z_rec, K)
        return LocalResult(
            doc_topic=doc_topic,
            summary=summary,
            iterations=np.full(D, n_burn + n_samp, dtype=np.int32),
            objective=float(objective),
            stats={"mh_acceptance": _acceptance(stats), "alias_rebuilds": int(stats[_S_REBUILDS]),
                   "sweeps": n_burn + n_samp,
                   "changed_per_token": float(stats[_S_CHANGED]) / max(N * (n_burn + n_samp), 1)},
        )

    def _infer_supervised(self, state, batch, summarize, head, targets) -> LocalResult:
        """Streaming supervised local step: per sweep, the augmentation of the labelled documents
        is drawn exactly from their current zbar (head.sample_augmentation, with the head's
        current eta sample), then one sweep of word/doc/exp-proposal MH against the regularised
        conditional (engines.alias_supervised).  eta stays fixed: model.py calls head.update."""
        from . import alias_supervised as sup

        K = state.n_topics
        D = batch.n_docs
        U = batch.uniq.shape[0]
        seed = self._next_seed()
        tok_w, tok_ptr = batch_tokens(batch)
        N = tok_w.shape[0]
        n_burn = max(int(self.burn_in), 0)
        n_samp = max(int(self.sample_sweeps), 1)
        n_total = n_burn + n_samp
        T = K if self.table_draws is None else int(self.table_draws)
        arr = SamplerArrays.allocate(U, N, K, T)
        G = state.beta + state.scale * state.mu[batch.uniq]
        Gk = state.lam_totals().astype(np.float64)
        z_rec = np.zeros((n_samp if summarize else 0, N), dtype=np.int32)
        doc_acc = np.zeros((D, K))
        seeds = np.random.SeedSequence(seed).generate_state(n_total + 1, dtype=np.uint32)
        sv = _SupervisedSweeps(head, targets, tok_ptr, K)
        mixture = self.proposal == "mixture"
        word_prior = self.alpha_proposal == "word"
        total = np.zeros(sup.N_STATS, dtype=np.int64)
        total += sup.run_sweeps(arr, seeds[0], tok_w, tok_ptr, Gk, G, True, state.beta, state.alpha, 0,
                                self.mh_steps, mixture, 2, sv.eta, sv.rho, sv.kappa, sv.sup_doc,
                                word_prior=word_prior)
        t_head = 0.0
        for sweep in range(n_total):
            t0 = time.perf_counter()
            sv.augment(arr.z)
            t_head += time.perf_counter() - t0
            rec = sweep - n_burn
            total += sup.run_sweeps(arr, seeds[sweep + 1], tok_w, tok_ptr, Gk, G, True, state.beta, state.alpha, 1,
                                    self.mh_steps, mixture, 0, sv.eta, sv.rho, sv.kappa, sv.sup_doc,
                                    word_prior=word_prior, record_from=0 if rec >= 0 else 1,
                                    z_rec=z_rec[rec:rec + 1] if rec >= 0 and summarize else None,
                                    doc_acc=doc_acc if rec >= 0 else None)
        z = arr.z
        objective = _word_loglik(tok_w, z, arr.nq.reshape(-1), arr.nk, Gk, G.reshape(-1), True, float(state.beta)) if N else 0.0
        summary = _summary_from_samples(batch, tok_w, z_rec, K) if summarize else None
        return LocalResult(
            doc_topic=doc_acc / n_samp, summary=summary, iterations=np.full(D, n_total, dtype=np.int32),
            objective=float(objective),
            stats={"mh_acceptance": _acceptance_sup(total), "alias_rebuilds": int(total[_S_REBUILDS]),
                   "sweeps": n_total, "changed_per_token": float(total[_S_CHANGED]) / max(N * n_total, 1),
                   "exp_proposal_docs": int(total[sup._S_EXP_DOCS]), "augment_seconds": t_head,
                   "supervised_docs": int(sv.sup_doc.sum())},
        )

    def fit_state(self, state, batch, n_sweeps: int, seed: int, callback: Callable | None = None,
                  callback_every: int = 0, head=None, targets=None, eta_sweeps: int = 1,
                  eta_burn_in: int | None = None) -> dict:
        """Batch mode: collapsed sweeps over ``batch`` (all of it in memory), then state <- last sample.

        The target is the exact collapsed conditional with g = beta and G_k = V beta, V the
        vocabulary size; afterwards lambda = beta + n_kw (scale 1, no smoothing), the
        counters are advanced as for one update, and the returned stats carry the MH
        acceptance, rebuilds, ``sampling_seconds`` (kernel time only) and ``tokens_per_s``.
        ``callback(sweeps_done, arrays)`` runs every ``callback_every`` sweeps, off the clock.
        """
        tok_w, tok_ptr = batch_tokens(batch)
        N = int(tok_w.shape[0])
        if head is not None and targets is not None:
            arr, stats = run_batch_sampler_supervised(
                tok_w, tok_ptr, batch.uniq.shape[0], state.n_topics, state.alpha, state.beta, state.n_words,
                n_sweeps, seed, head, targets, mh_steps=self.mh_steps, proposal=self.proposal,
                table_draws=self.table_draws, callback=callback, callback_every=callback_every,
                alpha_proposal=self.alpha_proposal, eta_sweeps=eta_sweeps, eta_burn_in=eta_burn_in)
        else:
            arr, stats = run_batch_sampler(tok_w, tok_ptr, batch.uniq.shape[0], state.n_topics, state.alpha,
                                           state.beta, state.n_words, n_sweeps, seed, mh_steps=self.mh_steps,
                                           proposal=self.proposal, table_draws=self.table_draws, callback=callback,
                                           callback_every=callback_every, alpha_proposal=self.alpha_proposal)
        arr.samples = None  # free the proposal buffers before lambda is written
        nv = state.n_words
        state.mu[:nv] = 0.0
        state.mu[batch.uniq] = arr.counts()
        state.scale = 1.0
        state.smoothing = 0.0
        state.refresh_totals()
        state.docs_seen += batch.n_docs
        state.tokens_seen += N
        state.n_updates += 1
        state.version += 1
        state.initialized = True
        stats.update(docs=batch.n_docs, tokens=N,
                     tokens_per_s=N * n_sweeps / stats["sampling_seconds"] if stats["sampling_seconds"] > 0 else 0.0)
        return stats

    def config(self) -> dict:
        return {"burn_in": self.burn_in, "sample_sweeps": self.sample_sweeps, "mh_steps": self.mh_steps,
                "proposal": self.proposal, "table_draws": self.table_draws, "alpha_proposal": self.alpha_proposal}


def _summary_from_samples(batch, tok_w, z_rec, K: int) -> Summary:
    """Topic-word counts averaged over the recorded sweeps, as CSR over batch.uniq."""
    S, N = z_rec.shape
    U = batch.uniq.shape[0]
    keys = (np.tile(tok_w.astype(np.int64), S) * K + z_rec.reshape(-1)) if N else np.empty(0, np.int64)
    uk, cnt = np.unique(keys, return_counts=True)
    rows = uk // K
    topics = (uk % K).astype(np.int32)
    values = cnt.astype(np.float64) / S
    indptr = np.zeros(U + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=U), out=indptr[1:])
    totals = np.bincount(topics, weights=values, minlength=K).astype(np.float64)
    return Summary(word_ids=batch.uniq.copy(), indptr=indptr, topics=topics, values=values, topic_totals=totals,
                   n_docs=batch.n_docs, n_tokens=float(batch.n_tokens))
