"""The model's options as small frozen objects that validate themselves once.

    from streamtopics import TopicModel
    from streamtopics.options import LSparse, AliasMH, Stochastic, Memoized, Hinge, Text

    TopicModel(20, engine=LSparse(sparsity=4), update=Memoized(memo_window=64),
               supervision=Hinge(c=2.0), text=Text(min_word_len=3))

Each slot of ``TopicModel`` takes an option object or its simple spelling (``engine="alias"``,
``supervision="hinge"``: the default object of that kind).  The older flat keywords
(``sparsity=``, ``sup_c=``, ``vocab_cap=`` ...) are mapped onto the objects by one table,
``FLAT``; the TOML tables ``[model.engine]``, ``[model.update]``, ``[model.supervision]``,
``[model.text]`` and ``[model.vocabulary]`` carry the same field names (``config.py``).

Every default here is the library default (docs/defaults.md); the packaged
``streamtopics.toml`` lists them and a test checks that the two agree.
"""
from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from .engines.alias import ALPHA_PROPOSALS, KERNELS, PROPOSALS, AliasEngine, check_tries
from .engines.lsparse import LSparseEngine
from .supervised.classifier import PG_CHOICES
from .text import SEGMENTATIONS
from .text import Vocabulary as _VocabularyStore

SUP_FEATURES = ("auto", "unsupervised", "supervised", "mean-field")  # what each means: features.py
INITS = ("kmeans++", "random")
VOCAB_POLICIES = _VocabularyStore.POLICIES

__all__ = ["AliasMH", "FLAT", "Hinge", "LSparse", "Logistic", "Memoized", "OptionError", "Regression",
           "ModelOptions", "SLOTS", "Stochastic", "Supervision", "Text", "Vocabulary", "flat_params", "resolve"]


class OptionError(ValueError):
    """A field of an option object out of its range: ``name`` ``must`` (got ``value``)."""

    def __init__(self, name: str, must: str, value: Any, where: str = "") -> None:
        self.name, self.must, self.value = name, must, value
        super().__init__(f"{where}{name} {must} (got {value!r})")


# -- field rules: (predicate, what the value must be) ------------------------------------------
def is_integer(v) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_num(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _int_ge(lo):
    return lambda v: is_integer(v) and v >= lo, f"must be an integer >= {lo}"


def _opt_int_ge(lo):
    return lambda v: v is None or (is_integer(v) and v >= lo), f"must be None or an integer >= {lo}"


def _one_of(choices):
    return lambda v: v in choices, f"must be one of {tuple(choices)}"


def _opt_finite(lo_open: bool):
    pred = (lambda v: v > 0) if lo_open else (lambda v: v >= 0)
    return (lambda v: v is None or (_is_num(v) and math.isfinite(v) and pred(v)),
            f"must be None or a finite number {'>' if lo_open else '>='} 0")


_BOOL = (lambda v: isinstance(v, (bool, np.bool_)), "must be a bool")


class _Option:
    """Base of the option objects: field rules checked once, in ``__post_init__``."""

    kind: ClassVar[str] = ""
    RULES: ClassVar[dict] = {}

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            check_field(type(self), f.name, getattr(self, f.name))
        self.normalise()
        self.check()

    def normalise(self) -> None:
        """Canonical forms of accepted spellings (frozen: set through object.__setattr__)."""

    def check(self) -> None:
        """Rules that tie fields together."""

    def params(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes) -> "_Option":
        return dataclasses.replace(self, **changes)


def check_field(cls: type, name: str, value, where: str | None = None, label: str | None = None) -> None:
    """Raise OptionError unless ``value`` is allowed for field ``name`` of ``cls`` (the message
    names ``label``, e.g. the flat keyword used, else the field)."""
    rule = cls.RULES.get(name)
    if rule is None:
        return
    pred, must = rule
    try:
        ok = bool(pred(value))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise OptionError(label or name, must, value, f"{cls.__name__}: " if where is None else where)


# -- engines -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LSparse(_Option):
    """L-sparse variational local step (engines.lsparse): at most ``sparsity`` topics per word type
    of a document, ``max_iter`` iterations stopping at mean change ``tol``; topics below
    ``active_eps`` leave the active set; ``restarts`` tries ``restart_trials`` other starts of
    ``restart_iters`` iterations on hard documents and keeps the best."""

    # the engine's own defaults: one home for each value
    sparsity: int = LSparseEngine.sparsity
    max_iter: int = LSparseEngine.max_iter
    tol: float = LSparseEngine.tol
    active_eps: float = LSparseEngine.active_eps
    restarts: bool = True
    restart_trials: int = LSparseEngine.restart_trials
    restart_iters: int = LSparseEngine.restart_iters

    kind: ClassVar[str] = "lsparse"

    RULES: ClassVar[dict] = {
        "sparsity": _int_ge(1),
        "max_iter": (lambda v: v >= 1, "must be >= 1"),
        "tol": (lambda v: v > 0, "must be > 0"),
        "active_eps": (lambda v: v >= 0, "must be >= 0"),
        "restart_trials": (lambda v: v >= 0, "must be >= 0"),
        "restart_iters": (lambda v: v >= 1, "must be >= 1"),
    }


@dataclass(frozen=True)
class AliasMH(_Option):
    """Alias-table Metropolis-Hastings sampler (engines.alias): ``burn_in`` / ``sample_sweeps``
    sweeps per minibatch before / while statistics are averaged, ``mh_steps`` MH steps per token
    (None: 1 with tries (2, 3) from K = 256, else 2),
    ``proposal`` "cycle" or "mixture" of the word and doc proposals, ``table_draws`` samples per
    alias table before a rebuild (None: max(K, 256)), ``alpha_proposal`` "word" or "uniform",
    ``tries`` candidates per MH step: an int for both kinds or a (word, doc) pair (a part None keeps that
    kind's default); None: (2, 3)
    for K >= 256 (more doc candidates where K alpha outweighs the document's other tokens:
    ``alias_core.default_tries``), else (1, 1); ``kernel`` of batch fits without labels: "auto" (dense exact Gibbs
    at K <= 768, alias-MH above: engines.alias_dense), "dense" or "mh"."""

    # the engine's own defaults: one home for each value
    burn_in: int = AliasEngine.burn_in
    sample_sweeps: int = AliasEngine.sample_sweeps
    mh_steps: int = AliasEngine.mh_steps
    proposal: str = AliasEngine.proposal
    table_draws: int | None = AliasEngine.table_draws
    alpha_proposal: str = AliasEngine.alpha_proposal
    tries: int | tuple | None = AliasEngine.tries
    kernel: str = AliasEngine.kernel

    kind: ClassVar[str] = "alias"

    RULES: ClassVar[dict] = {
        "burn_in": _int_ge(0),
        "sample_sweeps": _int_ge(1),
        "mh_steps": _opt_int_ge(1),
        "proposal": _one_of(PROPOSALS),
        "table_draws": _opt_int_ge(1),
        "alpha_proposal": _one_of(ALPHA_PROPOSALS),
        "kernel": _one_of(KERNELS),
    }

    def normalise(self) -> None:
        try:
            object.__setattr__(self, "tries", check_tries(self.tries))  # None or a (word, doc) pair
        except ValueError as e:
            raise OptionError("tries", str(e).partition("tries ")[2].rpartition(" (got")[0], self.tries,
                              "AliasMH: ") from None


# -- global updates ------------------------------------------------------------------------------
CORPUS_SIZE_RULES = ("seen",)


def check_corpus_size(corpus_size) -> None:
    """None (the rule of ``updates``), "seen", or a number of documents >= 1."""
    if corpus_size is None or corpus_size in CORPUS_SIZE_RULES:
        return
    if (isinstance(corpus_size, bool) or not isinstance(corpus_size, (int, float)) or not corpus_size >= 1
            or not math.isfinite(corpus_size)):
        raise ValueError(f"corpus_size must be None, 'seen' or a number of documents >= 1 (got {corpus_size!r})")


def _corpus_size_ok(v) -> bool:
    check_corpus_size(v)
    return True


@dataclass(frozen=True)
class Stochastic(_Option):
    """Stochastic (SVI) update: step rho_t = max(rho_min, (delay + t)^-forgetting_rate), t counting
    batches of 256 documents (a smaller batch is that fraction of a step, docs/defaults.md §5), a batch
    scaled to ``corpus_size`` documents (None: the rule of ``updates``; "seen": documents so far);
    ``births``: dead topics are reseeded from the batch (``births``; L-sparse engine)."""

    delay: float = 10.0
    forgetting_rate: float = 0.7
    rho_min: float = 0.0
    corpus_size: int | str | None = None
    births: bool = True

    kind: ClassVar[str] = "stochastic"

    RULES: ClassVar[dict] = {
        "delay": (lambda v: v >= 0, "must be >= 0"),
        "forgetting_rate": (lambda v: 0.5 < v <= 1.0, "must be in (0.5, 1]"),
        "rho_min": (lambda v: 0.0 <= v < 1.0, "must be in [0, 1)"),
        "corpus_size": (_corpus_size_ok, "must be None, 'seen' or a number of documents >= 1"),
        "births": (lambda v: isinstance(v, bool), "must be true or false"),
    }


@dataclass(frozen=True)
class Memoized(_Option):
    """Memoized (MVI) update over the last ``memo_window`` batch summaries (None: all)."""

    memo_window: int | None = 256

    kind: ClassVar[str] = "memoized"

    RULES: ClassVar[dict] = {"memo_window": (lambda v: v is None or v >= 1, "must be None or >= 1 batches")}


# -- supervision ---------------------------------------------------------------------------------
_SUP_RULES = {
    "c": _opt_finite(True),
    "ell": _opt_finite(False),
    "epsilon": _opt_finite(False),
    "prior_var": _opt_finite(True),
    "decay": (lambda v: v is None or 0.0 < v <= 1.0, "must be None or in (0, 1]"),
    "sweeps": _int_ge(1),
    "burn_in": _opt_int_ge(0),
    "pg_method": _one_of(PG_CHOICES),
    "max_labels": _opt_int_ge(1),
    "features": _one_of(SUP_FEATURES),
    "local": _BOOL,
}


@dataclass(frozen=True)
class Supervision(_Option):
    """Fields every loss shares (docs/supervised.md).  None constants scale themselves
    (``supervised.scaling``): c * unit = the mean labelled document length, prior_var = K unit^2.
    ``decay``: weight the classifier's statistics keep per labelled batch (1 = exact streaming
    posterior; None = the topics' own, 1 - rho_t of the stochastic update that batch made, and 1
    under the memoized update: docs/supervised.md "The classifier forgets at the topics' rate"); ``sweeps`` / ``burn_in``: Gibbs sweeps of the classifier per labelled batch and
    those discarded (None: half); ``max_labels``: cap of the label vocabulary (None: unbounded);
    ``features``: the topic proportions the classifier learns from and predicts with (``features``
    module): "auto" (mean-field for the sampling engine, else unsupervised), "unsupervised" (the
    engine's label-free local step), "mean-field" (the variational label-free step at the flat
    supervised alpha) or "supervised" (training on the supervised step's proportions);
    ``local``: whether the variational local step of a labelled batch includes the label term."""

    c: float | None = None
    prior_var: float | None = None
    decay: float | None = None
    sweeps: int = 10
    burn_in: int | None = None
    max_labels: int | None = None
    features: str = "auto"
    local: bool = True

    RULES: ClassVar[dict] = _SUP_RULES

    def head_kwargs(self) -> dict:
        """Loss constants for ``SupervisedHead`` (None -> "auto", the self-scaling value)."""
        def auto(v):
            return "auto" if v is None else float(v)
        return {"c": auto(self.c), "ell": auto(getattr(self, "ell", None)),
                "epsilon": auto(getattr(self, "epsilon", None)), "prior_var": auto(self.prior_var),
                "decay": 1.0 if self.decay is None else float(self.decay), "gibbs_sweeps": int(self.sweeps),
                "burn_in": None if self.burn_in is None else int(self.burn_in),
                "pg_method": getattr(self, "pg_method", "auto"), "max_labels": self.max_labels}


@dataclass(frozen=True)
class Hinge(Supervision):
    """Max-margin topics (Gibbs MedLDA): margin ``ell`` (None: 1, the discriminant's unit)."""

    ell: float | None = None
    kind: ClassVar[str] = "hinge"

    def check(self) -> None:
        if self.ell is not None and self.ell <= 0:
            raise OptionError("ell", "must be > 0 for the hinge loss", self.ell, "Hinge: ")


@dataclass(frozen=True)
class Logistic(Supervision):
    """Logistic loss by Polya-Gamma augmentation; ``pg_method`` "exact", "gamma_sum" or "auto"
    (exact for c <= 8, else the gamma sum, whose cost does not grow with c)."""

    pg_method: str = "auto"
    kind: ClassVar[str] = "logistic"

    def check(self) -> None:
        if self.pg_method == "exact" and self.c is not None and self.c < 1:
            raise OptionError("c", "must be >= 1 for exact Polya-Gamma sampling; use pg_method='gamma_sum'",
                              self.c, "Logistic: ")


@dataclass(frozen=True)
class Regression(Supervision):
    """eps-insensitive regression on the response; ``epsilon`` None: 1e-3 response sd."""

    epsilon: float | None = None
    kind: ClassVar[str] = "regression"


# -- text ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Text(_Option):
    """Tokenizer of raw-text documents: token lengths kept, stopwords ("english", "none"/None or a
    collection of words), ``segmentation`` "whitespace" or "cjk_bigrams" (runs of Chinese,
    Japanese, Korean or Thai characters become overlapping character bigrams)."""

    min_word_len: int = 2
    max_word_len: int = 30
    stopwords: Any = "english"
    segmentation: str = "whitespace"

    kind: ClassVar[str] = "text"
    RULES: ClassVar[dict] = {
        "min_word_len": (lambda v: v >= 1, "must be >= 1"),
        "segmentation": _one_of(SEGMENTATIONS),
        "stopwords": (lambda v: v is None or v in ("english", "none") or not isinstance(v, (str, bytes)),
                      "must be 'english', 'none' or a collection of words"),
    }

    def normalise(self) -> None:
        if self.stopwords is not None and not isinstance(self.stopwords, str):
            object.__setattr__(self, "stopwords", tuple(sorted(self.stopwords)))

    def check(self) -> None:
        if not self.max_word_len >= self.min_word_len:
            raise OptionError("max_word_len", f"must be >= min_word_len ({self.min_word_len!r})",
                              self.max_word_len, "Text: ")


@dataclass(frozen=True)
class Vocabulary(_Option):
    """Vocabulary ``cap`` (None: unbounded) and ``policy`` past it: "ignore" new words or "evict"
    the rarest by a count decayed by ``decay`` per batch."""

    cap: int | None = 200000
    policy: str = "ignore"
    decay: float = 0.999

    kind: ClassVar[str] = "vocabulary"
    RULES: ClassVar[dict] = {
        "cap": (lambda v: v is None or v >= 1, "must be None or >= 1"),
        "policy": _one_of(VOCAB_POLICIES),
        "decay": (lambda v: 0.0 < v <= 1.0, "must be in (0, 1]"),
    }


# -- slots and the flat keywords -----------------------------------------------------------------
SLOTS: dict[str, dict[str, type]] = {
    "engine": {"lsparse": LSparse, "alias": AliasMH},
    "update": {"stochastic": Stochastic, "memoized": Memoized},
    "supervision": {"hinge": Hinge, "logistic": Logistic, "regression": Regression},
    "text": {"text": Text},
    "vocabulary": {"vocabulary": Vocabulary},
}

# The one table of the older flat keywords: keyword -> (slot, field of that slot's option).
FLAT: dict[str, tuple[str, str]] = {
    "sparsity": ("engine", "sparsity"), "max_iter": ("engine", "max_iter"), "tol": ("engine", "tol"),
    "active_eps": ("engine", "active_eps"), "restarts": ("engine", "restarts"),
    "restart_trials": ("engine", "restart_trials"), "restart_iters": ("engine", "restart_iters"),
    "burn_in": ("engine", "burn_in"), "sample_sweeps": ("engine", "sample_sweeps"),
    "mh_steps": ("engine", "mh_steps"), "proposal": ("engine", "proposal"),
    "table_draws": ("engine", "table_draws"), "alpha_proposal": ("engine", "alpha_proposal"),
    "tries": ("engine", "tries"), "kernel": ("engine", "kernel"),
    "delay": ("update", "delay"), "forgetting_rate": ("update", "forgetting_rate"), "rho_min": ("update", "rho_min"),
    "corpus_size": ("update", "corpus_size"), "births": ("update", "births"), "memo_window": ("update", "memo_window"),
    "vocab_cap": ("vocabulary", "cap"), "vocab_policy": ("vocabulary", "policy"),
    "vocab_decay": ("vocabulary", "decay"),
    "min_word_len": ("text", "min_word_len"), "max_word_len": ("text", "max_word_len"),
    "stopwords": ("text", "stopwords"), "segmentation": ("text", "segmentation"),
    "sup_c": ("supervision", "c"), "sup_ell": ("supervision", "ell"), "sup_epsilon": ("supervision", "epsilon"),
    "sup_prior_var": ("supervision", "prior_var"), "sup_decay": ("supervision", "decay"),
    "sup_sweeps": ("supervision", "sweeps"), "sup_burn_in": ("supervision", "burn_in"),
    "sup_pg_method": ("supervision", "pg_method"), "sup_max_labels": ("supervision", "max_labels"),
    "sup_features": ("supervision", "features"), "sup_local": ("supervision", "local"),
}


def _owner(slot: str, fld: str) -> type:
    """The first option class of ``slot`` that has field ``fld`` (its rule and default)."""
    for cls in SLOTS[slot].values():
        if fld in {f.name for f in dataclasses.fields(cls)}:
            return cls
    raise KeyError(fld)


def flat_default(name: str):
    slot, fld = FLAT[name]
    return {f.name: f.default for f in dataclasses.fields(_owner(slot, fld))}[fld]


def resolve(slot: str, value, flat: dict, default: str | None):
    """The option object of ``slot`` from ``value`` (an option object, its kind name, or None for
    ``default``) and the flat keywords of that slot (``flat``: keyword -> value).

    A flat keyword that the chosen kind does not have is validated and otherwise ignored, as
    before (e.g. ``burn_in`` with the variational engine), with a warning when its value is
    not the default (``get_params()`` lists every keyword, so its output must rebuild the model
    silently); one given beside an option object raises, since the object is the whole setting."""
    kinds = SLOTS[slot]
    mine = {k: v for k, v in flat.items() if FLAT[k][0] == slot}
    if value is None:
        value = default
    if value is None:  # supervision=None: the sup_* keywords are only checked
        for k, v in mine.items():
            check_field(_owner(slot, FLAT[k][1]), FLAT[k][1], v, where="", label=k)
            _warn_ignored(k, v, slot, None)
        return None
    if isinstance(value, _Option):
        if type(value) not in kinds.values():
            raise ValueError(_slot_message(slot, value))
        if mine:
            raise ValueError(f"{', '.join(sorted(mine))} given beside {slot}={value!r}: set "
                             f"{'it' if len(mine) == 1 else 'them'} on the option object instead")
        return value
    if not isinstance(value, str) or value not in kinds:
        raise ValueError(_slot_message(slot, value))
    cls = kinds[value]
    own = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for k, v in mine.items():
        fld = FLAT[k][1]
        if fld in own:
            kwargs[fld] = v
        else:
            check_field(_owner(slot, fld), fld, v, where="", label=k)
            _warn_ignored(k, v, slot, value)
    try:
        return cls(**kwargs)
    except OptionError as e:  # name the keyword the caller used
        back = {FLAT[k][1]: k for k in mine}
        raise OptionError(back.get(e.name, e.name), e.must, e.value, where="") from None


def _warn_ignored(name: str, value, slot: str, kind: str | None) -> None:
    """A flat keyword the chosen kind has no use for, set to other than its default: say so
    (``TopicModel(engine="alias", sparsity=4)`` would otherwise run as if it were not given)."""
    default = flat_default(name)
    same = (tuple(value) == tuple(default) if isinstance(value, (list, tuple)) and isinstance(default, (list, tuple))
            else value == default)
    if same:
        return
    users = [k for k, cls in SLOTS[slot].items() if FLAT[name][1] in {f.name for f in dataclasses.fields(cls)}]
    what = f"{slot}={kind!r}" if kind is not None else f"{slot}=None"
    warnings.warn(f"{name}={value!r} is ignored with {what}: it applies to {slot}="
                  f"{' or '.join(map(repr, users))}", UserWarning, stacklevel=5)


def _slot_message(slot: str, value) -> str:
    kinds = SLOTS[slot]
    objects = " or ".join(c.__name__ for c in kinds.values())
    names = f"one of {tuple(kinds)} or " if slot in ("engine", "update", "supervision") else ""
    none = "None, " if slot == "supervision" else ""
    return f"{slot} must be {none}{names}an option object {objects} (got {value!r})"


def flat_params(options: dict) -> dict:
    """The flat keyword values of the slots' option objects (``options``: slot -> object or None);
    a keyword the chosen kind lacks reports its default."""
    out = {}
    for name, (slot, fld) in FLAT.items():
        opt = options.get(slot)
        out[name] = getattr(opt, fld) if opt is not None and hasattr(opt, fld) else flat_default(name)
    return out


@dataclass(frozen=True)
class ModelOptions:
    """The option object of every slot of one model (``TopicModel.options``)."""

    engine: LSparse | AliasMH
    update: Stochastic | Memoized
    supervision: Supervision | None
    text: Text
    vocabulary: Vocabulary

    @classmethod
    def build(cls, engine="lsparse", update="stochastic", supervision=None, text=None, vocabulary=None,
              **flat) -> "ModelOptions":
        """From option objects, kind names, and the flat keywords of ``FLAT``."""
        unknown = sorted(set(flat) - set(FLAT))
        if unknown:
            raise TypeError(f"TopicModel got unexpected keyword argument(s) {', '.join(map(repr, unknown))}")
        return cls(engine=resolve("engine", engine, flat, "lsparse"),
                   update=resolve("update", update, flat, "stochastic"),
                   supervision=resolve("supervision", supervision, flat, None),
                   text=resolve("text", text, flat, "text"),
                   vocabulary=resolve("vocabulary", vocabulary, flat, "vocabulary"))

    def slots(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def describe(self) -> dict:
        """Nested plain dict (msgpack / TOML-able): slot -> {"kind": ..., fields} or None."""
        out = {}
        for slot, o in self.slots().items():
            if o is None:
                out[slot] = None
                continue
            d = {} if slot in ("text", "vocabulary") else {"kind": o.kind}
            for k, v in o.params().items():
                d[k] = list(v) if isinstance(v, tuple) else v
            out[slot] = d
        return out
