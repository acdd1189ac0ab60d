"""Mean-field expectations of the augmentation (docs/supervised.md §5): the coefficients the
variational local step weighs the label term with; and the coefficients a batch is carried with
once it is over (§4)."""
from __future__ import annotations

import math

import numpy as np


def expected_coefficients(loss: str, c: float, ell: float, eps: float, e_omega, e_omega_sq, y, mask
                          ) -> tuple[np.ndarray, np.ndarray]:
    """Mean-field (rho, kappa): the expectations under q(lam) given E[omega], E[omega^2].

    q(lam) prop. to exp(E_q log phi(y, lam | z, eta)) (docs/supervised.md §5):
      hinge      E[1/lam] = 1/(c sqrt(E zeta^2)),  E zeta^2 = ell^2 - 2 ell y E omega + E omega^2
      logistic   q(lam) = PG(c, sqrt(E omega^2)),  E lam = c tanh(w/2)/(2w)
      regression E[1/lam] = 1/(c sqrt(E (y-eps-omega)^2)), E[1/om] likewise with y+eps
    and then rho, kappa as in the sampler.  Shapes (D, L).
    """
    m = np.asarray(e_omega, dtype=np.float64)
    s = np.asarray(e_omega_sq, dtype=np.float64)
    if m.shape != y.shape or s.shape != y.shape:
        raise ValueError(f"e_omega and e_omega_sq must have shape {y.shape}")
    if (s < m * m - 1e-12 * np.maximum(1.0, m * m)).any():
        raise ValueError("e_omega_sq must be >= e_omega^2")
    # E zeta^2 is floored at 1/c^2, the width of exp(-2c max(0, zeta)): at E zeta^2 -> 0 the
    # GIG mean E[1/lam] diverges and the label term would swamp the words (docs/supervised.md §7).
    tiny = 1.0 / (c * c)
    with np.errstate(divide="ignore"):
        if loss == "hinge":
            ez2 = np.maximum(ell * ell - 2.0 * ell * y * m + s, tiny)
            il = 1.0 / (c * np.sqrt(ez2))
            rho, kappa = c * c * il, c * y * (1.0 + c * ell * il)
        elif loss == "logistic":
            w = np.sqrt(np.maximum(s, 0.0))
            small = w < 1e-6
            el = np.where(small, c * (0.25 - w * w / 48.0), c * np.tanh(0.5 * w) / (2.0 * np.where(small, 1.0, w)))
            rho, kappa = el, 0.5 * c * y
        else:
            e1 = np.maximum((y - eps) ** 2 - 2.0 * (y - eps) * m + s, tiny)
            e2 = np.maximum((y + eps) ** 2 - 2.0 * (y + eps) * m + s, tiny)
            il, io = 1.0 / (c * np.sqrt(e1)), 1.0 / (c * np.sqrt(e2))
            rho, kappa = c * c * (il + io), c * c * ((y - eps) * il + (y + eps) * io)
    return np.where(mask, rho, 0.0), np.where(mask, kappa, 0.0)


def carried_coefficients(head, zbar, rho, kappa) -> tuple[np.ndarray, np.ndarray]:
    """(rho, kappa) of a batch as ``head`` carries them once the batch is over (``end_batch``).

    The augmentation's per-document weight is a quadratic bound tight at the document's residual
    (margin) under eta *of the batch's time*; carried, it is evaluated at every later eta, where that
    residual no longer holds, and the documents the eta of the time happened to put at the loss's
    kink keep weights ~ 1/|residual| without bound (docs/supervised.md §4, "Regression: what the
    carried statistics keep"; "The hinge: the same defect"). What the batch's loss has in expectation
    over the residuals is one curvature w for every document (rho_d = w):

    * regression: ``2c sum_d max(0, |y_d - eta^T zbar_d| - eps)`` has curvature 4c f(eps), f the
      residuals' density, Gaussian with the RMS s of the batch's residuals (floor 1/c):
      w = 4c phi(eps / s) / s, each document's pseudo-target u_d = kappa_d / rho_d kept
      (kappa_d = w u_d);
    * hinge, per label: ``2c sum_d max(0, zeta_d)``, zeta_d = ell - y_d eta^T zbar_d, has curvature
      2c f(0), f the margins' density at the kink, a Gaussian kernel estimate (the margins of a
      one-vs-rest label are far from Gaussian): w = 2c mean_d phi(zeta_d / h) / h, Silverman's
      h = 1.06 sd n^(-1/5) (floor 1/c, the loss's width); each document keeps its slope of the same
      smoothed loss, kappa_d = w omega_d + y_d 2c Phi(zeta_d / h) (the second-order expansion at the
      batch's eta); y_d = sign(kappa_d), exact for the hinge.

    eta is the average of the batch's retained samples.  The logistic loss is unchanged: its
    Polya-Gamma weight c tanh(omega/2) / (2 omega) is bounded by c/4 and smooth in omega.
    """
    rho = np.asarray(rho, dtype=np.float64)
    kappa = np.asarray(kappa, dtype=np.float64)
    if head.loss == "logistic" or rho.ndim != 2:
        return rho, kappa
    eta = head.acc_sum / head.acc_n if head.acc_n > 0 else head.eta
    if eta.shape[0] != rho.shape[1]:
        return rho, kappa
    omega = np.asarray(zbar, dtype=np.float64) @ eta.T
    c = float(head.c)
    rho_c, kappa_c = rho.copy(), kappa.copy()
    for l in range(rho.shape[1]):
        lab = rho[:, l] > 0.0
        if head.task == "regression":
            u = kappa[lab, l] / rho[lab, l]
            w = _regression_weight(c, float(head.epsilon), u - omega[lab, l])
            rho_c[lab, l], kappa_c[lab, l] = w, w * u
        elif lab.sum() >= 2:
            y = np.sign(kappa[lab, l])
            w, grad = _hinge_terms(c, float(head.ell) - y * omega[lab, l])
            rho_c[lab, l], kappa_c[lab, l] = w, w * omega[lab, l] + y * grad
    return rho_c, kappa_c


def _regression_weight(c: float, eps: float, resid: np.ndarray) -> float:
    """4c phi(eps / s) / s, s the residuals' RMS (floor 1/c); 0 for no residuals."""
    if resid.size == 0:
        return 0.0
    s = max(math.sqrt(float(np.mean(resid * resid))), 1.0 / c)
    t = eps / s
    return 4.0 * c * math.exp(-0.5 * t * t) / (math.sqrt(2.0 * math.pi) * s)


def _hinge_terms(c: float, zeta: np.ndarray) -> tuple[float, np.ndarray]:
    """The kernel-smoothed hinge 2c E max(0, zeta + h e) around the batch's margins: the documents'
    common curvature 2c f(0) and each one's slope 2c Phi(zeta_d / h) (towards its label)."""
    h = max(1.06 * float(np.std(zeta)) * zeta.size ** -0.2, 1.0 / c)
    t = zeta / h
    w = 2.0 * c * float(np.mean(np.exp(-0.5 * t * t))) / (math.sqrt(2.0 * math.pi) * h)
    grad = 2.0 * c * 0.5 * np.array([math.erfc(-x / math.sqrt(2.0)) for x in t])
    return w, grad
