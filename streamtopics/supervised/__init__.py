"""Supervised topics: the engine-independent mathematical building blocks.

* :mod:`.samplers`   - exact Pólya-Gamma (Devroye / alternate) and inverse-Gaussian draws in numba,
  plus an approximate O(1)-in-b gamma-sum PG sampler with a stated error bound.
* :mod:`.classifier` - :class:`SupervisedHead`, the streaming multi-task linear classifier on
  topic proportions (hinge / logistic / eps-insensitive regression, coordinate-wise Gibbs for eta,
  carried Gaussian statistics with decay and memoized batches), and the per-token supervised
  weights the topic engines add (:func:`token_log_weights`).
* :mod:`.labels`     - the growing label vocabulary; :mod:`.targets` a batch's targets encoded over it.
* :mod:`.newlabels`  - what a label first seen mid-stream missed: the documents before it, as negatives.

Derivations: docs/supervised.md.
"""
from .classifier import SupervisedHead, omega_moments, token_log_weight, token_log_weights, token_log_weights_mf
from .targets import Targets
from .labels import LabelCapacityError, LabelVocabulary, UnknownLabelError

__all__ = ["SupervisedHead", "Targets", "token_log_weights", "token_log_weight", "token_log_weights_mf", "omega_moments",
           "LabelVocabulary", "LabelCapacityError", "UnknownLabelError"]
