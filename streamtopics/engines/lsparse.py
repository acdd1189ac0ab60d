"""L-sparse variational local step for LDA (Hughes & Sudderth, "Fast learning of clusters
and topics via sparse posteriors", §5, Alg. 2 right, App. D).

Per document d and distinct word type u (count c_du), the responsibilities r_du keep at
most L non-zero entries: the top-L of the weights

    W_duk = E[log phi_{k v_du}] + E[log pi_dk],   E[log pi_dk] = psi(N_dk + alpha) - const

(Eq. 10), exponentiated and normalised over the L winners only (TopLRespFromWeights,
Alg. 1).  Only the document's active topics A_d = {k : N_dk > eps} are candidates
(App. D.3); selection runs on the first 5 iterations and then every 10, otherwise each
token's current L topics are just reweighted.  Cold start from the topic-word weights;
iterate until max_k |delta N_dk| < tol or max_iter.  Restart proposals (App. D.4) then
try to drop each small active topic, run a few iterations and keep the proposal only if
the document objective improves.

alpha here is the per-topic Dirichlet concentration (the paper's alpha/K).

Supervised local step (docs/supervised.md §5.2-§5.3).  With a classifier head and the
batch's targets, a labelled document's weights gain the gradient of the expected
pseudo-likelihood E_q[log psi_d] of its labels:

    W_duk = E[log phi_{k v_du}] + E[log pi_dk] + G_dk,
    G_dk = sum_y (E kappa_dy / N - E rho_dy mbar_dy / N^2) e_yk
                 - E rho_dy / (2 N^2) (e_yk^2 + v_yk (1 + 2 cbar_dk)),

with e, v the mean and variance of q(eta), cbar_dk = N_dk (N - 1)/N and mbar_dy = e_y^T cbar_d.
G_dk is the average over the document's N tokens of the exact per-token gradient (§5.2
uses each token's own "counts without me" c^{-n}; those are linear in c^{-n} and average
to cbar), so it depends on (d, k) only and enters through the per-topic term P_k, like
E[log pi_dk]: the cost is O(n_labels) per active topic per iteration, the per-token work
and the L-sparse selection are unchanged.  The expected augmentation (E rho, E kappa) is
recomputed from the exact E[omega], E[omega^2] of the current responsibilities on the
selection iterations (O(n_labels L) per word type there).  Restart proposals compare the
unsupervised objective, so labelled documents skip them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .._numeric import digamma, select_top
from ..jit_cache import njit
from ..parallel import ThreadRunner, claim_range
from ..state import require_topics
from ..summary import LocalResult, Summary, summarize_sparse

# Below this sum of the winners' exps the multiplicative domain has lost its precision
# (subnormal floats, and 1/z overflows below ~5.6e-309): the pass recomputes those
# responsibilities in the log domain. A strong label term (large c or prior variance, short
# documents) drives every winner of a token far below the document's best topic; a subnormal
# z had turned into inf responsibilities and NaN topics.
Z_NORMAL = 1e-250


@njit(cache=True, nogil=True)
def _resp_pass(C, eC, loc, cnt, s, e, L, P, eP, N, Nold, sel, in_sel, n_sel, select, eps,
               top_idx, top_r, top_e, top_n, vals, idxbuf, w):
    """One sweep over a document's word types; returns (n_sel, max |delta N|).

    Between selections a token's winners are fixed, so r_ul is proportional to
    exp(C_uk) exp(P_k): with e_ul = exp(C_uk - max_l C_ul) stored at selection time and
    eP_k = exp(P_k - max P) computed once per topic, re-weighting needs no exp at all.
    """
    for a in range(n_sel):
        k = sel[a]
        Nold[k] = N[k]
        N[k] = 0.0
    if select > 0:
        # Candidates are the active topics; pruned ones never come back (App. D.3).
        m = 0
        for a in range(n_sel):
            k = sel[a]
            if Nold[k] > eps:
                sel[m] = k
                m += 1
            else:
                in_sel[k] = 0
        n_sel = m
    want = L if n_sel > L else n_sel
    for j in range(s, e):
        u = loc[j]
        pick = select == 1
        if select == 2:
            # Restart proposal: only tokens that lost one of their winners choose again.
            for l in range(top_n[j]):
                if not in_sel[top_idx[j, l]]:
                    pick = True
                    break
        if pick:
            # Exact top-L with a warm threshold: the token's previous winners, re-weighted,
            # bound the L-th best weight from below, so only values >= tau can win.
            tau = np.inf
            vmax = -np.inf
            valid = 0
            for l in range(top_n[j]):
                k = top_idx[j, l]
                if in_sel[k]:
                    v = C[u, k] + P[k]
                    if v < tau:
                        tau = v
                    if v > vmax:
                        vmax = v
                    valid += 1
            if valid < want:
                tau = -np.inf
            if want < n_sel:
                # A candidate 36 nats below the best has r < 2.3e-16 r_max: it cannot change
                # N_dk in float64, so leaving it out keeps the result and the selection small.
                floor = vmax - 36.0
                if floor > tau:
                    tau = floor
            # Every candidate that can win (W_uk >= tau) is kept, compacted without a branch, and
            # the best `want` of those few are selected (SelectTopL, Alg. 1): typically ~10 of
            # the active set survive. (A scan in decreasing P_k that stopped at the bound
            # max_k C_uk + P_k < tau cost more: in the first iterations the active set is most of
            # K, P is flat and the bound rarely stopped it; its branches and the per-pass sort
            # of the candidates were most of the selection's time.)
            n = 0
            for a in range(n_sel):
                k = sel[a]
                v = C[u, k] + P[k]
                vals[n] = v
                idxbuf[n] = k
                n += v >= tau
            if n > want:
                select_top(vals, idxbuf, n, want)
                n = want
            m = n  # fewer than L only when the floor left fewer (the rest were negligible anyway)
            for l in range(m):
                k = idxbuf[l]
                top_idx[j, l] = k
                top_e[j, l] = eC[u, k]  # exp(C_uk - max_k C_uk), once per batch (word_top_rows)
            top_n[j] = m
        # r_ul = exp(C_uk + P_k) / z = top_e * eP / z': the winners' exps are shared with the
        # re-weighting iterations (one exp per winner per selection, none in between).
        m = top_n[j]
        z = 0.0
        for l in range(m):
            q = top_e[j, l] * eP[top_idx[j, l]]
            top_r[j, l] = q
            z += q
        if z > Z_NORMAL:
            inv = 1.0 / z
            c = cnt[j]
            for l in range(m):
                r = top_r[j, l] * inv
                top_r[j, l] = r
                N[top_idx[j, l]] += c * r
            continue
        for l in range(m):  # (nearly) underflowed: the log domain, exact at any scale
            k = top_idx[j, l]
            w[l] = C[u, k] + P[k]
        mx = w[0]
        for l in range(1, m):
            if w[l] > mx:
                mx = w[l]
        z = 0.0
        for l in range(m):
            r = math.exp(w[l] - mx)
            top_r[j, l] = r
            z += r
        c = cnt[j]
        for l in range(m):
            r = top_r[j, l] / z
            top_r[j, l] = r
            N[top_idx[j, l]] += c * r
    # Pruned topics moved by at most eps, so the survivors decide convergence.
    delta = 0.0
    for a in range(n_sel):
        k = sel[a]
        dd = abs(N[k] - Nold[k])
        if dd > delta:
            delta = dd
    return n_sel, delta


@njit(cache=True, nogil=True)
def _word_top(C, L):
    """Cold-start top-L per batch word: with a uniform document prior W_duk = C_uk depends on u only.
    Also returns max_k C_uk per word."""
    U = C.shape[0]
    idx = np.empty((U, L), dtype=np.int32)
    val = np.empty((U, L))
    cmax = np.empty(U)
    eC = np.empty((U, C.shape[1]))
    c0, order, e0 = no_common(C.shape[1])
    word_top_rows(C, L, idx, val, cmax, eC, 0, U, c0, order, e0)
    return idx, val, cmax, eC


@njit(cache=True, nogil=True)
def no_common(K):
    """``word_top_rows``' common-entry arguments when no entry is known to be common."""
    return np.full(K, np.nan), np.arange(K), np.ones(K)


def common_entries(c0: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``word_top_rows``' arguments for the value c0_k = psi(beta + scale s) - psi(sum_v lambda_kv)
    that every entry still at the initial pseudo-count s has in E[log phi] (``ModelState.common_log_phi``):
    c0, the topics by descending c0 (ties by index), exp(c0_k - max c0)."""
    c0 = np.ascontiguousarray(c0, dtype=np.float64)
    return c0, np.argsort(-c0, kind="stable").astype(np.int64), np.exp(c0 - c0.max())


@njit(cache=True, nogil=True)
def word_top_rows(C, L, idx, val, cmax, eC, u0, u1, c0, order, e0):
    """``_word_top`` for rows u0..u1-1 (rows are independent: safe to split over threads).

    Also the word part of the weights in the multiplicative domain, eC_uk = exp(C_uk - max_k C_uk):
    every selection then reads a winner's factor instead of taking an exp per token and
    iteration (r_ul = eC_uk exp(P_k) / z, Eq. 10 exponentiated).

    Entries still at the initial pseudo-count (``C_uk == c0[k]``: 40-50 % of a batch's entries on
    20NG, most of a rare word's row) need no work of their own: the best of them are the first
    such topics in ``order`` (descending c0), so the top L is selected among the row's other
    entries and at most L of them; their factor is exp(c0_k - max c0) exp(max c0 - max_k C_uk),
    one multiplication. With ``no_common`` every entry is selected among, as a plain scan."""
    K = C.shape[1]
    vals = np.empty(K + L)
    buf = np.empty(K + L, dtype=np.int32)
    mine = np.empty(K, dtype=np.int32)
    c0max = -np.inf
    for k in range(K):
        if c0[k] > c0max:
            c0max = c0[k]
    for u in range(u0, u1):
        n = 0
        for k in range(K):  # the row's own entries, compacted without a branch
            x = C[u, k]
            vals[n] = x
            buf[n] = k
            n += x != c0[k]
        own = n
        found = 0
        t = 0
        while n < K and found < L and t < K:  # the best initial entries, at most L
            k = order[t]
            hit = C[u, k] == c0[k]
            vals[n] = c0[k]
            buf[n] = k
            n += hit
            found += hit
            t += 1
        for i in range(own):  # indices of the row's own entries (select_top reorders buf)
            mine[i] = buf[i]
        select_top(vals, buf, n, L)
        mx = vals[0]
        for l in range(1, L):
            if vals[l] > mx:
                mx = vals[l]
        cmax[u] = mx  # max_k C_uk: the scale of the row's factors eC_uk = exp(C_uk - max_k C_uk)
        a = math.exp(c0max - mx) if own < K else 0.0
        for k in range(K):
            eC[u, k] = a * e0[k]
        for i in range(own):
            k = mine[i]
            eC[u, k] = math.exp(C[u, k] - mx)
        for l in range(L):
            idx[u, l] = buf[l]
            val[u, l] = math.exp(vals[l] - mx)  # unnormalised cold-start responsibility


@njit(cache=True, nogil=True)
def _cold_start(loc, cnt, s, e, L, alpha, sequential, init_idx, init_val, N, sel, in_sel, top_idx, top_r, top_e,
                top_n):
    """First sweep of a document from the per-word top-L; returns the active-set size.

    Each word type keeps its topic-word top L (the cold start of App. D with a uniform
    document prior), but the sweep is sequential: an entry's weights are multiplied by the
    posterior-mean proportions N_dk + alpha of the entries before it (the document part in
    the multiplicative domain, one product per winner, no exp or digamma).  The document
    starts from a sharper N_d with the same candidates, so the exact iterations that follow
    converge in fewer sweeps (measured: same local objective, ~15 % fewer sweeps).  Without
    ``sequential`` (L >= K: the dense algorithm, DenseStepForDoc) all entries start alike.
    """
    n_sel = 0
    for j in range(s, e):
        u = loc[j]
        z = 0.0
        for l in range(L):
            k = init_idx[u, l]
            r = init_val[u, l]
            top_e[j, l] = r
            if sequential:
                r *= N[k] + alpha
            top_r[j, l] = r
            top_idx[j, l] = k
            z += r
        top_n[j] = L
        for l in range(L):
            r = top_r[j, l] / z
            top_r[j, l] = r
            k = top_idx[j, l]
            N[k] += cnt[j] * r
            if not in_sel[k]:
                in_sel[k] = 1
                sel[n_sel] = k
                n_sel += 1
    return n_sel


HINGE, LOGISTIC, REGRESSION = 0, 1, 2  # = supervised.classifier.LOSSES


@njit(cache=True, nogil=True)
def _sup_coefs(loc, cnt, s, e, nd, N, sel, n_sel, top_idx, top_r, top_n, E, V, y, mask, loss, c, ell, eps,
               rho, kappa, tmp):
    """Mean-field E[rho_dy], E[kappa_dy] of one document from its current responsibilities.

    E omega and E omega^2 as in docs/supervised.md §5.2 (``omega_moments``), then q(lam) per loss
    (``SupervisedHead.expected_coefficients``): hinge E[1/lam] = 1/(c sqrt(E zeta^2)) (GIG(1/2, 1,
    c^2 E zeta^2)); logistic E lam = c tanh(w/2)/(2w), w = sqrt(E omega^2) (PG(c, w) mean);
    regression one inverse-Gaussian mean per half of the eps-insensitive loss.
    """
    Ly = E.shape[0]
    inv = 1.0 / nd
    floor = 1.0 / (c * c)  # E zeta^2 >= 1/c^2, the hinge width: E[1/lam] <= 1 (docs/supervised.md §7)
    for l in range(Ly):
        if not mask[l]:
            rho[l] = 0.0
            kappa[l] = 0.0
            continue
        m1 = 0.0
        diag = 0.0
        for a in range(n_sel):
            k = sel[a]
            z = N[k] * inv
            m1 += E[l, k] * z
            diag += V[l, k] * z * z
        tok = 0.0  # sum_n [sum_k phi_nk (e_k^2 + v_k) - (phi_n^T e)^2 - sum_k phi_nk^2 v_k]
        for j in range(s, e):
            pe = 0.0
            q = 0.0
            for t in range(top_n[j]):
                k = top_idx[j, t]
                r = top_r[j, t]
                ek = E[l, k]
                pe += r * ek
                q += r * (ek * ek + V[l, k]) - r * r * V[l, k]
            tok += cnt[j] * (q - pe * pe)
        m2 = m1 * m1 + diag + tok * inv * inv
        if m2 < m1 * m1:
            m2 = m1 * m1
        yy = y[l]
        if loss == HINGE:
            ez2 = ell * ell - 2.0 * ell * yy * m1 + m2
            if ez2 < floor:
                ez2 = floor
            il = 1.0 / (c * math.sqrt(ez2))
            rho[l] = c * c * il
            kappa[l] = c * yy * (1.0 + c * ell * il)
        elif loss == LOGISTIC:
            wv = math.sqrt(m2)
            if wv < 1e-6:
                rho[l] = c * (0.25 - wv * wv / 48.0)
            else:
                rho[l] = c * math.tanh(0.5 * wv) / (2.0 * wv)
            kappa[l] = 0.5 * c * yy
        else:
            e1 = (yy - eps) * (yy - eps) - 2.0 * (yy - eps) * m1 + m2
            e2 = (yy + eps) * (yy + eps) - 2.0 * (yy + eps) * m1 + m2
            if e1 < floor:
                e1 = floor
            if e2 < floor:
                e2 = floor
            il = 1.0 / (c * math.sqrt(e1))
            io = 1.0 / (c * math.sqrt(e2))
            rho[l] = c * c * (il + io)
            kappa[l] = c * c * ((yy - eps) * il + (yy + eps) * io)


@njit(cache=True, nogil=True)
def _sup_weights(nd, N, sel, n_sel, E, V, rho, kappa, G, mbar):
    """G_k (module docstring): the token-averaged supervised gradient for every active topic k."""
    Ly = E.shape[0]
    inv = 1.0 / nd
    n2 = inv * inv
    shrink = (nd - 1.0) * inv  # cbar = N_d (N - 1) / N: the counts without one (average) token
    for a in range(n_sel):
        G[sel[a]] = 0.0
    for l in range(Ly):
        if rho[l] == 0.0 and kappa[l] == 0.0:
            mbar[l] = 0.0
            continue
        m = 0.0
        for a in range(n_sel):
            k = sel[a]
            m += E[l, k] * N[k]
        mbar[l] = m * shrink
        lin = kappa[l] * inv - rho[l] * mbar[l] * n2
        b = 0.5 * rho[l] * n2
        for a in range(n_sel):
            k = sel[a]
            ek = E[l, k]
            G[k] += lin * ek - b * (ek * ek + V[l, k] * (1.0 + 2.0 * N[k] * shrink))


@njit(cache=True, nogil=True)
def _iterate(C, eC, loc, cnt, s, e, alpha, L, P, eP, N, Nold, sel, in_sel, n_sel, first_iter, max_iter, tol, eps,
             top_idx, top_r, top_e, top_n, vals, idxbuf, w, proposal=False):
    """Block coordinate ascent between r_d and theta_d (Alg. 2); returns (n_sel, iterations).

    With ``proposal`` (restart proposals) the first sweep re-selects only the tokens that
    lost a winner and later sweeps re-weight.
    """
    it = 0
    for it in range(first_iter, max_iter + 1):
        pmx = -np.inf
        for a in range(n_sel):
            k = sel[a]
            P[k] = digamma(N[k] + alpha)  # E[log pi_dk] up to a constant (Eq. 10)
            if P[k] > pmx:
                pmx = P[k]
        for a in range(n_sel):
            k = sel[a]
            eP[k] = math.exp(P[k] - pmx)
        if proposal:
            select = 2 if it == first_iter else 0
        else:
            select = 1 if (it <= 5 or it % 10 == 0) else 0
        n_sel, delta = _resp_pass(C, eC, loc, cnt, s, e, L, P, eP, N, Nold, sel, in_sel, n_sel, select, eps,
                                  top_idx, top_r, top_e, top_n, vals, idxbuf, w)
        if delta < tol:
            break
    return n_sel, it


@njit(cache=True, nogil=True)
def _iterate_sup(C, eC, loc, cnt, s, e, alpha, L, P, eP, N, Nold, sel, in_sel, n_sel, first_iter, max_iter, tol, eps,
                 top_idx, top_r, top_e, top_n, vals, idxbuf, w,
                 nd, E, V, yd, md, loss, c, ell, sup_eps, rho, kappa, G, mbar, tmp, tmpG, damp):
    """``_iterate`` with the label term: P_k = E[log pi_dk] + G_dk (docs/supervised.md §5.3).

    The expected augmentation (rho, kappa) is refreshed on the selection iterations from the
    current responsibilities; G is recomputed every iteration from the current N_d.
    """
    it = 0
    for it in range(first_iter, max_iter + 1):
        select = 1 if (it <= 5 or it % 10 == 0) else 0
        if select == 1 or it == first_iter:
            _sup_coefs(loc, cnt, s, e, nd, N, sel, n_sel, top_idx, top_r, top_n, E, V, yd, md, loss, c, ell,
                       sup_eps, rho, kappa, tmp)
        if it == first_iter or damp <= 0.0:
            _sup_weights(nd, N, sel, n_sel, E, V, rho, kappa, G, mbar)
        else:
            # Damped: every token reacts to the same G at once (a Jacobi step), which
            # overshoots when the coupling rho e^2 / N is strong; the fixed point is unchanged.
            for a in range(n_sel):
                tmpG[sel[a]] = G[sel[a]]
            _sup_weights(nd, N, sel, n_sel, E, V, rho, kappa, G, mbar)
            for a in range(n_sel):
                k = sel[a]
                G[k] = damp * tmpG[k] + (1.0 - damp) * G[k]
        pmx = -np.inf
        for a in range(n_sel):
            k = sel[a]
            P[k] = digamma(N[k] + alpha) + G[k]  # Eq. 10 plus the label term
            if P[k] > pmx:
                pmx = P[k]
        for a in range(n_sel):
            k = sel[a]
            eP[k] = math.exp(P[k] - pmx)
        n_sel, delta = _resp_pass(C, eC, loc, cnt, s, e, L, P, eP, N, Nold, sel, in_sel, n_sel, select, eps,
                                  top_idx, top_r, top_e, top_n, vals, idxbuf, w)
        if delta < tol:
            break
    return n_sel, it


@njit(cache=True, nogil=True)
def _doc_terms(C, loc, cnt, s, e, alpha, K, N, sel, n_sel, top_idx, top_r, top_n):
    """(data, entropy, alloc) of one document at theta_d = N_d + alpha (App. C)."""
    data = 0.0
    ent = 0.0
    nd = 0.0
    for j in range(s, e):
        u = loc[j]
        c = cnt[j]
        nd += c
        for l in range(top_n[j]):
            r = top_r[j, l]
            if r > 0.0:
                data += c * r * C[u, top_idx[j, l]]
                ent -= c * r * math.log(r)
    # c_Dir(alpha) - c_Dir(N_d + alpha); inactive topics cancel exactly.
    alloc = math.lgamma(K * alpha) - math.lgamma(nd + K * alpha)
    la = math.lgamma(alpha)
    for a in range(n_sel):
        k = sel[a]
        if N[k] > 0.0:
            alloc += math.lgamma(N[k] + alpha) - la
    return data, ent, alloc


@njit(cache=True, nogil=True)
def lsparse_batch(C, doc_ptr, loc, cnt, alpha, L, max_iter, tol, eps, restart_trials, restart_iters):
    """L-sparse local step for every document of a batch.

    C: (U, K) E[log phi] for the batch's word types.  Returns doc-topic counts (D, K),
    the per-entry top-L topics/responsibilities, per-document iteration counts and
    objective terms, and restart statistics.
    """
    E0 = np.zeros((0, C.shape[1]))
    y0 = np.zeros((0, 0))
    m0 = np.zeros((0, 0), dtype=np.uint8)
    out = lsparse_batch_sup(C, doc_ptr, loc, cnt, alpha, L, max_iter, tol, eps, restart_trials, restart_iters,
                            False, E0, E0, y0, m0, 0, 1.0, 0.0, 0.0, 0.0)
    return out[:11]


@njit(cache=True, nogil=True)
def lsparse_batch_sup(C, doc_ptr, loc, cnt, alpha, L, max_iter, tol, eps, restart_trials, restart_iters,
                      sup, E, V, Y, M, loss, c, ell, sup_eps, sup_damp=0.5):
    """``lsparse_batch`` with an optional label term (``sup``): documents with any target in
    ``M`` (D, n_labels) run ``_iterate_sup`` with q(eta) = N(E, V) and targets Y; the others,
    and every document when ``sup`` is False, run exactly the unsupervised step.  Also returns
    the final expected augmentation (rho, kappa), shape (D, n_labels)."""
    D = doc_ptr.shape[0] - 1
    K = C.shape[1]
    Lc = L if L < K else K
    init_idx, init_val, cmax, eC = _word_top(C, Lc)
    outs = batch_outputs(D, loc.shape[0], K, Lc, E.shape[0], sup)
    doc_topic, top_idx, top_r, top_e, top_n, iters, n_active, data, ent, alloc, sup_rho, sup_kappa = outs
    tried, accepted = lsparse_docs(0, D, C, eC, init_idx, init_val, doc_ptr, loc, cnt, alpha, Lc, max_iter, tol,
                                   eps, restart_trials, restart_iters, sup, E, V, Y, M, loss, c, ell, sup_eps,
                                   sup_damp, doc_topic, top_idx, top_r, top_e, top_n, iters, n_active, data, ent,
                                   alloc, sup_rho, sup_kappa)
    return doc_topic, top_idx, top_r, top_n, iters, n_active, data, ent, alloc, tried, accepted, sup_rho, sup_kappa


@njit(cache=True, nogil=True)
def batch_outputs(D, nnz, K, Lc, Ly, sup):
    """The per-document and per-entry output arrays of a batch (filled by ``lsparse_docs``)."""
    return (np.zeros((D, K)), np.zeros((nnz, Lc), dtype=np.int32), np.zeros((nnz, Lc)), np.zeros((nnz, Lc)),
            np.zeros(nnz, dtype=np.int32), np.zeros(D, dtype=np.int32), np.zeros(D, dtype=np.int32),
            np.zeros(D), np.zeros(D), np.zeros(D), np.zeros((D if sup else 0, Ly)), np.zeros((D if sup else 0, Ly)))


@njit(cache=True, nogil=True)
def lsparse_docs(d0, d1, C, eC, init_idx, init_val, doc_ptr, loc, cnt, alpha, Lc, max_iter, tol, eps,
                 restart_trials, restart_iters, sup, E, V, Y, M, loss, c, ell, sup_eps, sup_damp,
                 doc_topic, top_idx, top_r, top_e, top_n, iters, n_active, data, ent, alloc, sup_rho, sup_kappa):
    """The local step of documents d0..d1-1, written into their rows/entries of the outputs.

    A document reads only the batch's shared inputs (C, the cold-start top-L) and its own
    rows, and all scratch is private to the call, so disjoint document ranges can run on
    separate threads (the GIL is released) with results identical to one call over all
    documents.  Returns (restarts tried, restarts accepted) of the range."""
    K = C.shape[1]
    P = np.zeros(K)
    eP = np.zeros(K)
    Nold = np.zeros(K)
    sel = np.empty(K, dtype=np.int32)
    in_sel = np.zeros(K, dtype=np.uint8)
    vals = np.empty(K)
    idxbuf = np.empty(K, dtype=np.int32)
    w = np.empty(Lc)
    max_u = 0
    for d in range(d0, d1):
        if doc_ptr[d + 1] - doc_ptr[d] > max_u:
            max_u = doc_ptr[d + 1] - doc_ptr[d]
    bk_idx = np.empty((max_u, Lc), dtype=np.int32)
    bk_r = np.empty((max_u, Lc))
    bk_e = np.empty((max_u, Lc))
    bk_n = np.empty(max_u, dtype=np.int32)
    bk_N = np.empty(K)
    bk_sel = np.empty(K, dtype=np.int32)
    order = np.empty(K, dtype=np.int64)
    tried = 0
    accepted = 0
    Ly = E.shape[0]
    G = np.zeros(K)
    mbar = np.zeros(Ly)
    tmp = np.zeros(Ly)
    tmpG = np.zeros(K)
    for d in range(d0, d1):
        s = doc_ptr[d]
        e = doc_ptr[d + 1]
        if e == s:
            continue
        N = doc_topic[d]
        labelled = False
        if sup:
            for l in range(Ly):
                if M[d, l]:
                    labelled = True
                    break
        # Cold start: uniform document prior, the topic-word weights alone pick the top L.
        n_sel = _cold_start(loc, cnt, s, e, Lc, alpha, Lc < K, init_idx, init_val, N, sel, in_sel, top_idx, top_r, top_e, top_n)
        if labelled:
            nd = 0.0
            for j in range(s, e):
                nd += cnt[j]
            n_sel, it = _iterate_sup(C, eC, loc, cnt, s, e, alpha, Lc, P, eP, N, Nold, sel, in_sel, n_sel, 1, max_iter,
                                     tol, eps, top_idx, top_r, top_e, top_n, vals, idxbuf, w,
                                     nd, E, V, Y[d], M[d], loss, c, ell, sup_eps, sup_rho[d], sup_kappa[d], G, mbar,
                                     tmp, tmpG, sup_damp)
        else:
            n_sel, it = _iterate(C, eC, loc, cnt, s, e, alpha, Lc, P, eP, N, Nold, sel, in_sel, n_sel, 1, max_iter, tol,
                                 eps, top_idx, top_r, top_e, top_n, vals, idxbuf, w)
        iters[d] = it
        dt, et, at = _doc_terms(C, loc, cnt, s, e, alpha, K, N, sel, n_sel, top_idx, top_r, top_n)
        best = dt + et + at
        if restart_trials > 0 and restart_iters > 0 and n_sel > 1 and not labelled:
            # Try removing the smallest active topics first (they are the likeliest to be spurious).
            m = 0
            for a in range(n_sel):
                if N[sel[a]] > eps:
                    order[m] = sel[a]
                    m += 1
            keys = np.empty(m)
            for a in range(m):
                keys[a] = N[order[a]]
            perm = np.argsort(keys)
            cand = np.empty(m, dtype=np.int64)
            for a in range(m):
                cand[a] = order[perm[a]]
            n_try = m - 1 if m - 1 < restart_trials else restart_trials
            for t in range(n_try):
                j = cand[t]
                if N[j] <= eps:
                    continue
                tried += 1
                nu = e - s
                for q in range(nu):
                    bk_n[q] = top_n[s + q]
                    for l in range(Lc):
                        bk_idx[q, l] = top_idx[s + q, l]
                        bk_r[q, l] = top_r[s + q, l]
                        bk_e[q, l] = top_e[s + q, l]
                bk_nsel = n_sel
                for a in range(n_sel):
                    bk_sel[a] = sel[a]
                    bk_N[sel[a]] = N[sel[a]]
                # Proposal: all of topic j's mass forced to zero, then a few iterations forward.
                N[j] = 0.0
                n_sel2, _ = _iterate(C, eC, loc, cnt, s, e, alpha, Lc, P, eP, N, Nold, sel, in_sel, n_sel, 1,
                                     restart_iters, tol, eps, top_idx, top_r, top_e, top_n, vals, idxbuf, w, True)
                if abs(N[j] - bk_N[j]) < 1e-5:
                    d2 = e2 = a2 = -np.inf  # the topic grew straight back: same optimum, skip the objective
                else:
                    d2, e2, a2 = _doc_terms(C, loc, cnt, s, e, alpha, K, N, sel, n_sel2, top_idx, top_r, top_n)
                if d2 + e2 + a2 > best + 1e-9:
                    accepted += 1
                    best = d2 + e2 + a2
                    dt, et, at = d2, e2, a2
                    n_sel = n_sel2
                else:
                    for a in range(n_sel2):
                        N[sel[a]] = 0.0
                        in_sel[sel[a]] = 0
                    n_sel = bk_nsel
                    for a in range(n_sel):
                        sel[a] = bk_sel[a]
                        N[sel[a]] = bk_N[sel[a]]
                        in_sel[sel[a]] = 1
                    for q in range(nu):
                        top_n[s + q] = bk_n[q]
                        for l in range(Lc):
                            top_idx[s + q, l] = bk_idx[q, l]
                            top_r[s + q, l] = bk_r[q, l]
                            top_e[s + q, l] = bk_e[q, l]
        data[d] = dt
        ent[d] = et
        alloc[d] = at
        n_active[d] = n_sel
        for a in range(n_sel):
            in_sel[sel[a]] = 0
    return tried, accepted


@njit(cache=True, nogil=True)
def dense_doc_reference(C, cnt, alpha, max_iter, tol):
    """The dense algorithm (Alg. 2 left, DenseStepForDoc) for one document, for tests.

    C: (U_d, K) E[log phi] rows of the document's word types.  Returns (N_d, iterations).
    """
    U = C.shape[0]
    K = C.shape[1]
    R = np.empty((U, K))
    N = np.zeros(K)
    P = np.zeros(K)
    it = 0
    for it in range(0, max_iter + 1):
        if it > 0:
            for k in range(K):
                P[k] = digamma(N[k] + alpha)
        Nn = np.zeros(K)
        for u in range(U):
            mx = -np.inf
            for k in range(K):
                R[u, k] = C[u, k] + P[k]
                if R[u, k] > mx:
                    mx = R[u, k]
            z = 0.0
            for k in range(K):
                R[u, k] = math.exp(R[u, k] - mx)
                z += R[u, k]
            for k in range(K):
                R[u, k] /= z
                Nn[k] += cnt[u] * R[u, k]
        delta = 0.0
        for k in range(K):
            dd = abs(Nn[k] - N[k])
            if dd > delta:
                delta = dd
        N = Nn
        if it > 0 and delta < tol:
            break
    return N, it


@njit(cache=True, nogil=True)
def word_top_claimed(counter, bounds, C, L, idx, val, cmax, eC, c0, order, e0):
    """``word_top_rows`` over the ranges this thread claims (``parallel.claim_range``)."""
    while True:
        lo, hi = claim_range(counter, bounds)
        if lo < 0:
            break
        word_top_rows(C, L, idx, val, cmax, eC, lo, hi, c0, order, e0)
    return 0


@njit(cache=True, nogil=True)
def lsparse_docs_claimed(counter, bounds, C, eC, init_idx, init_val, doc_ptr, loc, cnt, alpha, Lc, max_iter, tol,
                         eps, restart_trials, restart_iters, sup, E, V, Y, M, loss, c, ell, sup_eps, sup_damp,
                         doc_topic, top_idx, top_r, top_e, top_n, iters, n_active, data, ent, alloc, sup_rho,
                         sup_kappa):
    """``lsparse_docs`` over the document ranges ``bounds[i]:bounds[i + 1]`` this thread claims
    (``parallel.claim_range``); returns the restarts tried and accepted in them."""
    tried = 0
    accepted = 0
    while True:
        lo, hi = claim_range(counter, bounds)
        if lo < 0:
            break
        t, a = lsparse_docs(lo, hi, C, eC, init_idx, init_val, doc_ptr, loc, cnt, alpha, Lc,
                            max_iter, tol, eps, restart_trials, restart_iters, sup, E, V, Y, M, loss, c, ell, sup_eps,
                            sup_damp, doc_topic, top_idx, top_r, top_e, top_n, iters, n_active, data, ent, alloc,
                            sup_rho, sup_kappa)
        tried += t
        accepted += a
    return tried, accepted


def run_lsparse(runner, C, doc_ptr, loc, cnt, alpha, L, max_iter, tol, eps, restart_trials, restart_iters,
                sup, E, V, Y, M, loss, c, ell, sup_eps, sup_damp, common=None):
    """``lsparse_batch_sup`` with the documents (and the cold start's word rows) split over
    ``runner``'s threads (None: one).  Documents are independent given C, so the outputs are the
    same bit for bit for any number of threads (the restart counters are integer sums).
    ``common``: ``common_entries`` of C's initial pseudo-count value, or None (no shortcut)."""
    runner = runner or ThreadRunner(1)
    D = doc_ptr.shape[0] - 1
    U, K = C.shape
    Lc = L if L < K else K
    init_idx = np.empty((U, Lc), dtype=np.int32)
    init_val = np.empty((U, Lc))
    cmax = np.empty(U)
    eC = np.empty((U, K))
    # The ranges are claimed inside the kernels (``ThreadRunner.run_claimed``): no thread goes back
    # to Python, and the GIL, between two of them.
    c0, order, e0 = no_common(K) if common is None else common
    words = runner.row_bounds(U)
    runner.run_claimed(lambda ctr: word_top_claimed(ctr, words, C, Lc, init_idx, init_val, cmax, eC, c0, order, e0))
    # batch_outputs run by numpy (its py_func): the zeros come from fresh zero pages (calloc), so the
    # ~4 MB of per-entry outputs are not cleared by the calling thread before the threads start
    # (0.74 ms of serial time per 20NG batch); the threads that fill the pages fault them in.
    outs = batch_outputs.py_func(D, loc.shape[0], K, Lc, E.shape[0], sup)
    docs = runner.bounds(doc_ptr, uneven=True)
    counts = runner.run_claimed(lambda ctr: lsparse_docs_claimed(
        ctr, docs, C, eC, init_idx, init_val, doc_ptr, loc, cnt, alpha, Lc, max_iter, tol, eps, restart_trials,
        restart_iters, sup, E, V, Y, M, loss, c, ell, sup_eps, sup_damp, *outs))
    tried = sum(t for t, _ in counts)
    accepted = sum(a for _, a in counts)
    doc_topic, top_idx, top_r, top_e, top_n, iters, n_active, data, ent, alloc, sup_rho, sup_kappa = outs
    return doc_topic, top_idx, top_r, top_n, iters, n_active, data, ent, alloc, tried, accepted, sup_rho, sup_kappa


@dataclass
class LSparseEngine:
    """Configuration of the L-sparse local step; ``infer`` runs it on a batch."""

    sparsity: int = 8
    max_iter: int = 100
    tol: float = 0.05
    active_eps: float = 0.01
    restart_trials: int = 2
    restart_iters: int = 2
    sup_damping: float = 0.5
    name: str = "lsparse"
    runner: ThreadRunner | None = field(default=None, repr=False, compare=False)  # None: one thread
    recent_words: np.ndarray | None = field(default=None, repr=False, compare=False)  # the last learned batch's

    def read_ahead(self, state) -> None:
        """Have a helper thread compute psi(lambda) of the last learned batch's words while the
        next batch is built (``ModelState.read_ahead``): its frequent words come again, and
        building a batch is serial work that leaves the other cores idle."""
        if self.recent_words is not None:
            state.read_ahead(self.recent_words, self.runner)

    def infer(self, state, batch, summarize: bool = True, head=None, targets=None,
              alpha: float | None = None) -> LocalResult:
        """Local step on ``batch``.  With ``head`` (a SupervisedHead) and ``targets`` (its
        ``Targets`` for this batch) labelled documents get the label term in their weights
        (module docstring); ``result.sup_rho`` / ``result.sup_kappa`` (D, n_labels) hold the
        final expected augmentation.  Without them the result is the unsupervised step's, bit for bit.
        ``alpha``: the document Dirichlet to use instead of ``state.alpha`` (the classifier's
        mean-field features, ``features.MeanFieldFeatures``)."""
        require_topics(state)
        runner = self.runner
        C = state.expected_log_phi(batch.uniq, runner=runner)
        sup = head is not None and targets is not None and head.n_labels > 0
        if sup:
            from ..supervised.classifier import LOSSES

            E = np.ascontiguousarray(head.eta_mean, dtype=np.float64)
            V = np.ascontiguousarray(np.maximum(head.eta_sq_mean - E * E, 0.0))
            Y = np.ascontiguousarray(targets.y, dtype=np.float64)
            M = np.ascontiguousarray(targets.mask, dtype=np.uint8)
            if Y.shape != (batch.n_docs, E.shape[0]):
                raise ValueError(f"targets encode {Y.shape}, expected ({batch.n_docs}, {E.shape[0]})")
            loss, c, ell, sup_eps = LOSSES[head.loss], float(head.c), float(head.ell), float(head.epsilon)
        else:
            E = V = np.zeros((0, C.shape[1]))
            Y = np.zeros((0, 0))
            M = np.zeros((0, 0), dtype=np.uint8)
            loss, c, ell, sup_eps = 0, 1.0, 0.0, 0.0
        alpha = float(state.alpha if alpha is None else alpha)
        out = run_lsparse(runner, C, batch.doc_ptr, batch.local, batch.counts, alpha, int(self.sparsity),
                          int(self.max_iter), float(self.tol), float(self.active_eps), int(self.restart_trials),
                          int(self.restart_iters), sup, E, V, Y, M, loss, c, ell, sup_eps, float(self.sup_damping),
                          common_entries(state.common_log_phi()))
        sup_stats = {"sup_rho": out[11], "sup_kappa": out[12]} if sup else {}
        doc_topic, top_idx, top_r, top_n, iters, n_active, data, ent, alloc, tried, accepted = out[:11]
        summary = None
        if summarize:
            self.recent_words = batch.uniq  # first-seen order: a batch's frequent words come early
            summary = summarize_sparse(batch, top_idx, top_r, top_n, state.n_topics, runner=runner)
            summary.entropy = float(ent.sum())
            summary.alloc = float(alloc.sum())
        result = LocalResult(
            doc_topic=doc_topic,
            summary=summary,
            iterations=iters,
            objective=float(data.sum() + ent.sum() + alloc.sum()),
            restarts_tried=int(tried),
            restarts_accepted=int(accepted),
            stats={"active_topics": float(n_active.mean()) if n_active.size else 0.0},
        )
        for name, v in sup_stats.items():
            setattr(result, name, v)
        return result

    def config(self) -> dict:
        return {
            "sparsity": self.sparsity, "max_iter": self.max_iter, "tol": self.tol,
            "active_eps": self.active_eps, "restart_trials": self.restart_trials,
            "restart_iters": self.restart_iters,
        }
