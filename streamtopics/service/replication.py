"""Replicas as deterministic state machines over an update log (docs/scale-out.md), no Kafka.

A replica *computes* a batch's local step against its model at update-log offset ``base`` and
turns it into an ``UpdateRecord``: the batch's sufficient statistics (the ``Summary`` CSR over
its words), its label-free document-topic counts (for alpha="auto"), its size, and its source
(input topic, partition, offsets, epoch). It never changes its model while computing: new
words get temporary ids that are rolled back (``prepare_mark`` / ``undo_prepare``), and the
record names them as strings. Every replica then *applies* every record in log order, its own
included: the source range is checked against the replicated ledger (a range learned already
is skipped, on every replica alike), new words join the vocabulary in record order
(``Vocabulary.add_batch``, so ids are a function of the log prefix), and ``TopicModel.learn``
runs the global update. A supervised model's record also carries the batch's targets, its
documents' lengths and the classifier's features when they are not the label-free document-topic
counts (the mean-field step's, or the supervised step's under ``features="supervised"``):
applying it calibrates and updates the classifier exactly as ``TopicModel.process`` does, its
draws seeded by the head's own call counter, itself a function of the log prefix. A record
computed against a model with no topics yet carries the batch's tokens instead
(``kind="batch"``): applying it seeds the topics and runs the whole step, with the model's
generator seeded from the record's log offset. Hence replicas that applied the same log prefix
hold bit-identical models (``digest``).

Wire format: msgpack maps with raw little-endian array buffers (never pickle); a record above
``max_bytes`` is split by summary rows into parts that share ``rid`` (``encode``), which
``Assembler`` puts back together.

Scope: both engines (the alias engine's record is the summary of its recorded sweeps; its
draws on the computing replica come from that replica's generator and only shape the record),
stochastic and memoized updates, with or without supervision (``check_replicable`` says why a
vocabulary that evicts words is refused).
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import msgpack
import numpy as np

from ..batch import build_batch_provisional
from ..batch_ops import doc_lengths, normalise_rows
from ..births import births_for
from ..features import training_counts
from ..jit_cache import njit
from ..model import local_step_stats, reading_ahead, settings_differences as differing
from ..summary import Summary, check_finite
from ..updates import classifier_decay
from ..supervised.targets import is_missing
from ..supervised.head_io import fork_head
from .ledger import OffsetLedger
from .rebase import Rebase, rebase_from_map

__all__ = ["Assembler", "Computed", "FORMAT_VERSION", "ForeignSettings", "NewerFormat", "Observed", "Source",
           "UpdateRecord", "Replica", "check_replicable", "decode", "encode", "digest", "model_settings",
           "settings_differences"]

log = logging.getLogger("streamtopics.daemon")

# The wire format's version, written as "v" into every message. A change that an older release
# would read otherwise (or not at all) must raise it: a replica meeting a newer version stops
# (``NewerFormat``) instead of skipping the record, which would leave it behind the replicas that
# applied it. "v", "rid" and "kind" stay in every version's messages.
# Update records are still written as version 1 (``RECORD_VERSION``): only rebase messages
# (``rebase.py``) need version 2, so a release that reads version 1 keeps reading this one's records.
FORMAT_VERSION = 2
RECORD_VERSION = 1
MAX_RECORD_BYTES = 900_000  # below the broker's default message limit (1 MiB) with room for headers
# Own records whose newborn topics are spared by the next births (``Replica.compute``); far above
# any staleness bound, so only records never applied (dropped at a revocation) fall out.
UNBORN_KEPT = 64
_ARRAYS = ("known", "indptr", "topics", "values", "totals", "doc_ptr", "doc_topics", "doc_values",
           "doc_len", "sup_ptr", "sup_topics", "sup_values")
_DOC_ARRAYS = ("doc_ptr", "doc_topics", "doc_values", "doc_len", "sup_ptr", "sup_topics", "sup_values")


@dataclass(frozen=True)
class Source:
    """The input records an update learned: ``[first, next)`` of ``topic``:``partition`` in log ``epoch``;
    ``topic_id``: the broker's id of the topic (KIP-516) that log had, when known. It goes into every
    replica's ledger, so a topic created again is told from its old log by every replica, not only
    by those that read the partition (the single daemon keeps it from its own reads)."""

    topic: str
    partition: int
    first: int
    next: int
    epoch: int = 0
    topic_id: str | None = None

    @property
    def key(self) -> str:
        return f"{self.topic}:{self.partition}"

    @property
    def batch_key(self) -> str:
        key = f"{self.topic}:{self.partition}:{self.first}"
        return f"{key}~{self.epoch}" if self.epoch else key


@dataclass
class UpdateRecord:
    """One learned batch, as every replica applies it (see the module docstring).

    Rows of the summary are the batch's words: ``known[r]`` is the word's id at ``base`` or -1,
    and the -1 rows are named, in row order, by ``new_words``; ``totals[r]`` is the word's token
    count in the batch (the vocabulary's counts grow by it)."""

    source: Source
    base: int
    kind: str = "summary"                 # "summary" | "batch" (tokens: the model had no topics yet) | "claim"
    n_docs: int = 0
    n_tokens: int = 0
    objective: float | None = None
    entropy: float = 0.0
    alloc: float = 0.0
    known: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    new_words: list = field(default_factory=list)
    indptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    topics: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    values: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    totals: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    doc_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    doc_topics: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    doc_values: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    # supervised models: targets per document (None: unlabelled), the documents' token counts
    # (the classifier's self-scaling constants), the classifier's features where they are not
    # doc_* (features "mean-field" or "supervised": the classifier learns from them instead)
    targets: list | None = None
    doc_len: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    sup_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    sup_topics: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))
    sup_values: np.ndarray = field(default_factory=lambda: np.empty(0, np.float64))
    tokens: list | None = None
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    writer: str = ""                      # the replica incarnation that computed it (logs; own claims)
    claim: int = -1                       # update offset of the claim it was computed under (-1: none)
    reborn: list = field(default_factory=list)  # topics reset before the update (births.py; travels with part 0)
    # the computing replica's model settings (``model_settings``; travels with part 0); None: a
    # record of a release that did not send them, taken as agreeing
    settings: dict | None = None

    @property
    def n_rows(self) -> int:
        return int(self.indptr.size - 1)

    def doc_fields(self) -> dict:
        """The per-document part (it travels whole, with the first part of a split record)."""
        return {name: getattr(self, name) for name in _DOC_ARRAYS} | {"tokens": self.tokens, "targets": self.targets,
                                                                      "reborn": self.reborn, "settings": self.settings}


class Observed(NamedTuple):
    """A computed batch as the topic explorer reads it (``explore.TopicExplorer.observe``): its
    documents' entries of words the model knows (the words the record adds are not in the model
    yet), and in ``uniq`` those words plus every word an update applied since the previous
    observation touched: the candidates for the topics' top words, which only those rows can
    have entered."""

    doc_ptr: np.ndarray
    word_ids: np.ndarray
    uniq: np.ndarray
    evicted: np.ndarray
    n_docs: int


class Computed(NamedTuple):
    """What a replica's computation predicts for a batch (prequential: the model at ``base``):
    topic mixtures, classifier scores and predictions (None before the classifier learned),
    the labels the score columns are over, and the batch for the topic explorer (``Observed``;
    None when the model had no topics)."""

    theta: np.ndarray
    scores: np.ndarray | None = None
    predicted: list | None = None
    label_names: list = []
    batch: Observed | None = None
    stats: dict | None = None  # the local step's diagnostics (``model.local_step_stats``), for the metrics


# Settings that replicas of one update log need not share: how a host runs, not what it learns
# (threads give bit-identical results, tests/test_threads.py).
HOST_SETTINGS = frozenset({"threads"})


def _plain(v):
    """A setting msgpack cannot carry as it is, in a form that compares alike on every replica."""
    if isinstance(v, (set, frozenset)):
        return sorted(map(str, v))
    return str(v)


def model_settings(model) -> dict:
    """The settings every replica of one update log must share (``TopicModel.get_params`` without
    ``HOST_SETTINGS``), as the wire carries them (lists for tuples, sorted lists for sets): what a
    record was computed under. Applying a record to a model of other settings (another number of
    topics, engine, update rule, supervision, ...) would corrupt it, or apply the same log into
    different models on different replicas."""
    params = {k: v for k, v in sorted(model.get_params().items()) if k not in HOST_SETTINGS}
    return msgpack.unpackb(msgpack.packb(params, default=_plain, use_bin_type=True), raw=False)


def settings_differences(theirs: dict | None, ours: dict) -> dict[str, tuple]:
    """Settings in which a record (``theirs``) and this replica's model (``ours``) differ:
    name -> (the record's, ours). Only names both know are compared (a release that added a
    setting still reads the records of one that did not). Spellings of one value are alike
    (``equivalent_settings``: beta None and 1/K, ...); the differences keep each side's spelling, and
    a None that means another value only through another setting (beta None under another n_topics)
    is left to that setting."""
    if theirs is None:
        return {}
    return differing(theirs, ours, sorted(set(theirs) & set(ours)))


class ForeignSettings(ValueError):
    """The update log's model has other settings than this replica's (``Replica.apply``): the
    replica has not applied a record of its own settings yet, so it is the one that differs and
    must not join: nothing is applied, and the daemon refuses to start with ``differences``."""

    def __init__(self, offset: int, writer: str, differences: dict[str, tuple]) -> None:
        self.offset, self.writer, self.differences = offset, writer, differences
        shown = ", ".join(f"{k} = {a!r} in the log, {b!r} here" for k, a, b in
                          ((k, *ab) for k, ab in list(differences.items())[:6]))
        more = f" (and {len(differences) - 6} more)" if len(differences) > 6 else ""
        super().__init__(f"the update log's model has other settings than this replica's: {shown}{more} "
                         f"(record at update offset {offset}, written by {writer or 'an unnamed replica'}). Replicas "
                         f"of one update log must share their [model] settings: give this replica the log's, or "
                         f"another [replication] updates_topic for a new model")


def check_replicable(model) -> list[str]:
    """Why ``model`` cannot be replicated through the log yet (empty: it can)."""
    errs = []
    if model.vocab.policy == "evict":
        errs.append("replicas: vocab_policy 'evict' is not supported (an evicted id is reused by another word, "
                    "so the ids a record was computed with would name other words when it is applied); use 'ignore'")
    return errs


# --------------------------------------------------------------------------- wire format


# Wire dtypes (compact) and in-memory dtypes of the record's arrays. Every replica applies the
# same rounded values, so rounding never separates replicas; it only moves them from what one
# daemon would learn. The statistics' entries (expected counts of a batch's (word, topic) pairs,
# and of its (document, topic) pairs) travel as float16 while they are below 60,000: half-ulp
# 2.4e-4 relative, and measured on 20NG (5,500 documents, K=100) held-out -8.4384 against
# -8.4398 with float32, at 1,702 instead of 2,382 bytes per document. Word token counts (the
# vocabulary's) stay float32 (float16 counts integers exactly only to 2,048). Topic ids travel as
# int16 while K < 32768. Entries whose float16 is zero are left out (``_pack_rows``): every replica
# would add zero for them, and on 20NG they are ~48 % of a summary's entries (the far tails of the
# top-L responsibilities): 1,907 -> 1,532 bytes per document, encode + decode 3.5 -> 1.8 ms a batch.
_CANONICAL = {"known": np.int64, "indptr": np.int64, "topics": np.int32, "values": np.float64,
              "totals": np.float64, "doc_ptr": np.int64, "doc_topics": np.int32, "doc_values": np.float64,
              "doc_len": np.float64, "sup_ptr": np.int64, "sup_topics": np.int32, "sup_values": np.float64}
_WIRE_DTYPES = ("<i2", "<i4", "<i8", "<f2", "<f4", "<f8")
_HALF_MAX = 60_000.0


def _wire_dtype(name: str, a: np.ndarray) -> str:
    if name in ("values", "doc_values", "sup_values"):
        return "<f2" if a.size == 0 or float(np.abs(a).max()) < _HALF_MAX else "<f4"
    if name == "totals":
        return "<f4"
    if name in ("topics", "doc_topics", "sup_topics"):
        return "<i2" if a.size == 0 or int(a.max()) < 32768 else "<i4"
    return "<i4" if a.size == 0 or (int(a.max()) < 2 ** 31 and int(a.min()) >= -2 ** 31) else "<i8"


def _pack_array(name: str, a: np.ndarray) -> list:
    dtype = _wire_dtype(name, a)
    return [dtype, np.ascontiguousarray(a, dtype=np.dtype(dtype)).tobytes()]


_TRIPLES = (("indptr", "topics", "values"), ("doc_ptr", "doc_topics", "doc_values"),
            ("sup_ptr", "sup_topics", "sup_values"))
_SINGLES = tuple(name for name in _ARRAYS if not any(name in t for t in _TRIPLES))  # known, totals, doc_len


@njit(cache=True, nogil=True)
def _half(b):
    """IEEE binary16 bits of the float64 whose bits are ``b`` (int64), rounded to nearest, ties to
    even: what numpy's ``astype(float16)`` gives, without its slow path for float16's subnormals
    (half of a 20NG record's entries)."""
    sign = 0x8000 if b < 0 else 0
    e = (b >> 52) & 0x7FF
    mant = b & 0xFFFFFFFFFFFFF
    if e == 0x7FF:
        return sign | (0x7E00 if mant != 0 else 0x7C00)
    ue = e - 1023
    if ue > 15:
        return sign | 0x7C00
    if ue >= -14:  # a normal float16 (a carry out of the mantissa moves the exponent, up to inf)
        m = mant >> 42
        rem = mant & ((1 << 42) - 1)
        if rem > (1 << 41) or (rem == (1 << 41) and (m & 1) == 1):
            m += 1
        return sign | (((ue + 15) << 10) + m)
    if e == 0:
        return sign
    shift = 28 - ue  # units of 2**-24, float16's smallest subnormal
    if shift > 53:
        return sign
    full = mant | (1 << 52)
    m = full >> shift
    rem = full & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    if rem > half or (rem == half and (m & 1) == 1):
        m += 1
    return sign | m


@njit(cache=True, nogil=True)
def _half_rows(indptr, topics, bits):
    """A CSR's values as float16 bits (``bits``: the values' float64 bits as int64), dropping the
    entries that round to zero, with the row pointer and topics to match."""
    out_ptr = np.zeros(indptr.shape[0], dtype=np.int64)
    out_topics = np.empty(topics.shape[0], dtype=topics.dtype)
    out_bits = np.empty(topics.shape[0], dtype=np.uint16)
    p = 0
    for r in range(indptr.shape[0] - 1):
        for q in range(indptr[r], indptr[r + 1]):
            h = _half(bits[q])
            if h & 0x7FFF:
                out_topics[p] = topics[q]
                out_bits[p] = h
                p += 1
        out_ptr[r + 1] = p
    return out_ptr, out_topics[:p], out_bits[:p]


def _pack_rows(m: dict, rec: "UpdateRecord") -> None:
    """The record's three CSRs into ``m``: values that fit float16 travel as float16, and their
    entries that round to zero are left out (every replica would add zero for them: on 20NG
    about half of a summary's entries, its responsibilities' far tails)."""
    for ptr_name, top_name, val_name in _TRIPLES:
        ptr, top, val = getattr(rec, ptr_name), getattr(rec, top_name), getattr(rec, val_name)
        if _wire_dtype(val_name, val) == "<f2" and val.size:
            ptr, top, bits = _half_rows(np.ascontiguousarray(ptr, dtype=np.int64), np.ascontiguousarray(top),
                                        np.ascontiguousarray(val, dtype=np.float64).view(np.int64))
            m[val_name] = ["<f2", bits.tobytes()]
        else:
            m[val_name] = _pack_array(val_name, val)
        m[ptr_name] = _pack_array(ptr_name, ptr)
        m[top_name] = _pack_array(top_name, top)


def _unpack_array(name: str, v: list) -> np.ndarray:
    dtype, raw = v
    if dtype not in _WIRE_DTYPES:
        raise ValueError(f"update record: unexpected array dtype {dtype!r}")
    return np.frombuffer(raw, dtype=np.dtype(dtype)).astype(_CANONICAL[name])


def _to_map(rec: UpdateRecord, part: int, parts: int) -> dict:
    src = rec.source
    m = {"v": RECORD_VERSION, "rid": rec.rid, "writer": rec.writer, "claim": rec.claim, "part": part, "parts": parts,
         "base": rec.base, "kind": rec.kind,
         "source": [src.topic, src.partition, src.first, src.next, src.epoch], "source_tid": src.topic_id,
         "n_docs": rec.n_docs, "n_tokens": rec.n_tokens, "objective": rec.objective,
         "entropy": rec.entropy, "alloc": rec.alloc, "new_words": rec.new_words, "tokens": rec.tokens,
         "targets": rec.targets, "reborn": rec.reborn}
    if rec.settings is not None:
        m["settings"] = rec.settings
    _pack_rows(m, rec)
    for name in _SINGLES:
        m[name] = _pack_array(name, getattr(rec, name))
    return m


def _row_slice(rec: UpdateRecord, lo: int, hi: int) -> UpdateRecord:
    """Rows ``lo:hi`` of the summary (the per-document part goes with part 0)."""
    a, b = int(rec.indptr[lo]), int(rec.indptr[hi])
    new_before = int(np.count_nonzero(rec.known[:lo] < 0))
    new_in = int(np.count_nonzero(rec.known[lo:hi] < 0))
    docs = rec.doc_fields() if lo == 0 else UpdateRecord(rec.source, rec.base).doc_fields()
    return UpdateRecord(
        source=rec.source, base=rec.base, kind=rec.kind, n_docs=rec.n_docs, n_tokens=rec.n_tokens,
        objective=rec.objective, entropy=rec.entropy, alloc=rec.alloc, known=rec.known[lo:hi],
        new_words=rec.new_words[new_before:new_before + new_in], indptr=rec.indptr[lo:hi + 1] - a,
        topics=rec.topics[a:b], values=rec.values[a:b], totals=rec.totals[lo:hi], rid=rec.rid, writer=rec.writer,
        claim=rec.claim, **docs)


def encode(rec: UpdateRecord, max_bytes: int = MAX_RECORD_BYTES) -> list[bytes]:
    """The record as one or more msgpack messages of at most about ``max_bytes`` each: a summary split
    by its rows, a batch record (tokens) by its documents. A single document above the limit stays
    one message (the broker refuses it; the daemon's input limits keep documents far below it)."""
    whole = msgpack.packb(_to_map(rec, 0, 1), use_bin_type=True)
    batch = rec.kind == "batch"
    n = rec.n_docs if batch else rec.n_rows
    if len(whole) <= max_bytes or n <= 1:
        return [whole]
    part_of = _doc_slice if batch else _row_slice
    n_parts = -(-len(whole) // max(1, max_bytes - 4096))
    while True:
        cuts = np.linspace(0, n, n_parts + 1).astype(int)
        out = [msgpack.packb(_to_map(part_of(rec, int(lo), int(hi)), i, n_parts), use_bin_type=True)
               for i, (lo, hi) in enumerate(zip(cuts[:-1], cuts[1:]))]
        if max(map(len, out)) <= max_bytes or n_parts >= n:
            return out
        n_parts *= 2


def _doc_slice(rec: UpdateRecord, lo: int, hi: int) -> UpdateRecord:
    """Documents ``lo:hi`` of a batch record (tokens), with their targets."""
    return replace(rec, tokens=rec.tokens[lo:hi], targets=None if rec.targets is None else rec.targets[lo:hi])


def _settings_of(v) -> dict | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise ValueError(f"settings: a map expected, not {type(v).__name__}")
    return {str(k): val for k, val in v.items()}


class NewerFormat(ValueError):
    """An update record of a wire format newer than this release reads (``FORMAT_VERSION``)."""


def decode(raw: bytes) -> tuple[UpdateRecord | Rebase, int, int]:
    """One message -> (the record or its part, part index, number of parts); a rebase message
    (``rebase.py``) -> its ``Rebase`` part. Raises ValueError (``NewerFormat`` for a record of a
    newer format version: not to be skipped like foreign data)."""
    try:
        m = msgpack.unpackb(raw, raw=False)
    except (TypeError, ValueError, msgpack.exceptions.ExtraData) as exc:
        raise ValueError(f"not an update record: {exc!r}") from None
    v = m.get("v") if isinstance(m, dict) else None
    if isinstance(v, int) and v > FORMAT_VERSION and "rid" in m and "kind" in m:
        raise NewerFormat(f"an update record of wire format version {v}; this release reads up to version "
                          f"{FORMAT_VERSION}")
    try:
        if isinstance(m, dict) and m.get("kind") == "rebase":
            part = rebase_from_map(m)
            return part, part.part, part.parts
        topic, partition, first, nxt, epoch = m["source"]
        rec = UpdateRecord(
            source=Source(str(topic), int(partition), int(first), int(nxt), int(epoch),
                          str(m["source_tid"]) if m.get("source_tid") else None), base=int(m["base"]),
            kind=str(m["kind"]), n_docs=int(m["n_docs"]), n_tokens=int(m["n_tokens"]), objective=m["objective"],
            entropy=float(m["entropy"]), alloc=float(m["alloc"]), new_words=list(m["new_words"]),
            tokens=m["tokens"], targets=m.get("targets"), rid=str(m["rid"]), writer=str(m.get("writer") or ""),
            claim=int(m.get("claim", -1)), reborn=[int(k) for k in m.get("reborn") or ()],
            settings=_settings_of(m.get("settings")),
            **{name: _unpack_array(name, m[name]) for name in _ARRAYS if name in m})
        return rec, int(m["part"]), int(m["parts"])
    except (KeyError, TypeError, ValueError, msgpack.exceptions.ExtraData) as exc:
        raise ValueError(f"not an update record: {exc!r}") from None


class Assembler:
    """Parts of split records back into whole records (in the order their last part arrives)."""

    def __init__(self) -> None:
        self._parts: dict[str, dict[int, UpdateRecord]] = {}

    def add(self, rec: UpdateRecord, part: int, parts: int) -> UpdateRecord | None:
        if parts == 1:
            return rec
        have = self._parts.setdefault(rec.rid, {})
        have[part] = rec
        if len(have) < parts:
            return None
        del self._parts[rec.rid]
        ps = [have[i] for i in range(parts)]
        if ps[0].kind == "batch":  # split by documents (``encode``)
            return replace(ps[0], tokens=[t for p in ps for t in p.tokens],
                           targets=None if ps[0].targets is None else [y for p in ps for y in p.targets])
        offsets = np.cumsum([0] + [p.topics.size for p in ps])
        indptr = np.concatenate([np.zeros(1, np.int64)] + [p.indptr[1:] + o for p, o in zip(ps, offsets[:-1])])
        head = ps[0]
        return UpdateRecord(
            source=head.source, base=head.base, kind=head.kind, n_docs=head.n_docs, n_tokens=head.n_tokens,
            objective=head.objective, entropy=head.entropy, alloc=head.alloc,
            known=np.concatenate([p.known for p in ps]), new_words=[w for p in ps for w in p.new_words],
            indptr=indptr, topics=np.concatenate([p.topics for p in ps]),
            values=np.concatenate([p.values for p in ps]), totals=np.concatenate([p.totals for p in ps]),
            rid=head.rid, writer=head.writer, claim=head.claim, **head.doc_fields())


# --------------------------------------------------------------------------- the state machine


def digest(model) -> str:
    """sha256 over what replicas must agree on: topic-word statistics and their totals, vocabulary,
    alpha, counters, and the classifier's whole state (supervised models)."""
    h = hashlib.sha256()
    st = model.state
    h.update(np.ascontiguousarray(st.lam()).tobytes())
    h.update(np.ascontiguousarray(st.lam_totals()).tobytes())
    h.update("\x00".join(model.vocab.words).encode())
    h.update(np.ascontiguousarray(model.vocab.counts).tobytes())
    h.update(np.float64(st.alpha).tobytes())
    h.update(np.array([st.docs_seen, st.tokens_seen, st.n_updates, st.version, st.steps, st.n_seeded],
                       dtype=np.float64).tobytes())
    if model.head is not None:
        header, arrays = model.head.state()
        h.update(msgpack.packb(header, use_bin_type=True))
        for name in sorted(arrays):
            h.update(name.encode())
            h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def _sparse_rows(dense: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, cols = np.nonzero(dense)
    ptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.bincount(rows, minlength=dense.shape[0]), out=ptr[1:])
    return ptr, cols.astype(np.int32), dense[rows, cols].astype(np.float64)


def _dense_rows(ptr: np.ndarray, cols: np.ndarray, vals: np.ndarray, n_topics: int) -> np.ndarray:
    out = np.zeros((ptr.size - 1, n_topics))
    rows = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
    out[rows, cols] = vals
    return out


class Replica:
    """A model, the update-log offset it has applied up to, the replicated ledger of the source
    ranges the applied updates learned, and the partitions' owners.

    Ownership is fencing, decided in the log (docs/scale-out.md, "Claims"): a replica that is
    assigned a partition publishes a *claim* and resumes the partition where the ledger ends once
    its claim is applied; from then on, records of that partition computed under an older claim
    (a zombie that lost the partition without noticing) are skipped by every replica. So no two
    owners' differently cut batches can both reach the model, and the new owner's first batch
    starts exactly where the learned ranges end. ``owners`` (partition -> offset of its latest
    claim) goes into snapshots with the ledger; ``writer`` names this incarnation."""

    def __init__(self, model, offset: int = 0, ledger: OffsetLedger | None = None,
                 owners: dict[str, int] | None = None, writer: str = "") -> None:
        errs = check_replicable(model)
        if errs:
            raise ValueError("; ".join(errs))
        self.model = model
        self.offset = int(offset)          # the next update-log offset to apply
        self.ledger = ledger or OffsetLedger()
        self.owners: dict[str, int] = {str(k): int(v) for k, v in (owners or {}).items()}
        self.writer = writer or uuid.uuid4().hex[:12]
        self.claims: dict[str, int] = {}   # partitions this incarnation owns -> its claim's offset
        self.applied = 0
        self.skipped = 0
        self.fenced = 0                    # records skipped because a later claim took their partition
        self.foreign = 0                   # records skipped because they were computed under other settings
        self.settings = model_settings(model)
        # A replica whose model learned from the log (a snapshot at an update offset, with
        # documents), or that applied a record of its own settings (a claim included: an idle
        # fleet's log holds only claims), holds the log's settings: a record of other settings met
        # later is a misconfigured replica's, skipped. Before that, such a record means this
        # replica is the one that differs (``ForeignSettings``).
        self.settled = self.offset > 0 and model.state.docs_seen > 0
        # offsets of skipped records that no learned range covers (a zombie's batch cut
        # otherwise than its successor's): not learned from that record; see docs/scale-out.md
        self.unlearned = 0
        self._touched = np.zeros(0, dtype=np.bool_)  # word rows updates changed since ``observed``
        # record id -> the topics its births reset, for own records computed and not yet applied
        self._unborn: dict[str, list[int]] = {}

    def _touch(self, word_ids: np.ndarray) -> None:
        if word_ids.size:
            n = int(word_ids.max()) + 1
            if n > self._touched.size:
                self._touched = np.concatenate([self._touched, np.zeros(max(n, 2 * self._touched.size)
                                                                        - self._touched.size, dtype=np.bool_)])
            self._touched[word_ids] = True

    def observed(self, batch, n_known: int) -> Observed:
        """``Observed`` of a batch built against the vocabulary's first ``n_known`` words (its
        provisional ids left out); the rows touched since the last call join its candidates."""
        keep = batch.word_ids < n_known
        ends = np.concatenate([[0], np.cumsum(keep)])
        touched = np.flatnonzero(self._touched)
        self._touched[touched] = False
        uniq = np.concatenate([batch.uniq[batch.uniq < n_known], touched])  # repeats: the explorer dedups
        return Observed(ends[batch.doc_ptr], batch.word_ids[keep], uniq, np.empty(0, np.int64), batch.n_docs)

    def compute(self, tokens: list[list[str]], source: Source, labels: list | None = None,
                kernels=contextlib.nullcontext):
        """(the update record of a batch of token lists, ``Computed``: its documents' predictions
        from the same local step) against the model as it is; the predictions are None when the
        model has no topics yet, or topics still to seed (``seeding.continue_seeding``): the record
        then carries the tokens, and predictions come after it is applied. ``labels``: one target per
        document (None where unlabelled) for a supervised model. The model is left unchanged:
        new words get provisional ids past the vocabulary (it is not touched; they join it when the
        record is applied), and the classifier's changes happen to a fork of it.
        ``kernels()``: a context entered around the local step (the daemon's GIL-free section)."""
        model = self.model
        targets = self._targets(tokens, labels)
        if not model.state.fully_seeded:  # applying it seeds (more) topics from the batch, then learns
            n_tokens = sum(len(t) for t in tokens)
            return UpdateRecord(source=source, base=self.offset, kind="batch", n_docs=len(tokens), n_tokens=n_tokens,
                                tokens=[list(map(str, t)) for t in tokens], targets=targets,
                                writer=self.writer, claim=self.claims.get(source.key, -1),
                                settings=self.settings), None
        state = model.state
        n_known, n_rows, totals0 = len(model.vocab), state.n_words, state.mu_totals.copy()
        label_names = model.label_names
        with reading_ahead(model):  # a helper computes likely word rows while this thread builds the batch
            batch, provisional = build_batch_provisional(tokens, model.vocab)
            state.ensure_words(n_known + len(provisional))  # the new words' rows, at the prior
            try:
                head = None if model.head is None else fork_head(model.head)
                t0 = time.perf_counter()
                with kernels():
                    local, pre, feats, scores, predicted = model.local_steps(batch, targets, learn=True, head=head)
                stats = local_step_stats(batch, local, time.perf_counter() - t0)
                check_finite(local.summary, pre.doc_topic)  # no NaN reaches the log (every replica would apply it)
                out = Computed(model.theta(pre.doc_topic, model.state.alpha), scores, predicted,
                               label_names if scores is not None else [], self.observed(batch, n_known), stats)
                # births are decided here and travel in the record (every replica resets the same topics)
                rng = np.random.default_rng([int(model.seed), self.offset])
                spare = sorted({k for ks in self._unborn.values() for k in ks})
                sm, reborn = births_for(model, batch, local.summary, rng=rng, spare=spare)
                known = np.where(sm.word_ids < n_known, sm.word_ids, -1).astype(np.int64)
                new_words = [provisional[i - n_known] for i in sm.word_ids[known < 0]]
                totals = np.bincount(batch.local, weights=batch.counts, minlength=batch.uniq.size)
            finally:
                state.shrink_words(n_rows)
                state.mu_totals[:] = totals0  # exactly: (x + s) - s need not be x in floating point
        # the summary's rows are batch.uniq in order (summarize_sparse / summarize_dense)
        ptr, cols, vals = _sparse_rows(pre.doc_topic)
        rec = UpdateRecord(source=source, base=self.offset, n_docs=batch.n_docs, n_tokens=int(batch.n_tokens),
                           objective=float(local.objective), entropy=float(sm.entropy), alloc=float(sm.alloc),
                           known=known, new_words=new_words, indptr=sm.indptr.astype(np.int64),
                           topics=sm.topics.astype(np.int32), values=sm.values.astype(np.float64),
                           totals=totals.astype(np.float64), doc_ptr=ptr, doc_topics=cols, doc_values=vals,
                           writer=self.writer, claim=self.claims.get(source.key, -1), reborn=reborn,
                           settings=self.settings)
        if reborn:
            self._unborn[rec.rid] = list(reborn)
            while len(self._unborn) > UNBORN_KEPT:  # records never applied (dropped at a revocation)
                self._unborn.pop(next(iter(self._unborn)))
        if targets is not None:
            rec.targets, rec.doc_len = targets, doc_lengths(batch).astype(np.float64)
            feats = training_counts(model.features, local, feats)
            if feats is not pre.doc_topic:  # the classifier reads other counts than doc_*
                rec.sup_ptr, rec.sup_topics, rec.sup_values = _sparse_rows(feats)
        return rec, out

    def _targets(self, tokens: list, labels: list | None) -> list | None:
        """The batch's targets as a record carries them (None: unsupervised, or none labelled)."""
        if labels is None or self.model.head is None:
            return None
        labels = list(labels)
        if len(labels) != len(tokens):
            raise ValueError(f"{len(labels)} labels for {len(tokens)} documents")
        if all(is_missing(t) for t in labels):
            return None
        # msgpack-able as they travel: lists for multi-label sets, NaN for a missing response
        return [sorted(t) if isinstance(t, (set, frozenset)) else list(t) if isinstance(t, tuple) else t
                for t in labels]

    def claim(self, topic: str, partition: int, epoch: int, topic_id: str | None = None) -> UpdateRecord:
        """The claim record this replica publishes when it is assigned ``topic``:``partition``
        (it computes nothing for the partition until the claim is applied: ``claimed``). A claim
        in a later epoch moves every replica's ledger to it, with ``topic_id`` (the topic's now)."""
        return UpdateRecord(source=Source(topic, int(partition), 0, 0, int(epoch), topic_id), base=self.offset,
                            kind="claim", writer=self.writer, settings=self.settings)

    def claimed(self, key: str) -> bool:
        """Whether this incarnation's latest claim of ``key`` has been applied and still stands."""
        return key in self.claims and self.owners.get(key) == self.claims[key]

    def apply(self, rec: UpdateRecord, offset: int) -> bool:
        """Apply the record read at update-log ``offset`` (in log order). False when it is skipped,
        identically by every replica: its source range was learned already, or a later claim
        took its partition from the claim it was computed under."""
        if offset < self.offset:
            return False  # replayed from before our snapshot: already in the model
        self.offset = offset + 1
        self._unborn.pop(rec.rid, None)
        if self._foreign(rec, offset):  # before anything changes (a claim's settings count too: fleets start idle)
            return False
        self.settled = True
        src = rec.source
        key = src.key
        while self.ledger.epoch(key) < src.epoch:  # a new log of the partition: its topic id, if known
            self.ledger.new_epoch(key, src.topic_id if self.ledger.epoch(key) + 1 == src.epoch else None)
        if rec.kind == "claim":
            if self.ledger.epoch(key) == src.epoch:
                self.ledger.name_log(key, src.topic_id)  # which log its offsets refer to, from the start
            self.owners[key] = offset
            if rec.writer == self.writer:
                self.claims[key] = offset
            return True
        if key in self.owners and rec.claim != self.owners[key]:
            self.skipped += 1
            self.fenced += 1
            log.warning("update log: a record computed under an older claim of its partition is skipped (its writer "
                        "lost the partition)", extra={"update_offset": offset, "partition": key, "writer": rec.writer,
                                                      "claim": rec.claim, "owner_claim": self.owners[key],
                                                      "first": src.first, "next": src.next})
            return False
        if self.ledger.epoch(key) > src.epoch or any(
                self.ledger.covers(key, o) for o in (src.first, src.next - 1)):
            self.skipped += 1
            if self.ledger.epoch(key) == src.epoch:
                self._note_partial(src, offset)
            return False
        model = self.model
        problem = self._unacceptable(rec)
        if problem is None:
            try:
                self._learn(rec, offset, model.memo_key(src.batch_key))
            except Exception as exc:  # noqa: BLE001 - alike on every replica: same state, same record
                problem = f"{type(exc).__name__}: {exc} (raised while applying)"
        self.ledger.learned(key, src.first, src.next, topic_id=src.topic_id)  # either way its owner moves on
        if problem is not None:
            self.skipped += 1
            self.unlearned += src.next - src.first
            log.error("update log: a record the model cannot learn is skipped", extra={
                "update_offset": offset, "partition": key, "first": src.first, "next": src.next, "reason": problem})
            return False
        self.applied += 1
        return True

    def _foreign(self, rec: UpdateRecord, offset: int) -> bool:
        """Whether ``rec`` was computed under other model settings and is skipped: identically on
        every replica of the log's settings, which leave its source range uncovered (the
        partition's next owner reads it again). Raises ``ForeignSettings`` (the offset stays
        before the record) on a replica that has not met the log's settings yet."""
        diff = settings_differences(rec.settings, self.settings)
        if not diff:
            return False
        if not self.settled:
            self.offset = offset
            raise ForeignSettings(offset, rec.writer, diff)
        self.skipped += 1
        self.foreign += 1
        log.error("update log: a record computed under other model settings is skipped (a misconfigured replica "
                  "wrote it; its documents are read again by the partition's next owner)", extra={
                      "update_offset": offset, "writer": rec.writer, "partition": rec.source.key,
                      "first": rec.source.first, "next": rec.source.next,
                      "differences": {k: {"record": a, "model": b} for k, (a, b) in diff.items()}})
        return True

    def _learn(self, rec: UpdateRecord, offset: int, batch_key) -> None:
        model = self.model
        if rec.kind == "batch":
            model.rng = np.random.default_rng([int(model.seed), int(offset)])
            batch = model.prepare(rec.tokens, grow=True)
            model.process(batch, learn=True, batch_key=batch_key, labels=rec.targets)
            self._touch(batch.uniq)
            return
        doc_topic = _dense_rows(rec.doc_ptr, rec.doc_topics, rec.doc_values, model.n_topics)
        summary = self._summary(rec)
        steps_before = model.state.steps
        model.learn(summary, rec.objective, doc_topic, rec.n_docs, rec.n_tokens, batch_key, rec.reborn)
        self._touch(summary.word_ids)
        if rec.targets is not None and model.head is not None:
            self._learn_head(rec, doc_topic, batch_key, steps_before)

    def _note_partial(self, src: Source, offset: int) -> None:
        """A skipped record that overlaps the learned ranges only in part: its uncovered offsets
        are not learned from it. Counted and logged (identically on every replica)."""
        gaps, at = [], src.first
        for a, b in self.ledger.ranges(src.key):
            if b <= at or a >= src.next:
                continue
            if a > at:
                gaps.append((at, a))
            at = max(at, b)
        if at < src.next:
            gaps.append((at, src.next))
        if gaps:
            self.unlearned += sum(b - a for a, b in gaps)
            log.error("update log: a record overlaps learned offsets only in part and is skipped; its uncovered "
                      "offsets are not learned from it", extra={"update_offset": offset, "partition": src.key,
                                                                 "epoch": src.epoch, "uncovered": gaps})

    def _unacceptable(self, rec: UpdateRecord) -> str | None:
        """Why applying ``rec`` would fail, checked before anything changes (None: it would not).
        The classifier's labels may have grown since the record was computed, past a label cap
        with ``on_overflow="error"``: with a capped label vocabulary (the only check that depends
        on the state at apply time; a summary's targets were encoded once already, on the computing
        replica) and for a record that carries its tokens (computed before any topic, nothing was
        encoded), the targets are tried on a fork of it. Anything else raising while applied is
        caught by ``apply``."""
        head = self.model.head
        if rec.targets is None or head is None:
            return None
        try:
            if len(rec.targets) != rec.n_docs or (rec.kind != "batch" and rec.doc_len.size != rec.n_docs):
                raise ValueError(f"{len(rec.targets)} targets and {rec.doc_len.size} lengths for "
                                 f"{rec.n_docs} documents")
            if rec.kind == "batch" or (head.labels.max_labels is not None and head.labels.on_overflow == "error"):
                fork_head(head).encode_targets(rec.targets, grow=True)
        except (ValueError, TypeError) as exc:
            return f"{type(exc).__name__}: {exc}"
        return None

    def _learn_head(self, rec: UpdateRecord, doc_topic: np.ndarray, batch_key, steps_before: float) -> None:
        """The classifier learns the record's labelled documents as ``TopicModel.process`` has it
        learn a batch: calibrate on the lengths, then update on the features."""
        head = self.model.head
        head.calibrate(rec.doc_len, head.encode_targets(rec.targets, grow=True))
        feats = doc_topic
        if rec.sup_ptr.size > 1:
            feats = _dense_rows(rec.sup_ptr, rec.sup_topics, rec.sup_values, self.model.n_topics)
        decay = classifier_decay(self.model.updater, steps_before, rec.n_docs, self.model.options.supervision.decay)
        head.update(normalise_rows(feats), rec.targets, batch_key=batch_key, decay=decay)

    def _summary(self, rec: UpdateRecord) -> Summary:
        """The record's summary over this model's word ids (new words join the vocabulary in row
        order; rows the vocabulary refuses are dropped, alike on every replica)."""
        model = self.model
        # Known rows keep their ids (no second lookup of ~all the batch's words); new words are
        # looked up (an earlier record may have added them since ``base``), the rest appended.
        ids = rec.known.copy()
        new_rows = np.flatnonzero(ids < 0)
        if new_rows.size:
            ids[new_rows] = model.vocab.ids(rec.new_words)
        ids, evicted = model.vocab.add_rows(ids, dict(zip(new_rows.tolist(), rec.new_words)), rec.totals)
        if evicted.size:
            model.state.reset_words(evicted)
            model.updater.forget_words(evicted)
        model.state.ensure_words(len(model.vocab))
        ids = np.asarray(ids, dtype=np.int64)
        keep_row = ids >= 0
        if keep_row.all():  # the usual case: no row refused, the record's arrays as they are
            indptr, topics, values = rec.indptr, rec.topics, rec.values
        else:
            lengths = np.diff(rec.indptr)
            keep = np.repeat(keep_row, lengths)
            topics, values, ids = rec.topics[keep], rec.values[keep], ids[keep_row]
            indptr = np.zeros(ids.size + 1, dtype=np.int64)
            np.cumsum(lengths[keep_row], out=indptr[1:])
        totals = np.bincount(topics, weights=values, minlength=model.n_topics)
        return Summary(word_ids=ids, indptr=indptr, topics=topics, values=values, topic_totals=totals,
                       n_docs=rec.n_docs, n_tokens=float(rec.n_tokens), entropy=rec.entropy, alloc=rec.alloc)
