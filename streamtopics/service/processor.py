"""Records in, one typed outcome per batch out: decode, tokenize, predict, learn.

``RecordDecoder`` turns one Kafka record into a ``Decoded`` value (its documents, its dead
letters with reasons, and the tokens of its texts, made once and ahead of time by the consumer's
read-ahead thread while the loop runs GIL-free kernels).

``BatchProcessor.run`` takes the decoded documents of a cut batch and the model, and returns a
``BatchOutcome``: which documents were kept, which had no tokens, their topic mixtures and
supervised predictions (made by the model *before* it learned the batch: prequential), the
dead letters, the stage timings and the local step's diagnostics. No Kafka, no metrics: the
daemon records the outcome's offsets, telemetry observes it, the publisher encodes it.

A document that makes the model raise must not crash the daemon into a restart loop (the same
batch again after every restart): ``run`` narrows the failure down to the documents that raise,
dead-letters them as ``model_error`` and learns the rest (``narrow_failure``).
"""
from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..model import reading_ahead
from ..stream.codec import DeadLetter, Document, decode_message, encode_document, is_array_message
from ..supervised.targets import conform_targets

__all__ = ["BatchOutcome", "BatchProcessor", "Decoded", "HostFailure", "RecordDecoder", "StepResult", "fit_targets",
           "over_capacity", "targets_of"]

log = logging.getLogger("streamtopics.daemon")


class StepInterrupted(Exception):
    """A step gave up for a reason that is not its documents' (the daemon stopping while the
    batch waited for the update log): re-raised by ``BatchProcessor.run``, never dead-lettered.
    The batch is neither learned nor published; its input is read again after the restart."""


class HostFailure(RuntimeError):
    """The model raised an OSError on a batch before learning it (a full disk, a read-only or lost
    directory): the host's failure, not the documents'. Their dead letters would lose them for good
    (bad-input audit: a full disk dead-lettered every document as model_error and committed past
    them), so the batch is undone and the daemon stops (exit 1); its input is read again after the
    restart."""


@dataclass
class Decoded:
    """One record, decoded: its documents, its dead letters, and tokens made ahead of time."""

    docs: list[Document]
    dead: list[DeadLetter]
    index: list[int | None]  # element index of each document inside an array message
    # Raw texts tokenized at decode time (None: a token-list document, or not done), and the
    # tokenizer that made them: used only while it is still the model's tokenizer.
    tokens: list | None = None
    tokenizer: Any = None


class RecordDecoder:
    """``decoder(record) -> (Decoded, number of documents)`` for the batching consumer.

    ``tokenizer()`` gives the current model's tokenizer (None before a model is loaded);
    ``point(name)``: the daemon's hook ("decode").
    """

    def __init__(self, limits, fmt: str, tokenizer: Callable[[], Any], point: Callable[[str], None] = None) -> None:
        self.limits = limits
        self.fmt = fmt
        self._tokenizer = tokenizer
        self._point = point or _none

    def __call__(self, record) -> tuple[Decoded, int]:
        self._point("decode")
        error = getattr(record, "unreadable", None)  # the Kafka client could not parse it (stream.consumer)
        if error is not None:
            dead = DeadLetter("corrupt_record", f"the Kafka client could not read this record ({error}); a record it "
                              "cannot parse, such as one with a header key that is not UTF-8, also hides the records "
                              "after it in its record batch, which are dead-lettered alike", topic=record.topic,
                              partition=record.partition, offset=record.offset)
            return Decoded([], [dead], [], None, self._tokenizer()), 0
        docs, dead = decode_message(record.value, self.limits, topic=record.topic, partition=record.partition,
                                    offset=record.offset, fmt=self.fmt, key=getattr(record, "key", None),
                                    headers=getattr(record, "headers", None))
        index: list[int | None] = [None] * len(docs)
        if docs and is_array_message(record.value, self.fmt):  # element positions, skipping the bad elements
            bad = {d.index for d in dead}
            index = [i for i in range(len(docs) + len(dead)) if i not in bad]
        tokenizer = self._tokenizer()
        tokens = None
        if tokenizer is not None and docs:
            try:  # a tokenizer failure is handled where the batch is learned (model_error)
                tokens = [tokenizer(d.text) if d.text is not None else None for d in docs]
            except Exception:  # noqa: BLE001
                tokens = None
        return Decoded(docs, dead, index, tokens, tokenizer), len(docs)


def _none(*_a) -> None:
    return None


def targets_of(docs: list[Document], supervision: str) -> list | None:
    """Each document's training target for a supervised model (None where it has none)."""
    if supervision == "none":
        return None
    if supervision == "regression":
        return [d.response for d in docs]
    return [d.labels if d.labels is not None else d.label for d in docs]


def misfit_targets(docs: list[Document], supervision: str) -> int:
    """Documents whose only target is of the other kind than the model learns (a ``label``/``labels``
    for a regression model, a ``response`` for a classifier): documented as ignored, but a stream of
    them means a misconfigured producer or model (bad-input audit: they went without a trace)."""
    if supervision == "none":
        return 0
    if supervision == "regression":
        return sum(d.response is None and (d.label is not None or d.labels is not None) for d in docs)
    return sum(d.response is not None and d.label is None and d.labels is None for d in docs)


MISFIT_WARN_EVERY_S = 60.0


def over_capacity(targets: list, labels) -> dict[int, str]:
    """{position: why} of the documents whose labels would overflow a capped label vocabulary
    (``labels``: the classifier's ``LabelVocabulary``) that refuses the overflow
    (``on_overflow="error"``): new labels are admitted in batch order while there is room, so one
    document with a label too many is dead-lettered instead of failing its whole batch (which left
    a capped classifier with no label at all)."""
    cap = labels.max_labels
    if cap is None or labels.on_overflow != "error":
        return {}
    admitted, bad = set(labels), {}
    for i, t in enumerate(targets):
        if t is None:
            continue
        new = [x for x in dict.fromkeys([t] if isinstance(t, str) else t) if x not in admitted]
        if len(admitted) + len(new) > cap:
            bad[i] = (f"new label(s) {', '.join(repr(x) for x in new[:3])} would exceed the classifier's "
                      f"max_labels = {cap} (it has {len(admitted)}: set [model.supervision] max_labels)")
        else:
            admitted.update(new)
    return bad


@dataclass
class StepResult:
    """What the model made of some positions of a batch."""

    keep: list[int] = field(default_factory=list)   # positions predicted and learned
    empty: list[int] = field(default_factory=list)  # positions left without tokens
    theta: np.ndarray | None = None                 # topic mixtures of ``keep``
    n_tokens: int = 0
    label_names: list | None = None                 # a replica's score columns (None: the batch's)
    sup: tuple | None = None                        # (scores, predictions) of ``keep``; None: none yet
    batch: Any = None                               # the prepared Batch (for the topic monitor)
    stats: dict = field(default_factory=dict)       # the local step's diagnostics


@dataclass
class BatchOutcome:
    """A processed batch: everything the daemon publishes, records and observes."""

    docs: list[Document]
    srcs: list[tuple[Any, int | None]]  # (record, element index in an array message) per document
    texts: list
    dead: list[DeadLetter]
    step: StepResult
    version: int                        # the model version that predicted (before learning)
    label_names: list                   # the labels the scores are over (fixed with the batch)
    targets: list | None
    stages: dict[str, float]
    error: BaseException | None = None  # the model raised (its documents are dead letters)

    @property
    def ids(self) -> list:
        return [self.docs[i].id for i in self.step.keep]

    def origins(self) -> list[float]:
        """Each kept document's origin time for the end-to-end latency: its Kafka record's
        timestamp, as the metric says (NaN without one). Not the document's ``ts``, an event time:
        a backfill of week-old events put every latency in +Inf, and future ones at 0."""
        out = []
        for i in self.step.keep:
            ts = self.srcs[i][0].timestamp
            out.append(ts / 1000.0 if ts and ts > 0 else float("nan"))
        return out


class BatchProcessor:
    """Tokenize, predict and learn a batch; see the module docstring.

    ``point(name)``: the daemon's named hook points ("tokenized", "prepared", "learn");
    ``gil_free(flag)`` says whether this thread is about to run GIL-free kernels (True: the
    publisher thread may do its GIL-bound work now) or GIL-bound Python (False);
    ``prefetch()`` is called as the kernels start, so the next records arrive meanwhile.
    """

    def __init__(self, *, point: Callable[[str], None] = _none,
                 gil_free: Callable[[bool], None] = _none, prefetch: Callable[[], None] = _none,
                 compute: Callable[[list, list | None], Any] | None = None) -> None:
        # replicas (service/replica_sync.py): (tokens, labels) -> replication.Computed; the model
        # learns from the update log
        self._compute = compute
        self._point = point
        self._gil_free = gil_free
        self._prefetch = prefetch
        self._prepare_mark: tuple | None = None  # restore point of the model before its prepare()
        self._misfit_warned_at = -math.inf  # the last WARNING about targets of the other kind (``misfit_targets``)

    def run(self, model, records: list, decoded: list, batch_key: str, decode_seconds: float = 0.0) -> BatchOutcome:
        docs: list[Document] = []
        srcs: list[tuple[Any, int | None]] = []
        dead: list[DeadLetter] = []
        pre: list = []  # tokens made at decode time, None where not
        for rec, dec in zip(records, decoded):
            dead.extend(dec.dead)
            fresh = dec.tokens is not None and dec.tokenizer is model.tokenizer
            pre.extend(dec.tokens if fresh else [None] * len(dec.docs))
            for doc, idx in zip(dec.docs, dec.index):
                docs.append(doc)
                srcs.append((rec, idx))
        stages = {"decode": decode_seconds, "predict": 0.0, "learn": 0.0}
        # the targets the model learns (its own supervision: a snapshot's model is kept over a
        # [model] that differs, and the documents must be read as that model takes them)
        supervision = getattr(model, "supervision", None) or "none"
        targets = targets_of(docs, supervision)
        self._warn_misfit(misfit_targets(docs, supervision), supervision, batch_key)
        if targets is not None and supervision != "regression":
            head = getattr(model, "head", None)
            targets, misfit = conform_targets(targets, None if head is None else head.task)
            if head is not None:
                misfit.update(over_capacity([None if i in misfit else t for i, t in enumerate(targets)],
                                            head.labels))
            for i, why in sorted(misfit.items()):
                rec, idx = srcs[i]
                dead.append(DeadLetter("bad_label", why, idx, rec.topic, rec.partition, rec.offset,
                                       rec.value if idx is None else encode_document(docs[i])))
            if misfit:
                keep = [i for i in range(len(docs)) if i not in misfit]
                docs, srcs, pre, targets = ([x[i] for i in keep] for x in (docs, srcs, pre, targets))
        texts = [d.text if d.text is not None else d.tokens for d in docs]
        out = BatchOutcome(docs, srcs, texts, dead, StepResult(), model.version,
                           # the labels the scores are over, fixed now: the publisher thread must
                           # not read the live model (which learns labels or is replaced)
                           list(model.label_names or []) if targets is not None else [], targets, stages)
        try:
            out.step = self.step(model, texts, list(range(len(docs))), batch_key, stages, targets, pre)
            if out.step.label_names is not None:  # a replica: the columns of the model that predicted
                out.label_names = out.step.label_names
        except StepInterrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the model on this input
            if isinstance(exc, OSError) and model.version == out.version:  # the host's, and not learned yet
                mark, self._prepare_mark = self._prepare_mark, None
                if mark is not None:
                    model.undo_prepare(mark)
                raise HostFailure(f"the model failed on the host, not on the documents: {exc!r}; the batch "
                                  "was not learned and is read again after the restart") from exc
            out.error = exc
            out.step = self.narrow_failure(model, out, batch_key, exc)
        for i in out.step.empty:
            rec, idx = srcs[i]
            dead.append(DeadLetter(
                "empty_document", "no token left after tokenization (stopwords, short or long words only)",
                idx, rec.topic, rec.partition, rec.offset,
                rec.value if idx is None else encode_document(docs[i])))
        return out

    def _warn_misfit(self, n: int, supervision: str, batch_key: str) -> None:
        now = time.monotonic()
        if n and now - self._misfit_warned_at >= MISFIT_WARN_EVERY_S:  # at most once a minute
            self._misfit_warned_at = now
            wanted = "a 'response'" if supervision == "regression" else "a 'label' or 'labels'"
            log.warning(f"documents carry a target of the other kind: the model ({supervision}) learns from {wanted}; "
                        "they are learned as unlabelled", extra={"documents": n, "batch_key": batch_key})

    def step(self, model, texts: list, idx: list[int], batch_key: str, stages: dict[str, float],
             targets: list | dict | None = None, pre: list | None = None) -> StepResult:
        """Tokenize ``texts`` (positions ``idx`` of the batch; ``pre``: tokens already made for
        them at decode time, None where not), predict and learn. ``targets`` holds the whole
        batch's labels by position (None: unsupervised model). While the batch is built, a
        helper reads ahead the word rows it will probably need (``model.reading_ahead``;
        not for a replica, whose batches learn through the update log)."""
        with reading_ahead(model) if self._compute is None else nullcontext():
            return self._step(model, texts, idx, batch_key, stages, targets, pre)

    def _step(self, model, texts, idx, batch_key, stages, targets, pre) -> StepResult:
        t0 = time.perf_counter()
        self._prepare_mark = None
        self._gil_free(False)
        if pre is None:
            tokens = model.tokenize(texts) if texts else []
        else:
            tokens = list(pre)
            todo = [j for j, t in enumerate(pre) if t is None]
            if todo:
                for j, t in zip(todo, model.tokenize([texts[j] for j in todo])):
                    tokens[j] = t
        self._point("tokenized")
        res = StepResult(keep=[idx[j] for j, t in enumerate(tokens) if t],
                         empty=[idx[j] for j, t in enumerate(tokens) if not t])
        stages["decode"] += time.perf_counter() - t0
        if not res.keep:
            return res
        if self._compute is not None:
            # A replica's compute says itself when it runs GIL-free (around the local step's
            # kernels only: its vocabulary and record building are GIL-bound Python).
            kept = [t for t in tokens if t]
            self._prefetch()
            self._point("learn")
            t0 = time.perf_counter()
            got = self._compute(kept, None if targets is None else [targets[i] for i in res.keep])
            self._gil_free(False)
            res.theta, res.label_names, res.batch, res.stats = got.theta, got.label_names, got.batch, got.stats or {}
            res.sup = None if got.predicted is None else (got.scores, got.predicted)
            stages["predict"] = time.perf_counter() - t0
            res.n_tokens = sum(map(len, kept))
            return res
        t0 = time.perf_counter()
        self._prepare_mark = model.prepare_mark()  # restore point should the step fail
        batch = res.batch = model.prepare([t for t in tokens if t], grow=True)
        stages["decode"] += time.perf_counter() - t0
        self._point("prepared")
        # The next records arrive while the kernels run. Polled before the flag is set: the poll
        # is GIL-bound Python, and the helper threads the flag wakes would make it wait for the GIL.
        self._prefetch()
        self._gil_free(True)
        self._point("learn")
        labels = None if targets is None else [targets[i] for i in res.keep]
        local = model.process(batch, learn=True, batch_key=batch_key, labels=labels)
        # GIL-bound Python again until the next kernel or an idle wait: publishing this batch
        # then overlaps the next batch's kernels instead of its tokenization.
        self._gil_free(False)
        res.theta, res.stats = local.theta, local.stats  # BatchResult: nothing read from the live model
        stages["predict"], stages["learn"] = res.stats.get("local_seconds", 0.0), res.stats.get("update_seconds", 0.0)
        res.sup = None if local.predicted is None else (local.scores, local.predicted)
        res.n_tokens = int(batch.n_tokens)
        return res

    def narrow_failure(self, model, out: BatchOutcome, batch_key: str, exc: BaseException) -> StepResult:
        """The model raised on a batch: dead-letter the documents it raises on and learn the rest.

        Narrowing: each document alone is tokenized and predicted without learning; the ones
        that raise are dead letters (``model_error``), and the batch is learned without them.
        When the update itself had already run, or no single document raises, or the rest
        raises again, the whole batch is dead-lettered (it is never retried: no restart loop).
        """
        self._gil_free(True)
        texts, targets = out.texts, out.targets
        log.error("the model raised on a batch; dead-lettering the documents it fails on",
                  extra={"error": repr(exc), "batch_key": batch_key, "docs": len(texts)}, exc_info=exc)
        every = list(range(len(texts)))
        # The failed step may have grown the vocabulary and counted the batch's words
        # (prepare) before raising: undo that, or a retry would count them twice. When it
        # cannot be undone (words evicted, or the update ran), nothing is retried.
        mark, self._prepare_mark = self._prepare_mark, None
        untouched = model.version == out.version and (mark is None or model.undo_prepare(mark))
        bad = self._failing_documents(model, texts, targets) if untouched else []
        result = None
        error = exc
        if bad and len(bad) < len(texts) and untouched:
            rest = [i for i in every if i not in set(bad)]
            try:
                result = self.step(model, [texts[i] for i in rest], rest, batch_key, out.stages,
                                   None if targets is None else {i: targets[i] for i in rest})
            except Exception as exc2:  # noqa: BLE001
                error = exc2
                if self._prepare_mark is not None and model.version == out.version:
                    model.undo_prepare(self._prepare_mark)  # the batch is dead-lettered whole
                self._prepare_mark = None
                log.error("the batch without the failing documents raised again; dead-lettering it all",
                          extra={"error": repr(exc2), "batch_key": batch_key})
        if result is None:
            bad = every
        detail = f"the model raised {type(error).__name__}: {error}"
        for i in bad:
            rec, idx = out.srcs[i]
            out.dead.append(DeadLetter("model_error", detail, idx, rec.topic, rec.partition, rec.offset,
                                       rec.value if idx is None else encode_document(out.docs[i])))
        return result if result is not None else StepResult()

    @staticmethod
    def _failing_documents(model, texts: list, targets: list | None) -> list[int]:
        """Positions whose document alone makes tokenizing, preparing, predicting or encoding
        its label raise (the model is left as it was)."""
        bad: list[int] = []
        vocab = model.vocab
        for i in range(len(texts)):
            try:
                toks = model.tokenize([texts[i]])
                if toks[0]:
                    # With its new words (they may be what fails), undone after the check.
                    grow = vocab.cap is None or len(vocab) < vocab.cap
                    one_mark = model.prepare_mark()
                    try:
                        one = model.prepare(toks, grow=grow)
                        if model.state.initialized:  # a model with no topics yet cannot predict
                            model.process(one, learn=False)
                    finally:
                        if grow:
                            model.undo_prepare(one_mark)
                if targets is not None and targets[i] is not None:
                    model.head.encode_targets([targets[i]], grow=False, unknown="ignore")
            except Exception:  # noqa: BLE001
                bad.append(i)
        return bad
