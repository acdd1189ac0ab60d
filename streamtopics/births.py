"""Topic births in the stochastic update: a dead topic is replaced by one seeded from the batch.

One pass of the stochastic update at K = 100 leaves about a third of the topics holding almost
nothing (docs/topic-quality.md §5): k-means++ seeded them from outlying documents, the large
topics won the words those documents share with the rest, and what was left to them are rare
words (names, signatures) that nothing else claims. They cost the model a third of its
capacity, and their top words never occur together (NPMI near -1).

A **birth** replaces such a topic by a new one seeded from documents of the current minibatch
that the topics explain worst, as k-means++ seeded the first topics from the first batch
(Hughes & Sudderth's birth moves for memoized VB, here for the stochastic update):

* The seed: a document d drawn with probability proportional to ``n_d dist_d^2`` (k-means++
  over tokens: dist_d = 1 - the largest cosine between d's term frequencies and a topic's
  word weights on the batch's words), together with its |B|/K nearest documents of the batch
  (the documents a topic holds in an even split), each weighted by its cosine to d.
* Which topic dies: the one that will hold the least data mass after this update, and only if
  that is **less than the newborn would hold**. The newborn's documents enter with the weight
  the update gives every document, rho_t D_t / |B|, so the test reads "after this update, this
  topic is worth less than the few documents a birth gives its replacement". No threshold is
  chosen: both sides are in the update's own units. As rho_t -> 0 a newborn weighs less and
  less, so births die out on a long stream (the topics settle); with ``rho_min > 0`` (drift)
  they stay possible, which recycles dead topics for new themes.
* Acceptance is the next update: a newborn that wins no tokens in the next minibatch is the
  smallest topic again and is replaced in turn.
* At most ``MAX_BIRTHS`` per update, so that newborns do not compete for the same documents
  (each takes its seed from documents far from all topics and from the previous newborns).

A birth travels with the update: the seed documents' counts go into column k of the batch's
summary and ``reborn`` names k, so ``TopicModel.learn`` resets column k to the prior before the
update (``reset_topics``). A replica applying the update log does the same from the record,
so replicas stay identical. A replica computes its next batch before its last record is back
from the log: that batch still sees the topic its last record rebirths as dead, and had it reborn
again before any update tested the newborn (4-6 times per pass of 20NG at K = 100, one record in
flight), so the topics of its own records not yet applied are spared (``spare``). Births apply to
the L-sparse engine's stochastic update; the memoized update keeps exact sums (a reset would
break them) and the alias engine keeps token assignments.
"""
from __future__ import annotations

import numpy as np

from .jit_cache import njit
from .parallel import ThreadRunner, claim_range
from .summary import Summary

__all__ = ["MAX_BIRTHS", "births_for", "data_mass", "propose_births", "reset_topics", "with_seeds"]

# Newborns per update. Two: each is seeded from documents far from the topics and from the other
# newborn, and on 20NG (K = 100) one per update left NPMI -0.05, two +0.02, with held-out alike.
MAX_BIRTHS = 2


@njit(cache=True, nogil=True)
def _topic_rows(counter, bounds, uniq, mu, scale, beta, lam):
    """lam[u] = lambda over the batch's words ``uniq`` (lambda_vk = beta + scale mu_vk), for the
    row ranges this thread claims (``parallel.claim_range``)."""
    K = mu.shape[1]
    while True:
        lo, hi = claim_range(counter, bounds)
        if lo < 0:
            break
        for u in range(lo, hi):
            row = mu[uniq[u]]
            for k in range(K):
                lam[u, k] = beta + scale * row[k]
    return 0


@njit(cache=True, nogil=True)
def _inverse_norms(lam):
    """1 / ||lam[:, k]|| per topic (0 for a zero column), summed over the rows in order."""
    U, K = lam.shape
    inv = np.zeros(K)
    for u in range(U):
        for k in range(K):
            inv[k] += lam[u, k] * lam[u, k]
    for k in range(K):
        inv[k] = 1.0 / np.sqrt(inv[k]) if inv[k] > 0.0 else 0.0
    return inv


@njit(cache=True, nogil=True)
def _doc_cosines(counter, bounds, doc_ptr, local, counts, lam, inv, out):
    """max_k cos(x_d, lam_k) of the documents in the ranges this thread claims."""
    K = lam.shape[1]
    acc = np.zeros(K)
    while True:
        lo, hi = claim_range(counter, bounds)
        if lo < 0:
            break
        for d in range(lo, hi):
            acc[:] = 0.0
            norm = 0.0
            for p in range(doc_ptr[d], doc_ptr[d + 1]):
                c = counts[p]
                norm += c * c
                u = local[p]
                for k in range(K):
                    acc[k] += c * lam[u, k]
            if norm > 0.0:
                best = 0.0
                for k in range(K):
                    best = max(best, acc[k] * inv[k])
                out[d] = best / np.sqrt(norm)


def doc_topic_cosine(batch, local, counts, state, runner=None) -> np.ndarray:
    """max_k cos(x_d, lambda_k) per document of ``batch``, both restricted to the batch's words
    (x_d: the document's counts). Rows of lambda and documents are split over ``runner``'s
    threads; every value is computed in the same order whatever the split."""
    runner = runner or ThreadRunner(1)
    U, D = batch.uniq.size, batch.n_docs
    lam = np.empty((U, state.n_topics))
    rows = runner.row_bounds(U)
    runner.run_claimed(lambda ctr: _topic_rows(ctr, rows, batch.uniq, state.mu, state.scale, state.beta, lam))
    inv = _inverse_norms(lam)
    out = np.zeros(D)
    docs = runner.bounds(batch.doc_ptr, uneven=True)
    runner.run_claimed(lambda ctr: _doc_cosines(ctr, docs, batch.doc_ptr, local, counts, lam, inv, out))
    return out


@njit(cache=True, nogil=True)
def _doc_doc_cosine(doc_ptr, local, counts, d, U):
    """cos(x_j, x_d) for every document j of the batch."""
    D = doc_ptr.shape[0] - 1
    ref = np.zeros(U)
    for p in range(doc_ptr[d], doc_ptr[d + 1]):
        ref[local[p]] += counts[p]
    rn = np.sqrt(np.sum(ref * ref))
    out = np.zeros(D)
    for j in range(D):
        dot = 0.0
        norm = 0.0
        for p in range(doc_ptr[j], doc_ptr[j + 1]):
            c = counts[p]
            norm += c * c
            dot += c * ref[local[p]]
        if norm > 0.0 and rn > 0.0:
            out[j] = dot / (np.sqrt(norm) * rn)
    return out


def data_mass(state) -> np.ndarray:
    """Each topic's data mass in lambda units (its pseudo-counts above the init smoothing)."""
    return state.scale * (state.mu_totals - state.smoothing * state.n_words)


def propose_births(state, updater, batch, summary: Summary, rng: np.random.Generator,
                   max_births: int = MAX_BIRTHS, runner=None, spare=()) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """The births of the update that is about to learn ``summary`` (see the module docstring):
    a list of (topic, batch-local word indices, seed counts in tokens), at most ``max_births``.
    ``runner``: the local step's threads (the documents' distances to the topics split over them).
    ``spare``: topics that may not die here (newborns of updates that ``state`` does not hold yet)."""
    K, B = state.n_topics, batch.n_docs
    if not state.initialized or K < 2 or B == 0 or summary.n_docs == 0 or batch.n_tokens <= 0:
        return []
    rho = updater.step(state.steps, summary.n_docs)
    per_token = rho * updater.effective_corpus_size(state, summary, rho) / summary.n_docs
    after = (1.0 - rho) * data_mass(state) + per_token * summary.topic_totals
    lengths = batch.doc_lengths()
    n_near = max(1, int(round(B / K)))
    mortal = np.ones(K, dtype=np.bool_)
    mortal[[int(k) for k in spare if 0 <= int(k) < K]] = False
    mortal[state.n_seeded:] = False  # topics still without a seed: the next batches seed them (seeding.py)
    if not mortal.any() or after[mortal].min() >= per_token * float(np.sort(lengths)[-n_near:].sum()):
        return []  # no seed could outweigh the smallest topic (the common case once rho_t is small)
    counts = np.asarray(batch.counts, dtype=np.float64)  # float64 already: no copy
    local = batch.local.astype(np.int64)
    cos = doc_topic_cosine(batch, local, counts, state, runner)
    dist = np.maximum(1.0 - cos, 0.0)
    order = np.argsort(after, kind="stable")
    order = order[mortal[order]]
    out = []
    for k in order[:max_births]:
        p = lengths * dist ** 2
        total = p.sum()
        if not total > 0.0:
            break
        d = int(rng.choice(B, p=p / total))
        sim = _doc_doc_cosine(batch.doc_ptr, local, counts, d, batch.uniq.size)
        near = np.argsort(-sim, kind="stable")[:n_near]
        if after[k] >= per_token * float(np.sum(sim[near] * lengths[near])):
            break
        seed = np.zeros(batch.uniq.size)
        for j in near:
            s, e = batch.doc_ptr[j], batch.doc_ptr[j + 1]
            np.add.at(seed, local[s:e], sim[j] * counts[s:e])
        rows = np.flatnonzero(seed)
        out.append((int(k), rows, seed[rows]))
        dist = np.minimum(dist, np.maximum(1.0 - sim, 0.0))
    return out


def with_seeds(summary: Summary, births, n_topics: int) -> Summary:
    """``summary`` plus each birth's seed counts in its topic's column (rows: the summary's rows,
    which are the batch's words in ``batch.uniq`` order). Within a row the summary's entries come
    first, then the births' in their order."""
    if not births:
        return summary
    totals = summary.topic_totals.astype(np.float64)  # a copy
    for k, r, v in births:
        if r.size > 1 and not np.all(np.diff(r) > 0):
            raise ValueError("a birth's seed rows must be distinct and ascending")
        totals[k] += float(v.sum())
    b_ptr = np.cumsum([0] + [r.size for _, r, _ in births]).astype(np.int64)
    b_rows = np.concatenate([r for _, r, _ in births]).astype(np.int64)
    b_vals = np.concatenate([v for _, _, v in births]).astype(np.float64)
    b_topic = np.array([k for k, _, _ in births], dtype=np.int32)
    indptr, topics, values = _merge_seeds(summary.indptr, summary.topics.astype(np.int32), summary.values,
                                          b_ptr, b_rows, b_vals, b_topic)
    return Summary(word_ids=summary.word_ids, indptr=indptr, topics=topics, values=values, topic_totals=totals,
                   n_docs=summary.n_docs, n_tokens=summary.n_tokens, entropy=summary.entropy, alloc=summary.alloc,
                   key=summary.key, extra=summary.extra)


@njit(cache=True, nogil=True)
def _merge_seeds(indptr, topics, values, b_ptr, b_rows, b_vals, b_topic):
    """The CSR rows of ``indptr``/``topics``/``values`` with each birth's entries (rows ascending,
    ``b_rows[b_ptr[j]:b_ptr[j + 1]]``, topic ``b_topic[j]``) appended to their rows, births in order."""
    U, J = indptr.shape[0] - 1, b_topic.shape[0]
    out_ptr = np.zeros(U + 1, dtype=np.int64)
    for u in range(U):
        out_ptr[u + 1] = indptr[u + 1] - indptr[u]
    for p in range(b_rows.shape[0]):
        out_ptr[b_rows[p] + 1] += 1
    for u in range(U):
        out_ptr[u + 1] += out_ptr[u]
    n = out_ptr[U]
    out_t = np.empty(n, dtype=np.int32)
    out_v = np.empty(n)
    cur = b_ptr[:-1].copy()
    for u in range(U):
        q = out_ptr[u]
        for p in range(indptr[u], indptr[u + 1]):
            out_t[q] = topics[p]
            out_v[q] = values[p]
            q += 1
        for j in range(J):
            c = cur[j]
            if c < b_ptr[j + 1] and b_rows[c] == u:
                out_t[q] = b_topic[j]
                out_v[q] = b_vals[c]
                q += 1
                cur[j] = c + 1
    return out_ptr, out_t, out_v


def reset_topics(state, topics) -> None:
    """Return the columns ``topics`` to the prior (every word at the init smoothing): the dead
    topics a birth replaces, before the update adds their newborns' seeds."""
    topics = [int(k) for k in topics]
    if not topics:
        return
    if any(not 0 <= k < state.n_topics for k in topics):
        raise ValueError(f"reborn topics {topics} outside 0..{state.n_topics - 1}")
    state.reset_topics(topics)


def births_for(model, batch, summary: Summary | None, head_key=None, rng: np.random.Generator | None = None,
               spare=()) -> tuple[Summary | None, list[int]]:
    """(the summary with the newborns' seeds, the reborn topics) for ``model``'s next update:
    none unless the model runs the L-sparse engine with a stochastic update and ``births`` on.
    ``head_key``: the batch's key in the classifier's records (``fit``'s laps with labels). Then no
    topic is reborn: the classifier keeps one record per batch, computed with the topics of its
    lap, and a reborn topic changes what the others refer to. (Births in the first lap only, where
    every record is replaced later, measured the same: 20NG, K = 100, logistic, seeds 0-2, 0.817 /
    0.821 / 0.818 against 0.822 / 0.820 / 0.815 without.) An unsupervised ``fit`` keeps its births.
    ``rng``: the draws' generator (default the model's own). ``spare``: topics born in updates the
    model will learn before this one (a replica's records still on their way through the update
    log): they may not die before an update has tested them."""
    opt = model.options.update
    if summary is None or model.engine != "lsparse" or getattr(opt, "births", False) is not True:
        return summary, []
    if head_key is not None and model.head is not None:
        return summary, []
    if not np.array_equal(summary.word_ids, batch.uniq):  # seeds index the batch's words as the summary's rows
        return summary, []
    births = propose_births(model.state, model.updater, batch, summary, model.rng if rng is None else rng,
                            runner=getattr(model.local_step, "runner", None), spare=spare)
    return with_seeds(summary, births, model.n_topics), [k for k, _, _ in births]
