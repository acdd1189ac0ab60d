"""Loss constants that scale themselves (docs/supervised.md §7, "Defaults that scale themselves").

The supervised constants have no natural values of their own; each is measured against a
quantity of the data, and the defaults are those quantities:

* **c against the document's word count.**  In the regularised posterior a document's words
  enter with N_d log-likelihood terms and its label with one loss term times c (PG-sLDA §2;
  the per-token label force is c/N_d).  A label that is to weigh as much as the words of an
  average document needs c proportional to the mean labelled document length Nbar:
  logistic ``c = Nbar``; hinge and regression ``c * scale = Nbar`` where ``scale`` is the
  loss's own unit (the margin ell, the response's standard deviation), because
  exp(-2c max(0, ell - y omega)) is unchanged by (c, ell, eta) -> (c/s, s ell, s eta).
* **ell against the scale of the discriminant.**  By that invariance only c*ell and ell/nu
  matter, so the margin fixes the unit of omega = eta^T zbar: ell = 1.
* **nu^2 against the number of topics.**  Under the prior, Var(omega_d) = nu^2 ||zbar_d||^2,
  and ||zbar_d||^2 lies in [1/K, 1] (1/K when a document spreads evenly over the K topics).
  The prior must not hold any document's discriminant below the loss's unit, so
  nu^2 = K unit^2: unit = ell (hinge), one logit (logistic), the response's RMS (regression,
  where the mean of y must also be reachable because zbar sums to one).
* **eps** (regression) is a precision in the response's unit: 1e-3 standard deviations
  (Gibbs MedLDA's 1e-3 on ratings with sd ~ 1).

Nbar and the response moments are running statistics of the labelled documents seen so far
(:class:`ScaleStats`), so a stream of unknown length needs no prior knowledge; they settle
after the first labelled batches.  Explicit constants always override.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

AUTO = "auto"
AUTO_NAMES = ("c", "ell", "epsilon", "prior_var")
PROVISIONAL_DOC_LEN = 100.0  # Nbar used before any labelled document was measured
EPS_REL = 1e-3               # regression eps in response standard deviations


@dataclass
class ScaleStats:
    """Running statistics of the labelled documents: token counts and (regression) responses."""

    n_docs: int = 0
    sum_len: float = 0.0
    n_resp: int = 0
    sum_y: float = 0.0
    sum_y2: float = 0.0

    def observe(self, doc_lengths, responses=None) -> None:
        """Add labelled documents: their token counts, and their responses (regression)."""
        lengths = np.asarray(doc_lengths, dtype=np.float64).ravel()
        if lengths.size and (not np.all(np.isfinite(lengths)) or (lengths < 0).any()):
            raise ValueError("document lengths must be finite and >= 0")
        self.n_docs += int(lengths.size)
        self.sum_len += float(lengths.sum())
        if responses is not None:
            y = np.asarray(responses, dtype=np.float64).ravel()
            self.n_resp += int(y.size)
            self.sum_y += float(y.sum())
            self.sum_y2 += float(np.dot(y, y))

    @property
    def mean_doc_len(self) -> float:
        if self.n_docs == 0 or self.sum_len <= 0:
            return PROVISIONAL_DOC_LEN
        return max(self.sum_len / self.n_docs, 1.0)

    def response_moments(self) -> tuple[float, float]:
        """(sd, rms) of the responses seen; (1, 1) before any (or for a constant response)."""
        if self.n_resp == 0:
            return 1.0, 1.0
        mean = self.sum_y / self.n_resp
        ms = self.sum_y2 / self.n_resp
        sd = math.sqrt(max(ms - mean * mean, 0.0))
        rms = math.sqrt(max(ms, 0.0))
        if not sd > 1e-12:
            sd = rms if rms > 1e-12 else 1.0
        return sd, max(rms, sd)

    def state(self) -> list:
        return [self.n_docs, self.sum_len, self.n_resp, self.sum_y, self.sum_y2]

    @classmethod
    def restore(cls, s) -> "ScaleStats":
        n_docs, sum_len, n_resp, sum_y, sum_y2 = s
        return cls(int(n_docs), float(sum_len), int(n_resp), float(sum_y), float(sum_y2))


def auto_constants(loss: str, n_topics: int, mean_doc_len: float, response_sd: float = 1.0,
                   response_rms: float = 1.0) -> dict:
    """The self-scaling (c, ell, epsilon, prior_var) of ``loss`` (module docstring has the argument)."""
    if n_topics < 1 or not mean_doc_len > 0:
        raise ValueError("need n_topics >= 1 and mean_doc_len > 0")
    K, n = float(n_topics), float(mean_doc_len)
    if loss == "hinge":
        ell = 1.0
        return {"c": n / ell, "ell": ell, "epsilon": 0.0, "prior_var": K * ell * ell}
    if loss == "logistic":
        return {"c": n, "ell": 0.0, "epsilon": 0.0, "prior_var": K}
    if loss == "regression":
        sd, rms = float(response_sd), float(response_rms)
        if not (sd > 0 and rms > 0):
            raise ValueError("response_sd and response_rms must be > 0")
        return {"c": 0.5 * n / sd, "ell": 0.0, "epsilon": EPS_REL * sd, "prior_var": K * rms * rms}
    raise ValueError(f"unknown loss {loss!r}")
