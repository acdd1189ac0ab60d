"""Batch mode (``TopicModel.fit``), apart from the model's streaming step.

The functions take the model and use its public seams only (``reset``, ``prepare``, ``process``,
``local_step``, ``head``, ``new_head``, ``updater``).
"""
from __future__ import annotations

import time

import numpy as np

from .batch_ops import doc_lengths, normalise_rows
from .supervised.targets import is_missing
from .updates import MemoizedUpdate

FIT_MAX_LAPS = 10      # fit(): most memoized laps of the variational engine
FIT_TOL = 0.05         # fit(): stop when a lap raises its objective by less than this, relative
FIT_BATCH_SIZE = 256   # fit(): minibatch of the memoized laps
FIT_SWEEPS = 200       # fit(): sweeps of the alias engine (with labels: the most, see fit_stop_rule)
FIT_WINDOW = 5         # fit(): alias engine with labels, sweeps the stopping rule and the eta average span


def fit(model, docs, labels=None, *, n_iter: int | None = None, tol: float = FIT_TOL,
        batch_size: int = FIT_BATCH_SIZE, n_sweeps: int | None = None):
    """Batch mode, sklearn-style, for every engine: learn from ``docs`` held in memory.  Returns the model.

    Starts from scratch (fresh vocabulary, state and classifier; random generator reset to
    ``seed``).  ``labels`` (supervised models, same forms as ``partial_fit``) learn
    supervised topics and the classifier.  The keywords mean the same thing for both engines:

    * variational engine (``LSparse``) - laps over the corpus cut, in the given order, into
      minibatches of ``batch_size``; each lap is one ``partial_fit(batch, labels)`` per minibatch.
      With a memoized update that is Hughes & Sudderth's batch setting: stable keys 0, 1, ...,
      so a lap replaces every batch's summary (and its classifier statistics), and ``fit``
      equals the same laps of ``partial_fit(..., batch_key=i)`` exactly; the cache stays,
      so later keyed ``partial_fit`` calls continue the laps (a corpus of more than
      ``memo_window`` batches needs ``memo_window=None``).  With the stochastic update (the
      default) the laps are the model's own stochastic updates, step size and effective
      corpus size as configured, and the classifier keeps one record per batch (key i), so a
      lap replaces a batch's classifier statistics instead of counting its documents again
      (without that, laps degraded 20NG hinge from 0.81 to 0.76 and the synthetic
      regression from 0.84 to 0.78 of the oracle's R^2).  (On 20NG with labels, K = 100,
      memoized laps from scratch settle in a worse optimum: test accuracy 0.74, against 0.82
      after two stochastic laps.)  ``n_iter`` is the most laps (default ``FIT_MAX_LAPS``).
      Stopping rule: after lap t >= 2, stop when the lap objective rose by less than ``tol``
      relative, (F_t - F_{t-1}) / |F_{t-1}| < tol, where F is the whole-data ELBO (memoized) or
      the lap's mean local objective per token (stochastic; each batch measured at its local
      step, before its update).
    * sampling engine (``AliasMH``) - collapsed Alias-MH sweeps from a uniform random start (the
      papers' Gibbs setting); the shared state is then the last sample, lambda = beta + n_kw.
      ``batch_size`` does not apply; ``n_sweeps`` is accepted as the old name of ``n_iter``.
      Without labels: ``n_iter`` sweeps (default ``FIT_SWEEPS``).  With labels: the supervised
      batch mode of LightMedLDA - each sweep draws the augmentation, then the topics by
      word/doc/exp proposal MH against the regularised conditional, then one coordinate-wise
      Gibbs sweep of eta - for at most ``n_iter`` sweeps (default ``FIT_SWEEPS``), stopped by
      ``fit_stop_rule``: after sweep t > w (w = ``FIT_WINDOW``), stop when the last w sweeps
      raised the chain's word log-likelihood per token by at most ``tol`` of its rise since the
      first sweep, L_t - L_{t-w} <= tol (L_t - L_1) (docs/supervised.md §5.4; on 20NG, K = 100,
      about 20-25 sweeps, where test accuracy has levelled off - it slowly falls with longer
      chains); eta and the augmentation are averaged over those last w sweeps.  ``tol=0``: a
      fixed chain of ``n_iter`` sweeps, the eta samples of its second half averaged.  With
      ``features="unsupervised"`` (default) the classifier is then refitted on the training
      documents' topic proportions from the label-free local step - the features ``predict``
      computes for new documents - starting from the chain's eta.

    Timings, laps / MH statistics and the objective trace are left in ``model.last_stats``.
    """
    if n_sweeps is not None:
        if n_iter is not None and n_iter != n_sweeps:
            raise ValueError(f"n_iter={n_iter!r} and n_sweeps={n_sweeps!r} disagree (n_sweeps is n_iter's old name)")
        n_iter = n_sweeps
    if n_iter is not None and (isinstance(n_iter, bool) or not isinstance(n_iter, (int, np.integer)) or n_iter < 1):
        raise ValueError(f"n_iter must be an integer >= 1 (got {n_iter!r})")
    if labels is not None:
        if model.head is None:
            raise ValueError("labels given to a model without supervision: TopicModel(supervision='hinge' | "
                             "'logistic' | 'regression') (supervised topics)")
        docs, labels = model.check_docs_labels(docs, labels)
        if all(is_missing(t) for t in labels):
            labels = None
    if not (isinstance(tol, (int, float, np.integer, np.floating)) and tol >= 0):
        raise ValueError(f"tol must be a number >= 0 (got {tol!r})")
    if model.engine != "alias" and (isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer))
                                    or batch_size < 1):
        raise ValueError(f"batch_size must be an integer >= 1 (got {batch_size!r})")
    model.reset()
    tokens = model.tokenize(docs)
    if not any(tokens):  # nothing to learn from, on either engine: the model stays as reset
        return model
    if model.engine != "alias":
        return fit_laps(model, tokens, labels, FIT_MAX_LAPS if n_iter is None else int(n_iter), tol, batch_size)
    return fit_sweeps(model, tokens, labels, FIT_SWEEPS if n_iter is None else int(n_iter), tol)


def fit_stop_rule(tol: float, window: int = FIT_WINDOW):
    """The supervised alias fit's stopping rule on the trace L_1, L_2, ... of the chain's word
    log-likelihood per token after each sweep: stop after sweep t > ``window`` when the last
    ``window`` sweeps raised it by less than ``tol`` of its whole rise since the first sweep,
    L_t - L_{t-w} <= tol (L_t - L_1)  (docs/supervised.md §5.4: the chain has burned in for
    classification; the rule is scale-free: no corpus size, vocabulary or length enters)."""
    w = int(window)

    def stop(trace) -> bool:
        t = len(trace)
        if t <= w:
            return False
        return trace[-1] - trace[-1 - w] <= tol * max(trace[-1] - trace[0], 0.0)

    return stop


def fit_sweeps(model, tokens, labels, n_sweeps: int, tol: float = FIT_TOL):
    """``fit`` of the sampling engine on the reset ``model``'s ``tokens``: collapsed sweeps over the
    whole corpus (see ``fit``)."""
    batch = model.prepare(tokens, grow=True)
    seed = int(model.rng.integers(1 << 62))
    if labels is None:
        model.last_stats = model.local_step.fit_state(model.state, batch, int(n_sweeps), seed=seed)
        return model
    t0 = time.perf_counter()
    targets = model.head.encode_targets(labels, grow=True)
    model.head.calibrate(doc_lengths(batch), targets)
    rule = {"stop": fit_stop_rule(tol), "window": FIT_WINDOW} if tol > 0 else {}
    stats = model.local_step.fit_state(model.state, batch, int(n_sweeps), seed=seed, head=model.head,
                                       targets=targets, eta_sweeps=1, **rule)
    stats["converged"] = bool(rule) and stats["sweeps"] < int(n_sweeps)
    sup = model.options.supervision
    if model.features != "supervised":
        # Refit eta on test-time features: theta of each training document from the
        # label-free step the classifier reads (``features``; mean-field by default) with the
        # learned topics, warm-started at the chain's eta.
        t1 = time.perf_counter()
        chain = model.head
        head = model.new_head()
        head.calibrate(doc_lengths(batch), head.encode_targets(labels, grow=True))
        head.eta[:] = chain.eta
        head.n_calls = chain.n_calls
        zbar = normalise_rows(model.feature_counts(batch))
        head.update(zbar, labels, n_sweeps=int(sup.sweeps))  # warm start: the head's own sweeps per call (§5.4)
        model.head = head
        stats["refit_seconds"] = time.perf_counter() - t1
    stats["fit_seconds"] = time.perf_counter() - t0
    model.last_stats = stats
    return model


def fit_laps(model, tokens, labels, max_laps: int, tol: float, batch_size: int):
    """``fit`` of the variational engine on the reset ``model``'s ``tokens``: laps of ``process``
    over fixed minibatches (see ``fit``; tol and batch_size were checked there)."""
    memoized = isinstance(model.updater, MemoizedUpdate)
    keep_batches = model.options.vocabulary.cap is None
    spans = [(lo, min(lo + batch_size, len(tokens))) for lo in range(0, len(tokens), batch_size)]
    batches: list = [None] * len(spans)
    trace: list[float] = []
    converged = False
    t0 = time.perf_counter()
    for lap in range(max_laps):
        objective = n_tokens = 0.0
        for i, (lo, hi) in enumerate(spans):
            # Batches are reused across laps unless a vocabulary cap may evict words (then rebuilt).
            batch = batches[i] if batches[i] is not None else model.prepare(tokens[lo:hi], grow=True)
            if keep_batches:
                batches[i] = batch
            result = model.process(batch, learn=True, batch_key=i if memoized else None,
                                   labels=None if labels is None else labels[lo:hi], head_key=i)
            objective += result.objective
            n_tokens += batch.n_tokens
        # memoized: the whole-data ELBO; stochastic: the lap's local objective per token
        trace.append(model.updater.elbo(model.state) if memoized else objective / max(n_tokens, 1.0))
        if lap >= 1 and (trace[-1] - trace[-2]) < tol * abs(trace[-2]):
            converged = True
            break
    model.last_stats = {"laps": len(trace), "objective": trace, "converged": converged, "batches": len(spans),
                        "fit_seconds": time.perf_counter() - t0,
                        "objective_kind": "elbo" if memoized else "local objective per token"}
    return model
