"""What one minibatch step returns: a typed value the daemon encodes without asking the model again."""
from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from .summary import LocalResult


@dataclass
class BatchResult(LocalResult):
    """``TopicModel.process``'s result: the local step's ``LocalResult`` fields (``doc_topic``:
    the prequential counts, computed before the update and without the labels; ``alpha``: the
    alpha they were computed with; ``summary``, ``objective``, ``iterations`` ...) and

    theta          (D, K) E[pi_d] of those counts, rows sum to one
    scores         (D, n_labels) classifier scores before this batch (None: no trained classifier)
    predicted      one prediction per document (None: no trained classifier)
    label_names    the labels of the score columns (empty for regression / unsupervised)
    version_before model version that made the predictions; ``version`` the one after the step
    stats          the step's statistics (also left in ``model.last_stats``)
    doc_topic_supervised  (D, K) the supervised local step's counts of a labelled batch, else None
    """

    theta: np.ndarray | None = None
    scores: np.ndarray | None = None
    predicted: list | None = None
    label_names: list = field(default_factory=list)
    version_before: int = 0
    version: int = 0
    doc_topic_supervised: np.ndarray | None = None

    @classmethod
    def of(cls, local: LocalResult, **extra) -> "BatchResult":
        """Extend the local step's result (its arrays are shared, not copied)."""
        base = {f.name: getattr(local, f.name) for f in fields(LocalResult)}
        return cls(**base, **extra)
