"""The classifier's features: which label-free local step computes the topic proportions that a
supervised model's classifier learns from and predicts with (docs/supervised.md §10).

``sup_features`` (``options.Supervision.features``, validated against ``options.SUP_FEATURES``):

* ``"unsupervised"``: the engine's own label-free local step (the one ``transform`` runs);
* ``"mean-field"``: the variational label-free local step, at the flat alpha of a supervised
  model (``model.SUPERVISED_ALPHA``), on the model's topics whatever the engine learned them with;
* ``"supervised"``: the labelled documents' supervised local step (training only; predictions
  use the label-free step);
* ``"auto"`` (the default): ``"mean-field"`` for the sampling engine, ``"unsupervised"`` for
  the variational one, whose label-free step is already the mean-field step at that alpha.

Why the sampler's models read mean-field features: a sampled zbar_d is a few draws per token,
noisy where mean-field expectations are exact averages, and on the same Alias-MH topics the
classifier reaches 0.82 on 20NG through mean-field features against 0.785 through sampled ones
(docs/supervised.md §10).
"""
from __future__ import annotations

import numpy as np

from .batch_ops import chunks, slice_batch
from .components import build_engine
from .options import LSparse


def resolve_features(options) -> str:
    """The features a model's classifier uses: ``sup_features`` with "auto" resolved by engine
    ("unsupervised" without supervision)."""
    sup = options.supervision
    if sup is None:
        return "unsupervised"
    if sup.features != "auto":
        return sup.features
    return "unsupervised" if options.engine.kind == "lsparse" else "mean-field"


def training_counts(features: str, learning, label_free: np.ndarray) -> np.ndarray:
    """The expected topic counts a labelled batch trains the classifier on: the supervised local
    step's (``learning``, its result) under "supervised", else the ``label_free`` features."""
    return learning.doc_topic if features == "supervised" else label_free


class MeanFieldFeatures:
    """The variational label-free local step at a fixed alpha, for the classifier's features.

    ``options``: the model's engine options (its ``LSparse`` settings are used; a sampling
    model's features get LSparse's defaults); ``runner``: makes the thread runner (the model's
    thread count)."""

    def __init__(self, options: LSparse | None, alpha: float, runner):
        self.alpha = float(alpha)
        self.engine = build_engine(options if isinstance(options, LSparse) else LSparse(), runner=runner,
                                   seed_source=None)

    @property
    def runner(self):
        return self.engine.runner

    @runner.setter
    def runner(self, value) -> None:
        self.engine.runner = value

    def counts(self, state, batch) -> np.ndarray:
        """(D, K) expected topic counts of ``batch``'s documents, in chunks."""
        out = np.empty((batch.n_docs, state.n_topics))
        for lo, hi in chunks(batch.n_docs):
            out[lo:hi] = self.engine.infer(state, slice_batch(batch, lo, hi), summarize=False,
                                           alpha=self.alpha).doc_topic
        return out


def feature_step(features: str, options, alpha: float, runner) -> MeanFieldFeatures | None:
    """The step a model with resolved ``features`` computes the classifier's features with, when it
    is not the engine's own label-free step (None: that step's counts are the features)."""
    return MeanFieldFeatures(options, alpha, runner) if features == "mean-field" else None
