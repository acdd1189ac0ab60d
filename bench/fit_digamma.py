"""How the rational approximation of psi below 2 in ``streamtopics/_numeric.py`` was fitted.

psi(x) = (x - x0) P(x - 1) / Q(x - 1) on [1, 2], x0 the positive zero of psi, P and Q of degree 6
with Q(0) = 1: linearised least squares P(t) - f(t) Q(t) at 4,000 Chebyshev nodes, reweighted by
1 / |Q| until it settles (Loeb's iteration), against mpmath's psi at 40 digits. Prints the
coefficients, the largest error on a fine grid, and min Q on [0, 1] (must stay away from 0).

    python bench/fit_digamma.py          # needs mpmath (pip install mpmath)
"""
from __future__ import annotations

import mpmath as mp
import numpy as np


def fit(degree: int = 6, nodes: int = 4000, iterations: int = 12):
    mp.mp.dps = 40
    x0 = mp.findroot(mp.digamma, 1.46)
    t = np.sort(0.5 + 0.5 * np.cos(np.pi * (np.arange(nodes) + 0.5) / nodes))
    f = np.array([float(mp.digamma(1 + mp.mpf(v)) / (1 + mp.mpf(v) - x0)) for v in t])
    w = np.ones(nodes)
    for _ in range(iterations):
        powers = t[:, None] ** np.arange(degree + 1)
        a = np.hstack([powers, -f[:, None] * powers[:, 1:]])
        c, *_ = np.linalg.lstsq(a * w[:, None], f * w, rcond=None)
        p, q = c[: degree + 1], np.concatenate([[1.0], c[degree + 1:]])
        w = 1.0 / np.abs(np.polyval(q[::-1], t))
    return float(x0), p, q


def main() -> None:
    x0, p, q = fit()
    xs = np.linspace(1.0, 2.0, 1001)
    approx = (xs - x0) * np.polyval(p[::-1], xs - 1) / np.polyval(q[::-1], xs - 1)
    ref = np.array([float(mp.digamma(mp.mpf(float(x)))) for x in xs])
    print("PSI_X0 =", repr(x0))
    print("PSI_P =", tuple(p.tolist()))
    print("PSI_Q =", tuple(q.tolist()))
    print(f"max |error| on [1, 2]: {np.abs(approx - ref).max():.2e}; "
          f"min Q on [0, 1]: {np.polyval(q[::-1], np.linspace(0, 1, 10001)).min():.3f}")


if __name__ == "__main__":
    main()
