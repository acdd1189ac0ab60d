"""Supervised Alias-MH (LightMedLDA): the supervised term passed into the one sweep kernel, and the
per-sweep hooks that redraw the augmentation and eta around it.

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

The kernel is ``alias_core.mh_sweeps``, the same one the LDA runs use: this module builds the
term it takes (``supervised_term``) and drives the sweeps around it (``SupervisedSweeps``).
"""
from __future__ import annotations

import time
from collections import deque

import numpy as np

from .alias_core import EXP_GATE, INIT_GIVEN, INIT_UNIFORM, N_STATS, SweepHook, run_chain
from ..jit_cache import njit

__all__ = ["EXP_GATE", "N_STATS", "SupervisedSweeps", "count_loglik", "doc_topic_counts", "run_fit_chain",
           "run_sweeps", "supervised_term"]


def supervised_term(eta, rho, kappa, sup_doc, K: int, D: int, exp_gate: float = EXP_GATE, use_exp: bool = True):
    """The ``sup`` argument of ``alias_core.mh_sweeps``: (etaT (K, L) contiguous, rho, kappa (D, L),
    sup_doc (D,), exp_gate, use_exp); without labels (L = 0) one zero label, which leaves every
    document unsupervised."""
    etaT = np.ascontiguousarray(np.asarray(eta, dtype=np.float64).T)
    if etaT.shape[1] == 0:
        etaT = np.zeros((K, 1))
        rho = np.zeros((D, 1))
        kappa = rho
    return (etaT, np.ascontiguousarray(rho, dtype=np.float64), np.ascontiguousarray(kappa, dtype=np.float64),
            np.ascontiguousarray(sup_doc, dtype=np.bool_), float(exp_gate), bool(use_exp))


def run_sweeps(arr, seed, tok_w, tok_ptr, Gk, G, dense_prior, beta, alpha, n_sweeps, mh_steps, mixture, init,
               eta, rho, kappa, sup_doc, word_prior=True, record_from=None, z_rec=None, doc_acc=None,
               exp_gate=EXP_GATE, use_exp=True, tries=(1, 1)) -> np.ndarray:
    """``arr.run`` with the supervised term of (eta, rho, kappa, sup_doc): ``mixture`` an
    ``alias_core.COMPOSE_*`` value (0 cycle, 1 mixture, 2 exp proposals only); returns the
    N_STATS statistics."""
    term = supervised_term(eta, rho, kappa, sup_doc, arr.nk.shape[0], tok_ptr.shape[0] - 1, exp_gate, use_exp)
    return arr.run(seed, tok_w, tok_ptr, Gk, G, dense_prior, beta, alpha, n_sweeps, mh_steps, int(mixture), init,
                   record_from, z_rec, doc_acc, word_prior=word_prior, tries=tries, sup=term)


@njit(cache=True, nogil=True)
def doc_topic_counts(z, tok_ptr, K, out):
    """out[d, k] = number of tokens of document d on topic k (out is overwritten)."""
    D = tok_ptr.shape[0] - 1
    for d in range(D):
        for k in range(K):
            out[d, k] = 0.0
        for i in range(tok_ptr[d], tok_ptr[d + 1]):
            out[d, z[i]] += 1.0


@njit(cache=True, nogil=True)
def count_loglik(counts, nk, beta, Gk):
    """sum_i log phi_hat(w_i | z_i) at the current counts, from n_wk and n_k alone:
    sum_wk n_wk log(beta + n_wk) - sum_k n_k log(Gk_k + n_k) (= ``SamplerArrays.word_loglik``
    with g = beta, in O(U K) instead of a row search per token)."""
    total = 0.0
    U, K = counts.shape
    for u in range(U):
        for k in range(K):
            c = counts[u, k]
            if c > 0:
                total += c * np.log(beta + c)
    for k in range(K):
        if nk[k] > 0:
            total -= nk[k] * np.log(Gk[k] + nk[k])
    return total


class SupervisedSweeps(SweepHook):
    """The engine side of the supervised contract, as the driver's per-sweep hook.

    Holds the (D, L) coefficient arrays the kernel reads; before each sweep the augmentation of
    the labelled documents is redrawn exactly from their current zbar with the head's current
    eta sample (IG for the hinge, PG for the logistic loss; docs/supervised.md §2).  In batch
    mode (``sample_eta``) each sweep is followed by ``eta_sweeps`` Gibbs sweeps of eta given
    (Z, augmentation); the augmentations (and eta samples) of the sweeps >= ``burn`` are averaged
    for ``finish`` (``head.end_batch``), or, with ``window``, those of the last ``window`` sweeps
    (a chain whose length a stopping rule decides).  Streaming keeps eta fixed (the model updates
    the head).  ``seconds``: time spent in the head.
    """

    def __init__(self, head, targets, tok_ptr, K: int, sample_eta: bool = False, eta_sweeps: int = 1,
                 burn: int = 0, callback=None, callback_every: int = 0, window: int | None = None):
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
        self.sample_eta = sample_eta
        self.eta_sweeps = int(eta_sweeps)
        self.burn = burn
        self.callback = callback
        self.callback_every = callback_every
        self.seconds = 0.0
        self.kept = 0
        self.zb = None
        self.done = 0
        self.window = None if window is None else deque(maxlen=max(int(window), 1))
        if sample_eta:
            head.begin_batch(None)
        self.rho_sum = np.zeros((self.rows.size, head.n_labels))
        self.kappa_sum = np.zeros_like(self.rho_sum)

    def term(self) -> tuple:
        """The kernel's ``sup`` argument for the current eta and augmentation (views, no copies)."""
        D = self.tok_ptr.shape[0] - 1
        return supervised_term(self.eta, self.rho, self.kappa, self.sup_doc, self.K, D)

    def zbar(self, z) -> np.ndarray:
        doc_topic_counts(z, self.tok_ptr, self.K, self.counts)
        return self.counts[self.rows] * self.inv_len[self.rows, None]

    def augment(self, z) -> None:
        if self.rows.size == 0:
            return
        rho, kappa = self.head.sample_augmentation(self.zbar(z), self.targets)
        self.rho[self.rows] = rho
        self.kappa[self.rows] = kappa
        self.eta = self.head.eta

    def before(self, done: int, arr) -> None:
        t0 = time.perf_counter()
        self.augment(arr.z)
        self.seconds += time.perf_counter() - t0

    def after(self, done: int, arr) -> None:
        self.done += 1
        done = self.done
        if self.sample_eta and self.rows.size:
            t0 = time.perf_counter()
            self.draw_eta(done, arr.z)
            self.seconds += time.perf_counter() - t0
        if self.callback and self.callback_every > 0 and done % self.callback_every == 0:
            self.callback(done, arr)

    def draw_eta(self, done: int, z) -> None:
        """eta given (Z, augmentation) after sweep ``done``; keep what ``finish`` averages."""
        self.zb = self.zbar(z)
        rho, kappa = self.rho[self.rows], self.kappa[self.rows]
        retain = self.window is None and done - 1 >= self.burn
        self.head.sample_eta(self.zb, rho, kappa, n_sweeps=self.eta_sweeps, retain=retain)
        if self.window is not None:
            self.window.append((self.head.eta.copy(), rho.copy(), kappa.copy()))
        elif retain:
            self.rho_sum += rho
            self.kappa_sum += kappa
            self.kept += 1

    def finish(self) -> None:
        """Batch mode: fold the batch into the head's carried statistics with the retained sweeps'
        average augmentation."""
        if self.rows.size and self.window:
            etas = np.stack([w[0] for w in self.window])
            self.kept = len(self.window)
            self.head.end_batch(self.zb, np.mean([w[1] for w in self.window], axis=0),
                                np.mean([w[2] for w in self.window], axis=0))
            self.head.eta_mean = etas.mean(axis=0)
            self.head.eta_sq_mean = (etas * etas).mean(axis=0)
            return
        if self.rows.size and self.kept:
            self.head.end_batch(self.zb, self.rho_sum / self.kept, self.kappa_sum / self.kept)


def run_fit_chain(arr, call, sv: SupervisedSweeps, max_sweeps: int, seed: int, loglik, stop=None):
    """Batch mode's supervised chain, one kernel call per sweep (``alias_core.run_chain`` each time,
    so the seeds are those of one ``run_chain`` over all sweeps): a uniform start, then sweeps
    with ``sv`` around each until ``max_sweeps`` or ``stop(trace)`` is true, where ``trace`` is
    the list of ``loglik()`` after each sweep.  Returns (statistics, kernel seconds, trace)."""
    seeds = np.random.SeedSequence(seed).generate_state(max_sweeps + 1, dtype=np.uint32)
    total = np.zeros(N_STATS, dtype=np.int64)
    t_kernel = 0.0
    trace: list[float] = []
    for t in range(max_sweeps):
        if t == 0:
            st, sec = run_chain(arr, call, 1, seeds[:2], chunk=1, init=INIT_UNIFORM, init_alone=True, hook=sv)
        else:
            st, sec = run_chain(arr, call, 1, seeds[t + 1:t + 2], chunk=1, init=INIT_GIVEN, hook=sv)
        total += st
        t_kernel += sec
        t0 = time.perf_counter()
        trace.append(float(loglik()))
        sv.seconds += time.perf_counter() - t0
        if stop is not None and stop(trace):
            break
    return total, t_kernel, trace
