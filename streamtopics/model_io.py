"""A TopicModel as snapshot parts (msgpack header + numpy arrays) and back; the file format is ``snapshot.py``'s.

The header keeps the flat ``params`` (``TopicModel.get_params()``: every option under its flat
keyword, so snapshots of every version load) and, since the option objects, ``options``: the
same settings per slot, for readers.
"""
from __future__ import annotations

import time

import numpy as np

from .snapshot import read_snapshot, write_snapshot
from .state import ModelState
from .summary import Summary
from .supervised.classifier import SupervisedHead
from .text import Vocabulary
from .trends import PrevalenceTracker

SNAPSHOT_KIND = "streamtopics.TopicModel"


def save_model(model, path, offsets: dict | None = None, extra: dict | None = None) -> int:
    header, arrays = snapshot_parts(model)
    header["offsets"] = offsets or {}
    header["extra"] = extra or {}
    return write_snapshot(path, header, arrays)


def snapshot_parts(model) -> tuple[dict, dict]:
    header = {
        "kind": SNAPSHOT_KIND,
        "created": time.time(),
        "params": model.get_params(),
        "options": model.options.describe(),
        "state": model.state.header(),
        "vocabulary": {"state": model.vocab.state(), "words": model.vocab.words},
        "rng": encode_rng(model.rng),
        "auto_key": model.auto_key,
    }
    arrays = dict(model.state.arrays())
    arrays["vocab_counts"] = model.vocab.counts
    header["trends"], trend_arrays = model.trends.state()
    arrays.update(trend_arrays)
    if model.head is not None:
        h_header, h_arrays = model.head.state()
        header["supervised"] = h_header
        for name, a in h_arrays.items():
            arrays["sup_" + name] = a
    items = model.updater.cache_items()
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


def restore_model(cls, header: dict, arrays: dict):
    """The model of ``cls`` the parts describe."""
    if header.get("kind") != SNAPSHOT_KIND:
        raise ValueError(f"not a TopicModel snapshot (kind={header.get('kind')!r})")
    _check_kinds(header)
    model = cls(**header["params"])
    model.state = ModelState.restore(header["state"], arrays)
    voc = header["vocabulary"]
    model.vocab = Vocabulary.restore(voc["state"], voc["words"], arrays["vocab_counts"])
    if len(model.vocab) != model.state.n_words:
        raise ValueError(f"vocabulary has {len(model.vocab)} words but the state has {model.state.n_words}")
    model.rng = decode_rng(header["rng"])
    model.auto_key = int(header.get("auto_key", 0))
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
        model.updater.restore_cache(_memo_items(header, arrays))
    model.snapshot_info = {"created": header.get("created"), "offsets": header.get("offsets", {}),
                           "extra": header.get("extra", {})}
    return model


def _check_kinds(header: dict) -> None:
    """The option kinds the snapshot describes (engine, update) must be the ones
    its params build: a file that names a kind this version does not know (written by a newer
    streamtopics, or edited) is refused by name instead of loading as the default engine."""
    params = header.get("params") or {}
    described = header.get("options") or {}
    for slot in ("engine", "update"):
        desc = described.get(slot)
        kind = desc.get("kind") if isinstance(desc, dict) else None
        param = params.get(slot)
        param_kind = param.get("kind") if isinstance(param, dict) else param
        if kind is not None and isinstance(param_kind, str) and kind != param_kind:
            raise ValueError(f"snapshot describes {slot} {kind!r} but its params build {param_kind!r}: written by "
                             f"another streamtopics version, or edited; not loaded")


def _memo_items(header: dict, arrays: dict) -> list:
    items = []
    r0 = l0 = 0
    for key, (n_docs, n_tokens, ent, alloc), n_rows, totals in zip(
            header["memo_keys"], header["memo_meta"], arrays["memo_rows"], arrays["memo_totals"]):
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
    return items


def load_model(cls, path):
    header, arrays = read_snapshot(path)
    return restore_model(cls, header, arrays)


def encode_rng(rng: np.random.Generator) -> dict:
    st = rng.bit_generator.state
    return {"bit_generator": st["bit_generator"], "state": {k: str(v) for k, v in st["state"].items()},
            "has_uint32": int(st["has_uint32"]), "uinteger": int(st["uinteger"])}


BIT_GENERATORS = ("PCG64", "PCG64DXSM", "Philox", "SFC64", "MT19937")


def decode_rng(d: dict) -> np.random.Generator:
    """The generator ``encode_rng`` saved; only numpy's bit generators are named (the name is
    read from the file: anything else is refused, never looked up and called)."""
    name = d.get("bit_generator")
    if name not in BIT_GENERATORS:
        raise ValueError(f"snapshot: unknown random bit generator {name!r} (expected one of {BIT_GENERATORS})")
    bg = getattr(np.random, name)()
    bg.state = {"bit_generator": d["bit_generator"], "state": {k: int(v) for k, v in d["state"].items()},
                "has_uint32": d["has_uint32"], "uinteger": d["uinteger"]}
    return np.random.Generator(bg)
