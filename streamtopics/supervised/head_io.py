"""The supervised head as snapshot parts (msgpack header + numpy arrays) and back; never pickle."""
from __future__ import annotations

import copy

import numpy as np

from .labels import LabelVocabulary
from .scaling import ScaleStats

SNAPSHOT_KIND = "streamtopics.supervised.head"
SNAPSHOT_FORMAT = 1


def head_state(head) -> tuple[dict, dict]:
    """(msgpack-able header, dict of numpy arrays) of a ``SupervisedHead``."""
    memo_meta, memo_arrays = head.memo.state()
    header = {"kind": SNAPSHOT_KIND, "format": SNAPSHOT_FORMAT, "params": head.get_params(),
              "task": head.task, "labels": head.labels.state(), "n_calls": head.n_calls,
              "n_updates": head.n_updates, "docs_seen": head.docs_seen, "memo": memo_meta,
              "acc_n": head.acc_n, "scale_stats": head.scale_stats.state()}
    arrays = {"eta": head.eta.copy(), "eta_mean": head.eta_mean.copy(), "eta_sq_mean": head.eta_sq_mean.copy(),
              "A": head.A.copy(), "r": head.r.copy(), "acc_sum": head.acc_sum.copy(),
              "acc_sq": head.acc_sq.copy(), "seed_coef": head.seed_coef.copy()}
    arrays.update(memo_arrays)
    arrays.update(head.pool.state())
    return header, arrays


def restore_head(cls, header: dict, arrays: dict):
    """The head of class ``cls`` (``SupervisedHead``) that ``head_state`` described."""
    if header.get("kind") != SNAPSHOT_KIND:
        raise ValueError(f"not a supervised-head state (kind={header.get('kind')!r})")
    if header.get("format") != SNAPSHOT_FORMAT:
        raise ValueError(f"unsupported supervised-head state format {header.get('format')!r}")
    p = dict(header["params"])
    p["task"] = header.get("task", p.get("task"))
    head = cls(**p)
    head.labels = LabelVocabulary.restore(header["labels"])
    eta = np.asarray(arrays["eta"])
    if eta.ndim != 2:
        raise ValueError(f"state array eta must be 2-d (got shape {eta.shape})")
    L, K = eta.shape
    if K != head.n_topics or (head.task != "regression" and L != len(head.labels)):
        raise ValueError(f"state arrays hold {L} x {K}, header says {len(head.labels)} labels x {head.n_topics}")
    for name in ("eta", "eta_mean", "eta_sq_mean", "r", "acc_sum", "acc_sq"):
        setattr(head, name, np.array(arrays[name], dtype=np.float64).reshape(L, K))
    head.A = np.array(arrays["A"], dtype=np.float64).reshape(L, K, K)
    # before new labels were seeded from the pool (2026-11-25): zeros, what they started from then
    head.seed_coef = np.array(arrays.get("seed_coef", np.zeros((L, 2))), dtype=np.float64).reshape(L, 2)
    head.pool.restore(arrays)
    head.acc_n = int(header.get("acc_n", 0))
    head.n_calls = int(header["n_calls"])
    head.n_updates = int(header["n_updates"])
    head.docs_seen = int(header["docs_seen"])
    if "scale_stats" in header:
        head.scale_stats = ScaleStats.restore(header["scale_stats"])
        head.refresh_auto()
    head.memo.restore(header["memo"], arrays)
    return head


def fork_head(head):
    """A copy of ``head`` that a local step may change (it calibrates the self-scaling constants
    and learns new labels) while ``head`` stays as it is: what those steps write in place (the
    label vocabulary, the scale statistics, ``eta_sq_mean`` while untrained) is copied; the other
    arrays are shared, read-only here (new labels replace them with grown copies)."""
    f = copy.copy(head)
    f.labels = copy.deepcopy(head.labels)
    f.scale_stats = copy.deepcopy(head.scale_stats)
    f.eta_sq_mean = head.eta_sq_mean.copy()
    return f
