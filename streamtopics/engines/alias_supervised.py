"""Supervised Alias-MH (LightMedLDA): word, doc and exp proposals against the regularised conditional.

References: Zheng, Yu & Xing, "Linear time samplers for supervised topic models using
compositional proposals" (LightMedLDA, KDD'15, §3.3-3.4, §4), Gibbs MedLDA (Zhu et al. 2013,
eq. 12) and the Pólya-Gamma sLDA (Zhu, Zheng & Zhang 2013, eq. 9); docs/supervised.md §5.1.

Target for token i of document d (N = N_d tokens, counts ¬i; rho_dy, kappa_dy the current
augmentation, eta a sample, L labels):

    p(z_i = k | rest) ∝ (n_dk + alpha)(g_wk + n_wk)/(G_k + n_k) · exp(g_d(k)),
    g_d(k) = sum_y [(kappa_dy/N - rho_dy m_dy/N^2) eta_yk - rho_dy eta_yk^2/(2 N^2)],
    m_dy = eta_y^T n_d^{¬i}                                            (LightMedLDA eqs. 15-16)

Bookkeeping per document visit (O(L K), amortised over its tokens as LightMedLDA §3.3 says):
``G1_k = sum_y kappa_dy/N eta_yk - rho_dy/(2N^2) eta_yk^2`` and the running classifier
re-weighted count ``M_y = eta_y^T n_d`` (all tokens), updated in O(L) when a token moves, so
``g_d(k) = G1_k - sum_y c_y (M_y - eta_ys) eta_yk`` with c_y = rho_dy/N^2 costs O(L) for any k
(s: the token's topic; m^{¬i} = M - eta_s).  With a single task this is LightMedLDA's O(1).

Proposals (each an independent MH kernel with its exact acceptance; composed by cycle or
mixture, LightMedLDA Theorem 1):

* word proposal: the unsupervised engine's stale Walker table (token's own build-time count
  removed), acceptance ``[p_LDA(t) q(s)]/[p_LDA(s) q(t)] · exp(g_d(t) - g_d(s))``;
* doc proposal: a random other token's topic, or the alpha part; the supervised factor again
  enters the ratio as ``exp(g_d(t) - g_d(s))``;
* exp proposal (LightMedLDA §3.3): ``p_e(k) ∝ exp(g~_d(k))`` from the count M~ frozen when the
  document's alias table was built (one table per document visit, O(L K), reused by all its
  tokens).  M~ contains token i's own topic b at build time, and a proposal that depends on
  the token's current value is not a valid independent-MH proposal (it biases the chain,
  the same issue as for the word table).  Token i therefore uses the table without its own
  contribution, ``q_i(k) ∝ exp(g~_d(k) + sum_y c_y eta_yb eta_yk)``, drawn exactly by
  rejection from the table with the bound ``sum_y c_y eta_yb eta_yk <= B_b = sum_y c_y
  |eta_yb| max_k |eta_yk|`` (O(L) per draw).  As b is the token's value before its update and
  every other token's build-time value is fixed, g~ - log q_i differs from g only through
  M - M~ (other tokens' moves since the build), and the acceptance s -> t is

      A_e = min(1, [p_LDA(t)/p_LDA(s)] · exp(-sum_y c_y (M_y - M~_y)(eta_yt - eta_ys))).

  The rejection bound can be poor for short documents with a strong supervised term; the
  exp proposal is used in a document only when ``sum_y c_y max_k eta_yk^2 <= exp_gate``
  (a per-document test independent of the topics, so the composition stays exact),
  otherwise its slots become doc proposals.

Unlabelled documents (``sup_doc`` False, or rho = kappa = 0) are sampled exactly as the
unsupervised kernel does (their exp slots become doc proposals).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from .alias_params import S_CHANGED, S_DOC_ACC, S_DOC_PROP, S_REBUILDS, S_WORD_ACC, S_WORD_PROP, resolve_tries
from .walker import rng_next, prefetch, rng_state, alias_build
from .word_rows import (MAX_LOAD_DEN, MAX_LOAD_NUM, M_CAP, M_OCC, M_OFF, M_PTR, M_SOFF, M_T, M_VER, M_ZT,
                        row_delete, draw_table, row_find, row_find_or_insert, row_rebuild, row_slot, build_shared_prior)

# extra statistics slots (after the unsupervised engine's six)
_S_EXP_PROP, _S_EXP_ACC, _S_EXP_DOCS, _S_EXP_REJ = 6, 7, 8, 9
N_STATS = 10
EXP_GATE = 2.0

_WORD, _DOC, _EXP = 0, 1, 2


@njit(cache=True, nogil=True, inline="always")
def _accept(rs, num, den, delta):
    """MH test for the ratio (num/den) exp(delta), num, den > 0; returns (state, accepted)."""
    if delta >= 0.0 and num >= den:
        return rs, True
    rs, x = rng_next(rs)
    return rs, x * den < num * math.exp(delta)


@njit(cache=True, nogil=True)
def sup_mh_sweeps(rs, tok_w, tok_ptr, z, tver, tb, ent, entf, meta, metaf, samples, nk, Gk, G, dense_prior, beta,
                  alpha, n_sweeps, mh_steps, mixture, word_prior, init, record_from, z_rec, doc_acc,
                  etaT, rho, kappa, sup_doc, exp_gate, use_exp, word_tries, doc_tries):
    """``n_sweeps`` sweeps of supervised Alias-MH; arguments as ``alias.mh_sweeps`` plus

    etaT (K, L) the classifier sample transposed (row k = eta_{., k}, contiguous), rho/kappa
    (D, L) the current augmentation coefficients, sup_doc (D,) bool: document d is
    supervised.  Each MH step is a word, a doc and an exp proposal ("cycle") or three
    proposals picked uniformly among them (``mixture`` 1); ``mixture`` 2 uses exp proposals
    only (tests: the exp kernel alone must keep the target).  ``word_tries`` / ``doc_tries``
    candidates per word / doc step, as in ``alias.mh_sweeps`` (independent multiple-try MH,
    Liu, Liang & Wong 2000): the word step picks among its candidates by the document factor
    (n_dk + alpha) and corrects to the regularised target by delayed acceptance (Christen &
    Fox 2005) with [b(t) exp(g_d(t)) q_i(s)] / [b(s) exp(g_d(s)) q_i(t)]; the doc step picks by
    p/q_d with p the regularised target itself.  Exp steps stay single-try.  Returns the statistics vector
    (unsupervised slots + exp proposals / acceptances / documents using it / rejections).
    """
    K = nk.shape[0]
    L = etaT.shape[1]
    D = tok_ptr.shape[0] - 1
    N = tok_w.shape[0]
    stats = np.zeros(N_STATS, dtype=np.int64)
    rk = np.empty(K)
    wbuf = np.empty(K)
    widx = np.empty(K, dtype=np.int64)
    prob = np.empty(K)
    alias = np.empty(K, dtype=np.int32)
    small = np.empty(K, dtype=np.int32)
    large = np.empty(K, dtype=np.int32)
    keys = np.empty(K, dtype=np.int64)
    vals = np.empty(K, dtype=np.int64)
    Bw = np.zeros(K)  # shared prior part of the word proposal (batch mode, word_rows docstring)
    BR = np.ones(K)
    Bprob = np.ones(K)
    Balias = np.zeros(K, dtype=np.int32)
    use_B = not dense_prior
    B_tot = 0.0
    # exp-proposal table of the current document
    eprob = np.empty(K)
    ealias = np.empty(K, dtype=np.int32)
    ew = np.empty(K)
    gt = np.empty(K)   # log-weights g~_d(k) of the table (stale M~)
    G1 = np.empty(K)   # kappa/N eta - rho/(2N^2) eta^2 summed over labels
    M = np.zeros(L)    # eta_y^T n_d (current, all tokens)
    Mt = np.zeros(L)   # M at the table's build
    cy = np.zeros(L)
    vi = np.zeros(L)
    emax = np.zeros(L)
    for l in range(L):
        mx = 0.0
        for k in range(K):
            a = abs(etaT[k, l])
            if a > mx:
                mx = a
        emax[l] = mx
    nd = np.zeros(K, dtype=np.int32)
    P = 3 * mh_steps
    MT = max(word_tries, doc_tries, 1)  # candidate slots per step
    p_t = np.zeros(P * MT, dtype=np.int64)
    p_kind = np.zeros(P, dtype=np.int64)
    p_m = np.ones(P, dtype=np.int64)
    p_b = np.zeros(P * MT)
    p_a = np.zeros(P * MT)
    p_g = np.zeros(P * MT)
    p_q = np.zeros(P * MT)
    p_w = np.zeros(MT)
    Ka = K * alpha
    inv_alpha = 1.0 / alpha
    record_docs = doc_acc.shape[0] == D and D > 0
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
            tver[i] = meta[mu + M_VER]
            tb[i] = -1

    n_wp = 0
    n_wa = 0
    n_dp = 0
    n_da = 0
    n_ep = 0
    n_ea = 0
    n_changed = 0
    for sweep in range(n_sweeps):
        if use_B:
            B_tot = build_shared_prior(Gk, nk, beta, Bw, BR, Bprob, Balias, small, large)
        for d in range(D):
            s0 = tok_ptr[d]
            e0 = tok_ptr[d + 1]
            if e0 == s0:
                continue
            Nd = e0 - s0
            others = Nd - 1
            d_mass = others + Ka
            for i in range(s0, e0):
                nd[z[i]] += 1
            # ---- supervised per-document quantities (O(L K) per visit) ----
            sup = False
            inv_n = 1.0 / Nd
            if sup_doc[d]:
                n2 = inv_n * inv_n
                for l in range(L):
                    cy[l] = rho[d, l] * n2
                    if rho[d, l] != 0.0 or kappa[d, l] != 0.0:
                        sup = True
            exp_on = False
            if sup:
                for k in range(K):
                    acc = 0.0
                    for l in range(L):
                        e = etaT[k, l]
                        acc += (kappa[d, l] * inv_n - 0.5 * cy[l] * e) * e
                    G1[k] = acc
                for l in range(L):
                    M[l] = 0.0
                for k in range(K):
                    c = nd[k]
                    if c != 0:
                        for l in range(L):
                            M[l] += c * etaT[k, l]
                if use_exp:
                    bmax = 0.0
                    for l in range(L):
                        bmax += cy[l] * emax[l] * emax[l]
                    exp_on = bmax <= exp_gate
                if exp_on:
                    stats[_S_EXP_DOCS] += 1
                    gmax = -np.inf
                    for k in range(K):
                        acc = G1[k]
                        for l in range(L):
                            acc -= cy[l] * M[l] * etaT[k, l]
                        gt[k] = acc
                        if acc > gmax:
                            gmax = acc
                    for k in range(K):
                        ew[k] = math.exp(gt[k] - gmax)
                    alias_build(ew, eprob, ealias, small, large)
                    for l in range(L):
                        Mt[l] = M[l]
            for i in range(s0, e0):
                if i + 4 < N:
                    prefetch(meta, 8 * tok_w[i + 4])
                if i + 2 < N:
                    m2 = 8 * tok_w[i + 2]
                    prefetch(ent, 4 * (meta[m2 + M_OFF] + row_slot(z[i + 2], meta[m2 + M_CAP], K)))
                    prefetch(samples, meta[m2 + M_SOFF] + min(meta[m2 + M_PTR], meta[m2 + M_T] - 1))
                u = tok_w[i]
                s = np.int64(z[i])
                ub = u * K
                mu = 8 * u
                base = meta[mu + M_OFF]
                cu = meta[mu + M_CAP]
                T_u = meta[mu + M_T]
                lo = meta[mu + M_SOFF]
                if tver[i] != meta[mu + M_VER]:
                    tver[i] = meta[mu + M_VER]
                    tb[i] = s
                # kinds of this token's proposals
                n_word = 0
                n_doc = 0
                for p in range(P):
                    if mixture == 1:
                        rs, x = rng_next(rs)
                        kind = min(int(x * 3.0), 2)
                    elif mixture == 2:  # exp proposals only (tests)
                        kind = _EXP
                    else:
                        kind = p % 3
                    if kind == _EXP and not exp_on:
                        kind = _DOC
                    p_kind[p] = kind
                    if kind == _WORD:
                        n_word += 1
                        p_m[p] = word_tries
                    elif kind == _DOC:
                        n_doc += 1
                        p_m[p] = doc_tries
                    else:
                        p_m[p] = 1
                n_draw = n_word * word_tries + n_doc * doc_tries if word_prior else n_word * word_tries
                # token i's word proposal q_i without its own contributions (word_rows docstring)
                b = np.int64(-1)
                fb = 1.0
                S_i = 0.0
                Bx = 0.0
                Z_i = 1.0
                if n_draw > 0:
                    if meta[mu + M_PTR] + n_draw > T_u:
                        rs = row_rebuild(u, s, K, ent, entf, meta, metaf, samples, G, dense_prior, nk, Gk, rk, wbuf,
                                      widx, prob, alias, small, large, keys, vals, rs)
                        stats[S_REBUILDS] += 1
                        tver[i] = meta[mu + M_VER]
                        tb[i] = -1
                    b = np.int64(tb[i])
                    S_i = metaf[mu + M_ZT]
                    if b >= 0:
                        eb = row_find(ent, base, cu, K, b)
                        fb = np.float64(entf[4 * eb + 2])  # A_i(b) / A~_b, stored at the build
                        S_i -= np.float64(entf[4 * eb + 3]) * (1.0 - fb)
                        if S_i <= 1e-9 * metaf[mu + M_ZT]:
                            S_i = 0.0
                    if use_B:
                        Bx = beta / (BR[s] * (BR[s] - 1.0))
                    Z_i = S_i + B_tot + Bx
                ka_z = Ka / Z_i
                ptr = meta[mu + M_PTR]
                # exp proposal of token i: the table without its own build-time topic (= s)
                bs = 0.0
                if exp_on:
                    for l in range(L):
                        bs += cy[l] * abs(etaT[s, l]) * emax[l]
                for pj in range(P * MT):
                    p = pj // MT
                    if pj - p * MT >= p_m[p]:
                        continue
                    kind = p_kind[p]
                    from_table = kind == _WORD
                    if kind == _EXP:
                        while True:
                            rs, x = rng_next(rs)
                            x *= K
                            j = min(int(x), K - 1)
                            t = np.int64(j if x - j < eprob[j] else ealias[j])
                            lf = 0.0
                            for l in range(L):
                                lf += cy[l] * etaT[s, l] * etaT[t, l]
                            if lf >= bs:
                                break
                            rs, x = rng_next(rs)
                            if x < math.exp(lf - bs):
                                break
                            stats[_S_EXP_REJ] += 1
                    elif kind == _DOC:
                        rs, x = rng_next(rs)
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
                        # a draw from q_i: count part w.p. S_i / Z_i, else the shared prior part
                        rs, x = rng_next(rs)
                        x *= Z_i
                        if x < S_i:
                            while True:
                                if ptr >= T_u:  # rejections ran past the buffer: same table, more draws
                                    rs = draw_table(u, K, ent, entf, meta, samples, wbuf, widx, prob, alias, small,
                                                     large, rs)
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
                                y = (y - Bx) / B_tot * K
                                bb = min(int(y), K - 1)
                                t = np.int64(bb if y - bb < Bprob[bb] else Balias[bb])
                    p_t[pj] = t
                meta[mu + M_PTR] = ptr
                # ¬i factors of s
                es = row_find(ent, base, cu, K, s)
                g_s = G[ub + s] if dense_prior else beta
                b_s = (g_s + ent[4 * es + 1] - 1) / (Gk[s] + nk[s] - 1)
                q_s = np.float64(entf[4 * es + 3]) * (fb if s == b else 1.0) + Bw[s] + Bx  # q_i(s)
                a_s = nd[s] - 1 + alpha
                sg_s = 0.0
                if sup:
                    # v = c (M - eta_s): the token's ¬i re-weighted count times c
                    for l in range(L):
                        vi[l] = cy[l] * (M[l] - etaT[s, l])
                    acc = G1[s]
                    for l in range(L):
                        acc -= vi[l] * etaT[s, l]
                    sg_s = acc
                for p in range(P * MT):
                    if p - (p // MT) * MT >= p_m[p // MT]:
                        continue
                    t = p_t[p]
                    if t == s:
                        p_b[p] = b_s
                        p_a[p] = a_s
                        p_g[p] = sg_s
                        p_q[p] = q_s
                    else:
                        e = row_find(ent, base, cu, K, t)
                        n_t = ent[4 * e + 1] if e >= 0 else 0
                        A_t = np.float64(entf[4 * e + 3]) if e >= 0 else 0.0
                        p_b[p] = ((G[ub + t] if dense_prior else beta) + n_t) * rk[t]
                        p_q[p] = A_t * (fb if t == b else 1.0) + Bw[t]
                        p_a[p] = nd[t] + alpha
                        if sup:
                            acc = G1[t]
                            for l in range(L):
                                acc -= vi[l] * etaT[t, l]
                            p_g[p] = acc
                        else:
                            p_g[p] = 0.0
                cur = s
                b_cur = b_s
                a_cur = a_s
                g_cur = sg_s
                q_c = q_s
                for p in range(P):
                    kind = p_kind[p]
                    m = p_m[p]
                    o = p * MT
                    if m > 1:  # multiple-try word / doc step (docstring); picks candidate o + J
                        if kind == _WORD:
                            n_wp += 1
                            W = 0.0
                            for j in range(m):
                                p_w[j] = p_a[o + j]  # pi1 / q_i = n_dk + alpha
                                W += p_w[j]
                            w_cur = a_cur
                        else:
                            n_dp += 1
                            gref = g_cur
                            for j in range(m):
                                if p_g[o + j] > gref:
                                    gref = p_g[o + j]
                            W = 0.0
                            for j in range(m):
                                k = o + j
                                qd = p_a[k] - alpha + ka_z * p_q[k] if word_prior else p_a[k]
                                p_w[j] = p_a[k] * p_b[k] * math.exp(p_g[k] - gref) / qd  # p / q_d
                                W += p_w[j]
                            qd = a_cur - alpha + ka_z * q_c if word_prior else a_cur
                            w_cur = a_cur * b_cur * math.exp(g_cur - gref) / qd if qd > 0.0 else np.inf
                        rs, x = rng_next(rs)
                        x *= W
                        J = 0
                        acc = p_w[0]
                        while acc <= x and J < m - 1:
                            J += 1
                            acc += p_w[J]
                        k = o + J
                        t = p_t[k]
                        if t != cur:
                            den = W - p_w[J] + w_cur
                            if not den < np.inf:
                                continue
                            rs, ok = _accept(rs, W, den, 0.0)  # I-MTM: min(1, W / (W - w(y_J) + w(x)))
                            if not ok:
                                continue
                            if kind == _WORD:  # stage 2: pi1 -> the regularised target
                                rs, ok = _accept(rs, p_b[k] * q_c, b_cur * p_q[k], p_g[k] - g_cur)
                                if not ok:
                                    continue
                        if kind == _WORD:
                            n_wa += 1
                        else:
                            n_da += 1
                        if t == cur:
                            continue
                        cur = t
                        b_cur = p_b[k]
                        a_cur = p_a[k]
                        g_cur = p_g[k]
                        q_c = p_q[k]
                        continue
                    t = p_t[o]
                    b_t = p_b[o]
                    a_t = p_a[o]
                    g_t = p_g[o]
                    q_t = p_q[o]
                    if kind == _WORD:
                        n_wp += 1
                        if t == cur:
                            n_wa += 1
                            continue
                        rs, ok = _accept(rs, a_t * b_t * q_c, a_cur * b_cur * q_t, g_t - g_cur)
                        if not ok:
                            continue
                        n_wa += 1
                    elif kind == _DOC:
                        n_dp += 1
                        if t == cur:
                            n_da += 1
                            continue
                        if word_prior:
                            qd_t = a_t - alpha + ka_z * q_t
                            qd_c = a_cur - alpha + ka_z * q_c
                            rs, ok = _accept(rs, a_t * b_t * qd_c, a_cur * b_cur * qd_t, g_t - g_cur)
                        else:
                            rs, ok = _accept(rs, b_t, b_cur, g_t - g_cur)
                        if not ok:
                            continue
                        n_da += 1
                    else:
                        n_ep += 1
                        if t == cur:
                            n_ea += 1
                            continue
                        # A_e: exp(g) / q_i differs from the target only through M - M~
                        dlt = 0.0
                        for l in range(L):
                            dlt -= cy[l] * (M[l] - Mt[l]) * (etaT[t, l] - etaT[cur, l])
                        rs, ok = _accept(rs, a_t * b_t, a_cur * b_cur, dlt)
                        if not ok:
                            continue
                        n_ea += 1
                    cur = t
                    b_cur = b_t
                    a_cur = a_t
                    g_cur = g_t
                    q_c = q_t
                if cur != s:
                    z[i] = cur
                    nd[s] -= 1
                    ent[4 * es + 1] -= 1
                    if cu < K and ent[4 * es + 1] == 0 and ent[4 * es + 3] == 0:
                        row_delete(ent, meta, u, base, cu, es)
                    nk[s] -= 1
                    rk[s] = 1.0 / (Gk[s] + nk[s])
                    nd[cur] += 1
                    e = row_find_or_insert(ent, meta, u, base, cu, K, cur)
                    ent[4 * e + 1] += 1
                    nk[cur] += 1
                    rk[cur] = 1.0 / (Gk[cur] + nk[cur])
                    if sup:
                        for l in range(L):
                            M[l] += etaT[cur, l] - etaT[s, l]
                    n_changed += 1
                    if cu < K and MAX_LOAD_DEN * meta[mu + M_OCC] > MAX_LOAD_NUM * cu:
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
    stats[S_WORD_PROP] = n_wp
    stats[S_WORD_ACC] = n_wa
    stats[S_DOC_PROP] = n_dp
    stats[S_DOC_ACC] = n_da
    stats[_S_EXP_PROP] = n_ep
    stats[_S_EXP_ACC] = n_ea
    stats[S_CHANGED] = n_changed
    return stats


@njit(cache=True, nogil=True)
def doc_topic_counts(z, tok_ptr, K, out):
    """out[d, k] = number of tokens of document d on topic k (out is overwritten)."""
    D = tok_ptr.shape[0] - 1
    for d in range(D):
        for k in range(K):
            out[d, k] = 0.0
        for i in range(tok_ptr[d], tok_ptr[d + 1]):
            out[d, z[i]] += 1.0


def run_sweeps(arr, seed, tok_w, tok_ptr, Gk, G, dense_prior, beta, alpha, n_sweeps, mh_steps, mixture, init,
               eta, rho, kappa, sup_doc, word_prior=True, record_from=None, z_rec=None, doc_acc=None,
               exp_gate=EXP_GATE, use_exp=True, tries=(1, 1)) -> np.ndarray:
    """Host wrapper of :func:`sup_mh_sweeps` over a ``SamplerArrays`` (see ``alias.SamplerArrays.run``);
    ``mixture``: False/0 cycle, True/1 mixture, 2 exp proposals only; ``tries`` (word, doc)
    candidates per step (an int for both)."""
    K = arr.nk.shape[0]
    word_tries, doc_tries = resolve_tries(tries, K)
    etaT = np.ascontiguousarray(np.asarray(eta, dtype=np.float64).T)
    if etaT.shape[1] == 0:
        etaT = np.zeros((K, 1))
        rho = np.zeros((tok_ptr.shape[0] - 1, 1))
        kappa = rho
    return sup_mh_sweeps(rng_state(seed), tok_w, tok_ptr, arr.z, arr.tver, arr.tb, arr.ent, arr.entf, arr.meta,
                         arr.metaf, arr.samples, arr.nk, Gk, np.ascontiguousarray(G).reshape(-1), bool(dense_prior),
                         float(beta), float(alpha), int(n_sweeps), int(mh_steps), int(mixture), bool(word_prior),
                         int(init), n_sweeps if record_from is None else int(record_from),
                         np.zeros((0, 0), dtype=np.int32) if z_rec is None else z_rec,
                         np.zeros((0, K)) if doc_acc is None else doc_acc,
                         etaT, np.ascontiguousarray(rho, dtype=np.float64),
                         np.ascontiguousarray(kappa, dtype=np.float64), np.ascontiguousarray(sup_doc, dtype=np.bool_),
                         float(exp_gate), bool(use_exp), int(word_tries), int(doc_tries))
