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
  nu^2 = K unit^2: unit = ell (hinge), one logit (logistic), the RMS of the response as learned
  (regression, y less its offset; what is left of its mean must also be reachable, because zbar
  sums to one).
* **The response's offset** (regression): the head learns y - offset and predicts eta^T zbar +
  offset, the offset the median of the stream's first MIN_RESPONSES responses. Since zbar sums to
  one this is a prior N(offset, nu^2) on every weight instead of N(0, nu^2): without it a response
  far from 0 (a year, a price) set nu^2 by its level and left the topics' differences in the
  weights' last digits (supervised audit, 2026-11-29: stream R^2 0.57 for 2000 + 5y, -6e4 for
  1e6 + 0.001y, against 0.66 for y; now 0.66 for each).
* **eps** (regression) is a precision in the response's unit: 1e-3 standard deviations
  (Gibbs MedLDA's 1e-3 on ratings with sd ~ 1).

Nbar and the response scale are running statistics of the labelled documents seen so far
(:class:`ScaleStats`), so a stream of unknown length needs no prior knowledge; they settle
after the first labelled batches.  Explicit constants always override.

The response's sd and RMS are **robust** (median and 1.4826 x MAD of an evenly thinned sample
of every response seen): the eps-insensitive loss is an absolute loss, whose unit is a typical
residual, and a sum of squares lets one stray response (a price typed in cents, 1e6 among
values near 1) set c, eps and nu^2 for the rest of the stream (measured: R^2 at -145x the
oracle's instead of 0.92x; docs/supervised.md §7).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .targets import Targets

AUTO = "auto"
AUTO_NAMES = ("c", "ell", "epsilon", "prior_var")
PROVISIONAL_DOC_LEN = 100.0  # Nbar used before any labelled document was measured
EPS_REL = 1e-3               # regression eps in response standard deviations


SAMPLE_CAP = 2048            # responses kept for the robust scale (thinned evenly beyond)
MAD_TO_SD = 1.4826           # sd of a normal distribution per median absolute deviation
TRIM = 0.01                  # share cut from each end for the fallback scale (MAD = 0: ties)
# Responses as the regression head learns them (``ScaleStats.response_range``): clipped to Tukey's
# far-out fences, the quartiles -/+ FENCE x the interquartile range. A normal response passes
# them with probability 1 - 2e-6 (4.7 sd), a Laplace one with 0.992, a lognormal (sigma = 1) one
# with 0.967 (it enters at the fence, 6.3 x the median, not dropped); a stray 1e6 among responses
# near 3 enters at the fence instead of carrying the weights off for several batches. The fences
# use the spread of the middle half, not the MAD, so a response with several modes (a class
# index, ratings) is not cut at its main mode. The head learns no response before
# MIN_RESPONSES were seen: a sample quartile of n responses has a standard error of 1.36 sd /
# sqrt(n) (normal), so at 16 the IQR is known to about +-35 % and one stray is 6 % of them
# (the IQR survives strays below a quarter). On R8 with the label index as response, a stray
# 1e6 as the first of 1, 3 or 6 responses took the next batches' R^2 to -1e12 / -4e4 / -960 and
# recovered after 3-5 batches; held and clipped, the stream predicts as the clean one
# (docs/supervised.md §7).
MIN_RESPONSES = 16
FENCE = 3.0
IQR_PER_SD = 1.349           # interquartile range of a normal distribution per sd


@dataclass
class ScaleStats:
    """Running statistics of the labelled documents: token counts and (regression) responses.

    ``sample`` holds the responses at indices 0, stride, 2 stride, ... of the stream (every
    response until SAMPLE_CAP were seen, then every second one of those, and so on): a
    deterministic, evenly spread sample, so every replica applying the same records holds the
    same one."""

    n_docs: int = 0
    sum_len: float = 0.0
    n_resp: int = 0
    sum_y: float = 0.0
    sum_y2: float = 0.0
    stride: int = 1
    sample: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.float64))
    # The response's location, the median of the stream's first MIN_RESPONSES responses (fixed once they
    # were seen; until then the sample holds every response, stride 1): the regression head
    # learns y - offset and predicts eta^T zbar + offset (``response_offset``). 0 until then, and in a
    # state restored from before it (its weights were learned about 0).
    offset: float = 0.0

    def observe(self, doc_lengths, responses=None) -> None:
        """Add labelled documents: their token counts, and their responses (regression)."""
        lengths = np.asarray(doc_lengths, dtype=np.float64).ravel()
        if lengths.size and (not np.all(np.isfinite(lengths)) or (lengths < 0).any()):
            raise ValueError("document lengths must be finite and >= 0")
        self.n_docs += int(lengths.size)
        self.sum_len += float(lengths.sum())
        if responses is not None:
            y = np.asarray(responses, dtype=np.float64).ravel()
            if self.n_resp < MIN_RESPONSES <= self.n_resp + y.size:  # the first MIN_RESPONSES, however batched
                self.offset = float(np.median(np.r_[self.sample[:self.n_resp], y[:MIN_RESPONSES - self.n_resp]]))
            at = np.arange(self.n_resp, self.n_resp + y.size)
            self.sample = np.concatenate([self.sample, y[at % self.stride == 0]])
            while self.sample.size > SAMPLE_CAP:  # keep indices 0, 2 stride, 4 stride, ...
                self.sample = self.sample[::2].copy()
                self.stride *= 2
            self.n_resp += int(y.size)
            self.sum_y += float(y.sum())
            self.sum_y2 += float(np.dot(y, y))

    @property
    def mean_doc_len(self) -> float:
        if self.n_docs == 0 or self.sum_len <= 0:
            return PROVISIONAL_DOC_LEN
        return max(self.sum_len / self.n_docs, 1.0)

    def response_moments(self) -> tuple[float, float]:
        """(sd, rms) of the responses seen as the head learns them (less ``offset``), robust to
        stray values: 1.4826 MAD about the median and sqrt((median - offset)^2 + sd^2); where ties
        make the MAD zero (a rating with one value for most documents), the sd of the middle 98 %.
        (1, 1) before any response, or for a constant one. A state restored from before the sample
        (no sample yet) uses the moments until responses arrive."""
        if self.n_resp == 0:
            return 1.0, 1.0
        if self.sample.size >= 2:
            center, sd = robust_scale(self.sample)
            rms = math.hypot(center - self.offset, sd)
        else:
            mean = self.sum_y / self.n_resp
            ms = self.sum_y2 / self.n_resp
            sd = math.sqrt(max(ms - mean * mean, 0.0))
            rms = math.hypot(mean - self.offset, sd)
        if not sd > 1e-9 * rms:  # constant (relative: a response in units of 1e-15 is not constant)
            sd = rms if rms > 0.0 else 1.0
        return sd, max(rms, sd)

    def response_range(self) -> tuple[float, float] | None:
        """(low, high) the regression head clips the responses it learns to (the fences above,
        over the sample of the responses seen); None before ``MIN_RESPONSES``: learn none yet.
        (-inf, inf) when no response was measured (explicit constants: the head does not
        calibrate) or the state predates the sample. Where ties make the IQR zero, the IQR of
        the responses off the tied value gives the width (or the fallback sd of
        ``response_moments`` when fewer than 4 are)."""
        if self.n_resp == 0 or (self.sample.size == 0 and self.n_resp >= MIN_RESPONSES):
            return -math.inf, math.inf
        if self.n_resp < MIN_RESPONSES or self.sample.size < 2:
            return None
        q1, q3 = np.percentile(self.sample, [25.0, 75.0])
        width = float(q3 - q1)
        if not width > 0:  # ties: the spread of the responses off the tied value (a rating's rarer ones)
            off = self.sample[self.sample != q1]
            a, b = np.percentile(off, [25.0, 75.0]) if off.size >= 4 else (0.0, 0.0)
            width = max(float(b - a), IQR_PER_SD * self.response_moments()[0])
        return float(q1) - FENCE * width, float(q3) + FENCE * width

    def learned_responses(self, tg):
        """Regression targets ``tg`` as the head learns them (``SupervisedHead.learned_targets``):
        clipped to ``response_range`` and less ``offset``, none before that range is known. The
        offset: the prior N(0, nu^2) holds each weight near 0 and zbar sums to one, so without it a
        response far from 0 (a year, a price) put every weight near the mean and the topics'
        differences in its last digits (docs/supervised.md §7)."""
        if tg.learned:
            return tg
        rng = self.response_range()
        if rng is None:
            return Targets(tg.y, np.zeros_like(tg.mask), learned=True)
        y = tg.y if np.isinf(rng[0]) and np.isinf(rng[1]) else np.clip(tg.y, rng[0], rng[1])
        return Targets(y - self.offset, tg.mask, learned=True)

    def state(self) -> list:
        return [self.n_docs, self.sum_len, self.n_resp, self.sum_y, self.sum_y2, self.stride,
                self.sample.astype("<f8").tobytes(), self.offset]

    @classmethod
    def restore(cls, s) -> "ScaleStats":
        n_docs, sum_len, n_resp, sum_y, sum_y2 = s[:5]
        st = cls(int(n_docs), float(sum_len), int(n_resp), float(sum_y), float(sum_y2))
        if len(s) >= 7:  # (snapshots from before the robust scale have the moments only)
            st.stride = int(s[5])
            st.sample = np.frombuffer(s[6], dtype="<f8").astype(np.float64)
        if len(s) >= 8:  # (before the offset, responses were learned about 0: it stays 0)
            st.offset = float(s[7])
        return st


def robust_scale(y: np.ndarray) -> tuple[float, float]:
    """(median, robust sd) of ``y``: 1.4826 x the median absolute deviation, or where that is
    zero (more than half the values tie), the sd of the values left after cutting TRIM of them
    from each end."""
    y = np.asarray(y, dtype=np.float64)
    center = float(np.median(y))
    sd = MAD_TO_SD * float(np.median(np.abs(y - center)))
    if not sd > 0:
        cut = int(TRIM * y.size)
        mid = np.sort(y)[cut:y.size - cut]
        sd = float(mid.std()) if mid.size >= 2 else 0.0
    return center, sd


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
