"""Alias-MH local step: ``AliasEngine`` (streaming ``infer``, batch ``fit_state``) and the batch driver.

The sampler itself (target, proposals, multiple tries, exactness, speed) is ``alias_core``: one
sweep kernel, the statistics slots, the sampler arrays and the one driver.  Unsupervised batch
fits at small K run the dense exact Gibbs kernel of ``alias_dense`` instead (``kernel="auto"``;
its state is handed back as the same SamplerArrays).  With labels the
supervised term of ``alias_supervised`` (LightMedLDA) is passed into the same kernel and its
per-sweep hook redraws the augmentation (and, in batch mode, eta) between sweeps.

Randomness: each call draws one seed (from the model's ``numpy.random.Generator`` via
``seed_source``) and seeds the kernel's own generator with it (an explicit SplitMix64 state
rather than numba's global np.random, which costs ~9x more per draw), so a run is a function
of the model seed and the call sequence, and snapshots (which save the Generator) resume it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..state import require_topics
from ..summary import LocalResult, Summary
from .alias_core import (INIT_TABLE, INIT_UNIFORM, S_CHANGED, S_EXP_DOCS, S_REBUILDS, SamplerArrays,  # noqa: F401
                         SweepHook, acceptance, check_mh_steps, check_tries, default_tries, resolve_steps, run_chain)
from .alias_dense import KERNELS, check_kernel, choose_kernel, run_dense_sampler  # noqa: F401  (KERNELS: public)
from .alias_supervised import SupervisedSweeps, count_loglik, run_fit_chain
from .walker import alias_sample  # noqa: F401  (public: tests and callers draw from a Walker table)

PROPOSALS = ("cycle", "mixture")
ALPHA_PROPOSALS = ("word", "uniform")


def check_proposals(proposal: str, alpha_proposal: str) -> None:
    """Raise ValueError unless ``proposal`` is in PROPOSALS and ``alpha_proposal`` in ALPHA_PROPOSALS."""
    if proposal not in PROPOSALS:
        raise ValueError(f"proposal must be one of {PROPOSALS} (got {proposal!r})")
    if alpha_proposal not in ALPHA_PROPOSALS:
        raise ValueError(f"alpha_proposal must be one of {ALPHA_PROPOSALS} (got {alpha_proposal!r})")


def batch_tokens(batch) -> tuple[np.ndarray, np.ndarray]:
    """Expand a CSR batch into tokens: (batch-local word of each token, token offsets per document)."""
    cnt = np.rint(batch.counts)
    if cnt.size and not np.allclose(cnt, batch.counts, rtol=0, atol=1e-9):
        raise ValueError("the alias engine samples tokens: batch counts must be whole numbers")
    cnt = cnt.astype(np.int64)
    if cnt.size and cnt.min() < 0:
        raise ValueError("negative word count in batch")
    tok_w = np.repeat(batch.local.astype(np.int32), cnt)
    per_doc = np.zeros(batch.n_docs, dtype=np.int64)
    if cnt.size:
        doc_of = np.repeat(np.arange(batch.n_docs), np.diff(batch.doc_ptr))
        per_doc = np.bincount(doc_of, weights=cnt, minlength=batch.n_docs).astype(np.int64)
    tok_ptr = np.zeros(batch.n_docs + 1, dtype=np.int64)
    np.cumsum(per_doc, out=tok_ptr[1:])
    return tok_w, tok_ptr


class _Progress(SweepHook):
    """Batch mode without labels: the user's callback after each kernel call (off the clock)."""

    def __init__(self, callback):
        self.callback = callback

    def after(self, done: int, arr) -> None:
        if self.callback:
            self.callback(done, arr)


def _mh_batch(tok_w, tok_ptr, U: int, K: int, alpha: float, beta: float, n_vocab: int, mh_steps: int, proposal: str,
              table_draws, alpha_proposal: str, m: tuple[int, int], term: Callable | None = None):
    """The MH kernel's batch-mode arrays (rows sized by word frequency; g = beta, G_k = V beta) and
    the ``call`` ``run_chain`` drives; ``term()`` gives each call's supervised term (None: LDA)."""
    arr = SamplerArrays(U, tok_w.shape[0], K, table_draws, freq=np.bincount(tok_w, minlength=U))
    Gk = np.full(K, n_vocab * beta)
    G = np.zeros((1, 1))

    def call(seed_, n, init, record_from, z_rec, doc_acc):
        return arr.run(seed_, tok_w, tok_ptr, Gk, G, False, beta, alpha, n, mh_steps, proposal == "mixture", init,
                       record_from, z_rec, doc_acc, word_prior=alpha_proposal == "word", tries=m,
                       sup=None if term is None else term())

    return arr, Gk, call


def run_batch_sampler(tok_w, tok_ptr, U: int, n_topics: int, alpha: float, beta: float, n_vocab: int,
                      n_sweeps: int, seed: int, mh_steps: int | None = None, proposal: str = "cycle",
                      table_draws: int | None = None, callback: Callable | None = None,
                      callback_every: int = 0, alpha_proposal: str = "word",
                      tries: int | tuple[int, int] | None = None, head=None, targets=None, eta_sweeps: int = 1,
                      eta_burn_in: int | None = None, kernel: str = "auto", **sup_kw) -> tuple[SamplerArrays, dict]:
    """Batch mode: collapsed LDA over tokens held in memory (g = beta, G_k = V beta), uniform start.

    Word rows are sized by each word's token count (hash rows for rare words).  Returns the
    sampler arrays (final counts and z) and stats including ``sampling_seconds`` (kernel
    time: allocation and token expansion excluded).  ``callback(sweep, arrays)`` runs every
    ``callback_every`` sweeps, outside the clock.

    With ``head`` and ``targets``, supervised batch mode (LightMedLDA §3): each sweep draws the
    augmentation given (Z, eta), then Z by word/doc/exp-proposal MH given (augmentation, eta),
    then ``eta_sweeps`` coordinate-wise Gibbs sweeps of eta given (Z, augmentation).  eta
    samples of the sweeps >= ``eta_burn_in`` (default n_sweeps // 2) are averaged into
    ``head.eta_mean`` (prediction), and the batch is folded into the head's carried statistics
    with the retained sweeps' average augmentation (``head.end_batch``).

    ``kernel`` ("auto", "dense", "mh"; ``alias_dense.choose_kernel``): without labels, "auto"
    runs the dense exact Gibbs kernel of ``alias_dense`` at small K, the alias-MH kernel above;
    either way the result is these SamplerArrays and the same stats keys (``stats["kernel"]``
    says which ran; the dense kernel has no MH acceptance: NaN).
    """
    check_proposals(proposal, alpha_proposal)
    chosen = choose_kernel(kernel, int(n_topics), U, supervised=head is not None and targets is not None)
    if head is not None and targets is not None:
        return run_batch_sampler_supervised(tok_w, tok_ptr, U, n_topics, alpha, beta, n_vocab, n_sweeps, seed, head,
                                            targets, mh_steps=mh_steps, proposal=proposal, table_draws=table_draws,
                                            callback=callback, callback_every=callback_every,
                                            alpha_proposal=alpha_proposal, tries=tries, eta_sweeps=eta_sweeps,
                                            eta_burn_in=eta_burn_in, **sup_kw)
    if sup_kw:
        raise TypeError(f"{sorted(sup_kw)} apply to supervised runs only (head and targets)")
    K = int(n_topics)
    n_sweeps = int(n_sweeps)
    step = callback_every if callback and callback_every > 0 else n_sweeps
    if chosen == "dense":
        return run_dense_sampler(tok_w, tok_ptr, U, K, alpha, beta, n_vocab, n_sweeps, seed, table_draws,
                                 chunk=step, hook=_Progress(callback))
    mh_steps, m = resolve_steps(mh_steps, tries, K, tok_ptr, alpha)
    arr, _, call = _mh_batch(tok_w, tok_ptr, U, K, alpha, beta, n_vocab, mh_steps, proposal, table_draws,
                             alpha_proposal, m)
    seeds = np.random.SeedSequence(seed).generate_state(max(n_sweeps, 1) + 1, dtype=np.uint32)
    total, elapsed = run_chain(arr, call, n_sweeps, seeds, chunk=step, init=INIT_UNIFORM, hook=_Progress(callback))
    return arr, {"kernel": "mh", "mh_acceptance": acceptance(total), "alias_rebuilds": int(total[S_REBUILDS]),
                 "sweeps": int(n_sweeps), "sampling_seconds": elapsed,
                 "changed_per_sweep": float(total[S_CHANGED]) / max(n_sweeps, 1), "tries": list(m),
                 "mh_steps": mh_steps, "rows_mib": arr.nbytes / 2**20}


def run_batch_sampler_supervised(tok_w, tok_ptr, U: int, n_topics: int, alpha: float, beta: float, n_vocab: int,
                                 n_sweeps: int, seed: int, head, targets, mh_steps: int | None = None, proposal: str = "cycle",
                                 table_draws: int | None = None, callback: Callable | None = None,
                                 callback_every: int = 0, alpha_proposal: str = "word",
                                 tries: int | tuple[int, int] | None = None, eta_sweeps: int = 1,
                                 eta_burn_in: int | None = None, stop: Callable | None = None,
                                 window: int | None = None
                                 ) -> tuple[SamplerArrays, dict]:
    """Supervised batch mode (LightMedLDA §3), ``run_batch_sampler`` with ``head`` and ``targets``:
    each sweep draws the augmentation given (Z, eta), then Z by word/doc/exp-proposal MH given
    (augmentation, eta), then ``eta_sweeps`` coordinate-wise Gibbs sweeps of eta given (Z,
    augmentation).  eta samples of the sweeps >= ``eta_burn_in`` (default n_sweeps // 2) are
    averaged into ``head.eta_mean`` (prediction), and the batch is folded into the head's carried
    statistics with the retained sweeps' average augmentation (``head.end_batch``).

    ``stop(trace)``: at most ``n_sweeps`` sweeps, fewer when it
    returns True on the trace of the word log-likelihood per token after each sweep
    (stats["loglik_trace"]); see ``alias_supervised.run_fit_chain``.  ``window``: eta and the
    augmentation are averaged over the last ``window`` sweeps instead (``eta_burn_in`` unused).
    """
    check_proposals(proposal, alpha_proposal)
    K = int(n_topics)
    n_sweeps = int(n_sweeps)
    mh_steps, m = resolve_steps(mh_steps, tries, K, tok_ptr, alpha)
    burn = n_sweeps // 2 if eta_burn_in is None else min(int(eta_burn_in), n_sweeps - 1)
    sv = SupervisedSweeps(head, targets, tok_ptr, K, sample_eta=True, eta_sweeps=eta_sweeps, burn=burn,
                          callback=callback, callback_every=callback_every, window=window)
    arr, Gk, call = _mh_batch(tok_w, tok_ptr, U, K, alpha, beta, n_vocab, mh_steps, proposal, table_draws,
                              alpha_proposal, m, term=sv.term)
    n_tok = max(tok_w.shape[0], 1)
    total, t_kernel, trace = run_fit_chain(arr, call, sv, n_sweeps, seed,
                                           lambda: count_loglik(arr.counts(), arr.nk, beta, Gk) / n_tok, stop)
    sv.finish()
    done = len(trace)
    return arr, {"mh_acceptance": acceptance(total, exp=True), "alias_rebuilds": int(total[S_REBUILDS]),
                 "sweeps": done, "sampling_seconds": t_kernel + sv.seconds, "kernel_seconds": t_kernel,
                 "supervised_seconds": sv.seconds, "changed_per_sweep": float(total[S_CHANGED]) / max(done, 1),
                 "exp_proposal_docs_per_sweep": float(total[S_EXP_DOCS]) / max(done, 1),
                 "supervised_docs": int(sv.rows.size), "eta_retained": sv.kept, "tries": list(m), "mh_steps": mh_steps,
                 "loglik_trace": trace}


def inference_seed(state) -> int:
    """A sampler seed that is a function of the model's state (its version and what it has seen)."""
    key = [int(state.version), int(state.docs_seen), int(state.n_words), int(state.n_topics)]
    return int(np.random.SeedSequence(key).generate_state(1, dtype=np.uint64)[0] >> 2)


@dataclass
class AliasEngine:
    """Alias-MH local step; ``infer`` has the interface of ``LSparseEngine.infer``.

    burn_in : sweeps over the minibatch before statistics are collected.
    sample_sweeps : sweeps whose assignments are averaged into doc_topic and the summary.
    mh_steps : MH steps per token per sweep; as in LightLDA a step is one word and one doc
        proposal ("cycle"), or two proposals each picked at random ("mixture").  None: 1 from
        256 topics on (with tries (2, 3), more doc candidates for short documents under a large
        alpha), else 2 (``alias_core.resolve_steps``).
    proposal : "cycle" or "mixture" composition of the two kernels (Light-MedLDA Theorem 1).
    alpha_proposal : where the doc proposal's alpha part comes from: "word" (the word's own
        alias table, matching the target's alpha term) or "uniform" (LightLDA's shared table).
    table_draws : samples drawn from a frequent word's alias table before it is rebuilt (None:
        max(K, 256); rare words' tables hold fewer, ``word_rows.WordRows``).
    tries : candidates per MH step, drawn from the step's proposal and chosen among by the other
        factor of the target (multiple-try MH, module docstring): an int for both kinds or a
        (word, doc) pair; None: (2, 3) for K >= 256, else (1, 1).
    kernel : the kernel of unsupervised batch fits (``fit_state``): "auto" (dense exact Gibbs
        at small K, alias-MH above: ``alias_dense``), "dense" or "mh"; streaming ``infer`` and
        supervised fits run the MH kernel.
    seed_source : callable returning a fresh seed per call (the model's Generator); without
        it the engine uses its own ``numpy.random.Generator(seed)``.
    """

    burn_in: int = 4
    sample_sweeps: int = 4
    mh_steps: int | None = None
    proposal: str = "cycle"
    table_draws: int | None = None
    alpha_proposal: str = "word"
    tries: int | tuple[int, int] | None = None
    seed: int = 0
    seed_source: Callable[[], int] | None = field(default=None, repr=False)
    name: str = "alias"
    kernel: str = "auto"

    def __post_init__(self):
        check_proposals(self.proposal, self.alpha_proposal)
        check_kernel(self.kernel)
        self.tries = check_tries(self.tries)
        self.mh_steps = check_mh_steps(self.mh_steps)
        self._rng = np.random.default_rng(self.seed)

    def _steps(self, K: int, tok_ptr=None, alpha: float = 0.0) -> tuple[int, tuple[int, int]]:
        return resolve_steps(self.mh_steps, self.tries, K, tok_ptr, alpha)

    def _next_seed(self) -> int:
        if self.seed_source is not None:
            return int(self.seed_source())
        return int(self._rng.integers(1 << 62))

    def infer(self, state, batch, summarize: bool = True, head=None, targets=None) -> LocalResult:
        """Streaming local step against lambda (fixed during the batch): burn-in sweeps, then
        ``sample_sweeps`` recorded ones.  With ``head`` and ``targets`` the labelled documents'
        augmentation is redrawn before every sweep from their current zbar (with the head's
        current eta sample) and each sweep samples the regularised conditional; eta stays fixed
        (model.py calls head.update)."""
        require_topics(state)
        K = state.n_topics
        D = batch.n_docs
        U = batch.uniq.shape[0]
        # Inference only (transform, predict, features): a seed from the model's state, not a draw
        # from the learning generator, so such calls neither change what the model learns next
        # (they did) nor differ between two calls on the same model and documents.
        seed = self._next_seed() if summarize else inference_seed(state)
        tok_w, tok_ptr = batch_tokens(batch)
        N = tok_w.shape[0]
        n_burn = max(int(self.burn_in), 0)
        n_samp = max(int(self.sample_sweeps), 1)
        n_total = n_burn + n_samp
        arr = SamplerArrays(U, N, K, self.table_draws)  # dense rows: the prior lambda_wk is dense
        # lambda for the batch's words and all-vocabulary totals: the prior of this batch's topics
        G = state.beta + state.scale * state.mu[batch.uniq]
        Gk = state.lam_totals().astype(np.float64)
        z_rec = np.zeros((n_samp if summarize else 0, N), dtype=np.int32)
        doc_acc = np.zeros((D, K))
        sv = SupervisedSweeps(head, targets, tok_ptr, K) if head is not None and targets is not None else None
        mh_steps, tries = self._steps(K, tok_ptr, state.alpha)

        def call(seed_, n, init, record_from, z_rec_, doc_acc_):
            return arr.run(seed_, tok_w, tok_ptr, Gk, G, True, state.beta, state.alpha, n, mh_steps,
                           self.proposal == "mixture", init, record_from, z_rec_, doc_acc_,
                           word_prior=self.alpha_proposal == "word", tries=tries,
                           sup=None if sv is None else sv.term())

        if sv is None:
            total, _ = run_chain(arr, call, n_total, [seed], chunk=n_total, init=INIT_TABLE, n_burn=n_burn,
                                 z_rec=z_rec, doc_acc=doc_acc)
        else:
            seeds = np.random.SeedSequence(seed).generate_state(n_total + 1, dtype=np.uint32)
            total, _ = run_chain(arr, call, n_total, seeds, chunk=1, init=INIT_TABLE, init_alone=True, hook=sv,
                                 n_burn=n_burn, z_rec=z_rec, doc_acc=doc_acc)
        objective = arr.word_loglik(tok_w, Gk, G, True, state.beta)
        summary = _summary_from_samples(batch, tok_w, z_rec, K) if summarize else None
        stats = {"mh_acceptance": acceptance(total, exp=sv is not None), "alias_rebuilds": int(total[S_REBUILDS]),
                 "sweeps": n_total, "changed_per_token": float(total[S_CHANGED]) / max(N * n_total, 1),
                 "tries": list(tries), "mh_steps": mh_steps}
        if sv is not None:
            stats.update(exp_proposal_docs=int(total[S_EXP_DOCS]), augment_seconds=sv.seconds,
                         supervised_docs=int(sv.sup_doc.sum()))
        return LocalResult(doc_topic=doc_acc / n_samp, summary=summary,
                           iterations=np.full(D, n_total, dtype=np.int32), objective=float(objective), stats=stats)

    def fit_state(self, state, batch, n_sweeps: int, seed: int, callback: Callable | None = None,
                  callback_every: int = 0, head=None, targets=None, eta_sweeps: int = 1,
                  eta_burn_in: int | None = None, **sup_kw) -> dict:
        """Batch mode: collapsed sweeps over ``batch`` (all of it in memory), then state <- last sample.

        The target is the exact collapsed conditional with g = beta and G_k = V beta, V the
        vocabulary size; afterwards lambda = beta + n_kw (scale 1, no smoothing), the
        counters are advanced as for one update, and the returned stats carry the MH
        acceptance, rebuilds, ``sampling_seconds`` (kernel time only) and ``tokens_per_s``.
        ``callback(sweeps_done, arrays)`` runs every ``callback_every`` sweeps, off the clock.
        """
        tok_w, tok_ptr = batch_tokens(batch)
        N = int(tok_w.shape[0])
        arr, stats = run_batch_sampler(tok_w, tok_ptr, batch.uniq.shape[0], state.n_topics, state.alpha, state.beta,
                                       state.n_words, n_sweeps, seed, mh_steps=self.mh_steps, proposal=self.proposal,
                                       table_draws=self.table_draws, callback=callback,
                                       callback_every=callback_every, alpha_proposal=self.alpha_proposal,
                                       tries=self.tries, head=head, targets=targets, eta_sweeps=eta_sweeps,
                                       eta_burn_in=eta_burn_in, kernel=self.kernel, **sup_kw)
        arr.release_tables()  # free the proposal buffers before lambda is written
        nv = state.n_words
        state.mu[:nv] = 0.0
        state.mu[batch.uniq] = arr.counts()
        state.scale = 1.0
        state.smoothing = 0.0
        state.refresh_totals()
        state.count_update(batch.n_docs, N, 1.0)  # a whole corpus: one step of the schedule
        state.initialized = True
        stats.update(docs=batch.n_docs, tokens=N,
                     tokens_per_s=N * stats["sweeps"] / stats["sampling_seconds"]
                     if stats["sampling_seconds"] > 0 else 0.0)
        return stats

    def config(self) -> dict:
        return {"burn_in": self.burn_in, "sample_sweeps": self.sample_sweeps, "mh_steps": self.mh_steps,
                "proposal": self.proposal, "table_draws": self.table_draws, "alpha_proposal": self.alpha_proposal,
                "tries": None if self.tries is None else list(self.tries), "kernel": self.kernel}


def _summary_from_samples(batch, tok_w, z_rec, K: int) -> Summary:
    """Topic-word counts averaged over the recorded sweeps, as CSR over batch.uniq."""
    S, N = z_rec.shape
    U = batch.uniq.shape[0]
    keys = (np.tile(tok_w.astype(np.int64), S) * K + z_rec.reshape(-1)) if N else np.empty(0, np.int64)
    uk, cnt = np.unique(keys, return_counts=True)
    rows = uk // K
    topics = (uk % K).astype(np.int32)
    values = cnt.astype(np.float64) / S
    indptr = np.zeros(U + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=U), out=indptr[1:])
    totals = np.bincount(topics, weights=values, minlength=K).astype(np.float64)
    return Summary(word_ids=batch.uniq.copy(), indptr=indptr, topics=topics, values=values, topic_totals=totals,
                   n_docs=batch.n_docs, n_tokens=float(batch.n_tokens))
