"""Supervised topics: the engine-independent mathematical building blocks.

* :mod:`.samplers` - exact Pólya-Gamma (Devroye / alternate) and inverse-Gaussian draws in numba,
  plus an approximate O(1)-in-b gamma-sum PG sampler with a stated error bound.
* :mod:`.labels`   - the growing label vocabulary.
"""
from .labels import LabelCapacityError, LabelVocabulary, UnknownLabelError

__all__ = ["LabelVocabulary", "LabelCapacityError", "UnknownLabelError"]
