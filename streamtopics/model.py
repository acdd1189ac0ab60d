"""TopicModel: the library's public face.  It arranges calls; numeric work lives in kernels.

    m = TopicModel(n_topics=100, engine="lsparse", sparsity=8, update="stochastic")
    m.partial_fit(docs)              # one minibatch of raw texts or token lists
    m.fit(docs, labels=None)         # batch mode: memoized laps (lsparse) or Alias-MH sweeps (alias)
    theta = m.transform(docs)        # (n_docs, K), rows sum to one
    m.save("model.stsnap"); m2 = load_snapshot("model.stsnap")

The daemon uses the lower-level trio ``prepare`` (tokens -> Batch, growing the
vocabulary), ``process`` (local step, predictions before learning, then the global
update) and ``save(..., offsets=...)``.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from .batch import Batch, build_batch
from .engines.alias import ALPHA_PROPOSALS, PROPOSALS, AliasEngine, check_tries
from .engines.lsparse import LSparseEngine
from .evaluate import heldout_loglik_arrays
from .hyper import alpha_step
from .parallel import ThreadRunner, resolve_threads
from .snapshot import read_snapshot, write_snapshot
from .state import ModelState
from .supervised.classifier import LOSSES as SUP_LOSSES
from .supervised.classifier import SupervisedHead
from .supervised.classifier import is_missing as _label_missing
from .supervised.classifier import PG_CHOICES as PG_METHODS
from .summary import LocalResult, Summary
from .text import SEGMENTATIONS, Tokenizer, Vocabulary
from .trends import PrevalenceTracker
from .updates import MemoizedUpdate, StochasticUpdate, check_corpus_size

ENGINES = ("lsparse", "alias")
UPDATES = ("stochastic", "memoized")
INITS = ("kmeans++", "random")
SUP_FEATURES = ("unsupervised", "supervised")
SNAPSHOT_KIND = "streamtopics.TopicModel"
_TRANSFORM_CHUNK = 2048
FIT_MAX_LAPS = 10      # fit(): most memoized laps of the variational engine
FIT_TOL = 0.05         # fit(): stop when a lap raises its objective by less than this, relative
FIT_BATCH_SIZE = 256   # fit(): minibatch of the memoized laps
FIT_SWEEPS = 200       # fit(): sweeps of the alias engine


class TopicModel:
    """LDA learned from a stream of minibatches, with one shared model state.

    Parameters
    ----------
    n_topics : number of topics K.
    engine : local step; ``"lsparse"`` (L-sparse variational) or ``"alias"`` (Alias-MH sampler).
    sparsity : L, the most topics any word type of a document may use (L >= K is dense).
    update : ``"stochastic"`` (SVI) or ``"memoized"`` (MVI) global update.
    alpha, beta : per-topic document-topic and topic-word Dirichlet concentrations.
    seed : seeds initialisation (and any sampling engine).
    delay, forgetting_rate, rho_min, corpus_size : stochastic step size
        rho_t = max(rho_min, (delay + t)^-forgetting_rate) and effective corpus size D
        (None: documents seen so far).
    memo_window : memoized updates cache at most this many batch summaries (None: all);
        the oldest batch is forgotten past it.
    max_iter, tol, active_eps, restarts, restart_trials, restart_iters : local step.
    vocab_cap, vocab_policy, vocab_decay : vocabulary cap, ``"ignore"`` or ``"evict"`` words past
        it (eviction picks the rarest by a count decayed by ``vocab_decay`` per batch).
    min_word_len, max_word_len, stopwords : tokenizer for raw-text documents.
    segmentation : "whitespace" or "cjk_bigrams" (runs of Chinese/Japanese/Korean/Thai
        characters, written without spaces, become overlapping character bigrams).
    init : ``"kmeans++"`` seeds topics from K diverse documents of the first batch (as the
        paper does), ``"random"`` from random documents.
    burn_in, sample_sweeps, mh_steps, proposal, table_draws, alpha_proposal, tries : alias engine
        (see ``engines.alias.AliasEngine``): sweeps per minibatch before / while statistics are
        averaged, MH steps per token, "cycle" or "mixture" of the word and doc proposals,
        samples drawn per alias table before it is rebuilt (None: max(K, 256)), whether the
        doc proposal's alpha part is drawn from the word's table ("word") or uniformly, and
        candidates per MH step (multiple-try): an int for both step kinds or a (word, doc)
        pair; None: (2, 1) for K >= 256, else (1, 1).
    supervision : None (plain LDA) or ``"hinge"`` (max-margin, Gibbs MedLDA), ``"logistic"``
        (Polya-Gamma) or ``"regression"`` (eps-insensitive); ``partial_fit(docs, labels=...)``
        then learns topics that predict the labels (docs/supervised.md).
    sup_c, sup_ell, sup_epsilon : loss constants: regularisation constant c (the weight of the
        label term against the words), hinge margin ell, regression eps; None: they scale
        themselves (``supervised.scaling``, docs/supervised.md §7): c * unit = the mean labelled
        document length, ell = 1, eps = 1e-3 response sd.
    sup_prior_var : nu^2 of the classifier prior eta_yk ~ N(0, nu^2); None: K unit^2 (scaling).
    sup_decay : weight kept by the classifier's carried statistics per labelled batch (1 = exact
        streaming posterior, < 1 forgets old batches).
    sup_sweeps, sup_burn_in : Gibbs sweeps of the classifier per labelled batch, and those discarded.
    sup_pg_method : Polya-Gamma sampler for the logistic loss ("exact", "gamma_sum", or "auto":
        exact for c <= 8, else the gamma sum, whose cost does not grow with c).
    sup_max_labels : cap of the label vocabulary (None: unbounded); labels past it raise.
    sup_features : which topic proportions of a labelled batch train the classifier:
        ``"unsupervised"`` (the label-free local step, the features used at prediction time)
        or ``"supervised"`` (the local step that saw the labels).
    sup_local : whether the variational local step of a labelled batch includes the label term
        (False: topics are learned unsupervised and only the classifier sees the labels).
    threads : threads of the variational local step (``partial_fit``, ``transform``, ``predict``):
        a minibatch's documents are split over them.  None (or 0): the cores this process may
        use (its CPU affinity).  The model is the same bit for bit whatever the number.
    """

    def __init__(self, n_topics: int = 100, engine: str = "lsparse", sparsity: int = 8,
                 update: str = "stochastic", alpha: float | str = "auto", beta: float = 0.01, seed: int = 0, *,
                 delay: float = 10.0, forgetting_rate: float = 0.7, rho_min: float = 0.0,
                 corpus_size: int | str | None = None, memo_window: int | None = 256,
                 max_iter: int = 100, tol: float = 0.05, active_eps: float = 0.01, restarts: bool = True,
                 restart_trials: int = 2, restart_iters: int = 2,
                 vocab_cap: int | None = 200000, vocab_policy: str = "ignore", vocab_decay: float = 0.999,
                 min_word_len: int = 2, max_word_len: int = 30, stopwords="english", init: str = "kmeans++",
                 init_smoothing: float = 1.0, burn_in: int = 4, sample_sweeps: int = 4, mh_steps: int = 2,
                 proposal: str = "cycle", table_draws: int | None = None, alpha_proposal: str = "word",
                 tries: int | None = None,
                 supervision: str | None = None, sup_c: float | None = None, sup_ell: float | None = None,
                 sup_epsilon: float | None = None, sup_prior_var: float | None = None, sup_decay: float = 1.0,
                 sup_sweeps: int = 10, sup_burn_in: int | None = None, sup_pg_method: str = "auto",
                 sup_max_labels: int | None = None, sup_features: str = "unsupervised", sup_local: bool = True,
                 segmentation: str = "whitespace", threads: int | None = None):
        self.n_topics = n_topics
        self.engine = engine
        self.sparsity = sparsity
        self.update = update
        self.alpha = alpha
        self.beta = beta
        self.seed = seed
        self.delay = delay
        self.forgetting_rate = forgetting_rate
        self.rho_min = rho_min
        self.corpus_size = corpus_size
        self.memo_window = memo_window
        self.max_iter = max_iter
        self.tol = tol
        self.active_eps = active_eps
        self.restarts = restarts
        self.restart_trials = restart_trials
        self.restart_iters = restart_iters
        self.vocab_cap = vocab_cap
        self.vocab_policy = vocab_policy
        self.vocab_decay = vocab_decay
        self.min_word_len = min_word_len
        self.max_word_len = max_word_len
        self.stopwords = stopwords
        self.init = init
        self.init_smoothing = init_smoothing
        self.burn_in = burn_in
        self.sample_sweeps = sample_sweeps
        self.mh_steps = mh_steps
        self.proposal = proposal
        self.table_draws = table_draws
        self.alpha_proposal = alpha_proposal
        self.tries = tries
        self.supervision = supervision
        self.sup_c = sup_c
        self.sup_ell = sup_ell
        self.sup_epsilon = sup_epsilon
        self.sup_prior_var = sup_prior_var
        self.sup_decay = sup_decay
        self.sup_sweeps = sup_sweeps
        self.sup_burn_in = sup_burn_in
        self.sup_pg_method = sup_pg_method
        self.sup_max_labels = sup_max_labels
        self.sup_features = sup_features
        self.sup_local = sup_local
        self.segmentation = segmentation
        self.threads = threads
        self._validate()
        self._build()

    _PARAMS = ("n_topics", "engine", "sparsity", "update", "alpha", "beta", "seed", "delay", "forgetting_rate",
               "rho_min", "corpus_size", "memo_window", "max_iter", "tol", "active_eps", "restarts",
               "restart_trials", "restart_iters", "vocab_cap", "vocab_policy", "vocab_decay", "min_word_len",
               "max_word_len", "stopwords", "init", "init_smoothing", "burn_in", "sample_sweeps", "mh_steps",
               "proposal", "table_draws", "alpha_proposal", "tries", "supervision", "sup_c", "sup_ell",
               "sup_epsilon", "sup_prior_var", "sup_decay", "sup_sweeps", "sup_burn_in", "sup_pg_method", "sup_max_labels",
               "sup_features", "sup_local", "segmentation", "threads")

    def get_params(self) -> dict:
        p = {name: getattr(self, name) for name in self._PARAMS}
        if not isinstance(p["stopwords"], str) and p["stopwords"] is not None:
            p["stopwords"] = sorted(p["stopwords"])
        return p

    def _validate(self) -> None:
        def need(cond, msg):
            if not cond:
                raise ValueError(msg)

        need(isinstance(self.n_topics, (int, np.integer)) and self.n_topics >= 2,
             f"n_topics must be an integer >= 2 (got {self.n_topics!r})")
        need(self.engine in ENGINES, f"engine must be one of {ENGINES} (got {self.engine!r})")
        need(self.update in UPDATES, f"update must be one of {UPDATES} (got {self.update!r})")
        need(isinstance(self.sparsity, (int, np.integer)) and self.sparsity >= 1,
             f"sparsity must be an integer >= 1 (got {self.sparsity!r})")
        need(self.alpha == "auto" or (isinstance(self.alpha, (int, float, np.integer, np.floating)) and self.alpha > 0),
             f"alpha must be > 0 or 'auto' (got {self.alpha!r})")
        need(self.beta > 0, f"beta must be > 0 (got {self.beta!r})")
        need(self.max_iter >= 1, f"max_iter must be >= 1 (got {self.max_iter!r})")
        need(self.tol > 0, f"tol must be > 0 (got {self.tol!r})")
        need(self.active_eps >= 0, f"active_eps must be >= 0 (got {self.active_eps!r})")
        need(self.init in INITS, f"init must be one of {INITS} (got {self.init!r})")
        need(self.init_smoothing >= 0, f"init_smoothing must be >= 0 (got {self.init_smoothing!r})")
        need(self.delay >= 0, f"delay must be >= 0 (got {self.delay!r})")
        need(0.5 < self.forgetting_rate <= 1.0, f"forgetting_rate must be in (0.5, 1] (got {self.forgetting_rate!r})")
        need(0.0 <= self.rho_min < 1.0, f"rho_min must be in [0, 1) (got {self.rho_min!r})")
        check_corpus_size(self.corpus_size)  # ValueError with the message
        need(self.memo_window is None or self.memo_window >= 1,
             f"memo_window must be None or >= 1 batches (got {self.memo_window!r})")
        need(self.restart_trials >= 0, f"restart_trials must be >= 0 (got {self.restart_trials!r})")
        need(self.restart_iters >= 1, f"restart_iters must be >= 1 (got {self.restart_iters!r})")
        need(self.vocab_cap is None or self.vocab_cap >= 1, f"vocab_cap must be None or >= 1 (got {self.vocab_cap!r})")
        need(self.vocab_policy in Vocabulary.POLICIES,
             f"vocab_policy must be one of {Vocabulary.POLICIES} (got {self.vocab_policy!r})")
        need(0.0 < self.vocab_decay <= 1.0, f"vocab_decay must be in (0, 1] (got {self.vocab_decay!r})")
        need(self.min_word_len >= 1, f"min_word_len must be >= 1 (got {self.min_word_len!r})")
        need(self.max_word_len >= self.min_word_len,
             f"max_word_len must be >= min_word_len (got {self.max_word_len!r} < {self.min_word_len!r})")
        need(isinstance(self.burn_in, (int, np.integer)) and self.burn_in >= 0,
             f"burn_in must be an integer >= 0 (got {self.burn_in!r})")
        need(isinstance(self.sample_sweeps, (int, np.integer)) and self.sample_sweeps >= 1,
             f"sample_sweeps must be an integer >= 1 (got {self.sample_sweeps!r})")
        need(isinstance(self.mh_steps, (int, np.integer)) and self.mh_steps >= 1,
             f"mh_steps must be an integer >= 1 (got {self.mh_steps!r})")
        need(self.proposal in PROPOSALS, f"proposal must be one of {PROPOSALS} (got {self.proposal!r})")
        need(self.table_draws is None or (isinstance(self.table_draws, (int, np.integer)) and self.table_draws >= 1),
             f"table_draws must be None or an integer >= 1 (got {self.table_draws!r})")
        need(self.alpha_proposal in ALPHA_PROPOSALS,
             f"alpha_proposal must be one of {ALPHA_PROPOSALS} (got {self.alpha_proposal!r})")
        self.tries = check_tries(self.tries)  # None or a (word, doc) pair; ValueError otherwise
        need(self.supervision is None or self.supervision in SUP_LOSSES,
             f"supervision must be None or one of {tuple(SUP_LOSSES)} (got {self.supervision!r})")
        for name in ("sup_c", "sup_ell", "sup_epsilon"):
            v = getattr(self, name)
            need(v is None or (isinstance(v, (int, float, np.integer, np.floating)) and np.isfinite(v) and v >= 0),
                 f"{name} must be None or a finite number >= 0 (got {v!r})")
        need(self.sup_c is None or self.sup_c > 0, f"sup_c must be > 0 (got {self.sup_c!r})")
        need(not (self.supervision == "hinge" and self.sup_ell is not None and self.sup_ell <= 0),
             f"sup_ell must be > 0 for the hinge loss (got {self.sup_ell!r})")
        need(not (self.supervision == "logistic" and self.sup_pg_method == "exact"
                  and self.sup_c is not None and self.sup_c < 1),
             f"exact Polya-Gamma sampling needs sup_c >= 1 (got {self.sup_c!r}); use sup_pg_method='gamma_sum'")
        need(self.sup_prior_var is None or (isinstance(self.sup_prior_var, (int, float, np.integer, np.floating))
                                            and np.isfinite(self.sup_prior_var) and self.sup_prior_var > 0),
             f"sup_prior_var must be > 0 (got {self.sup_prior_var!r})")
        need(0.0 < self.sup_decay <= 1.0, f"sup_decay must be in (0, 1] (got {self.sup_decay!r})")
        need(isinstance(self.sup_sweeps, (int, np.integer)) and self.sup_sweeps >= 1,
             f"sup_sweeps must be an integer >= 1 (got {self.sup_sweeps!r})")
        need(self.sup_burn_in is None or (isinstance(self.sup_burn_in, (int, np.integer)) and self.sup_burn_in >= 0),
             f"sup_burn_in must be None or an integer >= 0 (got {self.sup_burn_in!r})")
        need(self.sup_pg_method in PG_METHODS, f"sup_pg_method must be one of {tuple(PG_METHODS)} "
                                               f"(got {self.sup_pg_method!r})")
        need(self.sup_max_labels is None or (isinstance(self.sup_max_labels, (int, np.integer))
                                             and self.sup_max_labels >= 1),
             f"sup_max_labels must be None or an integer >= 1 (got {self.sup_max_labels!r})")
        need(self.sup_features in SUP_FEATURES, f"sup_features must be one of {SUP_FEATURES} "
                                                f"(got {self.sup_features!r})")
        need(isinstance(self.sup_local, (bool, np.bool_)), f"sup_local must be a bool (got {self.sup_local!r})")
        need(self.segmentation in SEGMENTATIONS,
             f"segmentation must be one of {SEGMENTATIONS} (got {self.segmentation!r})")
        resolve_threads(self.threads)  # ValueError unless None, 0 or an integer >= 1

    def _build(self) -> None:
        self.tokenizer = Tokenizer(self.min_word_len, self.max_word_len, self.stopwords, self.segmentation)
        self.vocab = Vocabulary(cap=self.vocab_cap, policy=self.vocab_policy, decay=self.vocab_decay)
        self.state = ModelState(self.n_topics, self._initial_alpha(), self.beta)
        if self.engine == "alias":
            # Seeds come from self.rng at call time (late binding: load_snapshot replaces self.rng).
            self.local_step = AliasEngine(
                burn_in=int(self.burn_in), sample_sweeps=int(self.sample_sweeps), mh_steps=int(self.mh_steps),
                proposal=self.proposal, table_draws=None if self.table_draws is None else int(self.table_draws),
                alpha_proposal=self.alpha_proposal, tries=self.tries,
                seed_source=lambda: int(self.rng.integers(1 << 62)))
        else:
            self.local_step = LSparseEngine(
                sparsity=int(self.sparsity), max_iter=int(self.max_iter), tol=float(self.tol),
                active_eps=float(self.active_eps), restart_trials=int(self.restart_trials) if self.restarts else 0,
                restart_iters=int(self.restart_iters), runner=ThreadRunner(self.threads))
        if self.update == "stochastic":
            self.updater = StochasticUpdate(self.delay, self.forgetting_rate, self.rho_min, self.corpus_size)
        else:
            self.updater = MemoizedUpdate(self.memo_window)
        self.rng = np.random.default_rng(self.seed)
        self._auto_key = 0
        self.last_stats: dict = {}
        self.head = self._new_head()
        self.trends = PrevalenceTracker(self.n_topics)  # per-topic prevalence per learned batch

    def _initial_alpha(self) -> float:
        """alpha="auto" starts at 1/K (gensim's start) and is learned; a number is kept fixed."""
        return 1.0 / self.n_topics if self.alpha == "auto" else float(self.alpha)

    def _new_head(self) -> SupervisedHead | None:
        if self.supervision is None:
            return None
        return SupervisedHead(
            self.n_topics, self.supervision, c=_auto(self.sup_c), ell=_auto(self.sup_ell),
            epsilon=_auto(self.sup_epsilon), prior_var=_auto(self.sup_prior_var), decay=float(self.sup_decay), gibbs_sweeps=int(self.sup_sweeps),
            burn_in=None if self.sup_burn_in is None else int(self.sup_burn_in),
            seed=int(np.random.SeedSequence([int(self.seed), 5]).generate_state(1)[0]),
            pg_method=self.sup_pg_method, max_labels=self.sup_max_labels,
            memo_window=self.memo_window if self.update == "memoized" else None)

    def set_threads(self, threads: int | None) -> None:
        """Change the number of threads (None or 0: the available cores); results do not depend on it."""
        resolve_threads(threads)
        self.threads = threads
        old = getattr(self.local_step, "runner", None)
        if old is not None:
            old.close()
            self.local_step.runner = ThreadRunner(threads)

    # -- documents --------------------------------------------------------------------
    def tokenize(self, docs: Sequence) -> list[list[str]]:
        """Raw strings go through the tokenizer; token lists are taken as given."""
        if isinstance(docs, (str, bytes)):
            raise TypeError("docs must be a sequence of documents (a list of str or of token lists), not one str")
        out = []
        for i, d in enumerate(docs):
            if isinstance(d, str):
                out.append(self.tokenizer(d))
            elif isinstance(d, (list, tuple)):
                if not all(issubclass(t, str) for t in set(map(type, d))):
                    raise TypeError(f"document {i}: a token list must contain only str")
                out.append(list(d))
            else:
                raise TypeError(f"document {i}: expected str or list[str], got {type(d).__name__}")
        return out

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
        return self.vocab.mark(), self.state.n_words, self.state.version

    def undo_prepare(self, mark: tuple) -> bool:
        """Undo ``prepare(grow=True)`` calls since ``mark`` when no update ran since (a failed
        step): new words and count updates go. False, changing nothing, when it cannot be undone
        (an update ran, or words were evicted)."""
        vmark, n_words, version = mark
        if self.state.version != version or not self.vocab.rollback(vmark):
            return False
        self.state.shrink_words(n_words)
        return True

    # -- learning ---------------------------------------------------------------------
    def process(self, batch: Batch, learn: bool = True, batch_key=None, labels=None, head_key=None) -> LocalResult:
        """Local step on ``batch`` with the current topics, then (if ``learn``) the global update.

        The returned ``doc_topic`` counts were computed *before* the update and without the
        labels: they are the prequential predictions for these documents.  ``result.scores``
        ((n_docs, n_labels) or None) and ``result.predicted`` (one prediction per document, or
        None) come from them and the classifier as it was before this batch.

        ``labels`` (supervised models): one target per document, None where a document has
        none.  A labelled batch runs the supervised local step (the label term in the local
        weights) for learning the topics, then trains the classifier.
        """
        t0 = time.perf_counter()
        head = self.head
        alpha_used = self.state.alpha
        if labels is not None:
            if head is None:
                raise ValueError("labels given to a model without supervision (set supervision=...)")
            labels = list(labels)
            if len(labels) != batch.n_docs:
                raise ValueError(f"{len(labels)} labels for {batch.n_docs} documents")
            if all(_label_missing(t) for t in labels):
                labels = None
        if learn and not self.state.initialized and batch.n_tokens > 0:
            self._initialize(batch)
        sup_step = learn and labels is not None and batch.n_docs > 0
        if sup_step and self.sup_local:
            # prequential: the label-free local step gives the predictions and the returned theta
            pre = self.local_step.infer(self.state, batch, summarize=False)
            scores, predicted = self._predict_from(pre.doc_topic)
            targets = head.encode_targets(labels, grow=True)
            head.calibrate(_doc_lengths(batch), targets)  # self-scaling constants see this batch first
            result = self.local_step.infer(self.state, batch, summarize=True, head=head, targets=targets)
        elif sup_step:
            # sup_local=False: the label-free step is both the prediction and the learning step
            result = pre = self.local_step.infer(self.state, batch, summarize=True)
            scores, predicted = self._predict_from(pre.doc_topic)
            head.calibrate(_doc_lengths(batch), head.encode_targets(labels, grow=True))
        else:
            result = pre = self.local_step.infer(self.state, batch, summarize=learn)
            scores, predicted = self._predict_from(pre.doc_topic)
        t1 = time.perf_counter()
        info: dict = {}
        if learn and batch.n_docs > 0:
            batch_key = self._memo_key(batch_key)
            # A sampler's objective is not the variational one the memoized update compares.
            info = self._apply(result.summary, None if self.engine == "alias" else result.objective, batch_key)
            if self.alpha == "auto":
                rho = max(self.rho_min, (self.delay + self.state.n_updates + 1) ** -self.forgetting_rate)
                self.state.alpha = alpha_step(self.state.alpha, pre.doc_topic, rho)
                info["alpha"] = self.state.alpha
            self.state.docs_seen += batch.n_docs
            self.state.tokens_seen += batch.n_tokens
            self.state.n_updates += 1
            self.state.version += 1
            self.trends.observe(pre.doc_topic.sum(axis=0), self.state.version)
        t2 = time.perf_counter()
        if sup_step:
            feats = pre.doc_topic if self.sup_features == "unsupervised" else result.doc_topic
            # head_key (fit's stochastic laps): a revisited batch replaces its classifier statistics
            info["supervised"] = head.update(_normalise_rows(feats), labels,
                                             batch_key=batch_key if batch_key is not None else head_key)
            if result is not pre:
                result.doc_topic_supervised = result.doc_topic
                result.doc_topic = pre.doc_topic
        t3 = time.perf_counter()
        result.scores = scores
        result.predicted = predicted
        result.alpha = alpha_used
        n_active = max(batch.n_docs, 1)
        self.last_stats = {
            "docs": batch.n_docs, "tokens": batch.n_tokens, "dropped_tokens": batch.dropped_tokens,
            "evicted_words": int(batch.evicted.size),
            "mean_iterations": float(result.iterations.mean()) if result.iterations.size else 0.0,
            "iterations": result.iterations,
            "restarts_tried": result.restarts_tried, "restarts_accepted": result.restarts_accepted,
            "objective_per_token": result.objective / batch.n_tokens if batch.n_tokens else 0.0,
            "local_seconds": t1 - t0, "update_seconds": t2 - t1, "docs_per_batch": n_active,
            "classifier_seconds": t3 - t2,
            **result.stats, **info,
        }
        return result

    def _memo_key(self, batch_key):
        """The key a learned batch is memoized under: None for a stochastic update (nothing is
        ever revisited, so neither the topic updater nor the supervised head keeps a record),
        the given or an automatic key for a memoized one (the head shares the updater's keys)."""
        if batch_key is not None and (not isinstance(batch_key, (str, int)) or isinstance(batch_key, bool)):
            raise TypeError(f"batch_key must be str or int (got {type(batch_key).__name__})")
        if self.update != "memoized":
            return None
        if batch_key is None:
            batch_key = f"auto-{self._auto_key}"
            self._auto_key += 1
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
        docs = self._check_docs_labels(docs, labels)
        batch = self.prepare(self.tokenize(docs), grow=True)
        self.process(batch, learn=True, batch_key=batch_key, labels=labels)
        return self

    def _check_docs_labels(self, docs, labels):
        if labels is None:
            return docs
        if self.head is None:
            raise ValueError("labels given to a model without supervision (set supervision=...)")
        if isinstance(labels, (str, bytes)) or not hasattr(labels, "__len__"):
            raise TypeError("labels must be a sequence with one target per document")
        if isinstance(docs, (str, bytes)):
            raise TypeError("docs must be a sequence of documents (a list of str or of token lists), not one str")
        docs = list(docs)
        if len(labels) != len(docs):
            raise ValueError(f"{len(labels)} labels for {len(docs)} documents")
        return docs

    def fit(self, docs: Sequence, labels=None, *, n_iter: int | None = None, tol: float = FIT_TOL,
            batch_size: int = FIT_BATCH_SIZE, n_sweeps: int | None = None) -> "TopicModel":
        """Batch mode, sklearn-style, for every engine: learn from ``docs`` held in memory.  Returns self.

        Starts from scratch (fresh vocabulary, state and classifier; random generator reset to
        ``seed``).  ``labels`` (supervised models, same forms as ``partial_fit``) learn
        supervised topics and the classifier.  The keywords mean the same thing for both engines:

        * ``engine="lsparse"`` - laps over the corpus cut, in the given order, into minibatches of
          ``batch_size``; each lap is one ``partial_fit(batch, labels)`` per minibatch.  With
          ``update="memoized"`` that is Hughes & Sudderth's batch setting: stable keys 0, 1, ...,
          so a lap replaces every batch's summary (and its classifier statistics), and ``fit``
          equals the same laps of ``partial_fit(..., batch_key=i)`` exactly; the cache stays,
          so later keyed ``partial_fit`` calls continue the laps (a corpus of more than
          ``memo_window`` batches needs ``memo_window=None``).  With ``update="stochastic"`` (the
          default) the laps are the model's own stochastic updates, step size and effective
          corpus size as configured, and the classifier keeps one record per batch (key i), so a
          lap replaces a batch's classifier statistics instead of counting its documents again
          (without that, laps degraded 20NG hinge from 0.81 to 0.76 and the synthetic
          regression from 0.84 to 0.78 of the oracle's R^2).  (On 20NG
          with labels, K = 100, memoized laps from scratch settle in a worse optimum: test
          accuracy 0.74, against 0.82 after two stochastic laps.)
          ``n_iter`` is the most laps (default ``FIT_MAX_LAPS``).  Stopping rule: after lap
          t >= 2, stop when the lap objective rose by less than ``tol`` relative,
          (F_t - F_{t-1}) / |F_{t-1}| < tol, where F is the whole-data ELBO (memoized) or the
          lap's mean local objective per token (stochastic; each batch measured at its local
          step, before its update).
        * ``engine="alias"`` - ``n_iter`` collapsed Alias-MH sweeps (default ``FIT_SWEEPS``) from
          a uniform random start (the papers' Gibbs setting); the shared state is then the
          last sample, lambda = beta + n_kw.  ``tol`` and ``batch_size`` do not apply (a
          sampler has no monotone objective to stop on).  ``n_sweeps`` is accepted as the
          old name of ``n_iter``.  With labels: the supervised batch mode of LightMedLDA -
          each sweep draws the augmentation, then the topics by word/doc/exp proposal MH
          against the regularised conditional, then one coordinate-wise Gibbs sweep of eta;
          the eta samples of the second half are averaged.  With ``sup_features="unsupervised"``
          (default) the classifier is then refitted on the training documents' topic
          proportions from the label-free local step - the features ``predict`` computes
          for new documents - starting from the chain's eta.

        Timings, laps / MH statistics and the objective trace are left in ``last_stats``.
        """
        if n_sweeps is not None:
            if n_iter is not None and n_iter != n_sweeps:
                raise ValueError(f"n_iter={n_iter!r} and n_sweeps={n_sweeps!r} disagree (n_sweeps is n_iter's old name)")
            n_iter = n_sweeps
        if n_iter is not None and (isinstance(n_iter, bool) or not isinstance(n_iter, (int, np.integer))
                                   or n_iter < 1):
            raise ValueError(f"n_iter must be an integer >= 1 (got {n_iter!r})")
        if labels is not None:
            if self.head is None:
                raise ValueError("labels given to a model without supervision: TopicModel(supervision='hinge' | "
                                 "'logistic' | 'regression') (supervised topics)")
            docs = self._check_docs_labels(docs, labels)
            labels = list(labels)
            if all(_label_missing(t) for t in labels):
                labels = None
        if self.engine != "alias":
            return self._fit_laps(docs, labels, FIT_MAX_LAPS if n_iter is None else int(n_iter), tol, batch_size)
        n_sweeps = FIT_SWEEPS if n_iter is None else int(n_iter)
        self._build()
        batch = self.prepare(self.tokenize(docs), grow=True)
        seed = int(self.rng.integers(1 << 62))
        if labels is None:
            self.last_stats = self.local_step.fit_state(self.state, batch, int(n_sweeps), seed=seed)
            return self
        t0 = time.perf_counter()
        targets = self.head.encode_targets(labels, grow=True)
        self.head.calibrate(_doc_lengths(batch), targets)
        stats = self.local_step.fit_state(self.state, batch, int(n_sweeps), seed=seed, head=self.head,
                                          targets=targets, eta_sweeps=1)
        if self.sup_features == "unsupervised":
            # Refit eta on test-time features: theta of each training document from the
            # label-free local step with the learned topics, warm-started at the chain's eta.
            t1 = time.perf_counter()
            chain = self.head
            head = self._new_head()
            head.calibrate(_doc_lengths(batch), head.encode_targets(labels, grow=True))
            head.eta[:] = chain.eta
            head.n_calls = chain.n_calls
            zbar = np.empty((batch.n_docs, self.n_topics))
            for lo in range(0, batch.n_docs, _TRANSFORM_CHUNK):
                hi = min(lo + _TRANSFORM_CHUNK, batch.n_docs)
                zbar[lo:hi] = _normalise_rows(
                    self.local_step.infer(self.state, _slice_batch(batch, lo, hi), summarize=False).doc_topic)
            head.update(zbar, labels, n_sweeps=max(int(self.sup_sweeps), 20))
            self.head = head
            stats["refit_seconds"] = time.perf_counter() - t1
        stats["fit_seconds"] = time.perf_counter() - t0
        self.last_stats = stats
        return self

    def _fit_laps(self, docs, labels, max_laps: int, tol: float, batch_size: int) -> "TopicModel":
        """``fit`` of the variational engine: laps of ``process`` over fixed minibatches (see ``fit``)."""
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1 (got {batch_size!r})")
        if not (isinstance(tol, (int, float, np.integer, np.floating)) and tol >= 0):
            raise ValueError(f"tol must be a number >= 0 (got {tol!r})")
        self._build()
        tokens = self.tokenize(docs)
        memoized = isinstance(self.updater, MemoizedUpdate)
        spans = [(lo, min(lo + batch_size, len(tokens))) for lo in range(0, len(tokens), batch_size)]
        batches: list = [None] * len(spans)
        trace: list[float] = []
        converged = False
        t0 = time.perf_counter()
        for lap in range(max_laps):
            objective = n_tokens = 0.0
            for i, (lo, hi) in enumerate(spans):
                # Batches are reused across laps unless a vocabulary cap may evict words (then rebuilt).
                batch = batches[i] if batches[i] is not None else self.prepare(tokens[lo:hi], grow=True)
                if self.vocab_cap is None:
                    batches[i] = batch
                result = self.process(batch, learn=True, batch_key=i if memoized else None,
                                      labels=None if labels is None else labels[lo:hi], head_key=i)
                objective += result.objective
                n_tokens += batch.n_tokens
            # memoized: the whole-data ELBO; stochastic: the lap's local objective per token
            trace.append(self.updater.elbo(self.state) if memoized else objective / max(n_tokens, 1.0))
            if lap >= 1 and (trace[-1] - trace[-2]) < tol * abs(trace[-2]):
                converged = True
                break
        self.last_stats = {"laps": len(trace), "objective": trace, "converged": converged, "batches": len(spans),
                           "fit_seconds": time.perf_counter() - t0,
                           "objective_kind": "elbo" if memoized else "local objective per token"}
        return self

    def partial_fit_transform(self, docs: Sequence, labels=None, batch_key=None) -> np.ndarray:
        """Prequential step: document-topic proportions under the model *before* learning from docs."""
        docs = self._check_docs_labels(docs, labels)
        batch = self.prepare(self.tokenize(docs), grow=True)
        result = self.process(batch, learn=True, batch_key=batch_key, labels=labels)
        return self.theta(result.doc_topic, result.alpha)

    def _initialize(self, batch: Batch) -> None:
        """Seed topic k from a document of the first batch (k-means++ over tf vectors, cosine distance)."""
        K = self.n_topics
        D, U = batch.n_docs, batch.uniq.size
        rng = self.rng
        rows = np.repeat(np.arange(D), np.diff(batch.doc_ptr))
        pool = np.flatnonzero(np.diff(batch.doc_ptr) > 0)
        if pool.size > 1024:
            pool = np.sort(rng.choice(pool, 1024, replace=False))
        X = np.zeros((D, U), dtype=np.float32)
        X[rows, batch.local] = batch.counts
        X = X[pool]
        X /= np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-12)
        chosen = np.empty(K, dtype=np.int64)
        chosen[0] = rng.integers(pool.size)
        if self.init == "kmeans++":
            dist = np.maximum(1.0 - X @ X[chosen[0]], 0.0)
            for k in range(1, K):
                p = dist ** 2
                total = p.sum()
                chosen[k] = rng.choice(pool.size, p=p / total) if total > 1e-12 else rng.integers(pool.size)
                dist = np.minimum(dist, np.maximum(1.0 - X @ X[chosen[k]], 0.0))
        else:
            chosen[1:] = rng.integers(pool.size, size=K - 1)
        st = self.state
        # Every (word, topic) starts with ~init_smoothing pseudo-counts (Gamma(100, 1/100)
        # noise as in Hoffman et al.); the noise also breaks ties between topics seeded alike.
        st.smoothing = float(self.init_smoothing)
        st.mu[: st.n_words] = st.smoothing
        if st.smoothing > 0:
            st.mu[batch.uniq] = rng.gamma(100.0, st.smoothing / 100.0, size=(U, K))
        else:
            st.mu[batch.uniq] += rng.gamma(1.0, st.beta, size=(U, K))
        for k, p in enumerate(pool[chosen]):
            s, e = batch.doc_ptr[p], batch.doc_ptr[p + 1]
            st.mu[batch.word_ids[s:e], k] += batch.counts[s:e]
        st.refresh_totals()
        st.initialized = True

    # -- inference --------------------------------------------------------------------
    def theta(self, doc_topic: np.ndarray, alpha: float | None = None) -> np.ndarray:
        """E[pi_d] = (N_dk + alpha) / (N_d + K alpha) from expected topic counts; ``alpha``: the one the
        counts were computed with (``LocalResult.alpha``) when it may have moved since (alpha="auto")."""
        a = self.state.alpha if alpha is None else alpha
        return (doc_topic + a) / (doc_topic.sum(axis=1, keepdims=True) + self.n_topics * a)

    def transform_batch(self, batch: Batch) -> np.ndarray:
        out = np.empty((batch.n_docs, self.n_topics))
        for lo in range(0, batch.n_docs, _TRANSFORM_CHUNK):
            hi = min(lo + _TRANSFORM_CHUNK, batch.n_docs)
            part = _slice_batch(batch, lo, hi)
            out[lo:hi] = self.theta(self.local_step.infer(self.state, part, summarize=False).doc_topic)
        return out

    def transform(self, docs: Sequence) -> np.ndarray:
        """Document-topic proportions (n_docs, K) under the current topics; rows sum to one."""
        return self.transform_batch(self.prepare(self.tokenize(docs), grow=False))

    # -- supervised prediction ----------------------------------------------------------
    @property
    def label_names(self) -> list[str]:
        """Labels known to the classifier, in score-column order (empty for regression / unsupervised)."""
        if self.head is None or self.head.task == "regression":
            return []
        return list(self.head.labels.labels)

    def _predict_from(self, doc_topic: np.ndarray):
        """(scores, predictions) of the classifier on expected topic counts; (None, None) when untrained."""
        head = self.head
        if head is None or head.n_updates == 0 or head.n_labels == 0:
            return None, None
        Z = _normalise_rows(doc_topic)
        return head.scores(Z), head.predict(Z)

    def _zbar_docs(self, docs: Sequence) -> np.ndarray:
        """Topic proportions of new documents from the unsupervised local step (the classifier's features)."""
        batch = self.prepare(self.tokenize(docs), grow=False)
        out = np.empty((batch.n_docs, self.n_topics))
        for lo in range(0, batch.n_docs, _TRANSFORM_CHUNK):
            hi = min(lo + _TRANSFORM_CHUNK, batch.n_docs)
            part = _slice_batch(batch, lo, hi)
            out[lo:hi] = _normalise_rows(self.local_step.infer(self.state, part, summarize=False).doc_topic)
        return out

    def _need_head(self) -> SupervisedHead:
        if self.head is None:
            raise RuntimeError("this model has no supervision (set supervision=... and train with labels)")
        return self.head

    def predict_scores(self, docs: Sequence) -> np.ndarray:
        """Per-label scores eta_y^T zbar_d, (n_docs, n_labels) in ``label_names`` order
        (regression: (n_docs, 1), the predicted response).  zbar_d comes from the unsupervised
        local step with the current topics; eta is the average of the retained samples."""
        head = self._need_head()
        return head.scores(self._zbar_docs(docs))

    def predict(self, docs: Sequence) -> list:
        """Predicted label per document (multi-class: str, None before any label was seen;
        multi-label: list[str] of the labels with a positive score; regression: float)."""
        head = self._need_head()
        return head.predict(self._zbar_docs(docs))

    def topic_word(self) -> np.ndarray:
        """Topic-word probabilities E[phi] as (K, V); rows sum to one."""
        return self.state.topic_word()

    @property
    def vocabulary(self) -> list[str]:
        return self.vocab.words

    def top_words(self, topic: int, n: int = 10) -> list[str]:
        if not 0 <= topic < self.n_topics:
            raise IndexError(f"topic {topic} out of range [0, {self.n_topics})")
        row = self.state.mu[: self.state.n_words, topic]
        n = min(n, row.size)
        idx = np.argpartition(-row, n - 1)[:n] if n < row.size else np.arange(row.size)
        idx = idx[np.argsort(-row[idx], kind="stable")]
        words = self.vocab.words
        return [words[i] for i in idx]

    def heldout_loglik(self, docs: Sequence, seed: int = 0) -> float:
        """Mean per-token document-completion log-likelihood (80/20 split by word type)."""
        batch = self.prepare(self.tokenize(docs), grow=False)
        return heldout_loglik_arrays(self.topic_word(), batch, self.state.alpha, seed=seed)

    def elbo(self) -> float:
        """Whole-data ELBO over the memoized cache (memoized update only)."""
        if not isinstance(self.updater, MemoizedUpdate):
            raise RuntimeError("elbo() is defined over the memoized cache; use update='memoized'")
        return self.updater.elbo(self.state)

    @property
    def version(self) -> int:
        return self.state.version

    # -- persistence ------------------------------------------------------------------
    def save(self, path, offsets: dict | None = None, extra: dict | None = None) -> int:
        """Write a snapshot (atomic); ``offsets`` records consumed stream positions with the state."""
        header, arrays = self._snapshot_parts()
        header["offsets"] = offsets or {}
        header["extra"] = extra or {}
        return write_snapshot(path, header, arrays)

    def _snapshot_parts(self) -> tuple[dict, dict]:
        header = {
            "kind": SNAPSHOT_KIND,
            "created": time.time(),
            "params": self.get_params(),
            "state": self.state.header(),
            "vocabulary": {"state": self.vocab.state(), "words": self.vocab.words},
            "rng": _encode_rng(self.rng),
            "auto_key": self._auto_key,
        }
        arrays = dict(self.state.arrays())
        arrays["vocab_counts"] = self.vocab.counts
        header["trends"], trend_arrays = self.trends.state()
        arrays.update(trend_arrays)
        if self.head is not None:
            h_header, h_arrays = self.head.state()
            header["supervised"] = h_header
            for name, a in h_arrays.items():
                arrays["sup_" + name] = a
        items = self.updater.cache_items()
        if items:
            header["memo_keys"] = [k for k, _ in items]
            header["memo_meta"] = [[s.n_docs, s.n_tokens, s.entropy, s.alloc] for _, s in items]
            arrays["memo_rows"] = np.array([s.word_ids.size for _, s in items], dtype=np.int64)
            arrays["memo_word_ids"] = np.concatenate([s.word_ids for _, s in items])
            arrays["memo_lengths"] = np.concatenate([np.diff(s.indptr) for _, s in items])
            arrays["memo_topics"] = np.concatenate([s.topics for _, s in items])
            arrays["memo_values"] = np.concatenate([s.values for _, s in items])
            arrays["memo_totals"] = np.stack([s.topic_totals for _, s in items])
        return header, arrays

    @classmethod
    def from_snapshot_parts(cls, header: dict, arrays: dict) -> "TopicModel":
        if header.get("kind") != SNAPSHOT_KIND:
            raise ValueError(f"not a TopicModel snapshot (kind={header.get('kind')!r})")
        model = cls(**header["params"])
        model.state = ModelState.restore(header["state"], arrays)
        voc = header["vocabulary"]
        model.vocab = Vocabulary.restore(voc["state"], voc["words"], arrays["vocab_counts"])
        if len(model.vocab) != model.state.n_words:
            raise ValueError(f"vocabulary has {len(model.vocab)} words but the state has {model.state.n_words}")
        model.rng = _decode_rng(header["rng"])
        model._auto_key = int(header.get("auto_key", 0))
        if "trends" in header:  # snapshots before trends were kept start a new series
            model.trends = PrevalenceTracker.restore(header["trends"], arrays)
        if "supervised" in header:
            if model.head is None:
                raise ValueError("snapshot holds a supervised head but its params have supervision=None")
            model.head = SupervisedHead.restore(
                header["supervised"], {k[4:]: v for k, v in arrays.items() if k.startswith("sup_")})
            # older snapshots kept a head memo record per keyed batch whatever the update
            if model.update == "memoized":
                model.head.limit_memo(model.memo_window)
            else:
                model.head.release_memo()
        if "memo_keys" in header:
            items = []
            rows = arrays["memo_rows"]
            r0 = l0 = 0
            for key, (n_docs, n_tokens, ent, alloc), n_rows, totals in zip(
                    header["memo_keys"], header["memo_meta"], rows, arrays["memo_totals"]):
                lengths = arrays["memo_lengths"][r0:r0 + n_rows]
                indptr = np.zeros(n_rows + 1, dtype=np.int64)
                np.cumsum(lengths, out=indptr[1:])
                nnz = int(indptr[-1])
                items.append((key, Summary(
                    word_ids=arrays["memo_word_ids"][r0:r0 + n_rows].copy(), indptr=indptr,
                    topics=arrays["memo_topics"][l0:l0 + nnz].copy(), values=arrays["memo_values"][l0:l0 + nnz].copy(),
                    topic_totals=totals.copy(), n_docs=int(n_docs), n_tokens=float(n_tokens),
                    entropy=float(ent), alloc=float(alloc), key=key)))
                r0 += int(n_rows)
                l0 += nnz
            model.updater.restore_cache(items)
        model.snapshot_info = {"created": header.get("created"), "offsets": header.get("offsets", {}),
                               "extra": header.get("extra", {})}
        return model


def load_snapshot(path) -> TopicModel:
    """Load a model saved by ``TopicModel.save`` (or by the daemon).  Raises SnapshotError on a bad file."""
    header, arrays = read_snapshot(path)
    model = TopicModel.from_snapshot_parts(header, arrays)
    model.snapshot_info["path"] = str(Path(path))
    return model


def _auto(value):
    """A supervised constant left at None scales itself (``supervised.scaling``)."""
    return "auto" if value is None else float(value)


def _doc_lengths(batch: Batch) -> np.ndarray:
    """Token count N_d of every document of the batch."""
    rows = np.repeat(np.arange(batch.n_docs), np.diff(batch.doc_ptr))
    return np.bincount(rows, weights=batch.counts, minlength=batch.n_docs)


def _normalise_rows(doc_topic: np.ndarray) -> np.ndarray:
    """zbar_d = N_dk / N_d (rows of empty documents stay zero)."""
    tot = doc_topic.sum(axis=1, keepdims=True)
    return np.ascontiguousarray(doc_topic / np.where(tot > 0, tot, 1.0))


def _slice_batch(batch: Batch, lo: int, hi: int) -> Batch:
    if lo == 0 and hi == batch.n_docs:
        return batch
    from .batch import batch_from_arrays

    s, e = batch.doc_ptr[lo], batch.doc_ptr[hi]
    return batch_from_arrays(batch.doc_ptr[lo:hi + 1] - s, batch.word_ids[s:e], batch.counts[s:e])


def _encode_rng(rng: np.random.Generator) -> dict:
    st = rng.bit_generator.state
    return {"bit_generator": st["bit_generator"], "state": {k: str(v) for k, v in st["state"].items()},
            "has_uint32": int(st["has_uint32"]), "uinteger": int(st["uinteger"])}


def _decode_rng(d: dict) -> np.random.Generator:
    bg = getattr(np.random, d["bit_generator"])()
    bg.state = {"bit_generator": d["bit_generator"], "state": {k: int(v) for k, v in d["state"].items()},
                "has_uint32": d["has_uint32"], "uinteger": d["uinteger"]}
    return np.random.Generator(bg)
