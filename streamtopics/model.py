"""TopicModel: the library's public face.  It arranges calls; numeric work lives in kernels.

    m = TopicModel(n_topics=100, engine=LSparse(sparsity=8), update="stochastic")
    m.partial_fit(docs)              # one minibatch of raw texts or token lists
    m.fit(docs, labels=None)         # batch mode: memoized laps (lsparse) or Alias-MH sweeps (alias)
    theta = m.transform(docs)        # (n_docs, K), rows sum to one
    m.save("model.stsnap"); m2 = load_snapshot("model.stsnap")

The daemon uses the lower-level trio ``prepare`` (tokens -> Batch, growing the
vocabulary), ``process`` (local step, predictions before learning, then the global
update; returns a ``results.BatchResult``) and ``save(..., offsets=...)``.

Options live in ``options`` (one frozen object per slot, validated there), batch mode in
``fitting``, the topics' initialisation in ``seeding``, snapshots in ``model_io``.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import fitting, model_io, seeding
from .batch import Batch, build_batch
from .births import births_for, reset_topics
from .batch_ops import chunks, doc_lengths, infer_in_chunks, normalise_rows, slice_batch, tokenize_docs
from .components import build_engine, build_update
from .evaluate import heldout_loglik_arrays
from .features import feature_step, resolve_features, training_counts
from .hyper import alpha_step
from .options import FLAT, INITS, ModelOptions, Stochastic, flat_params, is_integer
from .parallel import ThreadRunner, resolve_threads
from .results import BatchResult
from .state import ModelState, require_topics
from .summary import Summary, check_finite
from .supervised.classifier import SupervisedHead, no_topic_mass
from .supervised.targets import conform_targets, is_missing
from .text import Tokenizer, Vocabulary
from .trends import PrevalenceTracker
from .updates import STEP_DOCS, MemoizedUpdate, classifier_decay, schedule_advance, schedule_step

ENGINES = ("lsparse", "alias")
UPDATES = ("stochastic", "memoized")
# alpha of a supervised model of the variational engine by default: the flat Dirichlet, the
# smallest concentration under which the mean-field local step does not annihilate a document's
# minor topics, which the classifier reads (docs/supervised.md §9; the evidence-optimal alpha is
# ~1/K). The sampler weighs topics by n_dk + alpha, linearly, and keeps the learned alpha.
SUPERVISED_ALPHA = 1.0
SNAPSHOT_KIND = model_io.SNAPSHOT_KIND
FIT_MAX_LAPS, FIT_TOL, FIT_BATCH_SIZE, FIT_SWEEPS = (fitting.FIT_MAX_LAPS, fitting.FIT_TOL, fitting.FIT_BATCH_SIZE,
                                                     fitting.FIT_SWEEPS)
# the order of get_params() (and so of snapshot headers)
_PARAMS = ("n_topics", "engine", "sparsity", "update", "alpha", "beta", "seed", "delay", "forgetting_rate",
           "rho_min", "corpus_size", "births", "memo_window", "max_iter", "tol", "active_eps", "restarts",
           "restart_trials", "restart_iters", "vocab_cap", "vocab_policy", "vocab_decay", "min_word_len",
           "max_word_len", "stopwords", "init", "init_smoothing", "burn_in", "sample_sweeps", "mh_steps",
           "proposal", "table_draws", "alpha_proposal", "tries", "kernel", "supervision", "sup_c", "sup_ell",
           "sup_epsilon", "sup_prior_var", "sup_decay", "sup_sweeps", "sup_burn_in", "sup_pg_method", "sup_max_labels",
           "sup_features", "sup_local", "segmentation", "threads")


@contextmanager
def reading_ahead(model):
    """Around building and learning one batch of ``model``: with threads, a helper computes word
    rows the batch will probably need while this thread builds it (``LSparseEngine.read_ahead``;
    with one thread it does nothing)."""
    start = getattr(model.local_step, "read_ahead", None)
    if start is not None:
        start(model.state)
    try:
        yield
    finally:
        model.state.drop_ahead()


class TopicModel:
    """LDA learned from a stream of minibatches, with one shared model state.

    n_topics : number of topics K.  alpha, beta : per-topic document-topic and topic-word
    Dirichlet concentrations (alpha=None: "auto", except ``SUPERVISED_ALPHA`` = 1 for a supervised
    model of the variational engine; alpha="auto": starts at 1/K, learned; beta=None: 1/K, one
    pseudo-count per word over all topics whatever K; docs/defaults.md, docs/supervised.md §9).  seed :
    seeds initialisation (and any sampling engine).  The slots take an option object of
    ``options`` or its name (the default object of that kind):
    engine = LSparse(...) "lsparse" (L-sparse variational) | AliasMH(...) "alias" (Alias-MH);
    update = Stochastic(...) "stochastic" (SVI) | Memoized(...) "memoized" (MVI);
    supervision = None | Hinge(...) "hinge" | Logistic(...) "logistic" | Regression(...)
    "regression" (``partial_fit(docs, labels=...)`` learns topics that predict labels,
    docs/supervised.md); text = Text(...) (tokenizer); vocabulary = Vocabulary(...) (cap, policy).
    init : "kmeans++" seeds topics from K diverse documents (as the paper does), "random" from random
    ones: the first batch's, then the next ones' (``seeding``); each (word, topic) starts at ``init_smoothing``.
    threads : threads of the local step (None or 0: the cores it may use); results do not depend on it.
    **flat : the older flat keywords (``sparsity``, ``corpus_size``, ``sup_c``, ``vocab_cap`` ...,
    the table ``options.FLAT``) set fields of the slots' objects; one given beside an option
    object of its slot raises.  They stay readable as attributes (``model.sparsity``) and
    ``get_params()`` lists them.
    """

    def __init__(self, n_topics: int = 100, engine="lsparse", update="stochastic", alpha: float | str | None = None,
                 beta: float | None = None, seed: int = 0, *, supervision=None, text=None, vocabulary=None,
                 init: str = "kmeans++", init_smoothing: float = 1.0, threads: int | None = None, **flat):
        _check_top(n_topics, alpha, beta, init, init_smoothing, threads)
        self.options = ModelOptions.build(engine, update, supervision, text, vocabulary, **flat)
        self.n_topics = n_topics
        self.alpha = alpha
        self.beta = beta
        self.seed = seed
        self.init = init
        self.init_smoothing = init_smoothing
        self.threads = threads
        self.reset()

    # -- options ------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        """Kind of the local step: "lsparse" or "alias" (the option object: ``options.engine``)."""
        return self.options.engine.kind

    @property
    def update(self) -> str:
        return self.options.update.kind

    @property
    def supervision(self) -> str | None:
        sup = self.options.supervision
        return None if sup is None else sup.kind

    def __getattr__(self, name: str):
        # the flat keywords read as attributes (model.sparsity, model.corpus_size, ...)
        if name in FLAT and "options" in self.__dict__:
            return self.flat_params()[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def flat_params(self) -> dict:
        return flat_params(self.options.slots())

    def get_params(self, deep: bool = True) -> dict:
        """Every setting under its flat keyword (``TopicModel(**get_params())`` rebuilds the model)."""
        p = {"n_topics": self.n_topics, "engine": self.engine, "update": self.update, "alpha": self.alpha,
             "beta": self.beta, "seed": self.seed, "init": self.init, "init_smoothing": self.init_smoothing,
             "supervision": self.supervision, "threads": self.threads, **self.flat_params()}
        if p["stopwords"] is not None and not isinstance(p["stopwords"], str):
            p["stopwords"] = sorted(p["stopwords"])
        return {k: p[k] for k in _PARAMS}

    def set_params(self, **params) -> "TopicModel":
        """scikit-learn's: the model rebuilt, untrained, with these settings changed (``clone``, searches)."""
        self.__init__(**{**self.get_params(), **params})
        return self

    def reset(self) -> None:
        """Fresh tokenizer, vocabulary, state, engine, update and classifier; generator reset to ``seed``."""
        o = self.options
        self.tokenizer = Tokenizer(o.text.min_word_len, o.text.max_word_len, o.text.stopwords, o.text.segmentation)
        self.vocab = Vocabulary(cap=o.vocabulary.cap, policy=o.vocabulary.policy, decay=o.vocabulary.decay)
        self.state = ModelState(self.n_topics, initial_alpha(self.alpha, self.n_topics, flat_alpha_default(o))[0],
                                1.0 / self.n_topics if self.beta is None
                                else float(self.beta))
        # Alias seeds come from self.rng at call time (late binding: load_snapshot replaces self.rng).
        self.local_step = build_engine(o.engine, runner=lambda: ThreadRunner(self.threads),
                                       seed_source=lambda: int(self.rng.integers(1 << 62)))
        self.features = resolve_features(o)  # the classifier's features (features.py)
        self.feature_step = feature_step(self.features, o.engine, SUPERVISED_ALPHA, lambda: ThreadRunner(self.threads))
        self.updater = build_update(o.update)
        self.rng = np.random.default_rng(self.seed)
        self.auto_key = 0
        self.last_stats: dict = {}
        self.head = self.new_head()
        self.trends = PrevalenceTracker(self.n_topics)  # per-topic prevalence per learned batch

    @property
    def alpha_learned(self) -> bool:
        """alpha is learned (empirical Bayes): "auto", as None is except for a supervised model of
        the variational engine (``flat_alpha_default``)."""
        return initial_alpha(self.alpha, self.n_topics, flat_alpha_default(self.options))[1]

    def new_head(self) -> SupervisedHead | None:
        """A fresh classifier for the supervision option (None without supervision)."""
        sup = self.options.supervision
        if sup is None:
            return None
        return SupervisedHead(
            self.n_topics, sup.kind, **sup.head_kwargs(),
            seed=int(np.random.SeedSequence([int(self.seed), 5]).generate_state(1)[0]),
            memo_window=self.options.update.memo_window if self.update == "memoized" else None)

    def set_threads(self, threads: int | None) -> None:
        """Change the number of threads (None or 0: the available cores); results do not depend on it."""
        resolve_threads(threads)
        self.threads = threads
        for step in (self.local_step, self.feature_step):
            old = getattr(step, "runner", None)
            if old is not None:
                old.close()
                step.runner = ThreadRunner(threads)

    # -- documents --------------------------------------------------------------------
    def tokenize(self, docs: Sequence, start: int = 0) -> list[list[str]]:
        """Raw strings go through the tokenizer, token lists are taken as given; errors count from ``start``."""
        return tokenize_docs(self.tokenizer, docs, start)

    def prepare(self, tokens: list[list[str]], grow: bool = True) -> Batch:
        """Token lists -> CSR batch; with ``grow`` new words join the vocabulary at the prior."""
        batch = build_batch(tokens, self.vocab, grow=grow)
        if grow:
            if batch.evicted.size:
                self.state.reset_words(batch.evicted)
                self.updater.forget_words(batch.evicted)
            self.state.ensure_words(len(self.vocab))
        return batch

    def prepare_mark(self) -> tuple:
        """A restore point for ``undo_prepare`` (vocabulary and state rows), taken before ``prepare``."""
        return self.vocab.mark(), self.state.n_words, self.state.version, self.state.mu_totals.copy()

    def undo_prepare(self, mark: tuple) -> bool:
        """Undo ``prepare(grow=True)`` calls since ``mark`` when no update ran since (a failed
        step): new words and count updates go. False, changing nothing, when it cannot be undone
        (an update ran, or words were evicted)."""
        vmark, n_words, version, totals = mark
        if self.state.version != version or not self.vocab.rollback(vmark):
            return False
        self.state.shrink_words(n_words)
        self.state.mu_totals[:] = totals  # exactly: (x + s) - s need not be x in floating point
        return True

    # -- learning ---------------------------------------------------------------------
    def process(self, batch: Batch, learn: bool = True, batch_key=None, labels=None, head_key=None) -> BatchResult:
        """Local step on ``batch`` with the current topics, then (if ``learn``) the global update.

        The returned ``doc_topic`` counts (and ``theta``) were computed *before* the update and
        without the labels: they are the prequential predictions for these documents.
        ``scores`` ((n_docs, n_labels) or None), ``predicted`` (one prediction per document, or
        None) and ``label_names`` come from them and the classifier as it was before this batch;
        ``version_before`` is the model version that made them, ``stats`` the step's statistics.

        ``labels`` (supervised models): one target per document, None where a document has
        none.  A labelled batch runs the supervised local step (the label term in the local
        weights) for learning the topics, then trains the classifier.
        """
        t0 = time.perf_counter()
        alpha_used, version_before, steps_before = self.state.alpha, self.state.version, self.state.steps
        labels = batch_labels(self.head, batch, labels)
        if learn and not self.state.fully_seeded and batch.n_tokens > 0:
            self.initialize(batch)
        sup_step = learn and labels is not None and batch.n_docs > 0
        label_names = self.label_names
        result, pre, feats, scores, predicted = self.local_steps(batch, labels if sup_step else None, learn)
        t1 = time.perf_counter()
        info: dict = {}
        if learn and batch.n_docs > 0:
            check_finite(result.summary, pre.doc_topic)  # raises before the topics or the classifier change
            batch_key = self.memo_key(batch_key)
            summary, reborn = births_for(self, batch, result.summary, head_key)  # dead topics reseeded (births.py)
            objective = None if self.engine == "alias" else result.objective  # a sampler's is not variational
            info = self.learn(summary, objective, pre.doc_topic, batch.n_docs, batch.n_tokens, batch_key, reborn)
        t2 = time.perf_counter()
        sup_counts = None
        if sup_step:
            if batch.n_docs > STEP_DOCS and self.features != "supervised":  # sup_step: learning
                feats = self.feature_counts(batch)  # after its update: a big step's topics moved (supervised.md §4)
            feats = training_counts(self.features, result, feats)
            # head_key (fit's stochastic laps): a revisited batch replaces its classifier statistics
            info["supervised"] = self.head.update(normalise_rows(feats), labels,
                                                  batch_key=batch_key if batch_key is not None else head_key,
                                                  decay=classifier_decay(self.updater, steps_before, batch.n_docs,
                                                                         self.options.supervision.decay))
            if result is not pre:
                sup_counts = result.doc_topic
        t3 = time.perf_counter()
        self.last_stats = _step_stats(batch, result, info, (t0, t1, t2, t3))
        said = without_unknown(pre.doc_topic, batch)  # what the model before this batch says
        out = BatchResult.of(result, theta=self.theta(said, alpha_used), scores=scores, predicted=predicted,
                             label_names=label_names if scores is not None else [], version_before=version_before,
                             version=self.state.version, doc_topic_supervised=sup_counts)
        out.doc_topic, out.alpha, out.stats = said, alpha_used, self.last_stats
        return out

    def local_steps(self, batch: Batch, labels=None, learn: bool = True, head: SupervisedHead | None = None):
        """(learning result, label-free result, classifier features (``feature_counts``), scores,
        predictions) of the local step(s) against the topics as they are. Only ``head`` changes (default
        the model's classifier: it calibrates and learns new labels here; a replica passes a fork)."""
        head = self.head if head is None else head
        sup_local = labels is not None and self.options.supervision.local
        # prequential: the label-free local step gives the predictions and the returned theta (without
        # labels, or with local=False, it is the learning step too)
        learns = (learn or labels is not None) and not sup_local
        result = pre = self.local_step.infer(self.state, batch, summarize=learns)
        needed = labels is not None or head_trained(head)
        feats = self.feature_counts(batch, pre) if needed else pre.doc_topic
        scores, predicted = predict_from(head, without_unknown(feats, batch))
        if labels is not None:
            targets = head.encode_targets(labels, grow=True)
            head.calibrate(doc_lengths(batch), targets)  # self-scaling constants see this batch first
            if sup_local:  # targets as the head learns them (``learned_targets``: a stray response clipped)
                result = self.local_step.infer(self.state, batch, head=head, targets=head.learned_targets(targets))
        return result, pre, feats, scores, predicted

    def feature_counts(self, batch: Batch, pre=None) -> np.ndarray:
        """(D, K) topic counts the classifier reads (``features``; ``pre``: the label-free result, if computed)."""
        if self.feature_step is not None:
            return self.feature_step.counts(self.state, batch)
        return pre.doc_topic if pre is not None else self.infer_counts(batch)

    def learn(self, summary: Summary, objective: float | None, doc_topic: np.ndarray, n_docs: int, n_tokens: int,
              batch_key=None, reborn=()) -> dict:
        """Global update from a local step's ``summary`` and label-free ``doc_topic`` counts (``process``; a
        replica applying the update log). ``reborn``: topics reset first, their newborns in ``summary`` (births.py)."""
        reset_topics(self.state, reborn)
        info = self._apply(summary, objective, batch_key) | ({"births": list(reborn)} if len(reborn) else {})
        if self.alpha_learned:
            info["alpha"] = self.state.alpha = learned_alpha(self.options.update, self.state, doc_topic, n_docs)
        share = schedule_advance(n_docs)  # of a full step: the schedule's and the trends' weight of this batch
        self.state.count_update(n_docs, n_tokens, share)
        self.trends.observe(doc_topic.sum(axis=0), self.state.version, share)
        return info

    def memo_key(self, batch_key):
        """The key a learned batch is memoized under: None for a stochastic update (nothing is
        ever revisited, so neither the topic updater nor the supervised head keeps a record),
        the given or an automatic key for a memoized one (the head shares the updater's keys)."""
        if batch_key is not None and (not isinstance(batch_key, (str, int)) or isinstance(batch_key, bool)):
            raise TypeError(f"batch_key must be str or int (got {type(batch_key).__name__})")
        if self.update != "memoized":
            return None
        if batch_key is None:
            batch_key = f"auto-{self.auto_key}"
            self.auto_key += 1
        return batch_key

    def _apply(self, summary: Summary, objective: float, batch_key) -> dict:
        if self.update == "memoized":
            return self.updater.apply(self.state, summary, batch_key, new_objective=objective)
        return self.updater.apply(self.state, summary)

    def partial_fit(self, docs: Sequence, labels=None, batch_key=None) -> "TopicModel":
        """Learn from one minibatch (raw strings or token lists).  Returns self.

        ``labels`` (supervised models): list[str] (multi-class), list[list[str]] (multi-label)
        or list[float] (regression), one per document; None entries are unlabelled documents,
        which still train the topics.  Label values not seen before join the classifier.
        """
        self.partial_fit_transform(docs, labels, batch_key)
        return self

    def check_docs_labels(self, docs, labels):
        """(docs, labels) checked and as lists when labels come with them (``check_docs_labels``)."""
        return check_docs_labels(self.head, docs, labels)

    def fit(self, docs: Sequence, labels=None, *, n_iter: int | None = None, tol: float = FIT_TOL,
            batch_size: int = FIT_BATCH_SIZE, n_sweeps: int | None = None) -> "TopicModel":
        """Batch mode, sklearn-style: learn from ``docs`` held in memory, from scratch.  Returns self.

        Variational engine: laps of minibatches of ``batch_size`` (at most ``n_iter``, stopping when
        a lap raises the objective by less than ``tol``); sampling engine: ``n_iter`` collapsed
        sweeps.  ``fitting.fit`` documents both; statistics are left in ``last_stats``."""
        return fitting.fit(self, docs, labels, n_iter=n_iter, tol=tol, batch_size=batch_size, n_sweeps=n_sweeps)

    def partial_fit_transform(self, docs: Sequence, labels=None, batch_key=None) -> np.ndarray:
        """Prequential step: document-topic proportions under the model *before* learning from docs.
        Stochastic update, no ``batch_key``: more than STEP_DOCS (256) documents are learned as even
        consecutive steps of at most that many, each part's proportions from the model before it
        (``step_cuts``; as gensim's ``chunksize``, scikit-learn's ``batch_size``)."""
        docs, labels = self.check_docs_labels(docs, labels)
        with reading_ahead(self):
            tokens = self.tokenize(docs)  # every document checked before any part is learned
            split = batch_key is None and self.updater.name == "stochastic"
            cuts = step_cuts(len(tokens)) if split else [(0, len(tokens))]
            if len(cuts) == 1:  # one step: learned inside this read-ahead, with its key
                return learn_tokens(self, tokens, labels, batch_key)
        out = []
        for a, b in cuts:
            with reading_ahead(self):
                out.append(learn_tokens(self, tokens[a:b], None if labels is None else labels[a:b], None))
        return np.vstack(out)

    def initialize(self, batch: Batch) -> None:
        """Seed topics from ``batch``: the first batch, then later ones while topics wait (``seeding.seed``)."""
        seeding.seed(self.state, batch, self.rng, self.init, self.init_smoothing, self.updater.name == "stochastic")

    # -- inference --------------------------------------------------------------------
    def theta(self, doc_topic: np.ndarray, alpha: float | None = None) -> np.ndarray:
        """E[pi_d] = (N_dk + alpha) / (N_d + K alpha) from expected topic counts; ``alpha``: the one the
        counts were computed with (``BatchResult.alpha``) when it may have moved since (alpha="auto")."""
        a = self.state.alpha if alpha is None else alpha
        return (doc_topic + a) / (doc_topic.sum(axis=1, keepdims=True) + self.n_topics * a)

    def infer_counts(self, batch: Batch, rows=None) -> np.ndarray:
        """(D, K) expected topic counts of the label-free local step, in chunks; ``rows`` maps them."""
        out = np.empty((batch.n_docs, self.n_topics))
        for lo, hi in chunks(batch.n_docs):
            counts = self.local_step.infer(self.state, slice_batch(batch, lo, hi), summarize=False).doc_topic
            out[lo:hi] = counts if rows is None else rows(counts)
        return out

    def transform_batch(self, batch: Batch) -> np.ndarray:
        return self.infer_counts(batch, self.theta)

    def transform(self, docs: Sequence) -> np.ndarray:
        """Document-topic proportions (n_docs, K) under the current topics; rows sum to one."""
        return self.infer_docs(docs, self.theta)

    def infer_docs(self, docs: Sequence, rows=None) -> np.ndarray:
        """``infer_counts`` of raw documents, in pipelined chunks (``batch_ops.infer_in_chunks``)."""
        prepare, infer = (lambda t: self.prepare(t, grow=False)), (lambda b: self.infer_counts(b, rows))
        return infer_in_chunks(self.tokenize, prepare, infer, docs, self.n_topics, resolve_threads(self.threads) > 1)

    # -- supervised prediction ----------------------------------------------------------
    @property
    def label_names(self) -> list[str]:
        """Labels known to the classifier, in score-column order (empty for regression / unsupervised)."""
        if self.head is None or self.head.task == "regression":
            return []
        return list(self.head.labels.labels)

    def zbar_docs(self, docs: Sequence) -> np.ndarray:
        """Topic proportions of new documents from the label-free step the classifier reads (``features``)."""
        return infer_in_chunks(self.tokenize, lambda t: self.prepare(t, grow=False),
                               lambda b: normalise_rows(self.feature_counts(b)), docs, self.n_topics,
                               resolve_threads(self.threads) > 1)

    def _need_head(self) -> SupervisedHead:
        if self.head is None:
            raise RuntimeError("this model has no supervision (set supervision=... and train with labels)")
        return self.head

    def predict_scores(self, docs: Sequence) -> np.ndarray:
        """Per-label scores eta_y^T zbar_d, (n_docs, n_labels) in ``label_names`` order
        (regression: (n_docs, 1), the predicted response).  zbar_d comes from the unsupervised
        local step with the current topics; eta is the average of the retained samples.  A document
        with no known word has no score: a NaN row (``predict`` gives it None), not zeros that read
        as a score of 0 for every label."""
        return scores_or_nan(self._need_head(), self.zbar_docs(docs))

    def predict(self, docs: Sequence) -> list:
        """Predicted label per document (multi-class: str, None before any label was seen or for a
        document with no known word; multi-label: list[str] of the labels with a positive score; regression: float)."""
        return self._need_head().predict(self.zbar_docs(docs))

    def topic_word(self) -> np.ndarray:
        """Topic-word probabilities E[phi] as (K, V); rows sum to one."""
        return self.state.topic_word()

    @property
    def vocabulary(self) -> list[str]:
        return self.vocab.words

    def top_words(self, topic: int, n: int = 10) -> list[str]:
        return top_words_of(self, topic, n)

    def heldout_loglik(self, docs: Sequence, seed: int = 0) -> float:
        """Mean per-token document-completion log-likelihood (80/20 split by word type)."""
        return heldout_of(self, docs, seed)

    def elbo(self) -> float:
        """Whole-data ELBO over the memoized cache (memoized update only)."""
        if not isinstance(self.updater, MemoizedUpdate):
            raise RuntimeError("elbo() is defined over the memoized cache; use update='memoized'")
        return self.updater.elbo(self.state)

    @property
    def version(self) -> int:
        return self.state.version

    # -- persistence (model_io) ---------------------------------------------------------
    def save(self, path, offsets: dict | None = None, extra: dict | None = None) -> int:
        """Write a snapshot (atomic); ``offsets`` records consumed stream positions with the state."""
        return model_io.save_model(self, path, offsets, extra)

    def snapshot_parts(self) -> tuple[dict, dict]:
        return model_io.snapshot_parts(self)

    @classmethod
    def from_snapshot_parts(cls, header: dict, arrays: dict) -> "TopicModel":
        return model_io.restore_model(cls, header, arrays)


def top_words_of(model: TopicModel, topic, n) -> list[str]:
    """``TopicModel.top_words``: topic ``topic``'s ``n`` most probable words, most probable first."""
    n = check_top_words(topic, n, model.n_topics)
    row = model.state.mu[: model.state.n_words, topic]
    n = min(n, row.size)
    if n == 0:
        return []
    idx = np.argpartition(-row, n - 1)[:n] if n < row.size else np.arange(row.size)
    idx = idx[np.argsort(-row[idx], kind="stable")]
    words = model.vocab.words
    return [words[i] for i in idx]


def check_top_words(topic, n, n_topics: int) -> int:
    """``top_words``' arguments checked (IndexError / ValueError naming them); returns ``n``."""
    if not is_integer(topic) or not 0 <= topic < n_topics:
        raise IndexError(f"topic must be an integer in [0, {n_topics}) (got {topic!r})")
    if not is_integer(n) or n < 0:
        raise ValueError(f"n must be an integer >= 0 (got {n!r})")
    return int(n)


def step_cuts(n_docs: int) -> list[tuple[int, int]]:
    """``partial_fit``'s parts of a call of ``n_docs`` documents: ceil(n_docs / STEP_DOCS) consecutive
    ranges of (nearly) equal size, at most STEP_DOCS each (docs/defaults.md §5)."""
    parts = max(1, -(-n_docs // STEP_DOCS))
    cut = [round(i * n_docs / parts) for i in range(parts + 1)]
    return list(zip(cut[:-1], cut[1:]))


def learn_tokens(model: TopicModel, tokens: list[list[str]], labels, batch_key) -> np.ndarray:
    """One learning step of ``model`` on tokenized documents; their prequential proportions."""
    batch = model.prepare(tokens, grow=True)
    if not model.state.initialized and batch.n_tokens == 0:  # no topics and no word: nothing to learn
        return np.full((batch.n_docs, model.n_topics), 1.0 / model.n_topics)
    return model.process(batch, learn=True, batch_key=batch_key, labels=labels).theta


def batch_labels(head: SupervisedHead | None, batch: Batch, labels):
    """``process``'s labels as a list of one per document, or None when there are none to learn."""
    if labels is None:
        return None
    if head is None:
        raise ValueError("labels given to a model without supervision (set supervision=...)")
    labels = list(labels)
    if len(labels) != batch.n_docs:
        raise ValueError(f"{len(labels)} labels for {batch.n_docs} documents")
    return None if all(is_missing(t) for t in labels) else labels


def predict_from(head: SupervisedHead | None, doc_topic: np.ndarray):
    """(scores, predictions) of a classifier on expected topic counts; (None, None) when untrained.
    A document with no topic mass (no word the model knows) gets a NaN score row and no prediction."""
    if not head_trained(head):
        return None, None
    Z = normalise_rows(doc_topic)
    return scores_or_nan(head, Z), head.predict(Z)


def without_unknown(doc_topic: np.ndarray, batch: Batch) -> np.ndarray:
    """``doc_topic`` with no mass for the documents none of whose words the vocabulary held before
    ``batch`` (``Batch.unknown_docs``): for predictions, which are the model's before the batch.
    Their local step gave the new words' prior-only rows, whose one difference between topics is
    the topic's size, so all their mass went to the smallest topic (and a label was read off it)."""
    blank = batch.unknown_docs
    if not blank.any():
        return doc_topic
    out = doc_topic.copy()
    out[blank] = 0.0
    return out


def scores_or_nan(head: SupervisedHead, zbar: np.ndarray) -> np.ndarray:
    """The head's scores of ``zbar``, a NaN row where a document has no topic mass (no known word)."""
    S = head.scores(zbar)
    S[no_topic_mass(zbar)] = np.nan
    return S


def head_trained(head: SupervisedHead | None) -> bool:
    """The classifier exists and has learned at least one label (it can predict)."""
    return head is not None and head.n_updates > 0 and head.n_labels > 0


def local_step_stats(batch: Batch, result, seconds: float) -> dict:
    """The diagnostics of a local step (``LocalResult``) on ``batch`` that took ``seconds``: what
    ``last_stats`` and a replica's computation report (the daemon's metrics read them)."""
    return {
        "docs": batch.n_docs, "tokens": batch.n_tokens, "dropped_tokens": batch.dropped_tokens,
        "evicted_words": int(batch.evicted.size),
        "mean_iterations": float(result.iterations.mean()) if result.iterations.size else 0.0,
        "iterations": result.iterations,
        "restarts_tried": result.restarts_tried, "restarts_accepted": result.restarts_accepted,
        "objective_per_token": result.objective / batch.n_tokens if batch.n_tokens else 0.0,
        "local_seconds": seconds, "docs_per_batch": max(batch.n_docs, 1), **result.stats,
    }


def _step_stats(batch: Batch, result, info: dict, times: tuple) -> dict:
    """``last_stats`` of one ``process`` step (times: start, local step done, update done, classifier done)."""
    t0, t1, t2, t3 = times
    return local_step_stats(batch, result, t1 - t0) | {"update_seconds": t2 - t1, "classifier_seconds": t3 - t2,
                                                       **info}


def flat_alpha_default(options) -> bool:
    """alpha=None means ``SUPERVISED_ALPHA``: a supervised model of the variational engine."""
    return options.supervision is not None and options.engine.kind == "lsparse"


def initial_alpha(alpha, n_topics: int, flat_default: bool) -> tuple[float, bool]:
    """(alpha to start from, whether it is learned): "auto" starts at 1/K (gensim's start) and
    is learned, as None is unless ``flat_default``; None with ``flat_default`` is
    ``SUPERVISED_ALPHA``, fixed (docs/supervised.md §9); a number is kept fixed."""
    if alpha == "auto" or (alpha is None and not flat_default):
        return 1.0 / n_topics, True
    return (SUPERVISED_ALPHA if alpha is None else float(alpha)), False


def equivalent_settings(params: dict) -> dict:
    """``params`` (``get_params``, or a snapshot's or an update record's copy) with each setting whose
    None stands for a value fixed by the other settings spelled as that value, so that two spellings of
    one model compare equal: beta None is 1/K; alpha None is "auto" (learned from 1/K) or
    ``SUPERVISED_ALPHA`` (fixed), as ``initial_alpha`` decides; table_draws None is max(K, 256). Numbers
    compare as floats (1 and 1.0 alike), tuples as lists. A None whose value depends on the data (sup_c, sup_ell, ...) is
    left as it is."""
    p = {k: list(v) if isinstance(v, tuple) else v for k, v in params.items()}  # as msgpack carries them
    K = p.get("n_topics")
    if not is_integer(K) or K < 1:
        return p
    if "beta" in p:
        p["beta"] = 1.0 / K if p["beta"] is None else _as_float(p["beta"])
    if "alpha" in p:
        flat = p.get("supervision") is not None and p.get("engine") == "lsparse"
        p["alpha"] = (SUPERVISED_ALPHA if flat else "auto") if p["alpha"] is None else _as_float(p["alpha"])
    if p.get("table_draws", 0) is None:
        p["table_draws"] = max(int(K), 256)
    return p


def settings_differences(theirs: dict, ours: dict, names) -> dict:
    """name -> (theirs, ours) for the ``names`` whose values differ by ``equivalent_settings``; a None
    that means another value only through another setting (beta None under another n_topics) is
    left to that setting (the spellings are equal). ``theirs`` may lack a name (None)."""
    a, b = equivalent_settings(theirs), equivalent_settings(ours)
    return {k: (theirs.get(k), ours[k]) for k in names if a.get(k) != b[k] and theirs.get(k) != ours[k]}


def _as_float(v):
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v


def learned_alpha(update, state, doc_topic: np.ndarray, n_docs: int) -> float:
    """alpha after this batch's (``n_docs`` documents) Newton step, on the stochastic schedule (the
    defaults' under a memoized update)."""
    u = update if isinstance(update, Stochastic) else Stochastic()
    rho = schedule_step(u.delay, u.forgetting_rate, u.rho_min, state.steps, n_docs)
    return alpha_step(state.alpha, doc_topic, rho)


def heldout_of(model: TopicModel, docs: Sequence, seed: int) -> float:
    """``TopicModel.heldout_loglik``: ``NotFittedError`` before any topics, ValueError when no word
    of ``docs`` is known to the model, or no document has two known word types (the mean over no
    tokens was a NaN with a numpy warning)."""
    require_topics(model.state)
    batch = model.prepare(model.tokenize(docs), grow=False)
    if batch.n_tokens == 0:
        raise ValueError("heldout_loglik: no word of these documents is in the model's vocabulary")
    if not (np.diff(batch.doc_ptr) >= 2).any():  # document completion needs two known word types
        raise ValueError("heldout_loglik: no document has two distinct words in the model's vocabulary "
                         "(each is split into words to condition on and words to predict)")
    return heldout_loglik_arrays(model.topic_word(), batch, model.state.alpha, seed=seed)


def check_docs_labels(head, docs, labels):
    """(docs, labels): as given without labels; with them, both as lists (any iterable, a
    generator too), one target per document, classification targets in the classifier's form
    (a one-label list is the label of a multi-class model, a label a one-label list for a
    multi-label one, as the daemon takes them; several labels for a multi-class model raise)."""
    if labels is None:
        return docs, None
    if head is None:
        raise ValueError("labels given to a model without supervision (set supervision=...)")
    if isinstance(labels, (str, bytes)) or not hasattr(labels, "__iter__"):
        raise TypeError("labels must be a sequence with one target per document")
    if isinstance(docs, (str, bytes)):
        raise TypeError("docs must be a sequence of documents (a list of str or of token lists), not one str")
    labels = column_targets(labels, head.task)
    docs, labels = list(docs), list(labels)
    if len(labels) != len(docs):
        raise ValueError(f"{len(labels)} labels for {len(docs)} documents")
    if head.task != "regression":
        labels, bad = conform_targets(labels, head.task)
        if bad:
            i, why = next(iter(bad.items()))
            raise ValueError(f"document {i}: {why}")
    return docs, labels


def column_targets(labels, task):
    """A numpy column (N, 1) of targets as its N targets, as scikit-learn's ``column_or_1d`` takes
    it; a wider 2-D array is refused with what to pass instead (a 0/1 indicator matrix carries
    no label names)."""
    if not isinstance(labels, np.ndarray) or labels.ndim < 2:
        return labels
    if labels.ndim == 2 and labels.shape[1] == 1:
        return labels[:, 0]
    raise ValueError(f"labels must be one target per document, got an array of shape {labels.shape}"
                     + (": for multi-label targets pass a list of label lists (an indicator matrix's "
                        "MultiLabelBinarizer.inverse_transform gives them)" if task != "regression" else ""))


def _check_top(n_topics, alpha, beta, init, init_smoothing, threads) -> None:
    """The settings outside the option objects."""
    resolve_threads(threads)  # ValueError unless None, 0 or an integer >= 1
    def need(cond, msg):
        if not cond:
            raise ValueError(msg)

    need(isinstance(n_topics, (int, np.integer)) and not isinstance(n_topics, bool) and n_topics >= 2,
         f"n_topics must be an integer >= 2 (got {n_topics!r})")
    def number(x) -> bool:  # finite: inf was taken and gave a useless model (uniform theta)
        return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)

    need(alpha is None or alpha == "auto" or (number(alpha) and alpha > 0),
         f"alpha must be a finite number > 0, 'auto' or None (got {alpha!r})")
    need(beta is None or (number(beta) and beta > 0), f"beta must be a finite number > 0 or None (1/K) (got {beta!r})")
    need(init in INITS, f"init must be one of {INITS} (got {init!r})")
    need(number(init_smoothing) and init_smoothing >= 0,
         f"init_smoothing must be a finite number >= 0 (got {init_smoothing!r})")


def load_snapshot(path) -> TopicModel:
    """Load a model saved by ``TopicModel.save`` (or by the daemon).  Raises SnapshotError on a bad file."""
    model = model_io.load_model(TopicModel, path)
    model.snapshot_info["path"] = str(Path(path))
    return model
