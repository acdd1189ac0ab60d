"""Mean-field expectations of the augmentation (docs/supervised.md §5): the coefficients the
variational local step weighs the label term with; and the coefficients a regression batch is
carried with once it is over (§4)."""
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

    Classification: unchanged.  Regression (docs/supervised.md §4, "Regression: what the carried
    statistics keep"): the eps-insensitive augmentation gives document d the precision
    rho_d ~ 2c / |y_d - omega_d|, the curvature of the absolute loss's quadratic bound tight at the
    residual under eta *of the batch's time*.  Carried, that bound is evaluated at every later eta,
    where the residual no longer holds: documents the eta of the time happened to fit keep huge
    weights.  What the batch's term 2c sum_d max(0, |y_d - eta^T zbar_d| - eps) has in expectation
    over the residuals is the curvature 2c (f(eps) + f(-eps)) = 4c f(eps) per document (f: the
    residuals' density), the same for every document.  So every labelled document is carried at

        w = 4c phi(eps / s) / s,   s = RMS of the batch's residuals u_d - eta^T zbar_d  (floor 1/c),

    (f Gaussian; eta: the average of the batch's retained samples), with its pseudo-target
    u_d = kappa_d / rho_d kept: kappa_d = w u_d.  The floor 1/c is the loss's width, as in
    ``expected_coefficients``.
    """
    rho = np.asarray(rho, dtype=np.float64)
    kappa = np.asarray(kappa, dtype=np.float64)
    if head.task != "regression" or rho.ndim != 2 or rho.shape[1] != 1:
        return rho, kappa
    lab = rho[:, 0] > 0.0
    if not lab.any():
        return rho, kappa
    eta = head.acc_sum / head.acc_n if head.acc_n > 0 else head.eta
    u = kappa[lab, 0] / rho[lab, 0]
    resid = u - np.asarray(zbar, dtype=np.float64)[lab] @ eta[0]
    c = float(head.c)
    s = max(math.sqrt(float(np.mean(resid * resid))), 1.0 / c)
    t = float(head.epsilon) / s
    w = 4.0 * c * math.exp(-0.5 * t * t) / (math.sqrt(2.0 * math.pi) * s)
    rho_c, kappa_c = rho.copy(), kappa.copy()
    rho_c[lab, 0] = w
    kappa_c[lab, 0] = w * u
    return rho_c, kappa_c
