"""Mean-field expectations of the augmentation (docs/supervised.md §5): the coefficients the
variational local step weighs the label term with."""
from __future__ import annotations

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


def carried_coefficients(task: str | None, rho, kappa) -> tuple[np.ndarray, np.ndarray]:
    """(rho, kappa) of a batch as the head carries them once the batch is over (``end_batch``).

    Classification: unchanged.  Regression: every labelled document of the batch (rho > 0) gets
    the batch's mean precision ``rhobar``, and ``kappa_d = rhobar * kappa_d / rho_d`` keeps its
    pseudo-target ``u_d = kappa_d / rho_d`` (y_d within +-eps).  Why (docs/supervised.md §4,
    "Regression: what the carried statistics keep"): the eps-insensitive augmentation gives
    document d the weight rho_d ~ 2c / |y_d - omega_d|, the reweighted-least-squares bound of the
    absolute loss tight at the residual under eta *of the batch's time*.  A carried Gaussian is
    evaluated at every later eta, where that residual no longer holds; the weight then encodes
    how well an early, poor eta happened to fit d, and the carried fit is biased towards the
    documents it fitted (measured: predictions shrunk by a factor 1.2-1.3).  The batch mean keeps
    the batch's total precision sum_d rho_d (and so its weight against the prior, the decay and
    newer batches) and drops only its spread over documents, which the batch's own time fixed.
    """
    rho = np.asarray(rho, dtype=np.float64)
    kappa = np.asarray(kappa, dtype=np.float64)
    if task != "regression" or rho.ndim != 2 or rho.shape[1] != 1:
        return rho, kappa
    lab = rho[:, 0] > 0.0
    if not lab.any():
        return rho, kappa
    rhobar = float(rho[lab, 0].mean())
    rho_c, kappa_c = rho.copy(), kappa.copy()
    kappa_c[lab, 0] = rhobar * (kappa[lab, 0] / rho[lab, 0])
    rho_c[lab, 0] = rhobar
    return rho_c, kappa_c
