"""What a label first seen mid-stream missed: every labelled document before it was a negative for it.

Each label's classifier learns from every labelled document, as a positive or as a negative
("label y vs rest", docs/supervised.md §2). A label first seen at document n has missed the n
labelled documents before it, all negatives for it. With none of them its classifier sees only
positives at first, its intercept (eta's common component: zbar sums to one) grows unchecked, and
in a stream whose labels arrive in runs (a backfill category by category, a new product line) the
newest label wins every argmax: Reuters R8 streamed in label order gave hinge 0.16 and logistic
0.45 test accuracy, against 0.96 shuffled (docs/supervised.md §8).

``NegativePool`` keeps the sufficient statistics of the labelled documents folded so far, decayed
and memoized exactly as the carried statistics (A, r) are:

    S2 = sum_d w_d zbar_d zbar_d^T,    S1 = sum_d w_d zbar_d,

and a new label starts from them as the batch those documents would have been for it, each a
negative with the augmentation's expectation at the classifier's starting point eta_y = 0
(``seed_coefficients``: hinge rho0 = c/ell, kappa0 = -2c; logistic rho0 = c/4, kappa0 = -c/2):

    A_y = rho0 S2,    r_y = kappa0 S1.

That is the coefficient a label present from the first batch gives its first batch's negatives
when its eta has not yet moved; like every carried batch, it is then frozen. The pair a label was
seeded with is kept per label (the constants self-scale, so they differ between labels), so that
a memoized batch subtracted later (a revisit, the memo window) takes its share back out of the
labels seeded after it was folded: ``drop``.
"""
from __future__ import annotations

import numpy as np

from .coefficients import expected_coefficients
from .memo import fold


def seed_coefficients(loss: str, c: float, ell, eps) -> tuple[float, float]:
    """(rho0, kappa0): the mean-field augmentation of a negative (y = -1) at omega = 0 exactly."""
    z = np.zeros((1, 1))
    rho, kappa = expected_coefficients(loss, c, ell, eps, z, z, -np.ones((1, 1)), np.ones((1, 1), dtype=bool))
    return float(rho[0, 0]), float(kappa[0, 0])


def labelled_rows(rho: np.ndarray, kappa: np.ndarray) -> np.ndarray:
    """Rows of a folded batch that carried a label (the others have rho = kappa = 0 throughout)."""
    return ((rho > 0) | (kappa != 0)).any(axis=1)


class NegativePool:
    """S2 (K, K) and S1 (K,) of the labelled documents folded so far (module docstring)."""

    def __init__(self, n_topics: int) -> None:
        self.S2 = np.zeros((1, n_topics, n_topics))  # a one-label (A, r) pair, so ``fold`` serves both
        self.S1 = np.zeros((1, n_topics))

    def add(self, indptr, indices, data, labelled: np.ndarray, weight: float = 1.0) -> None:
        """Fold a batch's labelled documents (CSR zbar; ``labelled``: ``labelled_rows`` of its rho and
        kappa) with ``weight``."""
        ones = labelled.astype(np.float64)[:, None]
        fold(self.S2, self.S1, indptr, indices, data, ones, ones, float(weight))

    def decay(self, factor: float) -> None:
        self.S2 *= factor
        self.S1 *= factor

    def seed(self, coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(A, r) of new labels, one per row (rho0, kappa0) of ``coef``: rho0 S2 and kappa0 S1."""
        coef = np.asarray(coef, dtype=np.float64).reshape(-1, 2)
        return coef[:, 0, None, None] * self.S2, coef[:, 1, None] * self.S1

    def drop(self, rec, A: np.ndarray, r: np.ndarray, coef: np.ndarray) -> None:
        """Take a memo record (``memo.MemoRecord``) being subtracted out of the pool, and its seeded
        share out of the labels added after it was folded (rows ``rec.rho.shape[1]`` on of A, r;
        ``coef`` the head's per-label seed pair)."""
        lab = labelled_rows(rec.rho, rec.kappa).astype(np.float64)[:, None]
        fold(self.S2, self.S1, rec.indptr, rec.indices, rec.data, lab, lab, -rec.weight)
        first = rec.rho.shape[1]
        if first < A.shape[0]:
            later = np.asarray(coef, dtype=np.float64)[first:]
            fold(A[first:], r[first:], rec.indptr, rec.indices, rec.data, lab * later[None, :, 0],
                 lab * later[None, :, 1], -rec.weight)

    def state(self) -> dict:
        return {"pool_S2": self.S2[0].copy(), "pool_S1": self.S1[0].copy()}

    def restore(self, arrays: dict) -> None:
        """From ``state``'s arrays; a snapshot written before the pool existed leaves it empty (labels
        new after such a resume start from the prior alone, as they used to)."""
        K = self.S1.shape[1]
        if "pool_S2" in arrays:
            self.S2 = np.array(arrays["pool_S2"], dtype=np.float64).reshape(1, K, K)
            self.S1 = np.array(arrays["pool_S1"], dtype=np.float64).reshape(1, K)
