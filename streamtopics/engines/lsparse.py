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
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from .._numeric import digamma, select_top
from ..summary import LocalResult, Summary, summarize_sparse


@njit(cache=True, nogil=True)
def _resp_pass(C, loc, cnt, s, e, L, P, eP, N, Nold, sel, in_sel, n_sel, select, eps,
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
            n = 0
            for a in range(n_sel):
                k = sel[a]
                v = C[u, k] + P[k]
                if v >= tau:
                    vals[n] = v
                    idxbuf[n] = k
                    n += 1
            if n < want:  # the floor left fewer than L; the rest were negligible anyway
                m = n
            else:
                select_top(vals, idxbuf, n, want)
                m = want
            cmx = -np.inf
            for l in range(m):
                k = idxbuf[l]
                top_idx[j, l] = k
                w[l] = vals[l]
                if C[u, k] > cmx:
                    cmx = C[u, k]
            for l in range(m):
                top_e[j, l] = math.exp(C[u, idxbuf[l]] - cmx)
            top_n[j] = m
        else:
            m = top_n[j]
            z = 0.0
            for l in range(m):
                q = top_e[j, l] * eP[top_idx[j, l]]
                top_r[j, l] = q
                z += q
            if z > 0.0:
                inv = 1.0 / z
                c = cnt[j]
                for l in range(m):
                    r = top_r[j, l] * inv
                    top_r[j, l] = r
                    N[top_idx[j, l]] += c * r
                continue
            for l in range(m):  # underflow: fall back to the log domain
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
    """Cold-start top-L per batch word: with a uniform document prior W_duk = C_uk depends on u only."""
    U = C.shape[0]
    K = C.shape[1]
    idx = np.empty((U, L), dtype=np.int32)
    val = np.empty((U, L))
    vals = np.empty(K)
    buf = np.empty(K, dtype=np.int32)
    for u in range(U):
        for k in range(K):
            vals[k] = C[u, k]
            buf[k] = k
        select_top(vals, buf, K, L)
        mx = vals[0]
        for l in range(1, L):
            if vals[l] > mx:
                mx = vals[l]
        for l in range(L):
            idx[u, l] = buf[l]
            val[u, l] = math.exp(vals[l] - mx)  # unnormalised cold-start responsibility
    return idx, val


@njit(cache=True, nogil=True)
def _cold_start(loc, cnt, s, e, L, init_idx, init_val, N, sel, in_sel, top_idx, top_r, top_e, top_n):
    """First sweep of a document from the per-word top-L; returns the active-set size."""
    n_sel = 0
    for j in range(s, e):
        u = loc[j]
        z = 0.0
        for l in range(L):
            r = init_val[u, l]
            top_r[j, l] = r
            top_e[j, l] = r
            top_idx[j, l] = init_idx[u, l]
            z += r
        top_n[j] = L
        c = cnt[j]
        for l in range(L):
            r = top_r[j, l] / z
            top_r[j, l] = r
            k = init_idx[u, l]
            N[k] += c * r
            if not in_sel[k]:
                in_sel[k] = 1
                sel[n_sel] = k
                n_sel += 1
    return n_sel


@njit(cache=True, nogil=True)
def _iterate(C, loc, cnt, s, e, alpha, L, P, eP, N, Nold, sel, in_sel, n_sel, first_iter, max_iter, tol, eps,
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
        n_sel, delta = _resp_pass(C, loc, cnt, s, e, L, P, eP, N, Nold, sel, in_sel, n_sel, select, eps,
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
    D = doc_ptr.shape[0] - 1
    K = C.shape[1]
    nnz = loc.shape[0]
    Lc = L if L < K else K
    doc_topic = np.zeros((D, K))
    top_idx = np.zeros((nnz, Lc), dtype=np.int32)
    top_r = np.zeros((nnz, Lc))
    top_e = np.zeros((nnz, Lc))
    top_n = np.zeros(nnz, dtype=np.int32)
    iters = np.zeros(D, dtype=np.int32)
    n_active = np.zeros(D, dtype=np.int32)
    data = np.zeros(D)
    ent = np.zeros(D)
    alloc = np.zeros(D)
    P = np.zeros(K)
    eP = np.zeros(K)
    Nold = np.zeros(K)
    sel = np.empty(K, dtype=np.int32)
    in_sel = np.zeros(K, dtype=np.uint8)
    init_idx, init_val = _word_top(C, Lc)
    vals = np.empty(K)
    idxbuf = np.empty(K, dtype=np.int32)
    w = np.empty(Lc)
    max_u = 0
    for d in range(D):
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
    for d in range(D):
        s = doc_ptr[d]
        e = doc_ptr[d + 1]
        if e == s:
            continue
        N = doc_topic[d]
        # Cold start: uniform document prior, the topic-word weights alone pick the top L.
        n_sel = _cold_start(loc, cnt, s, e, Lc, init_idx, init_val, N, sel, in_sel, top_idx, top_r, top_e, top_n)
        n_sel, it = _iterate(C, loc, cnt, s, e, alpha, Lc, P, eP, N, Nold, sel, in_sel, n_sel, 1, max_iter, tol,
                             eps, top_idx, top_r, top_e, top_n, vals, idxbuf, w)
        iters[d] = it
        dt, et, at = _doc_terms(C, loc, cnt, s, e, alpha, K, N, sel, n_sel, top_idx, top_r, top_n)
        best = dt + et + at
        if restart_trials > 0 and restart_iters > 0 and n_sel > 1:
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
                n_sel2, _ = _iterate(C, loc, cnt, s, e, alpha, Lc, P, eP, N, Nold, sel, in_sel, n_sel, 1,
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
    return doc_topic, top_idx, top_r, top_n, iters, n_active, data, ent, alloc, tried, accepted


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


@dataclass
class LSparseEngine:
    """Configuration of the L-sparse local step; ``infer`` runs it on a batch."""

    sparsity: int = 8
    max_iter: int = 100
    tol: float = 0.05
    active_eps: float = 0.01
    restart_trials: int = 2
    restart_iters: int = 2
    name: str = "lsparse"

    def infer(self, state, batch, summarize: bool = True) -> LocalResult:
        C = state.expected_log_phi(batch.uniq)
        out = lsparse_batch(
            C, batch.doc_ptr, batch.local, batch.counts, float(state.alpha), int(self.sparsity),
            int(self.max_iter), float(self.tol), float(self.active_eps),
            int(self.restart_trials), int(self.restart_iters),
        )
        doc_topic, top_idx, top_r, top_n, iters, n_active, data, ent, alloc, tried, accepted = out
        summary = None
        if summarize:
            summary = summarize_sparse(batch, top_idx, top_r, top_n, state.n_topics)
            summary.entropy = float(ent.sum())
            summary.alloc = float(alloc.sum())
        return LocalResult(
            doc_topic=doc_topic,
            summary=summary,
            iterations=iters,
            objective=float(data.sum() + ent.sum() + alloc.sum()),
            restarts_tried=int(tried),
            restarts_accepted=int(accepted),
            stats={"active_topics": float(n_active.mean()) if n_active.size else 0.0},
        )

    def config(self) -> dict:
        return {
            "sparsity": self.sparsity, "max_iter": self.max_iter, "tol": self.tol,
            "active_eps": self.active_eps, "restart_trials": self.restart_trials,
            "restart_iters": self.restart_iters,
        }
