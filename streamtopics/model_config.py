"""The ``[model]`` section of the configuration and the option objects it builds.

The file spells the model the way the library does: ``[model]`` holds what is not an option
object (n_topics, alpha, beta, seed, init, init_smoothing, threads, prequential_window) and one
table per slot of ``TopicModel``, with the option object's field names::

    [model.engine]          # options.LSparse / options.AliasMH
    kind = "lsparse"
    sparsity = 8
    [model.update]          # options.Stochastic / options.Memoized
    kind = "stochastic"
    corpus_size = 0
    [model.supervision]     # options.Hinge / Logistic / Regression, or kind = "none"
    [model.text]            # options.Text
    [model.vocabulary]      # options.Vocabulary

Inside ``ModelConfig`` (``config.py``) the settings stay flat (``cfg.model.engine`` is the kind,
``cfg.model.sparsity`` ...), and the flat keys of earlier files (``[model] sparsity = 8``,
``STREAMTOPICS_MODEL__SPARSITY``) keep working and win over the table field:
``TABLES`` below is the one map between the two spellings.  Nested keys also come from the environment, e.g.
``STREAMTOPICS_MODEL__ENGINE__SPARSITY=4``.  Numbers the library leaves to itself (None there)
are 0 here (``NONE_AS``).

This module reads the configuration only through attributes and plain mappings, so
``config.py`` can import it without a cycle.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .options import FLAT, SLOTS, ModelOptions, OptionError

# (table, field) -> flat ModelConfig key; "kind" picks the option class of the slot.
_RENAMES = {("engine", "max_iter"): "max_local_iters", ("engine", "tol"): "local_tol"}
TABLES: dict[tuple[str, str], str] = {
    **{(slot, "kind"): slot for slot in ("engine", "update", "supervision")},
    **{(slot, fld): _RENAMES.get((slot, fld), flat) for flat, (slot, fld) in FLAT.items()},
    ("engine", "doc_tries"): "doc_tries",  # the config spells AliasMH.tries = (word, doc) as tries + doc_tries
}
FLAT_TO_TABLE = {flat: key for key, flat in TABLES.items()}
SLOT_TABLES = ("engine", "update", "supervision", "text", "vocabulary")
TOP_KEYS = ("n_topics", "alpha", "beta", "seed", "init", "init_smoothing", "threads", "prequential_window")
# config value standing for the library's None / "auto"
NONE_AS = {"alpha": 0.0, "beta": 0.0, "corpus_size": 0, "memo_window": 0, "vocab_cap": 0, "table_draws": 0, "threads": 0,
           "mh_steps": 0,
           "sup_c": 0.0, "sup_ell": 0.0, "sup_epsilon": 0.0, "sup_prior_var": 0.0, "sup_decay": 0.0, "sup_burn_in": -1,
           "sup_max_labels": 0, "supervision": "none"}


def kind_fields(slot: str, kind: str) -> set[str]:
    """Table fields that apply to ``kind`` of ``slot`` ("kind" included)."""
    if slot == "supervision" and kind == "none":
        return {"kind"}
    cls = SLOTS[slot].get(kind) or next(iter(SLOTS[slot].values()))
    names = {f.name for f in dataclasses.fields(cls)} | {"kind"}
    return names | ({"doc_tries"} if cls.kind == "alias" else set())


def flatten(table: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str], list[str]]:
    """The ``[model]`` table with its sub-tables spread onto flat keys: (values by flat key, how
    each key was spelled, errors).  A flat key given beside its table field wins (tools that
    edit the parsed file, e.g. the demo's ``model["sparsity"] = ...``, keep working)."""
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    errors: list[str] = []
    for key, value in table.items():
        if key in SLOT_TABLES and isinstance(value, Mapping):
            for fld, v in value.items():
                flat = TABLES.get((key, fld))
                if flat is None:
                    errors.append(f"config error: unknown key model.{key}.{fld}{suggest(key, fld)}")
                elif flat not in table or isinstance(table[flat], Mapping):  # [model.engine] kind: the table itself
                    out[flat], spelled[flat] = v, f"{key}.{fld}"
        else:
            out[key], spelled[key] = value, key
    return out, spelled, errors


def env_key(key: str) -> tuple[str | None, str]:
    """An environment key below [model] ("engine__sparsity") as (flat key or None, its spelling)."""
    slot, sep, fld = key.partition("__")
    if not sep:
        return key, key
    return TABLES.get((slot, fld)), f"{slot}.{fld}"


def suggest(slot: str, fld: str) -> str:
    import difflib

    names = [f for (s, f) in TABLES if s == slot]
    match = difflib.get_close_matches(fld, names, n=1, cutoff=0.6)
    return f" (did you mean model.{slot}.{match[0]}?)" if match else ""


def kind_errors(m, spelled: Mapping[str, str], skip=()) -> list[str]:
    """Table fields given for a kind that does not have them (e.g. [model.engine] burn_in with
    kind = "lsparse"): the file says something the model would silently ignore.  Slots in
    ``skip`` (kind chosen by the environment) are not checked."""
    errs = []
    for flat, name in spelled.items():
        slot, _, fld = name.partition(".")
        if not fld or slot not in ("engine", "update", "supervision") or slot in skip:
            continue
        kind = getattr(m, slot)
        if fld not in kind_fields(slot, kind):
            errs.append(f'config error: model.{name} does not apply to model.{slot}.kind = "{kind}" '
                        f"(it sets: {', '.join(sorted(kind_fields(slot, kind) - {'kind'})) or 'nothing'})")
    return errs


def flat_kind_errors(m, given, skip=()) -> list[str]:
    """``kind_errors`` for the flat keys of earlier files (``[model] memo_window = 16`` with the
    stochastic update): an error when ``given`` (flat keys set in the file or the environment)
    holds a field of another kind than its slot's, set to something else than its default, which
    the model would silently ignore (the library warns; the table form was already an error).
    At its default it is the residue of an old full file and says nothing."""
    defaults = {f.name: f.default for f in dataclasses.fields(type(m))}
    errs = []
    for flat in given:
        slot, fld = FLAT_TO_TABLE.get(flat, ("", ""))
        if slot not in ("engine", "update", "supervision") or fld == "kind" or slot in skip:
            continue
        kind = getattr(m, slot)
        if fld not in kind_fields(slot, kind) and getattr(m, flat) != defaults.get(flat):
            errs.append(f'config error: model.{flat} = {getattr(m, flat)!r} does not apply to model.{slot} = "{kind}" '
                        f"(the model would ignore it; it sets: {', '.join(sorted(kind_fields(slot, kind) - {'kind'})) or 'nothing'})")
    return errs


def library_value(m, flat: str):
    v = getattr(m, flat)
    return None if flat in NONE_AS and v == NONE_AS[flat] else v


def _tries(m):
    """Config tries/doc_tries (0 = auto) as AliasMH's (word, doc) pair, None for a kind left at
    auto (the library's rule, which may depend on the documents); None keeps both defaults."""
    if not (m.tries or m.doc_tries):
        return None
    return m.tries or None, m.doc_tries or None


def options(m) -> ModelOptions:
    """The option objects of a ``ModelConfig`` (OptionError names the option field)."""
    built = {}
    for slot in SLOT_TABLES:
        kind = getattr(m, slot) if slot in ("engine", "update", "supervision") else slot
        kind = library_value(m, slot) if slot == "supervision" else kind
        if kind is None:
            built[slot] = None
            continue
        cls = SLOTS[slot][kind]
        kw = {}
        for f in dataclasses.fields(cls):
            flat = TABLES[(slot, f.name)]
            kw[f.name] = _tries(m) if flat == "tries" else library_value(m, flat)
        built[slot] = cls(**kw)
    return ModelOptions(**built)


def option_errors(m) -> list[str]:
    """Rules of the option objects the key-by-key checks cannot see (e.g. max_word_len >= min_word_len)."""
    try:
        options(m)
    except OptionError as e:
        slot = next((s for s in SLOT_TABLES if (s, e.name) in TABLES), None)
        key = f"{slot}.{e.name}" if slot else e.name
        return [f"config error: model.{key} {e.must} (got {e.value!r})"]
    return []


def tables(m) -> dict[str, Any]:
    """The ``[model]`` section as the file spells it: top keys, then one table per slot holding
    the fields of its kind (config values: 0 where the library decides)."""
    out: dict[str, Any] = {k: getattr(m, k) for k in TOP_KEYS}
    for slot in SLOT_TABLES:
        kind = getattr(m, slot) if slot in ("engine", "update", "supervision") else None
        names = kind_fields(slot, kind) if kind is not None else {f for (s, f) in TABLES if s == slot}
        out[slot] = {fld: getattr(m, flat) for (s, fld), flat in TABLES.items() if s == slot and fld in names}
    return out


def model_from_config(m):
    """A fresh TopicModel with the ``[model]`` settings."""
    from .model import TopicModel

    o = options(m)
    return TopicModel(n_topics=m.n_topics, engine=o.engine, update=o.update, alpha=m.alpha or None, beta=m.beta or None,
                      seed=m.seed, supervision=o.supervision, text=o.text, vocabulary=o.vocabulary, init=m.init,
                      init_smoothing=m.init_smoothing, threads=m.threads or None)


def resolved(m) -> list[str]:
    """What the library makes of the ``[model]`` settings left to it whose value depends on other
    settings (alpha, the classifier's features), one line each: "key = value -> what it becomes"."""
    from .features import resolve_features
    from .model import flat_alpha_default, initial_alpha

    o = options(m)
    out = []
    if not m.alpha:
        a, learned = initial_alpha(None, m.n_topics, flat_alpha_default(o))
        out.append("alpha = 0 -> " + (f"learned from the stream, from 1/{m.n_topics}" if learned
                                       else f"{a:g}, fixed (a supervised model of the variational engine)"))
    if o.supervision is not None and o.supervision.features == "auto":
        out.append(f'supervision.features = "auto" -> "{resolve_features(o)}" (engine "{o.engine.kind}")')
    return out


def param_differences(model, m) -> dict[str, tuple[Any, Any]]:
    """Settings of ``model`` (e.g. restored from a snapshot) that differ from the configuration's."""
    return params_differences(model.get_params(), m)


def params_differences(have: dict, m) -> dict[str, tuple[Any, Any]]:
    """``param_differences`` from the settings alone (a snapshot header's ``params``)."""
    from .model import settings_differences

    fresh = model_from_config(m).get_params()
    return settings_differences(have, fresh, fresh)
