"""The topics' initialisation: each topic starts from one document (k-means++ over the documents'
term frequencies, cosine distance, as Hughes & Sudderth seed theirs) on top of a noisy prior.

A first batch with fewer distinct documents than topics cannot seed them all. Seeding the rest
from copies of the same few documents (as this did before) leaves K topics that differ only by
the prior's noise, and one pass of the stochastic update does not undo it: 20NG df>=5, K = 100,
then batches of 256, held-out after one pass (seeds 0 and 1) with a first batch of 1 / 4 / 16 /
64 / 256 documents: -8.204 / -8.193 / -8.174 / -8.149 / -8.160; R8 -6.225 / -6.232 / -6.239 /
-6.193 / -6.164 (docs/defaults.md §6). A daemon's first batch is whatever the first poll
returned, often a handful of documents of a live stream.

So with the stochastic update a batch seeds at most one topic per distinct document
(``seed_topics``), the others stay at the prior, and every later batch seeds more before its
local step (``continue_seeding``: k-means++ continued, distances to the topics already seeded)
until all K hold a seed. Topics are seeded in index order: 0..n_seeded-1 hold a seed. The
memoized update keeps exact sums that a column reset would break, so it seeds all K at once from
the first batch (copies allowed), as before.
"""
from __future__ import annotations

import numpy as np

from .batch import Batch

__all__ = ["continue_seeding", "seed", "seed_topics"]

POOL = 1024  # documents k-means++ draws from (a random subset of a larger batch)
COPY = 1e-5  # a cosine distance below this is float32 rounding: the document is a copy of a seed


def _pool(batch: Batch, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(the batch's non-empty documents k-means++ draws from, their unit-length term frequencies
    over the batch's words as a (pool, U) float32 array)."""
    lengths = np.diff(batch.doc_ptr)
    pool = np.flatnonzero(lengths > 0)
    if pool.size > POOL:
        pool = np.sort(rng.choice(pool, POOL, replace=False))
    entries = np.concatenate([np.arange(batch.doc_ptr[d], batch.doc_ptr[d + 1]) for d in pool]) if pool.size \
        else np.empty(0, np.int64)
    X = np.zeros((pool.size, batch.uniq.size), dtype=np.float32)  # the pooled documents only
    X[np.repeat(np.arange(pool.size), lengths[pool]), batch.local[entries]] = batch.counts[entries]
    X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
    return pool, X


def _kmeanspp(X: np.ndarray, dist: np.ndarray, n: int, rng: np.random.Generator) -> list[int]:
    """Up to ``n`` documents (rows of X) drawn with probability proportional to dist^2, each
    draw lowering dist to the new seed's; stops when every document left is at distance 0 from a
    seed (a copy of one)."""
    chosen: list[int] = []
    dist = np.where(dist < COPY, 0.0, dist)
    for _ in range(n):
        p = dist ** 2
        total = p.sum()
        if not total > 1e-12:
            break
        c = int(rng.choice(X.shape[0], p=p / total))
        chosen.append(c)
        dist = np.minimum(dist, np.maximum(1.0 - X @ X[c], 0.0))
        dist[dist < COPY] = 0.0  # the seed itself and its copies (float32 leaves them ~1e-7 away)
    return chosen


def seed(state, batch: Batch, rng: np.random.Generator, init: str, smoothing: float, distinct: bool) -> None:
    """Seed topics from ``batch`` before its local step: the first batch (``seed_topics``), then,
    while topics wait for a seed, the later ones (``continue_seeding``)."""
    if state.initialized:
        continue_seeding(state, batch, rng, init)
    else:
        seed_topics(state, batch, rng, init, smoothing, distinct)


def seed_topics(state, batch: Batch, rng: np.random.Generator, init: str, smoothing: float,
                distinct: bool = False) -> None:
    """Seed the topics from the first batch: topic k from one of its documents (k-means++ over tf
    vectors, cosine distance, or random ones). Every (word, topic) starts near ``smoothing``.
    ``distinct``: at most one topic per distinct document; topics past those stay at the prior
    (``state.n_seeded`` says how many hold a seed) for ``continue_seeding``."""
    K = state.n_topics
    pool, X = _pool(batch, rng)
    first = int(rng.integers(pool.size))
    if init == "kmeans++":
        chosen = [first] + _kmeanspp(X, np.maximum(1.0 - X @ X[first], 0.0), K - 1, rng)
    elif distinct:  # random documents, each at most once
        chosen = [first] + [int(c) for c in rng.permutation(np.delete(np.arange(pool.size), first))[:K - 1]]
    else:
        chosen = [first] + [int(c) for c in rng.integers(pool.size, size=K - 1)]
    if not distinct and len(chosen) < K:  # copies of the seeds (every document left is one)
        chosen += [int(c) for c in rng.integers(pool.size, size=K - len(chosen))]
    state.smoothing = float(smoothing)
    state.mu[: state.n_words] = state.smoothing
    _plant(state, batch, np.arange(K), pool[chosen], rng)  # every column's noise, the first ones' seeds
    state.n_seeded = len(chosen)
    state.initialized = True


def continue_seeding(state, batch: Batch, rng: np.random.Generator, init: str) -> list[int]:
    """Seed topics ``state.n_seeded``.. from ``batch`` before its local step, at most one per
    distinct document, as the first batch seeded the first ones: k-means++ continued (a document's
    distance is to the nearest seeded topic's data counts over the batch's words), the column reset
    to the prior with its noise, the seed's counts added in lambda units. Returns the topics seeded."""
    K, m0 = state.n_topics, state.n_seeded
    if not state.initialized or m0 >= K or batch.n_tokens <= 0:
        return []
    pool, X = _pool(batch, rng)
    if init == "kmeans++":
        data = np.maximum(state.scale * (state.mu[batch.uniq, :m0] - state.smoothing), 0.0)
        data /= np.maximum(np.linalg.norm(data, axis=0, keepdims=True), 1e-300)
        cos = (X @ data.astype(np.float32)).max(axis=1) if m0 else np.zeros(pool.size, dtype=np.float32)
        chosen = _kmeanspp(X, np.maximum(1.0 - cos, 0.0), K - m0, rng)
    else:
        chosen = [int(c) for c in rng.permutation(pool.size)[:K - m0]]
    if not chosen:
        return []
    new = list(range(m0, m0 + len(chosen)))
    state.reset_topics(new)
    _plant(state, batch, np.asarray(new), pool[chosen], rng)
    state.n_seeded = m0 + len(chosen)
    return new


def _plant(state, batch: Batch, cols: np.ndarray, docs: np.ndarray, rng: np.random.Generator) -> None:
    """Columns ``cols`` over the batch's words: the prior with its noise (Gamma(100, 1/100) around the
    smoothing, as in Hoffman et al.; it also breaks ties between topics seeded alike), then document
    ``docs[i]``'s counts added to column ``cols[i]`` in lambda units; the totals recomputed."""
    rows, scale = batch.uniq[:, None], state.scale
    shape = (batch.uniq.size, cols.size)
    if state.smoothing > 0:
        state.mu[rows, cols] = rng.gamma(100.0, state.smoothing / 100.0, size=shape)
    else:
        state.mu[rows, cols] += rng.gamma(1.0, state.beta, size=shape) / scale
    for k, p in zip(cols, docs):
        s, e = batch.doc_ptr[p], batch.doc_ptr[p + 1]
        state.mu[batch.word_ids[s:e], k] += batch.counts[s:e] / scale
    state.refresh_totals()
