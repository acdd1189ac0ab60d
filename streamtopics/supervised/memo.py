"""The classifier's memo: each keyed batch's contribution to the carried statistics (A, r), kept so
that a revisited batch (memoized laps) replaces its contribution instead of counting it twice."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..jit_cache import njit


@njit(cache=True, nogil=True)
def fold(A, r, indptr, indices, data, rho, kappa, weight):
    """A_l += weight sum_d rho_dl zbar_d zbar_d^T, r_l += weight sum_d kappa_dl zbar_d (CSR zbar).

    O(L sum_d nnz_d^2): documents use few topics, so this is far below a dense K x K product.
    Only the first rho.shape[1] labels are touched (a memoized batch predates later labels).
    """
    D, L = rho.shape
    for d in range(D):
        lo, hi = indptr[d], indptr[d + 1]
        for l in range(L):
            w = weight * rho[d, l]
            kw = weight * kappa[d, l]
            for p in range(lo, hi):
                k = indices[p]
                v = data[p]
                r[l, k] += kw * v
                if w != 0.0:
                    wv = w * v
                    for q in range(lo, hi):
                        A[l, k, indices[q]] += wv * data[q]


def csr(Z: np.ndarray):
    """CSR rows of dense Z (D, K): (indptr (D+1,), int32 columns, values)."""
    dd, kk = np.nonzero(Z)
    indptr = np.zeros(Z.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(dd, minlength=Z.shape[0]), out=indptr[1:])
    return indptr, kk.astype(np.int32), np.ascontiguousarray(Z[dd, kk])


@dataclass
class MemoRecord:
    """One batch's folded terms: CSR zbar, the averaged (rho, kappa) and its current weight decay^age."""

    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray
    rho: np.ndarray
    kappa: np.ndarray
    weight: float

    def fold_into(self, A, r, sign: float = 1.0) -> None:
        fold(A, r, self.indptr, self.indices, self.data, self.rho, self.kappa, sign * self.weight)


_ARRAYS = {"indptr": np.int64, "indices": np.int32, "data": np.float64, "rho": np.float64, "kappa": np.float64}


class HeadMemo:
    """Records by batch key, oldest first; ``window`` caps how many are kept."""

    def __init__(self, window: int | None = None) -> None:
        self.records: OrderedDict = OrderedDict()
        self.window = window

    def __contains__(self, key) -> bool:
        return key in self.records

    def __getitem__(self, key) -> MemoRecord:
        return self.records[key]

    def __len__(self) -> int:
        return len(self.records)

    def keys(self) -> list:
        return list(self.records.keys())

    def forget(self, key, subtract) -> bool:
        """Drop the record of ``key``, handing it to ``subtract`` (the owner takes its contribution
        out of what it carries); False when there is none."""
        if key is None or key not in self.records:
            return False
        subtract(self.records.pop(key))
        return True

    def decay(self, factor: float) -> None:
        for rec in self.records.values():
            rec.weight *= factor

    def add(self, key, rec: MemoRecord, subtract) -> None:
        self.records[key] = rec
        self.limit(self.window, subtract)

    def limit(self, window: int | None, subtract) -> int:
        """Set ``window`` and hand the oldest records beyond it to ``subtract``; returns how many."""
        if window is not None and (not isinstance(window, (int, np.integer)) or window < 1):
            raise ValueError(f"memo_window must be a positive int or None (got {window!r})")
        self.window = None if window is None else int(window)
        n = 0
        while self.window is not None and len(self.records) > self.window:
            _, old = self.records.popitem(last=False)
            subtract(old)
            n += 1
        return n

    def release(self) -> int:
        """Forget every record, keeping its contribution in the carried statistics."""
        n = len(self.records)
        self.records.clear()
        return n

    def state(self) -> tuple[list, dict]:
        """(header rows [key, weight, n_docs, n_labels, nnz], concatenated arrays "memo_*")."""
        meta = []
        parts: dict = {name: [] for name in _ARRAYS}
        for key, rec in self.records.items():
            meta.append([key, float(rec.weight), int(rec.indptr.shape[0] - 1), int(rec.rho.shape[1]),
                         int(rec.indices.shape[0])])
            parts["indptr"].append(rec.indptr)
            parts["indices"].append(rec.indices)
            parts["data"].append(rec.data)
            parts["rho"].append(rec.rho.ravel())
            parts["kappa"].append(rec.kappa.ravel())
        arrays = {"memo_" + name: (np.concatenate(parts[name]).astype(dt) if parts[name] else np.zeros(0, dtype=dt))
                  for name, dt in _ARRAYS.items()}
        return meta, arrays

    def restore(self, meta: list, arrays: dict) -> None:
        o = dict.fromkeys(_ARRAYS, 0)

        def take(name, n):
            a = np.array(arrays["memo_" + name][o[name]:o[name] + n])
            if a.shape[0] != n:
                raise ValueError(f"memo array {name} is truncated")
            o[name] += n
            return a

        for key, weight, n_docs, n_rows, nnz in meta:
            indptr = take("indptr", n_docs + 1).astype(np.int64)
            self.records[key] = MemoRecord(indptr, take("indices", nnz).astype(np.int32), take("data", nnz),
                                           take("rho", n_docs * n_rows).reshape(n_docs, n_rows),
                                           take("kappa", n_docs * n_rows).reshape(n_docs, n_rows), float(weight))
