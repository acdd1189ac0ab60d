"""Streaming multi-task linear classifier on topic proportions: the supervised head.

One weight vector eta_y in R^K per label y on the documents' normalised topic counts
zbar_d (multi-task formulation of LightMedLDA §4.1: multi-class = "label y vs rest"
tasks that share the topics; multi-label = each label on/off; regression = one vector
and a real response).  Every loss is handled through the same scale mixture
(LightMedLDA §4.2): given an augmentation variable per (document, label), the
pseudo-likelihood is Gaussian in omega_dy = eta_y^T zbar_d,

    log psi_dy = kappa_dy * omega_dy - rho_dy * omega_dy^2 / 2   (+ terms free of eta, zbar)

with (docs/supervised.md §2 derives each line)

    hinge      1/lam ~ IG(1/(c|zeta|), 1), zeta = ell - y omega     rho = c^2/lam
               (Gibbs MedLDA eq. 13)                                kappa = c y (1 + c ell / lam)
    logistic   lam ~ PG(c, omega)  (Zhu et al. 2013 eq. 10)         rho = lam,  kappa = c y / 2
    regression 1/lam ~ IG(1/(c|Delta-eps|), 1), 1/om ~ IG(1/(c|Delta+eps|), 1),
               Delta = y - omega (Gibbs MedLDA eqs. 18-19)          rho = c^2 (1/lam + 1/om)
                                                                    kappa = c^2 ((y-eps)/lam + (y+eps)/om)

with y in {-1, +1} for classification.  ``rho`` and ``kappa`` (shape (D, L)) are
exactly the per-document coefficients the topic samplers need: the regularised
conditional of document d is quadratic in zbar_d with linear coefficient
sum_y kappa_dy eta_y and quadratic weight sum_y rho_dy eta_y eta_y^T
(see :func:`token_log_weights` and docs/supervised.md §4-5).

Sampling eta (coordinate-wise Gibbs, LightMedLDA §3.4)
------------------------------------------------------
Given the augmentation, eta_y | rest is Gaussian with precision
P = I/nu^2 + A_y + sum_d rho_dy zbar_d zbar_d^T and linear term r_y + sum_d kappa_dy zbar_d,
where (A_y, r_y) are the carried statistics of earlier batches.  Each coordinate
eta_yk | eta_y,-k is univariate normal (docs/supervised.md §3).  The current batch
enters through residual bookkeeping (omega_dy = eta_y^T zbar_d kept up to date, CSC
columns of zbar), costing O(nnz of column k); the carried prior enters through
u_y = A_y eta_y kept up to date, O(K) per coordinate.  One sweep therefore costs
O(L (nnz(zbar) + K^2)): no K x K inversion, no K^3, and - unlike forming the batch's
precision sum_d rho zbar zbar^T (O(sum_d nnz_d^2) per augmentation draw) - the batch
cost stays linear in nnz when the augmentation is redrawn every sweep.  The K^2 term
is unavoidable once a streaming posterior is carried: a Gaussian prior that summarises
thousands of earlier documents is a dense K x K precision.  (With K = 100 and L = 20
that is 2e5 multiply-adds per sweep.)

Streaming
---------
After a batch's sweeps, the batch is folded into the carried statistics with the
averages of rho and kappa over the retained sweeps:
A_y <- decay * A_y + sum_d rho_bar_dy zbar_d zbar_d^T, r_y <- decay * r_y + sum_d kappa_bar_dy zbar_d.
(Regression folds every document at one precision, the expected curvature of the batch's loss, and
its pseudo-target kappa/rho: ``coefficients.carried_coefficients``, docs/supervised.md §4.)
That is the Gaussian whose natural parameters are the posterior expectations of the
batch's (Gaussian-in-eta) pseudo-likelihood terms - the mean-field q(eta) update - and
it becomes the prior for the next batch.  decay = 1 carries the posterior exactly in
these statistics (A then B gives the statistics of A u B); decay < 1 forgets old
batches geometrically (drift).  With a ``batch_key`` the batch's contribution is
stored (CSR zbar, rho_bar, kappa_bar, current weight decay^age) and subtracted when the
key is revisited, so memoized laps replace a batch instead of counting it twice.

Determinism: numba's generator is reseeded at each stochastic call from
SeedSequence([seed, call_index]); the call index is part of the snapshot, so a
restored head continues with exactly the draws the original would have made.
"""
from __future__ import annotations

import math

import numpy as np

from . import head_io
from . import samplers as _s
from .coefficients import carried_coefficients, expected_coefficients
from ..jit_cache import njit
from .labels import LabelVocabulary
from .memo import HeadMemo, MemoRecord, csr, fold
from .newlabels import NegativePool, labelled_rows, seed_coefficients
from .targets import Targets, encode_responses, infer_task, label_lists, one_vs_rest
from .scaling import AUTO, AUTO_NAMES, ScaleStats, auto_constants

HINGE, LOGISTIC, REGRESSION = 0, 1, 2
LOSSES = {"hinge": HINGE, "logistic": LOGISTIC, "regression": REGRESSION}
TASKS = ("multiclass", "multilabel", "regression")
DEFAULTS = {  # Gibbs MedLDA multi-class (c=1, ell=64); Zhu et al. 2013 binary (c=25); Gibbs MedLDA regression eps
    "hinge": {"c": 1.0, "ell": 64.0, "epsilon": 0.0},
    "logistic": {"c": 25.0, "ell": 0.0, "epsilon": 0.0},
    "regression": {"c": 1.0, "ell": 0.0, "epsilon": 1e-3},
}
PG_CHOICES = ("auto", *_s.METHODS)  # "auto": exact for c <= PG_EXACT_MAX_C, else the gamma sum
PG_EXACT_MAX_C = 8.0  # exact PG(c) costs grow with c (chunks of <= 4); the gamma sum's cost does not
SNAPSHOT_KIND, SNAPSHOT_FORMAT = head_io.SNAPSHOT_KIND, head_io.SNAPSHOT_FORMAT


# =========================================================================== numba kernels
@njit(cache=True, nogil=True)
def _augment(loss, c, ell, eps, pg_method, pg_tol, y, mask, omega, rho, kappa):
    """Draw the augmentation of every (document, label) given omega = zbar eta^T.

    Writes the Gaussian-in-omega coefficients rho, kappa (zeros where mask is False).
    """
    D, L = y.shape
    inf = np.inf
    # the PG chunk plan depends only on b = c: set it up once for the whole batch
    n4, h_rem, n_rem, t_rem = 0, 1.0, 0, _s.TRUNC
    if loss == LOGISTIC and pg_method == _s.METHOD_EXACT and c != 1.0:
        n4, h_rem, n_rem, t_rem = _s._alt_plan(c)
    for d in range(D):
        for l in range(L):
            if not mask[d, l]:
                rho[d, l] = 0.0
                kappa[d, l] = 0.0
                continue
            w = omega[d, l]
            yy = y[d, l]
            if loss == HINGE:
                zeta = ell - yy * w  # Gibbs MedLDA §3.1
                a = c * abs(zeta)
                inv_lam = _s.ig(1.0 / a if a > 0.0 else inf, 1.0)  # eq. (13)
                rho[d, l] = c * c * inv_lam  # eq. (11): Sigma^-1 += c^2 zbar zbar^T / lam
                kappa[d, l] = c * yy * (1.0 + c * ell * inv_lam)  # eq. (11): c y (lam + c ell) / lam
            elif loss == LOGISTIC:
                if pg_method == _s.METHOD_GAMMA_SUM:
                    lam = _s.pg_gamma_sum(c, w, pg_tol)
                elif c == 1.0:
                    lam = _s.pg1(w)
                else:
                    lam = _s._pg_alt_planned(0.5 * abs(w), n4, h_rem, n_rem, t_rem)
                rho[d, l] = lam  # Zhu et al. 2013 eq. (10): lam ~ PG(c, omega)
                kappa[d, l] = 0.5 * c * yy  # eq. (8): kappa = c (y01 - 1/2)
            else:
                dl = yy - w  # Gibbs MedLDA §3.5: Delta = y - eta^T zbar
                a1 = c * abs(dl - eps)
                a2 = c * abs(dl + eps)
                il = _s.ig(1.0 / a1 if a1 > 0.0 else inf, 1.0)  # eq. (18)
                io = _s.ig(1.0 / a2 if a2 > 0.0 else inf, 1.0)  # eq. (19)
                rho[d, l] = c * c * (il + io)  # eq. (16) rho_d, times c^2
                kappa[d, l] = c * c * ((yy - eps) * il + (yy + eps) * io)  # eq. (16) psi_d, times c^2


@njit(cache=True, nogil=True)
def _eta_sweep(eta, A, r, prior_prec, cptr, crow, cval, rho, kappa, omega, u):
    """One coordinate-wise Gibbs sweep over every eta_yk (LightMedLDA §3.4).

    eta_yk | rest ~ N(m, 1/p) with
      p = 1/nu^2 + A_kk + sum_d rho_d zbar_dk^2
      m = (r_k - (u_k - A_kk eta_k) + sum_d [kappa_d zbar_dk - rho_d zbar_dk (omega_d - zbar_dk eta_k)]) / p
    keeping omega = zbar eta^T and u = A eta current after every move.
    """
    L, K = eta.shape
    for l in range(L):
        for k in range(K):
            ek = eta[l, k]
            akk = A[l, k, k]
            prec = prior_prec + akk
            lin = r[l, k] - (u[l, k] - akk * ek)
            for p in range(cptr[k], cptr[k + 1]):
                d = crow[p]
                v = cval[p]
                rd = rho[d, l]
                prec += rd * v * v
                lin += kappa[d, l] * v - rd * v * (omega[d, l] - v * ek)
            new = lin / prec + np.random.standard_normal() / math.sqrt(prec)
            delta = new - ek
            eta[l, k] = new
            for p in range(cptr[k], cptr[k + 1]):
                omega[crow[p], l] += cval[p] * delta
            for j in range(K):  # A symmetric: column k == row k
                u[l, j] += A[l, k, j] * delta


@njit(cache=True, nogil=True)
def _gibbs_batch(loss, c, ell, eps, pg_method, pg_tol, y, mask, eta, A, r, prior_prec,
                 cptr, crow, cval, omega, u, n_sweeps, burn_in,
                 rho, kappa, rho_sum, kappa_sum, eta_sum, eta_sq_sum):
    """n_sweeps of (augmentation | eta, then eta | augmentation); sums over retained sweeps."""
    kept = 0
    for s in range(n_sweeps):
        _augment(loss, c, ell, eps, pg_method, pg_tol, y, mask, omega, rho, kappa)
        _eta_sweep(eta, A, r, prior_prec, cptr, crow, cval, rho, kappa, omega, u)
        if s >= burn_in:
            kept += 1
            rho_sum += rho
            kappa_sum += kappa
            eta_sum += eta
            eta_sq_sum += eta * eta
    return kept


@njit(cache=True, nogil=True)
def _eta_sweeps_traced(eta, A, r, prior_prec, cptr, crow, cval, rho, kappa, omega, u,
                       n_sweeps, trace, eta_sum, eta_sq_sum, retain):
    for s in range(n_sweeps):
        _eta_sweep(eta, A, r, prior_prec, cptr, crow, cval, rho, kappa, omega, u)
        if trace.shape[0] > 0:
            trace[s] = eta
        if retain:
            eta_sum += eta
            eta_sq_sum += eta * eta


@njit(cache=True, nogil=True)
def token_log_weights(eta, eta_sq, kappa_d, rho_d, m_d, inv_n, out):
    """Supervised log-weight of every topic k for one token of document d.

    out[k] = sum_y (kappa_dy/N - rho_dy m_dy/N^2) eta_yk - rho_dy eta_sq_yk / (2 N^2),  inv_n = 1/N_d.

    Collapsed Gibbs / alias MH (Gibbs MedLDA eq. 12, Zhu et al. 2013 eq. 9): m_dy = eta_y^T C_d^-n
    (the classifier re-weighted count without the token) and eta_sq = eta * eta, eta a sample.
    Add ``out`` to the log of the unsupervised weight; it is the exp-proposal's log-density up
    to a constant.  For a mean-field local step with uncertain eta use
    :func:`token_log_weights_mf` (with eta_var = 0 the two agree).
    """
    L, K = eta.shape
    for k in range(K):
        out[k] = 0.0
    n2 = inv_n * inv_n
    for l in range(L):
        a = kappa_d[l] * inv_n - rho_d[l] * m_d[l] * n2
        b = 0.5 * rho_d[l] * n2
        if a == 0.0 and b == 0.0:
            continue
        for k in range(K):
            out[k] += a * eta[l, k] - b * eta_sq[l, k]


@njit(cache=True, nogil=True)
def token_log_weights_mf(eta_mean, eta_var, kappa_d, rho_d, m_d, cnt_minus, inv_n, out):
    """Mean-field supervised weight (docs/supervised.md §5), q(eta_y) = prod_k N(eta_mean, eta_var):

    out[k] = sum_y (kappa_dy/N - rho_dy m_dy/N^2) eta_mean_yk
                   - rho_dy/(2 N^2) (eta_mean_yk^2 + eta_var_yk (1 + 2 cnt_minus_k))

    with m_dy = eta_mean_y^T cnt_minus and cnt_minus = N phibar_d - phi_dn, the expected topic
    counts of the document without this token (for a word type with count n_dw sharing phi_dw,
    subtract phi_dw once).  eta_mean_yk^2 + eta_var_yk is the self-interaction E[eta_yk^2];
    eta_var_yk cnt_minus_k comes from other tokens on the same topic (E[eta_yk eta_yk]).
    rho_d, kappa_d are the augmentation expectations (SupervisedHead.expected_coefficients).
    """
    L, K = eta_mean.shape
    for k in range(K):
        out[k] = 0.0
    n2 = inv_n * inv_n
    for l in range(L):
        a = kappa_d[l] * inv_n - rho_d[l] * m_d[l] * n2
        b = 0.5 * rho_d[l] * n2
        if a == 0.0 and b == 0.0:
            continue
        for k in range(K):
            e = eta_mean[l, k]
            out[k] += a * e - b * (e * e + eta_var[l, k] * (1.0 + 2.0 * cnt_minus[k]))


@njit(cache=True, nogil=True)
def token_log_weight(k, eta, eta_sq, kappa_d, rho_d, m_d, inv_n):
    """One entry of :func:`token_log_weights`: O(L), for MH acceptance ratios."""
    n2 = inv_n * inv_n
    s = 0.0
    for l in range(eta.shape[0]):
        s += (kappa_d[l] * inv_n - rho_d[l] * m_d[l] * n2) * eta[l, k] - 0.5 * rho_d[l] * n2 * eta_sq[l, k]
    return s


def omega_moments(phi, counts, eta_mean, eta_var=None) -> tuple[np.ndarray, np.ndarray]:
    """E[omega_y] and E[omega_y^2] of one document under q(z) q(eta) (docs/supervised.md §5).

    phi (W, K): responsibilities of the document's W word types, counts (W,): their counts
    n_dw (N = sum counts tokens, tokens of a type share phi); eta_mean, eta_var (L, K): the
    factorised q(eta) (eta_var None = a point eta).  With phibar = sum_w n_w phi_w / N:

      E omega   = eta^T phibar
      E omega^2 = (eta^T phibar)^2 + sum_k v_k phibar_k^2
                  + (1/N^2) sum_w n_w [sum_k phi_wk (eta_k^2 + v_k) - (phi_w^T eta)^2 - sum_k phi_wk^2 v_k]

    These feed SupervisedHead.expected_coefficients (the mean-field augmentation).
    """
    phi = np.asarray(phi, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    eta = np.asarray(eta_mean, dtype=np.float64)
    v = np.zeros_like(eta) if eta_var is None else np.asarray(eta_var, dtype=np.float64)
    N = n.sum()
    if N <= 0:
        return np.zeros(eta.shape[0]), np.zeros(eta.shape[0])
    phibar = n @ phi / N
    e1 = eta @ phibar
    pe = phi @ eta.T  # (W, L): phi_w^T eta_y
    tok = (phi @ (eta * eta + v).T) - pe * pe - (phi * phi) @ v.T  # (W, L)
    e2 = e1 * e1 + (phibar * phibar) @ v.T + (n @ tok) / (N * N)
    return e1, e2


# =========================================================================== helpers
def no_topic_mass(zbar) -> np.ndarray:
    """Rows of ``zbar`` with no topic mass (documents none of whose words the model knows): they
    get no prediction (``SupervisedHead.predict``) and no score (``TopicModel.predict_scores``)."""
    return ~(np.asarray(zbar, dtype=np.float64).sum(axis=1) > 0)


def _csc(Z: np.ndarray):
    """CSC columns of dense Z (D, K): (col_ptr (K+1,), rows, values) sorted by column."""
    kk, dd = np.nonzero(Z.T)
    cptr = np.zeros(Z.shape[1] + 1, dtype=np.int64)
    np.cumsum(np.bincount(kk, minlength=Z.shape[1]), out=cptr[1:])
    return cptr, dd.astype(np.int64), np.ascontiguousarray(Z[dd, kk])


def resolve_params(n_topics, loss, task, c, ell, epsilon, prior_var, decay, gibbs_sweeps, burn_in, pg_method,
                   pg_tol, memo_window):
    """Validate ``SupervisedHead``'s arguments; return (task, (c, ell, epsilon, prior_var) as numbers,
    the names of the self-scaling ones)."""
    if not isinstance(n_topics, (int, np.integer)) or n_topics < 1:
        raise ValueError(f"n_topics must be a positive int (got {n_topics!r})")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)} (got {loss!r})")
    if loss == "regression":
        if task not in (None, "regression"):
            raise ValueError(f"loss='regression' needs task='regression' (got {task!r})")
        task = "regression"
    elif task not in (None, "multiclass", "multilabel"):
        raise ValueError(f"task for a classification loss must be 'multiclass' or 'multilabel' (got {task!r})")
    d = DEFAULTS[loss]
    given = {"c": c, "ell": ell, "epsilon": epsilon, "prior_var": prior_var}
    for name, v in given.items():
        if isinstance(v, str) and v != AUTO:
            raise ValueError(f"{name} must be a number, None or {AUTO!r} (got {v!r})")
    auto = tuple(n for n in AUTO_NAMES if given[n] == AUTO)
    provisional = auto_constants(loss, int(n_topics), ScaleStats().mean_doc_len)
    c = provisional["c"] if c == AUTO else d["c"] if c is None else float(c)
    ell = provisional["ell"] if ell == AUTO else d["ell"] if ell is None else float(ell)
    epsilon = provisional["epsilon"] if epsilon == AUTO else d["epsilon"] if epsilon is None else float(epsilon)
    prior_var = provisional["prior_var"] if prior_var == AUTO else float(prior_var)
    if not (c > 0 and math.isfinite(c)):
        raise ValueError(f"c must be positive (got {c})")
    if loss == "hinge" and not ell > 0:
        raise ValueError(f"ell must be positive for the hinge loss (got {ell})")
    if not epsilon >= 0:
        raise ValueError(f"epsilon must be >= 0 (got {epsilon})")
    if not (prior_var > 0 and math.isfinite(prior_var)):
        raise ValueError(f"prior_var must be positive (got {prior_var})")
    if not 0.0 < decay <= 1.0:
        raise ValueError(f"decay must be in (0, 1] (got {decay})")
    if not isinstance(gibbs_sweeps, (int, np.integer)) or gibbs_sweeps < 1:
        raise ValueError(f"gibbs_sweeps must be a positive int (got {gibbs_sweeps!r})")
    if burn_in is not None and (not isinstance(burn_in, (int, np.integer)) or burn_in < 0):
        raise ValueError(f"burn_in must be a non-negative int or None (got {burn_in!r})")
    if pg_method not in PG_CHOICES:
        raise ValueError(f"pg_method must be one of {sorted(PG_CHOICES)} (got {pg_method!r})")
    if loss == "logistic" and pg_method == "exact" and c < 1.0 and "c" not in auto:
        raise ValueError("exact PG sampling needs c >= 1; use pg_method='gamma_sum' for c < 1")
    if not 0.0 < pg_tol < 1.0:
        raise ValueError(f"pg_tol must be in (0, 1) (got {pg_tol})")
    if memo_window is not None and (not isinstance(memo_window, (int, np.integer)) or memo_window < 1):
        raise ValueError(f"memo_window must be a positive int or None (got {memo_window!r})")
    return task, (c, ell, epsilon, prior_var), auto


# =========================================================================== the head
class SupervisedHead:
    """Streaming supervised head over topic proportions (see module docstring).  Parameters:

    n_topics : K, the length of zbar_d.
    loss : "hinge" (Gibbs MedLDA), "logistic" (Pólya-Gamma) or "regression" (eps-insensitive).
    task : "multiclass" | "multilabel" | "regression"; None infers it from the first
        labelled target (str -> multiclass, list of str -> multilabel).
    c, ell, epsilon : loss constants (regularisation constant, hinge margin ell, regression eps);
        None takes the loss's paper default in ``DEFAULTS``; ``"auto"`` scales it to the data
        (``supervised.scaling``: mean labelled document length, K, response scale), measured by
        :meth:`calibrate` as labelled batches arrive.
    prior_var : nu^2 of the isotropic prior eta_yk ~ N(0, nu^2); ``"auto"``: K unit^2 (scaling).
    decay : in (0, 1]; weight kept by the carried statistics at each batch.
    gibbs_sweeps : sweeps per ``update`` (each: augmentation, then one coordinate sweep).
    burn_in : sweeps discarded before averaging (default gibbs_sweeps // 2).
    seed : integer seed of every draw.
    pg_method : "exact" (Devroye / alternate), "gamma_sum" (approximate, see samplers) or "auto"
        (exact for c <= PG_EXACT_MAX_C, the gamma sum above, where exact draws cost O(c)).
    pg_tol : W2 tolerance (in standard deviations) of the gamma-sum method.
    max_labels, on_overflow : label vocabulary cap and policy (see ``labels``).
    memo_window : keep at most this many memoized batches (oldest subtracted, ``memo.HeadMemo``); None = all.
    Argument checks: ``resolve_params``; snapshots: ``head_io``."""

    def __init__(self, n_topics: int, loss: str = "hinge", *, task: str | None = None,
                 c: float | None = None, ell: float | None = None, epsilon: float | None = None,
                 prior_var: float = 1.0, decay: float = 1.0, gibbs_sweeps: int = 10,
                 burn_in: int | None = None, seed: int = 0, pg_method: str = "exact",
                 pg_tol: float = 1e-2, max_labels: int | None = None, on_overflow: str = "error",
                 memo_window: int | None = None):
        task, (c, ell, epsilon, prior_var), self._auto = resolve_params(
            n_topics, loss, task, c, ell, epsilon, prior_var, decay, gibbs_sweeps, burn_in, pg_method, pg_tol,
            memo_window)
        self.scale_stats = ScaleStats()
        self.n_topics = int(n_topics)
        self.loss = loss
        self.task = task
        self.c, self.ell, self.epsilon = c, ell, epsilon
        self.prior_var = float(prior_var)
        self.decay = float(decay)
        self.gibbs_sweeps = int(gibbs_sweeps)
        self.burn_in = None if burn_in is None else int(burn_in)
        self.seed = int(seed)
        self.pg_method = pg_method
        self.pg_tol = float(pg_tol)
        self.memo_window = None if memo_window is None else int(memo_window)
        self.labels = LabelVocabulary(max_labels, on_overflow)
        K = self.n_topics
        L0 = 1 if task == "regression" else 0
        self.eta = np.zeros((L0, K))          # current Gibbs sample (chain state)
        self.eta_mean = np.zeros((L0, K))     # average of the retained samples of the last batch
        self.eta_sq_mean = np.full((L0, K), self.prior_var)  # their second moments E[eta^2]
        self.A = np.zeros((L0, K, K))         # carried precision (data part), per label
        self.r = np.zeros((L0, K))            # carried linear term, per label
        self.memo = HeadMemo(self.memo_window)  # keyed batches' contributions (memoized laps)
        self.pool = NegativePool(K)           # what a label new later missed (``newlabels``)
        self.seed_coef = np.zeros((L0, 2))    # the (rho0, kappa0) each label started from
        self.n_calls = 0                      # index of the next RNG stream
        self.n_updates = 0
        self.docs_seen = 0
        self.acc_sum = np.zeros((L0, K))
        self.acc_sq = np.zeros((L0, K))
        self.acc_n = 0

    # ------------------------------------------------------------------ parameters
    def get_params(self) -> dict:
        """Constructor arguments; self-scaling constants come back as ``"auto"`` (their current
        values are the attributes c, ell, epsilon, prior_var)."""
        cur = {"c": self.c, "ell": self.ell, "epsilon": self.epsilon, "prior_var": self.prior_var}
        cur.update({n: AUTO for n in self._auto})
        return {"n_topics": self.n_topics, "loss": self.loss, "task": self.task, "c": cur["c"],
                "ell": cur["ell"], "epsilon": cur["epsilon"], "prior_var": cur["prior_var"],
                "decay": self.decay, "gibbs_sweeps": self.gibbs_sweeps, "burn_in": self.burn_in,
                "seed": self.seed, "pg_method": self.pg_method, "pg_tol": self.pg_tol,
                "max_labels": self.labels.max_labels, "on_overflow": self.labels.on_overflow,
                "memo_window": self.memo_window}

    @property
    def n_labels(self) -> int:
        """Rows of eta: the number of labels (1 for regression)."""
        return self.eta.shape[0]

    @property
    def prior_prec(self) -> float:
        return 1.0 / self.prior_var

    @property
    def auto_constants(self) -> tuple[str, ...]:
        """Names of the constants that scale themselves (see ``supervised.scaling``)."""
        return self._auto

    def calibrate(self, doc_lengths, targets) -> None:
        """Measure a labelled batch for the self-scaling constants: token counts of its documents
        (``doc_lengths``, one per document) and, for regression, their responses.  Unlabelled
        documents are ignored.  Call before the batch's local step and ``update``; a no-op when
        every constant was given explicitly."""
        if not self._auto:
            return
        tg = targets if isinstance(targets, Targets) else self.encode_targets(targets, grow=False)
        lengths = np.asarray(doc_lengths, dtype=np.float64).ravel()
        if lengths.shape[0] != tg.y.shape[0]:
            raise ValueError(f"{lengths.shape[0]} document lengths for {tg.y.shape[0]} targets")
        rows = tg.labelled
        responses = tg.y[rows, 0] if self.task == "regression" else None
        self.scale_stats.observe(lengths[rows], responses)
        self.refresh_auto()

    def refresh_auto(self) -> None:
        if not self._auto:
            return
        sd, rms = self.scale_stats.response_moments()
        vals = auto_constants(self.loss, self.n_topics, self.scale_stats.mean_doc_len, sd, rms)
        for name in self._auto:
            setattr(self, name, float(vals[name]))
        if self.n_updates == 0 and "prior_var" in self._auto:
            self.eta_sq_mean[:] = self.prior_var  # untrained: q(eta) is still the (now calibrated) prior

    def _pg_id(self) -> int:
        m = self.pg_method
        if m == "auto":
            m = "exact" if 1.0 <= self.c <= PG_EXACT_MAX_C else "gamma_sum"
        return _s.METHODS[m]

    # ------------------------------------------------------------------ targets
    def encode_targets(self, targets, grow: bool = True, unknown: str = "ignore") -> Targets:
        """Encode one batch of targets; ``grow`` adds new labels (training), else lookup only.

        multi-class: list of str or None (unlabelled); a labelled document is +1 for its label
        and -1 for every other label.  multi-label: list of lists of str or None; +1 for the
        listed labels, -1 for the others.  regression: floats, None or NaN for unlabelled.
        With ``grow=False`` an unknown label raises (``unknown="error"``) or is dropped, the
        document staying a negative for every known label (``unknown="ignore"``).
        """
        targets = list(targets)
        if self.task == "regression":
            return encode_responses(targets)
        self.task = self.task or infer_task(targets)
        per_doc = label_lists(self.task, targets)
        idx = self.labels.encode([lab for labs in per_doc if labs is not None for lab in labs], grow=grow,
                                 unknown=unknown)
        if grow:
            self._grow()
        return one_vs_rest(per_doc, idx, self.n_labels)

    def _grow(self) -> None:
        """New labels -> new eta rows at the prior (mean 0); carried statistics: the labelled documents
        folded so far, each a negative for them (``newlabels``).  New arrays, never in place (forks)."""
        L, K = self.n_labels, self.n_topics
        n = len(self.labels) - L
        if n <= 0:
            return
        coef = np.tile(seed_coefficients(self.loss, self.c, self.ell, self.epsilon), (n, 1))
        A_new, r_new = self.pool.seed(coef)
        self.seed_coef = np.vstack([self.seed_coef, coef])
        self.eta = np.vstack([self.eta, np.zeros((n, K))])
        self.eta_mean = np.vstack([self.eta_mean, np.zeros((n, K))])
        self.eta_sq_mean = np.vstack([self.eta_sq_mean, np.full((n, K), self.prior_var)])
        self.A = np.concatenate([self.A, A_new])
        self.r = np.vstack([self.r, r_new])
        self.acc_sum = np.vstack([self.acc_sum, np.zeros((n, K))])
        self.acc_sq = np.vstack([self.acc_sq, np.zeros((n, K))])

    # ------------------------------------------------------------------ checks
    def _zbar(self, zbar) -> np.ndarray:
        Z = np.ascontiguousarray(zbar, dtype=np.float64)
        if Z.ndim != 2 or Z.shape[1] != self.n_topics:
            raise ValueError(f"zbar must have shape (n_docs, {self.n_topics}) (got {Z.shape})")
        if not np.all(np.isfinite(Z)) or (Z < 0).any():
            raise ValueError("zbar must be finite and non-negative (normalised topic counts)")
        return Z

    def _coefs(self, rho, kappa, D) -> tuple[np.ndarray, np.ndarray]:
        rho = np.ascontiguousarray(rho, dtype=np.float64)
        kappa = np.ascontiguousarray(kappa, dtype=np.float64)
        if rho.shape != (D, self.n_labels) or kappa.shape != (D, self.n_labels):
            raise ValueError(f"rho and kappa must have shape ({D}, {self.n_labels}) "
                             f"(got {rho.shape}, {kappa.shape})")
        if (rho < 0).any() or not np.all(np.isfinite(rho)) or not np.all(np.isfinite(kappa)):
            raise ValueError("rho must be finite and >= 0, kappa finite")
        return rho, kappa

    def _subtract(self, rec: MemoRecord) -> None:
        """Take a memoized batch back out of (A, r) and of the pool (with its share of later labels)."""
        rec.fold_into(self.A, self.r, -1.0)
        if self.task != "regression":
            self.pool.drop(rec, self.A, self.r, self.seed_coef)

    def _reseed(self) -> None:
        s = int(np.random.SeedSequence([self.seed, self.n_calls]).generate_state(1)[0])
        self.n_calls += 1
        _s.seed(s)

    @staticmethod
    def _check_key(batch_key):
        if batch_key is None:
            return
        if isinstance(batch_key, bool) or not isinstance(batch_key, (str, int)):
            raise TypeError(f"batch_key must be str or int (it goes into msgpack snapshots); got {batch_key!r}")

    # ------------------------------------------------------------------ building blocks
    def omega(self, zbar, eta: np.ndarray | None = None) -> np.ndarray:
        """omega_dy = eta_y^T zbar_d, shape (D, L); default eta is the current chain sample."""
        Z = self._zbar(zbar)
        return Z @ (self.eta if eta is None else eta).T

    def sample_augmentation(self, zbar, targets) -> tuple[np.ndarray, np.ndarray]:
        """Draw the augmentation given the current eta sample; return (rho, kappa), each (D, L).

        ``targets`` is a :class:`Targets` (or raw targets, encoded with ``grow=True``).
        These are the per-document coefficients of the regularised conditional:
        log psi_d = sum_y kappa_dy eta_y^T zbar_d - rho_dy (eta_y^T zbar_d)^2 / 2.
        """
        Z = self._zbar(zbar)
        tg = self.learned_targets(targets if isinstance(targets, Targets) else self.encode_targets(targets, grow=True))
        if tg.y.shape != (Z.shape[0], self.n_labels):
            raise ValueError(f"targets encode {tg.y.shape}, expected ({Z.shape[0]}, {self.n_labels})")
        om = np.ascontiguousarray(Z @ self.eta.T)
        rho = np.zeros(om.shape)
        kappa = np.zeros(om.shape)
        self._reseed()
        _augment(LOSSES[self.loss], self.c, self.ell, self.epsilon, self._pg_id(), self.pg_tol,
                 np.ascontiguousarray(tg.y), np.ascontiguousarray(tg.mask), om, rho, kappa)
        return rho, kappa

    def sample_eta(self, zbar, rho, kappa, n_sweeps: int = 1, retain: bool = False,
                   trace: bool = False) -> np.ndarray | None:
        """Coordinate-wise Gibbs sweeps of eta given the batch's augmentation (rho, kappa).

        The prior is N(0, nu^2 I) plus the carried statistics (A, r).  ``retain`` adds each
        sample to the batch average that :meth:`end_batch` publishes as ``eta_mean``;
        ``trace`` returns the samples, shape (n_sweeps, L, K).
        """
        Z = self._zbar(zbar)
        rho, kappa = self._coefs(rho, kappa, Z.shape[0])
        cptr, crow, cval = _csc(Z)
        om = np.ascontiguousarray(Z @ self.eta.T)
        u = np.einsum("lkj,lj->lk", self.A, self.eta)
        tr = np.zeros((n_sweeps if trace else 0, self.n_labels, self.n_topics))
        self._reseed()
        _eta_sweeps_traced(self.eta, self.A, self.r, self.prior_prec, cptr, crow, cval, rho, kappa,
                           om, u, int(n_sweeps), tr, self.acc_sum, self.acc_sq, bool(retain))
        if retain:
            self.acc_n += int(n_sweeps)
        return tr if trace else None

    def begin_batch(self, batch_key=None, decay: float | None = None) -> None:
        """Start a batch: subtract the memoized contribution of ``batch_key``, apply the decay
        (``decay`` in [0, 1]: this batch's, instead of the head's own ``self.decay``)."""
        self._check_key(batch_key)
        self.memo.forget(batch_key, self._subtract)
        decay = self.decay if decay is None else float(decay)
        if decay < 1.0:
            self.A *= decay
            self.r *= decay
            self.memo.decay(decay)
            self.pool.decay(decay)
        self.acc_sum[:] = 0.0
        self.acc_sq[:] = 0.0
        self.acc_n = 0

    def end_batch(self, zbar, rho, kappa, batch_key=None) -> None:
        """Fold the batch (averaged rho, kappa) into the carried statistics; memoize it by key.

        Also publishes the average of the samples retained since :meth:`begin_batch`.
        """
        self._check_key(batch_key)
        Z = self._zbar(zbar)
        rho, kappa = carried_coefficients(self, Z, *self._coefs(rho, kappa, Z.shape[0]))  # §4: hinge, regression
        indptr, indices, data = csr(Z)
        fold(self.A, self.r, indptr, indices, data, rho, kappa, 1.0)
        labelled = labelled_rows(rho, kappa)
        if self.task != "regression":
            self.pool.add(indptr, indices, data, labelled)
        if batch_key is not None:
            self.memo.add(batch_key, MemoRecord(indptr, indices, data, rho.copy(), kappa.copy(), 1.0), self._subtract)
        if self.acc_n > 0:
            self.eta_mean = self.acc_sum / self.acc_n
            self.eta_sq_mean = self.acc_sq / self.acc_n
        self.n_updates += 1
        self.docs_seen += int(labelled.sum())

    # ------------------------------------------------------------------ one call per batch
    def update(self, zbar, targets, batch_key=None, n_sweeps: int | None = None, decay: float | None = None) -> dict:
        """Learn from one batch of (zbar, targets): augmentation + coordinate Gibbs sweeps; the
        statistics carried so far keep ``decay`` (None: ``self.decay``).

        Equivalent to begin_batch -> n_sweeps x (sample_augmentation, sample_eta) ->
        end_batch(rho and kappa averaged over the retained sweeps), in one numba call.
        Unlabelled documents are skipped.  Returns a small dict of counters.
        """
        Z = self._zbar(zbar)
        targets = list(targets)
        if len(targets) != Z.shape[0]:
            raise ValueError(f"{len(targets)} targets for {Z.shape[0]} documents")
        n_before = len(self.labels)
        tg = self.learned_targets(self.encode_targets(targets, grow=True))
        if self.task == "regression" and not tg.mask.any():  # nothing to learn yet: the head stays untrained
            return {"n_docs": int(Z.shape[0]), "n_labelled": 0, "n_labels": self.n_labels, "new_labels": [],
                    "sweeps": 0, "retained": 0}
        self.begin_batch(batch_key, decay)
        rows = tg.labelled
        Zl = np.ascontiguousarray(Z[rows])
        y = np.ascontiguousarray(tg.y[rows])
        mask = np.ascontiguousarray(tg.mask[rows])
        n_sweeps = self.gibbs_sweeps if n_sweeps is None else int(n_sweeps)
        if n_sweeps < 1:
            raise ValueError(f"n_sweeps must be >= 1 (got {n_sweeps})")
        burn = n_sweeps // 2 if self.burn_in is None else self.burn_in
        burn = min(burn, n_sweeps - 1)
        L = self.n_labels
        rho = np.zeros((Zl.shape[0], L))
        kappa = np.zeros((Zl.shape[0], L))
        kept = 0
        if Zl.shape[0] > 0 and L > 0:
            cptr, crow, cval = _csc(Zl)
            om = np.ascontiguousarray(Zl @ self.eta.T)
            u = np.einsum("lkj,lj->lk", self.A, self.eta)
            rho_sum = np.zeros_like(rho)
            kappa_sum = np.zeros_like(rho)
            self._reseed()
            kept = _gibbs_batch(LOSSES[self.loss], self.c, self.ell, self.epsilon, self._pg_id(),
                                self.pg_tol, y, mask, self.eta, self.A, self.r, self.prior_prec,
                                cptr, crow, cval, om, u, n_sweeps, burn, rho, kappa,
                                rho_sum, kappa_sum, self.acc_sum, self.acc_sq)
            self.acc_n += kept
            rho = rho_sum / kept
            kappa = kappa_sum / kept
        self.end_batch(Zl, rho, kappa, batch_key)
        return {"n_docs": int(Z.shape[0]), "n_labelled": int(Zl.shape[0]), "n_labels": L,
                "new_labels": self.labels.labels[n_before:], "sweeps": n_sweeps, "retained": kept}

    def learned_targets(self, tg: Targets) -> Targets:
        """Targets as the head learns them: for regression, responses clipped to
        ``ScaleStats.response_range`` (a stray response cannot carry the weights off) and less the
        response's offset (``response_offset``), and none before the head has seen the few
        responses those need. Call after ``calibrate``; targets already learned pass as they are."""
        return tg if self.task != "regression" else self.scale_stats.learned_responses(tg)

    @property
    def response_offset(self) -> float:
        """Regression: y = eta^T zbar + offset (``ScaleStats.offset``); 0 for the classifiers."""
        return self.scale_stats.offset if self.task == "regression" else 0.0

    # ------------------------------------------------------------------ prediction
    def scores(self, zbar) -> np.ndarray:
        """Per-label scores eta_mean_y^T zbar_d, shape (D, n_labels) (regression: the prediction,
        plus ``response_offset``)."""
        return self._zbar(zbar) @ self.eta_mean.T + self.response_offset

    def predict(self, zbar) -> list:
        """multi-class: argmax label (None if no label is known yet); multi-label: the labels
        with a positive score; regression: floats. A document with no topic mass (none of its
        words known to the model) gets no prediction: None ([] multi-label), not the first label."""
        S = self.scores(zbar)
        blank = no_topic_mass(zbar)
        if self.task == "regression":
            return [None if b else float(v) for v, b in zip(S[:, 0], blank)]
        if self.n_labels == 0:
            return [None if self.task != "multilabel" else [] for _ in range(S.shape[0])]
        if self.task == "multilabel":
            return [[] if b else [self.labels[i] for i in np.flatnonzero(row > 0)] for row, b in zip(S, blank)]
        return [None if b else lab for lab, b in zip(self.labels.decode(np.argmax(S, axis=1)), blank)]

    # ------------------------------------------------------------------ variational coefficients
    def expected_coefficients(self, e_omega, e_omega_sq, targets) -> tuple[np.ndarray, np.ndarray]:
        """Mean-field (rho, kappa), shapes (D, L): ``coefficients.expected_coefficients`` with this
        head's loss and constants."""
        tg = targets if isinstance(targets, Targets) else self.encode_targets(targets, grow=False)
        tg = self.learned_targets(tg)
        return expected_coefficients(self.loss, self.c, self.ell, self.epsilon, e_omega, e_omega_sq, tg.y, tg.mask)

    # ------------------------------------------------------------------ snapshots
    def state(self) -> tuple[dict, dict]:
        """(msgpack-able header, dict of numpy arrays); never pickle (``head_io``)."""
        return head_io.head_state(self)

    @classmethod
    def restore(cls, header: dict, arrays: dict) -> "SupervisedHead":
        return head_io.restore_head(cls, header, arrays)

    def memo_keys(self) -> list:
        return self.memo.keys()

    def release_memo(self) -> int:
        """Forget every memo record (kept in the carried statistics); returns how many.  For owners
        that never revisit a batch: the records would grow memory and snapshots without bound."""
        return self.memo.release()

    def limit_memo(self, window: int | None) -> int:
        """Set ``memo_window`` and subtract the oldest records beyond it; returns how many."""
        n = self.memo.limit(window, self._subtract)
        self.memo_window = self.memo.window
        return n
