"""Alias-MH local step: Metropolis-Hastings-Walker sampling with amortized O(1) cost per token.

References: Li, Ahmed, Ravi, Smola, "Reducing the sampling complexity of topic models"
(AliasLDA, KDD'14, §3-4); Zheng/Chen/Zhu, "Linear time samplers for supervised topic
models" (Light-MedLDA, §2.3, §3.3), whose doc/word proposal split is LightLDA's; Liu, Liang
& Wong 2000 (multiple-try Metropolis with independent proposals); Christen & Fox 2005
(delayed acceptance).

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

Proposals.  LightLDA's two O(1) proposals are

* the word proposal q_w(k) ∝ (g_wk + n~_wk)/(G_k + n~_k), a stale Walker table per word type
  (``word_rows``: how tables are stored, built, drawn, and how token i's own contribution
  is removed so the proposal never depends on the token's state), and
* the doc proposal q_d(k) ∝ n_dk + K alpha q_i(k)/Z_i: with probability (N_d-1)/(N_d-1+K alpha)
  the topic of a uniformly random *other* token of the document, else a draw from the word's
  table (``alpha_proposal="word"``, the alpha term of the target) or a uniform topic
  (``"uniform"``, LightLDA's choice).

Each proposal alone matches one factor of the target and is blind to the other; at large K
a document's topics and a word's topics rarely meet in one draw, and a plain MH step wastes
most proposals (acceptance ~0.35 at K=1024; on 20 Newsgroups the plain chain needed ~3.5x
the sweeps of exact Gibbs).  So every step draws several candidates and lets the other
factor choose among them, with exact corrections:

* word step = independent multiple-try MH (I-MTM) on pi1(k) = (n_dk + alpha) q_i(k):
  ``word_tries`` draws y_1..y_m from the word table, y_J picked ∝ w(y) = n_dy + alpha (the
  document counts, in L1 cache), accepted with min(1, W / (W - w(y_J) + w(x))), W = sum w;
  then delayed acceptance (stage 2) corrects pi1 to the target with
  min(1, [b(y) q_i(x)] / [b(x) q_i(y)]), b(k) = (g_wk + n_wk)/(G_k + n_k) the current word
  factor.  Stage 2 only ever costs when the table is stale (accepts ~97%).
* doc step = I-MTM on the target itself: ``doc_tries`` draws from q_d, picked ∝ p/q_d.

As tries grow, the word step tends to AliasLDA's proposal (n_dk + alpha) q_w(k) and the
doc step to a draw from p itself.  With tries = 1 both are plain LightLDA MH steps.
``tries`` = (word_tries, doc_tries) defaults to (2, 1) for K >= 256 and (1, 1) below.  On
20 Newsgroups after 200 sweeps, held-out completion vs exact Gibbs: K=100 (1, 1) 0.7% short;
K=1024 (1, 1) 1.0%, (2, 1) 0.8%, (2, 2) 0.4%.  A word candidate costs a table draw and an
L1 read (only the chosen one is looked up); a doc candidate costs a row lookup, so (2, 2)
runs ~25% slower than (2, 1) at K=1024.
``mh_steps`` (default 2) steps of each kind per token and sweep: "cycle" alternates word and
doc steps, "mixture" picks each step's kind with probability 1/2 (Light-MedLDA Theorem 1:
both compositions keep p stationary).

Exactness: I-MTM with independent proposals and delayed acceptance are both p-reversible
for any proposal fixed in advance, so staleness never changes what the chain samples
(tests: a deliberately wrong, never rebuilt table reproduces the exact conditional; whole
chains reproduce the enumerated joint posterior of tiny models, with hash and dense rows).

Speed: everything a token's steps draw is independent of its state, so all candidates are
drawn first and their rows looked up together (the cache misses overlap) before the
accept/reject chain; the uniforms of the next token's doc candidates are drawn one token
ahead so their row entries can be prefetched, as are the metadata line 4 tokens ahead and
the current-topic entry and sample buffer 2 tokens ahead.  A token whose topic does not
change is never removed and re-added (its ¬i counts are formed on the fly).

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
from numba import njit

from ..summary import LocalResult, Summary
from .alias_params import (S_CHANGED, S_DOC_ACC, S_DOC_PROP, S_REBUILDS, S_WORD_ACC, S_WORD_PROP,  # noqa: F401
                           check_tries, default_tries, resolve_tries)
from .walker import rng_next, prefetch, rng_state, alias_sample  # noqa: F401  (alias_sample: public)
from .word_rows import (MAX_LOAD_DEN, MAX_LOAD_NUM, M_CAP, M_OCC, M_OFF, M_PTR, M_SOFF, M_T, M_VER, M_ZT,
                        WordRows, row_delete, draw_table, row_find, row_find_or_insert, row_rebuild, row_slot, build_shared_prior)

PROPOSALS = ("cycle", "mixture")
ALPHA_PROPOSALS = ("word", "uniform")

# The statistics slots and the multiple-try settings live in alias_params, shared with the
# supervised kernel without an import cycle.


@njit(cache=True, nogil=True)
def mh_sweeps(rs, tok_w, tok_ptr, z, tver, tb, ent, entf, meta, metaf, samples, nk, Gk, G, dense_prior, beta, alpha,
              n_sweeps, mh_steps, word_tries, doc_tries, mixture, word_prior, init, record_from, z_rec, doc_acc):
    """Run ``n_sweeps`` sweeps of Alias-MH over the documents; returns the statistics vector.

    rs: uint64 random state (SplitMix64).  tok_w (N,) int32 batch-local word of each token,
    documents contiguous (tok_ptr (D+1,)); z (N,) int32 assignments.  ent/entf/meta/metaf/
    samples: the ``word_rows.WordRows`` arrays; nk (K,) int64 topic counts; Gk (K,) prior
    totals; G (U K,) prior pseudo-counts if ``dense_prior`` (streaming) else unused (g =
    ``beta`` and the shared prior table).  tver/tb (N,): per token, the version of its
    word's table it last saw and its topic when that table was built (-1: not counted in it).

    ``init`` 0: z is given and already counted; 1: uniform random z; 2: z drawn from each
    word's table.  Sweeps >= ``record_from`` store z in z_rec[sweep - record_from] and add the
    document counts to doc_acc (D, K) when doc_acc has D rows.

    The helpers of ``word_rows`` are written out here where they sit in the token loop:
    numba's IR inlining of array-taking helpers cost this loop 20-40% (measured).
    """
    K = nk.shape[0]
    D = tok_ptr.shape[0] - 1
    N = tok_w.shape[0]
    stats = np.zeros(6, dtype=np.int64)
    rk = np.empty(K)
    wbuf = np.empty(K)
    widx = np.empty(K, dtype=np.int64)
    prob = np.empty(K)
    alias = np.empty(K, dtype=np.int32)
    small = np.empty(K, dtype=np.int32)
    large = np.empty(K, dtype=np.int32)
    keys = np.empty(K, dtype=np.int64)
    vals = np.empty(K, dtype=np.int64)
    Bw = np.zeros(K)  # shared prior table (batch mode); all zero in streaming
    BR = np.ones(K)
    Bprob = np.ones(K)
    Balias = np.zeros(K, dtype=np.int32)
    use_B = not dense_prior
    B_tot = 0.0
    nd = np.zeros(K, dtype=np.int32)
    P = 2 * mh_steps
    M = max(word_tries, doc_tries, 1)
    cand = np.empty(M, dtype=np.int64)
    cw = np.empty(M)
    cb = np.empty(M)
    cq = np.empty(M)
    # per step: kind, chosen topic, W, w(chosen), and a, b, q at the chosen topic
    st_word = np.empty(P, dtype=np.bool_)
    nx_word = np.empty(P, dtype=np.bool_)
    st_y = np.empty(P, dtype=np.int64)
    st_W = np.empty(P)
    st_w = np.empty(P)
    st_b = np.empty(P)
    st_q = np.empty(P)
    st_a = np.empty(P)
    LK = P * (M + 1)
    lk_t = np.empty(LK, dtype=np.int64)
    lk_n = np.empty(LK, dtype=np.int64)
    lk_A = np.empty(LK)
    Ka = K * alpha
    record_docs = doc_acc.shape[0] == D and D > 0
    # the doc-candidate uniforms (and, for "mixture", the step kinds) of a token are drawn one
    # token ahead, so the row entries its candidates need can be prefetched
    du = np.empty(max(P * doc_tries, 1))
    nx_du = np.empty(max(P * doc_tries, 1))
    nx_nd = 0
    for p in range(P):
        if mixture:
            rs, x = rng_next(rs)
            nx_word[p] = x < 0.5
        else:
            nx_word[p] = (p & 1) == 0  # cycle: word, doc, word, doc, ...
        if not nx_word[p]:
            for j in range(doc_tries):
                rs, nx_du[nx_nd] = rng_next(rs)
                nx_nd += 1
    for k in range(K):
        rk[k] = 1.0 / (Gk[k] + nk[k])

    if init > 0:
        for i in range(N):
            u = tok_w[i]
            mu = 8 * u
            if init == 1:
                rs, x = rng_next(rs)
                t = min(int(x * K), K - 1)
            else:
                if meta[mu + M_PTR] >= meta[mu + M_T]:
                    rs = row_rebuild(u, -1, K, ent, entf, meta, metaf, samples, G, dense_prior, nk, Gk, rk, wbuf,
                                  widx, prob, alias, small, large, keys, vals, rs)
                    stats[S_REBUILDS] += 1
                t = np.int64(samples[meta[mu + M_SOFF] + meta[mu + M_PTR]])
                meta[mu + M_PTR] += 1
            z[i] = t
            e = row_find_or_insert(ent, meta, u, meta[mu + M_OFF], meta[mu + M_CAP], K, t)
            ent[4 * e + 1] += 1
            nk[t] += 1
            rk[t] = 1.0 / (Gk[t] + nk[t])
            tver[i] = meta[mu + M_VER]  # counted after the current table was built: not part of it
            tb[i] = -1

    for sweep in range(n_sweeps):
        if use_B:
            B_tot = build_shared_prior(Gk, nk, beta, Bw, BR, Bprob, Balias, small, large)
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
                # -- software pipeline: metadata 4 tokens ahead, entry + samples 2 ahead --
                if i + 4 < N:
                    prefetch(meta, 8 * tok_w[i + 4])
                if i + 2 < N:
                    m2 = 8 * tok_w[i + 2]
                    prefetch(ent, 4 * (meta[m2 + M_OFF] + row_slot(z[i + 2], meta[m2 + M_CAP], K)))
                    prefetch(samples, meta[m2 + M_SOFF] + min(meta[m2 + M_PTR], meta[m2 + M_T] - 1))
                # this token's kinds and doc uniforms; draw the next token's and prefetch its candidates
                n_du = nx_nd
                for j in range(n_du):
                    du[j] = nx_du[j]
                for p in range(P):
                    st_word[p] = nx_word[p]
                nx_nd = 0
                n_word_draws = 0
                for p in range(P):
                    if mixture:
                        rs, x = rng_next(rs)
                        nx_word[p] = x < 0.5
                    if not nx_word[p]:
                        for j in range(doc_tries):
                            rs, nx_du[nx_nd] = rng_next(rs)
                            nx_nd += 1
                    else:
                        n_word_draws += word_tries
                if i + 1 < e0:
                    m1 = 8 * tok_w[i + 1]
                    b1 = meta[m1 + M_OFF]
                    c1 = meta[m1 + M_CAP]
                    for j in range(nx_nd):
                        x = nx_du[j] * d_mass
                        if x < others:
                            jj = s0 + int(x)
                            if jj >= i + 1:
                                jj += 1
                            prefetch(ent, 4 * (b1 + row_slot(z[jj], c1, K)))
                    # and the entries of the word-step candidates it will read from its table
                    p1 = meta[m1 + M_PTR]
                    n1 = min(meta[m1 + M_T] - p1, n_word_draws)
                    lo1 = meta[m1 + M_SOFF] + p1
                    for j in range(n1):
                        prefetch(ent, 4 * (b1 + row_slot(np.int64(samples[lo1 + j]), c1, K)))

                u = tok_w[i]
                s = np.int64(z[i])
                ub = u * K
                mu = 8 * u
                base = meta[mu + M_OFF]
                cu = meta[mu + M_CAP]
                T_u = meta[mu + M_T]
                lo = meta[mu + M_SOFF]
                if tver[i] != meta[mu + M_VER]:
                    # rebuilt after this token's last update, so it was counted there at s
                    tver[i] = meta[mu + M_VER]
                    tb[i] = s
                n_draw = n_du if word_prior else 0  # table draws this token may need
                for p in range(P):
                    if st_word[p]:
                        n_draw += word_tries
                if meta[mu + M_PTR] + n_draw > T_u:
                    # the samples left cannot serve this token: rebuild from fresh counts
                    rs = row_rebuild(u, s, K, ent, entf, meta, metaf, samples, G, dense_prior, nk, Gk, rk, wbuf, widx,
                                  prob, alias, small, large, keys, vals, rs)
                    stats[S_REBUILDS] += 1
                    tver[i] = meta[mu + M_VER]
                    tb[i] = -1  # built from ¬i counts
                ptr = meta[mu + M_PTR]
                # token i's proposal q_i without its own contributions (word_rows docstring):
                # the count part at b scaled by fb, an extra prior-part mass Bx at s
                b = np.int64(tb[i])
                S_i = metaf[mu + M_ZT]
                fb = 1.0
                if b >= 0:
                    eb = row_find(ent, base, cu, K, b)
                    fb = np.float64(entf[4 * eb + 2])  # A_i(b) / A~_b, stored at the build
                    S_i -= np.float64(entf[4 * eb + 3]) * (1.0 - fb)
                    if S_i <= 1e-9 * metaf[mu + M_ZT]:
                        S_i = 0.0
                Bx = beta / (BR[s] * (BR[s] - 1.0)) if use_B else 0.0
                Z_i = S_i + B_tot + Bx
                ka_z = Ka / Z_i  # alpha part of the doc proposal: K alpha q_i(k) / Z_i
                es = row_find(ent, base, cu, K, s)
                g_s = G[ub + s] if dense_prior else beta
                b_s = (g_s + ent[4 * es + 1] - 1) / (Gk[s] + nk[s] - 1)
                A_s = np.float64(entf[4 * es + 3])
                q_s = A_s * (fb if s == b else 1.0) + Bw[s] + Bx

                # -- A: every step's candidates (state-independent); word steps choose now --
                nl = 0
                jd = 0
                for p in range(P):
                    word = st_word[p]
                    mm = word_tries if word else doc_tries
                    W = 0.0
                    for j in range(mm):
                        from_q = word
                        if not word:
                            x = du[jd] * d_mass
                            jd += 1
                            if x < others:
                                jj = s0 + int(x)
                                if jj >= i:
                                    jj += 1
                                t = np.int64(z[jj])
                            elif word_prior:
                                from_q = True
                            else:
                                t = min(int((x - others) / alpha), K - 1)
                        if from_q:
                            # a draw from q_i: count part w.p. S_i / Z_i, else the shared prior part
                            rs, x = rng_next(rs)
                            x *= Z_i
                            if x < S_i:
                                while True:
                                    if ptr >= T_u:  # rejections ran past the buffer: same table, more draws
                                        rs = draw_table(u, K, ent, entf, meta, samples, wbuf, widx, prob, alias,
                                                         small, large, rs)
                                        ptr = 0
                                    t = np.int64(samples[lo + ptr])
                                    ptr += 1
                                    if t != b:
                                        break
                                    rs, y = rng_next(rs)
                                    if y < fb:
                                        break
                            else:
                                y = x - S_i
                                if y < Bx:
                                    t = s
                                else:
                                    y = (y - Bx) / B_tot * K  # the residual is a fresh uniform
                                    bb = min(int(y), K - 1)
                                    t = np.int64(bb if y - bb < Bprob[bb] else Balias[bb])
                        if word:
                            a_t = nd[t] - (1 if t == s else 0) + alpha  # w(y) = pi1 / q_i = n_dy + alpha
                            cand[j] = t
                            cw[j] = a_t
                            W += a_t
                        else:
                            lk_t[nl] = t
                            nl += 1
                    if word:
                        J = 0
                        if mm > 1:
                            rs, x = rng_next(rs)
                            x *= W
                            acc = cw[0]
                            while acc <= x and J < mm - 1:
                                J += 1
                                acc += cw[J]
                        t = cand[J]
                        st_y[p] = t
                        st_W[p] = W
                        st_w[p] = cw[J]
                        lk_t[nl] = t
                        nl += 1
                meta[mu + M_PTR] = ptr
                # -- B: counts and stale weights of the looked-up topics (independent loads overlap) --
                for l in range(nl):
                    e = row_find(ent, base, cu, K, lk_t[l])
                    if e >= 0:
                        lk_n[l] = ent[4 * e + 1]
                        lk_A[l] = entf[4 * e + 3]
                    else:
                        lk_n[l] = 0
                        lk_A[l] = 0.0
                # -- C: factors; doc steps choose (I-MTM on the target, weights p / q_d) --
                l = 0
                for p in range(P):
                    if st_word[p] or doc_tries == 1:  # one looked-up topic: the word step's choice or the doc draw
                        t = lk_t[l]
                        if t == s:
                            st_b[p] = b_s
                            st_q[p] = q_s
                        else:
                            st_b[p] = ((G[ub + t] if dense_prior else beta) + lk_n[l]) * rk[t]
                            st_q[p] = lk_A[l] * (fb if t == b else 1.0) + Bw[t]
                        if st_word[p]:
                            st_a[p] = st_w[p]
                        else:  # a plain MH step: the chain compares p q_d cross-multiplied
                            st_y[p] = t
                            st_a[p] = nd[t] - (1 if t == s else 0) + alpha
                        l += 1
                        continue
                    W = 0.0
                    for j in range(doc_tries):
                        t = lk_t[l + j]
                        a_t = nd[t] - (1 if t == s else 0) + alpha
                        if t == s:
                            b_t = b_s
                            q_t = q_s
                        else:
                            b_t = ((G[ub + t] if dense_prior else beta) + lk_n[l + j]) * rk[t]
                            q_t = lk_A[l + j] * (fb if t == b else 1.0) + Bw[t]
                        if word_prior:
                            wj = a_t * b_t / (a_t - alpha + ka_z * q_t)
                        else:
                            wj = b_t
                        cw[j] = wj
                        cb[j] = b_t
                        cq[j] = q_t
                        W += wj
                    J = 0
                    if doc_tries > 1:
                        rs, x = rng_next(rs)
                        x *= W
                        acc = cw[0]
                        while acc <= x and J < doc_tries - 1:
                            J += 1
                            acc += cw[J]
                    t = lk_t[l + J]
                    st_y[p] = t
                    st_W[p] = W
                    st_w[p] = cw[J]
                    st_a[p] = nd[t] - (1 if t == s else 0) + alpha
                    st_b[p] = cb[J]
                    st_q[p] = cq[J]
                    l += doc_tries
                # -- the chain: the token stays counted at s until it moves --
                cur = s
                a_cur = nd[s] - 1 + alpha
                b_cur = b_s
                q_cur = q_s
                for p in range(P):
                    y = st_y[p]
                    W = st_W[p]
                    if st_word[p]:
                        stats[S_WORD_PROP] += 1
                        if y != cur:
                            # stage 1 (I-MTM on pi1): min(1, W / (W - w(y) + w(cur)))
                            den = W - st_w[p] + a_cur
                            if W < den:
                                rs, x = rng_next(rs)
                                if x * den >= W:
                                    continue
                            # stage 2 (delayed acceptance): pi / pi1 = b / q
                            num = st_b[p] * q_cur
                            den = b_cur * st_q[p]
                            if num < den:
                                rs, x = rng_next(rs)
                                if x * den >= num:
                                    continue
                        stats[S_WORD_ACC] += 1
                    elif doc_tries == 1:
                        stats[S_DOC_PROP] += 1
                        if y != cur:
                            # A_d = p(y) q_d(cur) / (p(cur) q_d(y)), q_d(k) ∝ n_dk + K alpha q_i(k) / Z_i
                            if word_prior:
                                num = st_a[p] * st_b[p] * (a_cur - alpha + ka_z * q_cur)
                                den = a_cur * b_cur * (st_a[p] - alpha + ka_z * st_q[p])
                            else:  # q_d ∝ n_dk + alpha: the document factor cancels
                                num = st_b[p]
                                den = b_cur
                            if num < den:
                                rs, x = rng_next(rs)
                                if x * den >= num:
                                    continue
                        stats[S_DOC_ACC] += 1
                    else:
                        stats[S_DOC_PROP] += 1
                        if y != cur:
                            if word_prior:
                                w_c = a_cur * b_cur / (a_cur - alpha + ka_z * q_cur)
                            else:
                                w_c = b_cur
                            den = W - st_w[p] + w_c
                            if W < den:
                                rs, x = rng_next(rs)
                                if x * den >= W:
                                    continue
                        stats[S_DOC_ACC] += 1
                    cur = y
                    a_cur = st_a[p]
                    b_cur = st_b[p]
                    q_cur = st_q[p]
                if cur != s:
                    z[i] = cur
                    nd[s] -= 1
                    ent[4 * es + 1] -= 1
                    if cu < K and ent[4 * es + 1] == 0 and ent[4 * es + 3] == 0:
                        row_delete(ent, meta, u, base, cu, es)  # not in the live table: free the slot
                    nk[s] -= 1
                    rk[s] = 1.0 / (Gk[s] + nk[s])
                    nd[cur] += 1
                    e = row_find_or_insert(ent, meta, u, base, cu, K, cur)
                    ent[4 * e + 1] += 1
                    nk[cur] += 1
                    rk[cur] = 1.0 / (Gk[cur] + nk[cur])
                    stats[S_CHANGED] += 1
                    if cu < K and MAX_LOAD_DEN * meta[mu + M_OCC] > MAX_LOAD_NUM * cu:
                        # compact the row: a fresh table, which holds token i at cur
                        rs = row_rebuild(u, -1, K, ent, entf, meta, metaf, samples, G, dense_prior, nk, Gk, rk, wbuf,
                                      widx, prob, alias, small, large, keys, vals, rs)
                        stats[S_REBUILDS] += 1
                        tver[i] = meta[mu + M_VER]
                        tb[i] = cur
            if sweep >= record_from and record_docs:
                for i in range(s0, e0):
                    doc_acc[d, z[i]] += 1.0
            for i in range(s0, e0):
                nd[z[i]] = 0
        if sweep >= record_from and z_rec.shape[0] > sweep - record_from:
            z_rec[sweep - record_from, :] = z
    return stats


@njit(cache=True, nogil=True)
def _word_loglik(tok_w, z, ent, meta, nk, Gk, G, dense_prior, beta):
    """sum_i log phi_hat(w_i | z_i) at the current counts (a cheap per-batch fit score)."""
    K = nk.shape[0]
    total = 0.0
    for i in range(tok_w.shape[0]):
        u = tok_w[i]
        k = z[i]
        e = row_find(ent, meta[8 * u + M_OFF], meta[8 * u + M_CAP], K, k)
        g = G[u * K + k] if dense_prior else beta
        total += math.log((g + ent[4 * e + 1]) / (Gk[k] + nk[k]))
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


class SamplerArrays(WordRows):
    """Everything one sampler run keeps between kernel calls: the word rows and tables
    (``word_rows.WordRows``) plus per token z (N,) int32 and tver/tb (N,), the table version
    it last saw and its topic in that table (-1: not counted in it)."""

    def __init__(self, U: int, N: int, K: int, table_draws: int | None = None, freq=None):
        super().__init__(U, N, K, table_draws, freq)
        self.z = np.zeros(N, dtype=np.int32)
        self.tver = np.zeros(N, dtype=np.int64)
        self.tb = np.full(N, -1, dtype=np.int32)

    @classmethod
    def allocate(cls, U: int, N: int, K: int, table_draws: int | None = None, freq=None) -> "SamplerArrays":
        return cls(U, N, K, table_draws, freq)

    def run(self, seed, tok_w, tok_ptr, Gk, G, dense_prior, beta, alpha, n_sweeps, mh_steps, mixture, init,
            record_from=None, z_rec=None, doc_acc=None, word_prior=True, tries=1) -> np.ndarray:
        K = self.K
        word_tries, doc_tries = resolve_tries(tries, K)
        return mh_sweeps(rng_state(seed), tok_w, tok_ptr, self.z, self.tver, self.tb, self.ent, self.entf,
                         self.meta, self.metaf, self.samples, self.nk, Gk, np.ascontiguousarray(G).reshape(-1),
                         bool(dense_prior), float(beta), float(alpha), int(n_sweeps), int(mh_steps),
                         word_tries, doc_tries,
                         bool(mixture), bool(word_prior), int(init),
                         n_sweeps if record_from is None else int(record_from),
                         np.zeros((0, 0), dtype=np.int32) if z_rec is None else z_rec,
                         np.zeros((0, K)) if doc_acc is None else doc_acc)

    def word_loglik(self, tok_w, Gk, G, dense_prior, beta) -> float:
        if tok_w.shape[0] == 0:
            return 0.0
        return float(_word_loglik(tok_w, self.z, self.ent, self.meta, self.nk, Gk,
                                  np.ascontiguousarray(G).reshape(-1), bool(dense_prior), float(beta)))


def _acceptance(stats: np.ndarray) -> dict:
    return {
        "word": float(stats[S_WORD_ACC] / stats[S_WORD_PROP]) if stats[S_WORD_PROP] else float("nan"),
        "doc": float(stats[S_DOC_ACC] / stats[S_DOC_PROP]) if stats[S_DOC_PROP] else float("nan"),
    }


def run_batch_sampler(tok_w, tok_ptr, U: int, n_topics: int, alpha: float, beta: float, n_vocab: int,
                      n_sweeps: int, seed: int, mh_steps: int = 2, proposal: str = "cycle",
                      table_draws: int | None = None, callback: Callable | None = None,
                      callback_every: int = 0, alpha_proposal: str = "word",
                      tries: int | tuple[int, int] | None = None) -> tuple[SamplerArrays, dict]:
    """Batch mode: collapsed LDA over tokens held in memory (g = beta, G_k = V beta), uniform start.

    Word rows are sized by each word's token count (hash rows for rare words).  Returns the
    sampler arrays (final counts and z) and stats including ``sampling_seconds`` (kernel
    time: allocation and token expansion excluded).  ``callback(sweep, arrays)`` runs every
    ``callback_every`` sweeps, outside the clock.
    """
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS} (got {proposal!r})")
    if alpha_proposal not in ALPHA_PROPOSALS:
        raise ValueError(f"alpha_proposal must be one of {ALPHA_PROPOSALS} (got {alpha_proposal!r})")
    K = int(n_topics)
    m = resolve_tries(tries, K)
    arr = SamplerArrays(U, tok_w.shape[0], K, table_draws, freq=np.bincount(tok_w, minlength=U))
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
                         proposal == "mixture", 1 if first else 0, word_prior=alpha_proposal == "word", tries=m)
        elapsed += time.perf_counter() - t0
        done += chunk
        first = False
        if callback and chunk > 0:
            callback(done, arr)
    stats = {"mh_acceptance": _acceptance(total), "alias_rebuilds": int(total[S_REBUILDS]),
             "sweeps": int(n_sweeps), "sampling_seconds": elapsed,
             "changed_per_sweep": float(total[S_CHANGED]) / max(n_sweeps, 1), "tries": list(m),
             "rows_mib": arr.nbytes / 2**20}
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
                                 eta_burn_in: int | None = None,
                                 tries: int | tuple[int, int] | None = None) -> tuple[SamplerArrays, dict]:
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
    n_sweeps = int(n_sweeps)
    burn = n_sweeps // 2 if eta_burn_in is None else min(int(eta_burn_in), n_sweeps - 1)
    arr = SamplerArrays(U, tok_w.shape[0], K, table_draws, freq=np.bincount(tok_w, minlength=U))
    Gk = np.full(K, n_vocab * beta)
    G = np.zeros((1, 1))
    seeds = np.random.SeedSequence(seed).generate_state(n_sweeps + 1, dtype=np.uint32)
    sv = _SupervisedSweeps(head, targets, tok_ptr, K)
    mixture = proposal == "mixture"
    word_prior = alpha_proposal == "word"
    m = resolve_tries(tries, K)
    total = np.zeros(sup.N_STATS, dtype=np.int64)
    t_kernel = t_head = 0.0
    t0 = time.perf_counter()
    total += sup.run_sweeps(arr, seeds[0], tok_w, tok_ptr, Gk, G, False, beta, alpha, 0, mh_steps, mixture, 1,
                            sv.eta, sv.rho, sv.kappa, sv.sup_doc, word_prior=word_prior, tries=m)
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
                                mixture, 0, sv.eta, sv.rho, sv.kappa, sv.sup_doc, word_prior=word_prior, tries=m)
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
    stats = {"mh_acceptance": _acceptance_sup(total), "alias_rebuilds": int(total[S_REBUILDS]),
             "sweeps": n_sweeps, "sampling_seconds": t_kernel + t_head, "kernel_seconds": t_kernel,
             "supervised_seconds": t_head, "changed_per_sweep": float(total[S_CHANGED]) / max(n_sweeps, 1),
             "exp_proposal_docs_per_sweep": float(total[sup._S_EXP_DOCS]) / max(n_sweeps, 1),
             "supervised_docs": int(Lr), "eta_retained": kept, "tries": list(m)}
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
    table_draws : samples drawn from a frequent word's alias table before it is rebuilt (None:
        max(K, 256); rare words' tables hold fewer, ``word_rows.WordRows``).
    tries : candidates per MH step, drawn from the step's proposal and chosen among by the other
        factor of the target (multiple-try MH, module docstring): an int for both kinds or a
        (word, doc) pair; None: (2, 1) for K >= 256, else (1, 1).
    seed_source : callable returning a fresh seed per call (the model's Generator); without
        it the engine uses its own ``numpy.random.Generator(seed)``.
    """

    burn_in: int = 4
    sample_sweeps: int = 4
    mh_steps: int = 2
    proposal: str = "cycle"
    table_draws: int | None = None
    alpha_proposal: str = "word"
    tries: int | tuple[int, int] | None = None
    seed: int = 0
    seed_source: Callable[[], int] | None = field(default=None, repr=False)
    name: str = "alias"

    def __post_init__(self):
        if self.proposal not in PROPOSALS:
            raise ValueError(f"proposal must be one of {PROPOSALS} (got {self.proposal!r})")
        if self.alpha_proposal not in ALPHA_PROPOSALS:
            raise ValueError(f"alpha_proposal must be one of {ALPHA_PROPOSALS} (got {self.alpha_proposal!r})")
        self.tries = check_tries(self.tries)
        self._rng = np.random.default_rng(self.seed)

    def _tries(self, K: int) -> tuple[int, int]:
        return resolve_tries(self.tries, K)

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
        arr = SamplerArrays(U, N, K, self.table_draws)  # dense rows: the prior lambda_wk is dense
        # lambda for the batch's words and all-vocabulary totals: the prior of this batch's topics
        G = state.beta + state.scale * state.mu[batch.uniq]
        Gk = state.lam_totals().astype(np.float64)
        z_rec = np.zeros((n_samp if summarize else 0, N), dtype=np.int32)
        doc_acc = np.zeros((D, K))
        stats = arr.run(seed, tok_w, tok_ptr, Gk, G, True, state.beta, state.alpha, n_burn + n_samp, self.mh_steps,
                        self.proposal == "mixture", 2, n_burn, z_rec, doc_acc,
                        word_prior=self.alpha_proposal == "word", tries=self._tries(K))
        objective = arr.word_loglik(tok_w, Gk, G, True, state.beta)
        doc_topic = doc_acc / n_samp
        summary = None
        if summarize:
            summary = _summary_from_samples(batch, tok_w, z_rec, K)
        return LocalResult(
            doc_topic=doc_topic,
            summary=summary,
            iterations=np.full(D, n_burn + n_samp, dtype=np.int32),
            objective=float(objective),
            stats={"mh_acceptance": _acceptance(stats), "alias_rebuilds": int(stats[S_REBUILDS]),
                   "sweeps": n_burn + n_samp,
                   "changed_per_token": float(stats[S_CHANGED]) / max(N * (n_burn + n_samp), 1)},
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
        arr = SamplerArrays(U, N, K, self.table_draws)
        G = state.beta + state.scale * state.mu[batch.uniq]
        Gk = state.lam_totals().astype(np.float64)
        z_rec = np.zeros((n_samp if summarize else 0, N), dtype=np.int32)
        doc_acc = np.zeros((D, K))
        seeds = np.random.SeedSequence(seed).generate_state(n_total + 1, dtype=np.uint32)
        sv = _SupervisedSweeps(head, targets, tok_ptr, K)
        tries = self._tries(K)
        mixture = self.proposal == "mixture"
        word_prior = self.alpha_proposal == "word"
        total = np.zeros(sup.N_STATS, dtype=np.int64)
        total += sup.run_sweeps(arr, seeds[0], tok_w, tok_ptr, Gk, G, True, state.beta, state.alpha, 0,
                                self.mh_steps, mixture, 2, sv.eta, sv.rho, sv.kappa, sv.sup_doc,
                                word_prior=word_prior, tries=tries)
        t_head = 0.0
        for sweep in range(n_total):
            t0 = time.perf_counter()
            sv.augment(arr.z)
            t_head += time.perf_counter() - t0
            rec = sweep - n_burn
            total += sup.run_sweeps(arr, seeds[sweep + 1], tok_w, tok_ptr, Gk, G, True, state.beta, state.alpha, 1,
                                    self.mh_steps, mixture, 0, sv.eta, sv.rho, sv.kappa, sv.sup_doc,
                                    word_prior=word_prior, tries=tries, record_from=0 if rec >= 0 else 1,
                                    z_rec=z_rec[rec:rec + 1] if rec >= 0 and summarize else None,
                                    doc_acc=doc_acc if rec >= 0 else None)
        objective = arr.word_loglik(tok_w, Gk, G, True, state.beta)
        summary = _summary_from_samples(batch, tok_w, z_rec, K) if summarize else None
        return LocalResult(
            doc_topic=doc_acc / n_samp, summary=summary, iterations=np.full(D, n_total, dtype=np.int32),
            objective=float(objective),
            stats={"mh_acceptance": _acceptance_sup(total), "alias_rebuilds": int(total[S_REBUILDS]),
                   "sweeps": n_total, "changed_per_token": float(total[S_CHANGED]) / max(N * n_total, 1),
                   "exp_proposal_docs": int(total[sup._S_EXP_DOCS]), "augment_seconds": t_head, "tries": list(tries),
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
                alpha_proposal=self.alpha_proposal, eta_sweeps=eta_sweeps, eta_burn_in=eta_burn_in,
                tries=self.tries)
        else:
            arr, stats = run_batch_sampler(tok_w, tok_ptr, batch.uniq.shape[0], state.n_topics, state.alpha,
                                           state.beta, state.n_words, n_sweeps, seed, mh_steps=self.mh_steps,
                                           proposal=self.proposal, table_draws=self.table_draws, callback=callback,
                                           callback_every=callback_every, alpha_proposal=self.alpha_proposal,
                                           tries=self.tries)
        arr.release_tables()  # free the proposal buffers before lambda is written
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
                "proposal": self.proposal, "table_draws": self.table_draws, "alpha_proposal": self.alpha_proposal,
                "tries": None if self.tries is None else list(self.tries)}


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
