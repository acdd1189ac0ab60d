"""Held-out document completion (Hughes & Sudderth App. E; Wang et al. 2011).

Each test document's distinct word types are split at random 80/20 into parts A and B.
With the topics fixed at their point estimate phi_hat (rows of ``topic_word``), the
document-topic proportions pi_hat_d = E[pi_d] are fitted on A with the dense local
step, and the score is the mean log-likelihood per token of B:

    score = sum_d sum_{n in B_d} log sum_k pi_hat_dk phi_hat_{k x_dn} / sum_d |B_d|

The function takes a plain topic-word matrix, so every model (ours, gensim's,
scikit-learn's, the Gibbs reference) is scored by exactly the same code.
"""
from __future__ import annotations

import math

import numpy as np

from .batch import Batch, batch_from_arrays
from .engines.lsparse import lsparse_batch
from .jit_cache import njit


def split_completion(batch: Batch, frac: float = 0.8, seed: int = 0) -> tuple[Batch, Batch]:
    """Split each document's word types into (A, B); documents with < 2 types are left out."""
    rng = np.random.default_rng(seed)
    lengths = np.diff(batch.doc_ptr)
    in_a = rng.random(batch.word_ids.size) < frac
    a_ptr, b_ptr = [0], [0]
    a_sel, b_sel = [], []
    for d in range(batch.n_docs):
        s, e = batch.doc_ptr[d], batch.doc_ptr[d + 1]
        if lengths[d] < 2:
            continue
        mask = in_a[s:e].copy()
        if mask.all():
            mask[rng.integers(e - s)] = False
        if not mask.any():
            mask[rng.integers(e - s)] = True
        idx = np.arange(s, e)
        a_sel.append(idx[mask])
        b_sel.append(idx[~mask])
        a_ptr.append(a_ptr[-1] + int(mask.sum()))
        b_ptr.append(b_ptr[-1] + int((~mask).sum()))
    a = np.concatenate(a_sel) if a_sel else np.empty(0, np.int64)
    b = np.concatenate(b_sel) if b_sel else np.empty(0, np.int64)
    return (batch_from_arrays(np.array(a_ptr), batch.word_ids[a], batch.counts[a]),
            batch_from_arrays(np.array(b_ptr), batch.word_ids[b], batch.counts[b]))


@njit(cache=True, nogil=True)
def _completion_loglik(theta, phi_t, doc_ptr, word_ids, counts):
    total = 0.0
    K = theta.shape[1]
    for d in range(doc_ptr.shape[0] - 1):
        for j in range(doc_ptr[d], doc_ptr[d + 1]):
            v = word_ids[j]
            p = 0.0
            for k in range(K):
                p += theta[d, k] * phi_t[v, k]
            total += counts[j] * math.log(p)
    return total


def fit_doc_topics(topic_word: np.ndarray, batch: Batch, alpha: float, max_iter: int = 100,
                   tol: float = 0.05) -> np.ndarray:
    """pi_hat = E[pi_d] for each document of ``batch`` with topics fixed at ``topic_word`` (dense step)."""
    K = topic_word.shape[0]
    log_phi = np.log(np.maximum(topic_word[:, batch.uniq].T, 1e-300))
    N, *_ = lsparse_batch(np.ascontiguousarray(log_phi), batch.doc_ptr, batch.local, batch.counts,
                          float(alpha), K, max_iter, tol, 0.0, 0, 0)
    return (N + alpha) / (N.sum(axis=1, keepdims=True) + K * alpha)


def completion_loglik(topic_word: np.ndarray, part_a: Batch, part_b: Batch, alpha: float) -> float:
    """Mean per-token log-likelihood of part B given part A (see module docstring)."""
    theta = fit_doc_topics(topic_word, part_a, alpha)
    phi_t = np.ascontiguousarray(topic_word.T)
    total = _completion_loglik(theta, phi_t, part_b.doc_ptr, part_b.word_ids, part_b.counts)
    return float(total / part_b.counts.sum())


def heldout_loglik_arrays(topic_word: np.ndarray, batch: Batch, alpha: float, seed: int = 0,
                          frac: float = 0.8) -> float:
    a, b = split_completion(batch, frac=frac, seed=seed)
    return completion_loglik(topic_word, a, b, alpha)
