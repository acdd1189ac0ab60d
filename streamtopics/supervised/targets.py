"""A batch's targets as the classifier learns them: the task they imply, and their encoding as
(y, mask) rows over the label vocabulary (docs/supervised.md §2, multi-task)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# |regression target| at most this: its square, and sums of squares over a stream, stay finite in
# float64 (one response of 1e200 made the classifier's prior variance inf and failed its batch).
# The daemon's codec dead-letters a larger one (bad_response).
MAX_RESPONSE = 1e100


@dataclass(frozen=True)
class Targets:
    """Encoded targets of a batch: ``y`` (D, L) in {-1, +1} (or the response), ``mask`` (D, L).
    ``learned``: already as the head learns them (``SupervisedHead.learned_targets``: a regression
    response clipped and less the head's offset), so that is not done twice."""

    y: np.ndarray
    mask: np.ndarray
    learned: bool = False

    @property
    def labelled(self) -> np.ndarray:
        return self.mask.any(axis=1)


def is_missing(t) -> bool:
    """None, a float NaN (numpy's too) or pandas' ``NA`` (checked by type name: no pandas import)."""
    return (t is None or (isinstance(t, (float, np.floating)) and math.isnan(t))
            or type(t).__name__ == "NAType")


def type_hint(t) -> str:
    """What to do with a target of the wrong type: integer class codes (scikit-learn's
    ``fetch_20newsgroups().target``) need their names, or a regression model."""
    if isinstance(t, (int, np.integer)) and not isinstance(t, bool):
        return ("; class labels are strings: pass the class names (e.g. [names[i] for i in y]) or "
                "[str(i) for i in y], or supervision='regression' for a numeric target")
    return ""


def infer_task(targets) -> str | None:
    """"multiclass" (str targets) or "multilabel" (lists of str) from the first labelled target;
    None while every target is missing."""
    for t in targets:
        if is_missing(t):
            continue
        if isinstance(t, str):
            return "multiclass"
        if isinstance(t, (list, tuple, set, frozenset)):
            return "multilabel"
        raise TypeError(f"classification targets must be str (multi-class) or lists of str "
                        f"(multi-label); got {type(t).__name__} {t!r}{type_hint(t)}")
    return None


def conform_targets(targets: list, task: str | None) -> tuple[list, dict[int, str]]:
    """Classification targets made to fit the classifier's ``task`` ("multiclass": one label per
    document; "multilabel": label lists; None: not fixed yet, the first labelled document fixes
    it), so one document of the other form cannot fail a batch, nor, first in a stream, turn
    every later one into a failure: a label is a one-label list for a multi-label model, a
    one-label list is its label for a multi-class one. Returns (the targets, {position: why} of
    those that cannot fit: several labels for a multi-class model; None in their place)."""
    task = task or infer_task(targets)
    out, bad = list(targets), {}
    for i, t in enumerate(targets):
        if task == "multilabel" and isinstance(t, str):
            out[i] = [t]
        elif task == "multiclass" and isinstance(t, (list, tuple)):
            if len(t) == 1:
                out[i] = t[0]
            else:
                out[i] = None
                bad[i] = (f"'labels' has {len(t)} labels, but this model is multi-class (it learned from one "
                          "'label' per document): send 'label'")
    return out, bad


def encode_responses(targets: list) -> Targets:
    """Regression: floats, None or NaN for unlabelled; one row."""
    try:
        yv = np.array([np.nan if is_missing(t) else float(t) for t in targets], dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise type(e)(f"regression targets must be numbers, None or NaN ({e})") from None
    yv = yv.reshape(len(targets), 1)
    mask = np.isfinite(yv)
    if np.isinf(yv).any():
        raise ValueError("regression targets must be finite (None or NaN for unlabelled)")
    if (np.abs(yv[mask]) > MAX_RESPONSE).any():
        raise ValueError(f"regression targets must be within +-{MAX_RESPONSE:g} (their squares must stay finite in "
                         f"the classifier's statistics; got {np.abs(yv[mask]).max():g})")
    return Targets(np.where(mask, yv, 0.0), mask)


def label_lists(task: str, targets: list) -> list:
    """Each document's labels as a list (None: unlabelled), type-checked for ``task``."""
    per_doc: list[list[str] | None] = []
    for t in targets:
        if is_missing(t):
            per_doc.append(None)
        elif task == "multiclass":
            if not isinstance(t, str):
                raise TypeError(f"multi-class targets must be str or None (got {type(t).__name__} {t!r}){type_hint(t)}")
            per_doc.append([t])
        else:
            if isinstance(t, str) or not isinstance(t, (list, tuple, set, frozenset)):
                raise TypeError(f"multi-label targets must be lists of str or None (got {t!r})")
            per_doc.append(list(t))
    return per_doc


def one_vs_rest(per_doc: list, idx, n_labels: int) -> Targets:
    """+1 for a document's labels (``idx``: their vocabulary indices, flat, -1 unknown), -1 for the
    others; unlabelled documents masked out."""
    D = len(per_doc)
    y = -np.ones((D, n_labels))
    mask = np.zeros((D, n_labels), dtype=bool)
    pos = 0
    for d, labs in enumerate(per_doc):
        if labs is None:
            continue
        mask[d, :] = True
        for i in idx[pos:pos + len(labs)]:
            if i >= 0:
                y[d, i] = 1.0
        pos += len(labs)
    return Targets(y, mask)
