"""The daemon: Kafka minibatches in, predictions out, model and offsets saved together.

One loop, one thread, per batch::

    poll (one partition, up to batch.max_docs documents or batch.max_wait_ms)
      -> decode and validate          (bad records -> dead-letter topic, with reason and source)
      -> tokenize, prepare            (documents with no token left -> dead letter ``empty_document``)
      -> local step with the current topics = the predictions (prequential), then the global update
      -> publish predictions and dead letters, wait for every acknowledgement
      -> snapshot when due (after the first learned batch, every N batches / T seconds, and at
         shutdown), then commit that snapshot's offsets to the group

Exactly-once learning (docs/exactly-once.md). The model in memory always travels with its
offset ledger (``service/ledger.py``: learned offset ranges per partition and log epoch): both
change together right after a batch is learned, and every snapshot stores both in one atomic
file, with the lineage (id, sequence) and this instance's id. At start the newest *valid*
snapshot is loaded (corrupt or truncated files are skipped with a warning and
``streamtopics_snapshot_load_failures_total``), and on every partition assignment each partition
is sought to the ledger's position (no snapshot at all: earliest; a partition this lineage never
saw: the group's committed offset, else earliest). The group's committed offsets only ever come
from written snapshots (``CommitGate``), so they never pass what a snapshot holds. Records read
again after a crash are therefore predicted again (same id; downstream deduplicates) but learned
only by a model that had not learned them; a record whose offset the ledger holds is never
learned again, whatever the broker returns. Batches are cut deterministically from a
partition's offsets and the memoized update is keyed by ``"topic:partition:first_offset"``, so a
restarted daemon replays the very batches an uninterrupted one would have learned.

A snapshot is written only when every prediction of the learned batches has been acknowledged
(so a snapshot never claims documents whose predictions were lost). Disk errors are counted and
logged; the daemon keeps running and keeps the previous snapshots; a failed *final* snapshot
exits with status 1. One daemon per snapshot directory (``service/checkpoint.py`` lock).

Kafka errors never end the loop: the broker being away shows as
``streamtopics_broker_up 0`` and a failing ``/readyz``; polling and publishing
retry with backoff, and clients are rebuilt after fatal errors.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from kafka import TopicPartition

from . import __version__
from .config import (
    Config,
    ConfigError,
    check_daemon_config,
    model_from_config,
    param_differences,
    prequential_window,
)
from .explore import TopicExplorer
from .metrics import PROPOSALS, Metrics, MetricsServer
from .model import TopicModel
from .service.checkpoint import CommitGate, DirectoryLock, Lineage, LockHeld, SnapshotStore
from .service.ledger import OffsetLedger, fingerprint
from .snapshot import SnapshotWriteError
from .stream import faults
from .stream.codec import (
    ALL_REASONS,
    DeadLetter,
    Document,
    decode_message,
    encode_dead_letter,
    encode_document,
    encode_prediction,
    fill_record_meta,
    is_array_message,
    prediction_key,
)
from .stream.consumer import BatchingConsumer, RecordBatch
from .stream.producer import OutMessage, PublishJob, PublishPipeline, Publisher

__all__ = ["Daemon", "SnapshotStore", "ensure_topics"]

log = logging.getLogger(__name__)

TOP_TOPICS = 10          # at most this many [topic, proportion] pairs per prediction ...
MIN_TOPIC_PROB = 0.01    # ... each at least this large (the largest one is always kept)
RATE_TAU_S = 10.0        # time constant of the docs/s and tokens/s moving averages
PROGRESS_LOG_S = 30.0    # an INFO "progress" line this often
SNAPSHOT_ACK_WAIT_S = 5.0  # a due snapshot waits this long for acknowledgements, then is postponed


# --------------------------------------------------------------------------- configuration


# --------------------------------------------------------------------------- topics


def _reachable(bootstrap: str, timeout: float = 0.5) -> bool:
    for item in filter(None, (s.strip() for s in bootstrap.split(","))):
        host, _, port = item.rpartition(":") if item.count(":") == 1 or item.startswith("[") else (item, "", "9092")
        host = host.strip("[]") or item
        try:
            with socket.create_connection((host, int(port or 9092)), timeout=timeout):
                return True
        except (OSError, ValueError):
            continue
    return False


def ensure_topics(cfg: Config, timeout_s: float = 15.0, created: list[str] | None = None) -> dict[str, int]:
    """Create the daemon's topics when missing (before any client could auto-create them).

    Returns the partition count of each topic; the names actually created are appended to
    ``created``. Raises on failure (the caller retries).
    """
    from kafka import KafkaAdminClient
    from kafka import errors as kerrors

    k, t = cfg.kafka, cfg.topics
    wanted = {t.input: k.input_partitions, t.output: k.input_partitions, t.dead_letter: 1}
    if t.snapshots:
        wanted[t.snapshots] = 1
    if t.events:
        wanted[t.events] = 1
    if not _reachable(k.bootstrap_servers):
        # A KafkaAdminClient that cannot bootstrap leaves its IO thread behind.
        raise ConnectionError(f"no broker reachable at {k.bootstrap_servers}")
    ms = int(timeout_s * 1000)
    admin = KafkaAdminClient(**k.admin_kwargs(), bootstrap_timeout_ms=ms)
    try:
        res = admin.create_topics(
            {name: {"num_partitions": n, "replication_factor": k.replication_factor} for name, n in wanted.items()},
            timeout_ms=ms, raise_errors=False)
        for item in res["topics"]:
            err = kerrors.for_code(item["error_code"])
            if err is kerrors.NoError and created is not None:
                created.append(item["name"])
            if err not in (kerrors.NoError, kerrors.TopicAlreadyExistsError):
                raise err(f"creating topic {item['name']!r}: {item.get('error_message')}")
        counts: dict[str, int] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for d in admin.describe_topics(list(wanted)):
                if d.get("error_code", 0) == 0 and d.get("partitions"):
                    counts[d["name"]] = len(d["partitions"])
            if len(counts) == len(wanted):
                break
            time.sleep(0.05)
    finally:
        admin.close()
    for name, n in wanted.items():
        if name in counts and counts[name] != n and name == t.input:
            log.warning("input topic has another partition count than configured (it existed already)",
                        extra={"topic": name, "partitions": counts[name], "configured": n})
    return counts


# --------------------------------------------------------------------------- the daemon


@dataclass
class _Decoded:
    docs: list[Document]
    dead: list[DeadLetter]
    index: list[int | None]  # element index of each document inside an array message
    # Raw texts tokenized at decode time (None: a token-list document, or not done), and the
    # tokenizer that made them: used only while it is still the model's tokenizer.
    tokens: list | None = None
    tokenizer: Any = None


def _tp_key(topic: str, partition: int) -> str:
    return f"{topic}:{partition}"


class Daemon:
    """The stream processor. ``run()`` blocks until ``stop()`` (or SIGTERM/SIGINT via ``install_signal_handlers``).

    Parameters
    ----------
    cfg : a validated ``Config``.
    metrics : a ``Metrics`` registry (default: a new one).
    serve_metrics : start the HTTP endpoint (``cfg.metrics.host:port``; port 0 = any).
    track_topics : topics whose top words ``status()`` keeps current (progress displays).
    """

    def __init__(self, cfg: Config, *, metrics: Metrics | None = None, serve_metrics: bool = True,
                 track_topics: int = 0) -> None:
        errs = check_daemon_config(cfg)
        if errs:
            raise ConfigError(errs)
        self.cfg = cfg
        self.metrics = metrics or Metrics(dead_letter_reasons=sorted(ALL_REASONS))
        self.metrics.set_build_info(__version__, cfg.model.engine, cfg.model.update)
        self.serve_metrics = serve_metrics
        self.track_topics = int(track_topics)
        self.limits = cfg.limits()
        self.instance = uuid.uuid4().hex
        self.store = SnapshotStore(cfg.snapshot.dir, cfg.snapshot.keep, self.metrics)
        self.server: MetricsServer | None = None
        self.model: TopicModel | None = None
        # Learned offsets per partition and log epoch (service/ledger.py): saved in every
        # snapshot; where reading resumes, and what is never learned again.
        self.ledger = OffsetLedger()
        self.lineage = Lineage.new()  # this model's history (adopted from a loaded snapshot)
        self.lock = DirectoryLock(cfg.snapshot.dir, self.instance)  # one writer per snapshot directory
        self.gate = CommitGate()  # the group's commits follow durable snapshots only
        self._left_topic_ids: dict[str, str] = {}  # ids of logs found reset behind us (never recorded again)
        self._reread: set[str] = set()  # partitions found reset: re-read from their beginning
        self.consumer: BatchingConsumer | None = None
        self.publisher: Publisher | None = None
        self.pipeline: PublishPipeline | None = None
        self.acked: dict[str, int] = {}  # offsets whose predictions the broker has acknowledged
        self.last_snapshot: Path | None = None
        self._known_snapshots: set[str] = set()
        self._stop = threading.Event()
        self._started = threading.Event()
        self._finished = threading.Event()
        self._beat = time.monotonic()
        self._dirty = False            # state differs from the newest snapshot
        self._publish_failed = False   # a learned batch's predictions could not be published (shutdown)
        self._in_batch: tuple | None = None  # (partition key, next offset) of the batch being learned
        self._span: tuple = (0, 0, None)  # (first, next offset, head fingerprint) of that batch
        self._prepare_mark: tuple | None = None  # restore point of the model before its prepare()
        # Set while this thread runs GIL-free (numba kernels, or blocked waiting for records);
        # the publisher thread does its GIL-bound encoding and sending only then (PublishPipeline).
        self._gil_free = threading.Event()
        self._gil_free.set()
        self._reader: threading.Thread | None = None  # read-ahead: decodes + tokenizes in kernel time
        self._batches_since_snapshot = 0
        self._last_snapshot_mono = time.monotonic()
        self._snapshot_retry_at = 0.0
        self._broker_up = False
        self._assigned: list[TopicPartition] = []
        self._topics_check_at = 0.0   # next check for topics a broker lost (create_topics)
        self._recreations_seen = {"consumer": 0, "producer": 0}
        self._rate_t = time.monotonic()
        self._rate_docs = 0
        self._rate_tokens = 0
        self._docs_rate = 0.0
        self._tokens_rate = 0.0
        self._last_status_words = 0.0
        self._last_progress_log = time.monotonic()
        self._first_batch_at: float | None = None  # monotonic clock, for benchmarks and the demo
        self._last_batch_at: float | None = None
        self.counts = {"documents": 0, "tokens": 0, "batches": 0, "dead_letters": 0, "predictions": 0}
        self.dead_by_reason: dict[str, int] = {}
        self.error: BaseException | None = None
        self._status: dict[str, Any] = {}
        self._prequential: deque[bool] = deque(maxlen=prequential_window(cfg))
        self._prequential_accuracy: float | None = None
        # (documents learned, windowed accuracy) once per batch; bounded for a never-ending stream
        self._prequential_curve: deque[tuple[int, float]] = deque(maxlen=2000)
        self.stale_after_s = max(10.0, 5 * cfg.batch.max_wait_ms / 1000.0)
        self._poll_tick_s = min(0.5, max(0.05, cfg.batch.max_wait_ms / 1000.0))
        # topic quality, trends and the /topics explorer: updated on this thread per batch,
        # read by the HTTP thread only through the immutable view it publishes
        self.explorer = TopicExplorer.from_config(cfg) if cfg.metrics.explorer else None
        self._last_batch = None

    @property
    def offsets(self) -> dict[str, int]:
        """``"topic:partition" -> next offset`` the model has learned up to (current epochs)."""
        return self.ledger.positions()

    @property
    def epochs(self) -> dict[str, int]:
        return self.ledger.epochs()

    # -- control -----------------------------------------------------------------------

    def stop(self) -> None:
        """Ask for a graceful stop (thread- and signal-safe): finish the batch, publish, commit, snapshot."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT -> graceful stop; a second signal exits at once (the last snapshot stays valid)."""
        def handler(signum, _frame):
            if self._stop.is_set():
                log.warning("second signal: exiting without the final snapshot", extra={"signal": signum})
                os._exit(128 + signum)
            log.info("signal received: stopping after the current batch", extra={"signal": signum})
            self._stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)

    def wait_started(self, timeout: float | None = None) -> bool:
        """Wait until the metrics endpoint answers and the model is loaded (Kafka may still be away)."""
        return self._started.wait(timeout)

    @property
    def metrics_url(self) -> str | None:
        return self.server.url if self.server is not None else None

    # -- health ------------------------------------------------------------------------

    def health(self) -> tuple[bool, dict]:
        age = time.monotonic() - self._beat
        alive = age < self.stale_after_s and not self._finished.is_set()
        return alive, {"loop_heartbeat_age_s": round(age, 3), "stale_after_s": self.stale_after_s}

    def readiness(self) -> tuple[bool, dict]:
        quarantined = self.ledger.quarantined()
        ok = (bool(self._assigned) and self._broker_up and self.model is not None and not self._stop.is_set()
              and not quarantined)
        out = {"partitions": [tp.partition for tp in self._assigned], "broker_up": self._broker_up,
               "model_ready": self.model is not None,
               "model_version": self.model.version if self.model is not None else None,
               "stopping": self._stop.is_set()}
        if quarantined:
            out["quarantined"] = quarantined
        return ok, out

    def status(self) -> dict[str, Any]:
        """A consistent copy of the progress counters (safe from other threads)."""
        return dict(self._status)

    # -- main --------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped. Returns the process exit code: 0 after a graceful stop whose final
        snapshot holds everything learned; 1 on errors, or when the final snapshot failed (the
        group's offsets then stay at the last good snapshot); 2 when another daemon owns the
        snapshot directory."""
        rc = 0
        try:
            try:
                self._startup()
                while not self._stop.is_set():
                    self._tick()
                    faults.hit("poll")
                    rb = self.consumer.next_batch(self._poll_tick_s, should_stop=self._stop.is_set)
                    self._tick()
                    if rb is not None:
                        self._process(rb)
                    self._housekeeping()
                rc = 0 if self.error is None else 1
            except LockHeld as exc:
                self.error = exc
                log.error("refusing to start: " + str(exc), extra={"owner": exc.owner})
                rc = 2
            except Exception as exc:
                self.error = exc
                log.exception("daemon failed", extra={"error": repr(exc)})
                rc = 1
        finally:
            self._started.set()
            final_ok = self._shutdown()
            self._finished.set()
        return rc if rc or final_ok else 1

    def _tick(self) -> None:
        self._beat = time.monotonic()

    def _tick_blocked(self) -> None:
        """Heartbeat while the loop waits on the publisher: keep broker_up and /readyz honest."""
        self._beat = time.monotonic()
        up = (self.publisher is not None and self.publisher.healthy
              and self.consumer is not None and self.consumer.connected())
        if up != self._broker_up:
            self._broker_up = up
            self.metrics.set_broker_up(up)
            self.metrics.set_ready(self.readiness()[0])

    def _startup(self) -> None:
        cfg = self.cfg
        faults.hit("startup")
        self.metrics.set_broker_up(False)
        self.metrics.set_ready(False)
        if self.serve_metrics:
            self.server = MetricsServer(self.metrics, cfg.metrics.host, cfg.metrics.port,
                                        health=self.health, ready=self.readiness,
                                        routes=self.explorer.route if self.explorer is not None else None)
        log.info("streamtopics daemon starting", extra={
            "version": __version__, "instance": self.instance, "config": cfg.to_dict(),
            "metrics_url": self.metrics_url})
        self.lock.acquire()  # LockHeld: another daemon writes this snapshot directory
        self._load_model()
        faults.hit("model_loaded")
        self._started.set()  # the metrics endpoint answers and the model is loaded
        self._connect()
        faults.hit("connected")

    def _load_model(self) -> None:
        self.store.clean_temp()
        found = self.store.load_newest(skip=self._known_snapshots)
        if found is None:
            self.model = model_from_config(self.cfg.model)
            self.ledger = OffsetLedger()
            self.lineage = Lineage.new()
            self.gate = CommitGate()
            log.info("no usable snapshot: starting a new model that reads every partition from its "
                     "earliest offset (the group's committed offsets never pass a snapshot, so without "
                     "one they do not say what a model learned)",
                     extra={"snapshot_dir": str(self.store.dir), "lineage": self.lineage.id})
        else:
            self._adopt(*found)
        self._known_snapshots.update(p.name for p in self.store.files())
        self._update_model_metrics()

    def _adopt(self, model: TopicModel, path: Path) -> None:
        info = model.snapshot_info
        model.set_threads(self.cfg.model.threads or None)  # how to run is this host's choice, not the snapshot's
        offsets = {str(k): int(v) for k, v in (info.get("offsets") or {}).items()}
        daemon_extra = (info.get("extra") or {}).get("daemon") or {}
        if daemon_extra.get("ledger"):
            ledger = OffsetLedger.from_dict(daemon_extra["ledger"])
        else:  # written before ledgers: [0, offset) learned in the saved epoch
            topic_ids = {str(k): str(v) for k, v in (daemon_extra.get("topic_ids") or {}).items()}
            ledger = OffsetLedger.from_offsets(offsets, daemon_extra.get("epochs") or {}, topic_ids)
        self.model = model
        self.ledger = ledger
        self.lineage = Lineage.of(info) or Lineage.new()
        self.gate.durable(ledger.positions())
        self._reread.clear()
        self.last_snapshot = path
        self._known_snapshots.add(path.name)
        self._dirty = False
        created = info.get("created")
        self.metrics.snapshot_succeeded(None, at=float(created) if created else None)
        diffs = param_differences(model, self.cfg.model)
        log.info("model loaded from snapshot", extra={
            "path": str(path), "version": model.version, "docs_seen": model.state.docs_seen,
            "offsets": self.offsets, "vocabulary": len(model.vocab), "lineage": self.lineage.id,
            "seq": self.lineage.seq})
        if diffs:
            log.warning("snapshot model settings differ from [model]; the snapshot's are kept",
                        extra={"differences": {k: {"snapshot": a, "config": b} for k, (a, b) in diffs.items()}})

    def _connect(self) -> None:
        """Create topics and clients, retrying with backoff while the broker is away."""
        cfg = self.cfg
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            self._tick()
            try:
                if cfg.kafka.create_topics:
                    self._ensure_topics()
                self.publisher = Publisher(self._producer_kwargs(), max_inflight=cfg.batch.max_inflight_predictions,
                                           flush_timeout_s=5.0)
                self.publisher.connect()
                self.pipeline = PublishPipeline(self.publisher, abort=self._stop.is_set,
                                                max_pending=cfg.batch.max_inflight_predictions,
                                                gate=self._gil_free)
                self.consumer = BatchingConsumer(
                    self._consumer_kwargs(), cfg.topics.input, max_docs=cfg.batch.max_docs,
                    max_wait_ms=cfg.batch.max_wait_ms, decode=self._decode, start_offset=self._start_offset,
                    on_assigned=self._on_assigned, on_revoked=self._on_revoked, on_reset=self._on_reset,
                    on_wait=self._gil_free.set)
                self.consumer.start()
                if self._reader is None:
                    self._reader = threading.Thread(target=self._read_ahead, name="streamtopics-read-ahead",
                                                    daemon=True)
                    self._reader.start()
                log.info("connected to Kafka", extra={"bootstrap": cfg.kafka.bootstrap_servers,
                                                      "input": cfg.topics.input, "group": cfg.kafka.group_id})
                return
            except Exception as exc:  # noqa: BLE001 - broker away, auth, ...: retry
                if self.pipeline is not None:
                    self.pipeline.close()
                    self.pipeline = None
                if self.publisher is not None:
                    self.publisher.close(timeout_s=0)
                    self.publisher = None
                self._broker_up = False
                self.metrics.set_broker_up(False)
                delay = min(5.0, 0.25 * 2 ** min(attempt, 5))
                log.warning("cannot reach Kafka; retrying", extra={
                    "bootstrap": cfg.kafka.bootstrap_servers, "error": repr(exc), "attempt": attempt,
                    "backoff_s": delay})
                deadline = time.monotonic() + delay
                while not self._stop.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
                    self._tick()  # retrying is alive: /healthz stays green, /readyz says not ready
                    if time.monotonic() >= deadline:
                        break

    def _ensure_topics(self, timeout_s: float = 15.0) -> None:
        """Create the topics; an unreachable broker is retried, anything else (say, no permission
        to create topics on a managed cluster) is logged and start-up goes on: they may exist."""
        from kafka import errors as kerrors

        created: list[str] = []
        try:
            ensure_topics(self.cfg, timeout_s=timeout_s, created=created)
            if created:
                self.metrics.topic_creations.inc()
                log.log(logging.WARNING if self.consumer is not None else logging.INFO,
                        "created missing topics", extra={"topics": created})
                if self.consumer is not None:
                    self.consumer.refresh_metadata()
        except (ConnectionError, OSError, kerrors.NoBrokersAvailable, kerrors.KafkaConnectionError,
                kerrors.KafkaTimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001
            log.error("could not create topics; going on (they may already exist)", extra={"error": repr(exc)})

    def _producer_kwargs(self) -> dict:
        kw = self.cfg.kafka.producer_kwargs()
        # Never block the loop for a minute on metadata while the broker is away.
        kw.setdefault("max_block_ms", 10000)
        if self.cfg.kafka.create_topics:
            # The daemon creates its topics (with the configured partitions), also after a broker
            # lost them: a client must not auto-create them first (tansu: 4 partitions).
            kw.setdefault("allow_auto_create_topics", False)
        return kw

    def _consumer_kwargs(self) -> dict:
        kw = self.cfg.kafka.consumer_kwargs()
        if self.cfg.kafka.create_topics:
            kw.setdefault("allow_auto_create_topics", False)
        return kw

    def _maybe_recreate_topics(self, now: float) -> None:
        """While not ready with a broker that answers: topics it lost (tansu restarted) are
        created again, at most every 5 s (``kafka.create_topics``)."""
        if not self.cfg.kafka.create_topics or now < self._topics_check_at:
            return
        if self._assigned and self._broker_up:
            return
        if not (self.consumer is not None and self.consumer.connected()):
            return
        self._topics_check_at = now + 5.0
        self._tick()
        try:
            self._ensure_topics(timeout_s=5.0)
        except Exception as exc:  # noqa: BLE001 - broker away again: next time
            log.info("topic check failed; retrying later", extra={"error": repr(exc)})
        self._tick()

    def _count_recreations(self) -> None:
        for name, client in (("consumer", self.consumer), ("producer", self.publisher)):
            n = getattr(client, "recreated", 0) if client is not None else 0
            if n > self._recreations_seen[name]:
                self.metrics.client_recreations.labels(client=name).inc(n - self._recreations_seen[name])
                self._recreations_seen[name] = n

    # -- consumer callbacks ------------------------------------------------------------

    def _decode(self, record) -> tuple[_Decoded, int]:
        faults.hit("decode")
        fmt = self.cfg.input.format
        docs, dead = decode_message(record.value, self.limits, topic=record.topic, partition=record.partition,
                                    offset=record.offset, fmt=fmt, key=getattr(record, "key", None),
                                    headers=getattr(record, "headers", None))
        index: list[int | None] = [None] * len(docs)
        if docs and is_array_message(record.value, fmt):  # element positions, skipping the bad elements
            bad = {d.index for d in dead}
            index = [i for i in range(len(docs) + len(dead)) if i not in bad]
        tokenizer = self.model.tokenizer if self.model is not None else None
        tokens = None
        if tokenizer is not None and docs:
            try:  # a tokenizer failure is handled where the batch is learned (model_error)
                tokens = [tokenizer(d.text) if d.text is not None else None for d in docs]
            except Exception:  # noqa: BLE001
                tokens = None
        return _Decoded(docs, dead, index, tokens, tokenizer), len(docs)

    def _read_ahead(self) -> None:
        """Decode and tokenize buffered records while the batch loop is GIL-free.

        Tokenizing and decoding are GIL-bound Python on the batch loop's critical path; done
        here, during the loop's numba kernels (``_gil_free`` set), they overlap with them
        instead. Cached on the consumer's buffered records; batches, offsets and learning are
        untouched, and anything not done ahead is done by the loop as before.
        """
        while not self._stop.is_set():
            c = self.consumer
            if c is None or not self._gil_free.wait(0.5):
                continue
            try:
                n = c.decode_ahead()
            except Exception as exc:  # noqa: BLE001 - never let the helper die silently
                log.warning("read-ahead failed", extra={"error": repr(exc)})
                n = 0
            if not n:
                c.undecoded.clear()
                c.undecoded.wait(0.5)

    def _start_offset(self, tp: TopicPartition) -> int | None:
        key = _tp_key(tp.topic, tp.partition)
        if self._in_batch is not None:
            # Called from the prefetch poll in the middle of a batch: that batch will be learned,
            # so its partition resumes after it; the model must not be swapped now.
            batch_key, next_offset = self._in_batch
            return next_offset if batch_key == key else self.ledger.position(key)
        self._maybe_follow_newer_snapshot()
        if key in self._reread:
            return 0  # its log was found reset: from the beginning (the ledger skips what was learned)
        if self.ledger.position(key) is not None and self._topic_recreated(tp.topic):
            return 0  # a new log: from its beginning (out of range on a trimmed log -> earliest)
        pos = self.ledger.position(key)
        if pos is None and (self.last_snapshot is None or key in self.ledger.keys()):
            # Nothing learned from this log by this model's lineage. Without any snapshot the
            # group's committed offset means nothing (commits never pass a snapshot: a committed
            # offset without one is a lost lineage's): read from the earliest offset. A known
            # partition in a new epoch: its new log from the beginning.
            return 0
        return pos  # None: a partition this lineage never saw -> the group's committed offset

    def _topic_id_now(self, topic: str) -> str | None:
        """The consumer's topic id of ``topic``, None when unknown or still naming a log we left."""
        now = self.consumer.topic_id(topic) if self.consumer is not None else None
        return None if now is None or now == self._left_topic_ids.get(topic) else now

    def _saved_topic_id(self, topic: str) -> str | None:
        for key in self.ledger.keys():
            if key.rpartition(":")[0] == topic and self.ledger.topic_id(key) is not None:
                return self.ledger.topic_id(key)
        return None

    def _topic_recreated(self, topic: str) -> bool:
        """The topic the saved offsets refer to was deleted and created again (another topic id):
        its offsets mean nothing in the new log, even where they are in range. New epochs."""
        saved = self._saved_topic_id(topic)
        now = self._topic_id_now(topic)
        if saved is None or now is None or saved == now:
            return False
        log.warning("topic was recreated since the model's offsets were saved (another topic id): "
                    "reading it from its beginning", extra={"topic": topic, "saved_topic_id": saved,
                                                            "topic_id": now})
        for key in [k for k in self.ledger.keys() if k.rpartition(":")[0] == topic]:
            self.ledger.new_epoch(key, now)
            self.metrics.partition_resets.inc()
        self._dirty = True
        return True

    def _maybe_follow_newer_snapshot(self) -> None:
        """On assignment: a snapshot this process did not write nor load. With the directory
        lock there is no other writer; a file that appears anyway (copied in, or written before a
        lock takeover) replaces the model only when it continues this model's lineage with a
        higher sequence and no fewer documents - never by its file name alone."""
        if self.model is None:
            return
        if not [p for p in self.store.files() if p.name not in self._known_snapshots]:
            return
        while True:
            found = self.store.load_newest(skip=self._known_snapshots)
            if found is None:
                return
            model, path = found
            self._known_snapshots.add(path.name)
            ok, why = self.lineage.may_adopt(Lineage.of(model.snapshot_info), int(model.state.docs_seen),
                                             int(self.model.state.docs_seen))
            if ok:
                log.warning("a newer snapshot of this model's lineage appeared; adopting it",
                            extra={"path": str(path), "why": why})
                self._adopt(model, path)
                self._update_model_metrics()
                return
            log.warning("ignoring a snapshot this daemon did not write", extra={"path": str(path), "why": why})

    def _on_assigned(self, tps: list[TopicPartition]) -> None:
        self._assigned = sorted(set(self._assigned) | set(tps))
        self.gate.forget()
        for tp in tps:
            if self.ledger.is_quarantined(_tp_key(tp.topic, tp.partition)) and self.consumer is not None:
                self.consumer.hold(tp)
        faults.hit("assigned")

    def _on_revoked(self, tps: list[TopicPartition]) -> None:
        gone = set(tps)
        self._assigned = [tp for tp in self._assigned if tp not in gone]
        for tp in gone:
            self.metrics.forget_partition(tp.partition)

    def _record_topic_id(self, key: str, topic: str) -> None:
        """Remember which log (topic id) the offsets of ``key`` refer to, after learning from it."""
        tid = self.consumer.topic_id(topic) if self.consumer is not None else None
        if tid is None or tid == self._left_topic_ids.get(topic):
            # After a log reset the client's metadata can still name the log we left; recording
            # that id would make the next assignment think the topic was recreated again and
            # re-read what was just learned. Wait for the new id.
            return
        self._left_topic_ids.pop(topic, None)
        self.ledger.set_topic_id(key, tid)

    def _on_reset(self, tp: TopicPartition, expected: int, highwater: int) -> None:
        """The consumer found the log behind our position and re-reads it from its beginning.
        Whether it is a new log (new epoch) or the same one served again is decided by the
        ledger when the records arrive; records already learned are never learned again."""
        key = _tp_key(tp.topic, tp.partition)
        if self._in_batch is not None and self._in_batch[0] == key:
            self._in_batch = (None, None)  # the batch belongs to a log we left: do not record its offset
        left = self.ledger.topic_id(key)
        if left is not None:
            self._left_topic_ids[tp.topic] = left
        self._reread.add(key)
        self.metrics.partition_resets.inc()
        why = f"expected offset {expected}, found {highwater}"
        if self.ledger.note_reset(key, why):
            reason = self.ledger.quarantined()[key]
            log.error("partition quarantined: its log keeps being reset; not reading it any more",
                      extra={"topic": tp.topic, "partition": tp.partition, "reason": reason})
            self.metrics.set_quarantined(tp.partition, True)
            if self.consumer is not None:
                self.consumer.hold(tp)

    def _batch_key(self, rb: RecordBatch) -> str:
        key = f"{rb.topic}:{rb.partition}:{rb.first_offset}"
        epoch = self.ledger.epoch(_tp_key(rb.topic, rb.partition))
        return f"{key}~{epoch}" if epoch else key

    def _admit(self, rb: RecordBatch) -> RecordBatch | None:
        """The batch without records the ledger says were learned already (or came out of
        order); None when nothing is left or the partition is quarantined."""
        key = _tp_key(rb.topic, rb.partition)
        if self.ledger.is_quarantined(key):
            return None
        self._reread.discard(key)
        offsets = [r.offset for r in rb.records]
        prints = [fingerprint(r.value, r.timestamp) for r in rb.records]
        adm = self.ledger.admit(key, offsets, prints, topic_id=self._topic_id_now(rb.topic))
        if adm.new_epoch:
            self._dirty = True
            log.warning("records at offsets already learned have other contents: a new log; new epoch",
                        extra={"partition": rb.partition, "first_offset": rb.first_offset,
                               "epoch": self.ledger.epoch(key)})
        if not adm.n_skipped:
            return rb
        for reason, n in adm.skipped.items():
            self.metrics.offsets_skipped.labels(reason=reason).inc(n)
        log.warning("records skipped: the model learned these offsets of this log already",
                    extra={"partition": rb.partition, "first_offset": rb.first_offset,
                           "next_offset": rb.next_offset, "skipped": adm.skipped})
        keep = [i for i, k in enumerate(adm.keep) if k]
        if not keep:
            return None
        rb.records = [rb.records[i] for i in keep]
        rb.decoded = [rb.decoded[i] for i in keep]
        return rb

    def _process(self, rb: RecordBatch) -> None:
        """Decode, predict and learn one batch, then hand its messages to the publisher thread."""
        model = self.model
        t_start = time.perf_counter()
        if self._first_batch_at is None:
            self._first_batch_at = time.monotonic()
        now = time.time()
        key = _tp_key(rb.topic, rb.partition)
        # The span the ledger records once learned: the whole batch as cut (records skipped as
        # already learned are inside it), with the fingerprint of its first record.
        span = (rb.first_offset, rb.next_offset, fingerprint(rb.records[0].value, rb.records[0].timestamp))
        rb = self._admit(rb)
        if rb is None:  # nothing new in it (or the partition is quarantined)
            self._collect()
            return
        self._in_batch = (key, span[1])
        self._span = span
        faults.hit("batch_received")
        try:
            self._learn_and_submit(rb, model, now, t_start)
        finally:
            self._in_batch = None
        self._housekeeping_after_batch()

    def _housekeeping_after_batch(self) -> None:
        self._batches_since_snapshot += 1
        self._collect()
        self._maybe_snapshot()

    def _learn_and_submit(self, rb: RecordBatch, model: TopicModel, now: float, t_start: float) -> None:
        batch_key = self._batch_key(rb)  # before the prefetch poll can bump the partition's epoch
        docs: list[Document] = []
        srcs: list[tuple[Any, int | None]] = []
        dead: list[DeadLetter] = []
        pre: list = []  # tokens made at decode time, None where not
        for rec, dec in zip(rb.records, rb.decoded):
            dead.extend(dec.dead)
            fresh = dec.tokens is not None and dec.tokenizer is model.tokenizer
            pre.extend(dec.tokens if fresh else [None] * len(dec.docs))
            for doc, idx in zip(dec.docs, dec.index):
                docs.append(doc)
                srcs.append((rec, idx))

        # Tokenize, predict, learn. A document that makes the model raise must not crash the
        # daemon into a restart loop (the same batch again after every restart): its documents
        # go to the dead-letter topic as ``model_error`` and the stream goes on.
        stages = {"decode": rb.decode_seconds, "predict": 0.0, "learn": 0.0}
        texts = [d.text if d.text is not None else d.tokens for d in docs]
        targets = self._targets(docs)
        version = model.version  # the model that predicts (before learning this batch)
        # The labels its scores are over, fixed now: the publisher thread must not read the live
        # model (the loop adds labels to it, or replaces it when adopting a snapshot).
        label_names = list(model.label_names or []) if targets is not None else []
        try:
            keep, empty, theta, n_tokens, sup = self._model_step(model, texts, list(range(len(docs))),
                                                                 batch_key, stages, targets, pre)
        except Exception as exc:  # noqa: BLE001 - any failure of the model on this input
            keep, empty, theta, n_tokens, sup = self._model_failure(model, texts, batch_key, stages, exc, version,
                                                                    docs, srcs, dead, targets)
        for i in empty:
            rec, idx = srcs[i]
            dead.append(DeadLetter(
                "empty_document", "no token left after tokenization (stopwords, short or long words only)",
                idx, rec.topic, rec.partition, rec.offset,
                rec.value if idx is None else encode_document(docs[i])))
        faults.hit("learned")
        # Model and offsets move together, in memory, before anything else can happen (unless
        # the log was found reset during the batch: its old offsets mean nothing any more).
        if self._in_batch[0] is not None:
            first, nxt, head = self._span
            self.ledger.learned(self._in_batch[0], first, nxt, head)
            self._record_topic_id(self._in_batch[0], rb.topic)
        self._dirty = True
        self._update_model_metrics()
        faults.hit("offsets_advanced")

        # Dead letters and predictions are encoded and sent on the publisher thread while the
        # next batch is learned.
        origins: list[float] = []
        ids: list = []
        for i in keep:
            d = docs[i]
            ids.append(d.id)
            ts = srcs[i][0].timestamp
            origins.append(d.ts if d.ts is not None else (ts / 1000.0 if ts and ts > 0 else math.nan))
        if sup is not None and targets is not None:
            self._score_prequential(sup, [targets[i] for i in keep])
        fill_record_meta(dead, rb.records)  # the daemon's own dead letters keep the record's key and headers
        build = partial(self._encode_batch, dead, ids, theta, version, now, sup, label_names)
        meta = _BatchMeta(rb.tp, rb.first_offset, rb.next_offset, len(keep), n_tokens,
                          [dl.reason for dl in dead], origins, stages, t_start)
        if not self.pipeline.submit(PublishJob([], meta, build=build, size=len(dead) + len(ids)),
                                    heartbeat=self._tick_blocked):
            self._publish_failed = True
            log.error("cannot hand predictions to the publisher (stopping while the broker is away): "
                      "this batch will be read and learned again after restart",
                      extra={"partition": rb.partition, "first_offset": rb.first_offset})
        faults.hit("submitted")
        if self.explorer is not None and theta is not None:
            self._observe_topics(model, ids, [texts[i] for i in keep], theta)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch learned", extra={
                "partition": rb.partition, "first_offset": rb.first_offset, "next_offset": rb.next_offset,
                "docs": len(keep), "dead_letters": len(dead), "tokens": n_tokens, "version": model.version,
                "complete": rb.complete})

    def _model_step(self, model: TopicModel, texts: list, idx: list[int], batch_key: str,
                    stages: dict[str, float], targets: list | None = None, pre: list | None = None
                    ) -> tuple[list[int], list[int], np.ndarray | None, int, tuple | None]:
        """Tokenize ``texts`` (positions ``idx`` of the batch; ``pre``: tokens already made for
        them at decode time, None where not), predict and learn.

        Returns (kept positions, positions left without tokens, theta of the kept ones, tokens,
        (scores, predictions) of the kept ones or None when the model is not supervised yet).
        ``targets`` holds the whole batch's labels by position (None: unsupervised model).
        """
        t0 = time.perf_counter()
        self._prepare_mark = None
        self._gil_free.clear()
        if pre is None:
            tokens = model.tokenize(texts) if texts else []
        else:
            tokens = list(pre)
            todo = [j for j, t in enumerate(pre) if t is None]
            if todo:
                for j, t in zip(todo, model.tokenize([texts[j] for j in todo])):
                    tokens[j] = t
        faults.hit("tokenized")
        keep = [idx[j] for j, t in enumerate(tokens) if t]
        empty = [idx[j] for j, t in enumerate(tokens) if not t]
        stages["decode"] += time.perf_counter() - t0
        if not keep:
            return keep, empty, None, 0, None
        t0 = time.perf_counter()
        self._prepare_mark = model.prepare_mark()  # restore point should the step fail
        batch = self._last_batch = model.prepare([t for t in tokens if t], grow=True)
        stages["decode"] += time.perf_counter() - t0
        faults.hit("prepared")
        self._gil_free.set()
        self.consumer.prefetch()  # the next records arrive while the kernels run
        faults.hit("learn")
        labels = None if targets is None else [targets[i] for i in keep]
        res = model.process(batch, learn=True, batch_key=batch_key, labels=labels)
        # GIL-bound Python again until the next kernel or an idle wait: publishing this batch
        # then overlaps the next batch's kernels instead of its tokenization.
        self._gil_free.clear()
        theta = model.theta(res.doc_topic, res.alpha)
        st = model.last_stats
        stages["predict"], stages["learn"] = st.get("local_seconds", 0.0), st.get("update_seconds", 0.0)
        self._observe_inference(st)
        scores, predicted = getattr(res, "scores", None), getattr(res, "predicted", None)
        sup = None if predicted is None else (scores, predicted)
        return keep, empty, theta, int(batch.n_tokens), sup

    def _observe_topics(self, model: TopicModel, ids: list, texts: list, theta: np.ndarray) -> None:
        """Topic quality, trends and the explorer's view after a learned batch (never fatal)."""
        try:
            obs = self.explorer.observe(model, self._last_batch, theta, ids, texts, status={
                "docs_per_s": self._docs_rate, "prequential_accuracy": self._prequential_accuracy,
                "prequential_curve": list(self._prequential_curve)[-300:]})
        except Exception:  # noqa: BLE001 - a view is not worth a batch
            log.exception("topic explorer update failed")
            return
        if obs is None:
            return
        self.metrics.observe_topics(obs.quality.npmi, obs.quality.diversity, obs.quality.window_docs,
                                    obs.prevalence, obs.rising, obs.fading, obs.seconds)
        if obs.events and self.cfg.topics.events and self.pipeline is not None:
            self.metrics.topic_events.inc(len(obs.events))
            self.pipeline.submit(PublishJob([OutMessage(self.cfg.topics.events, msgpack.packb(ev, use_bin_type=True),
                                                        key=str(ev["topic"]).encode()) for ev in obs.events]))

    def _model_failure(self, model: TopicModel, texts: list, batch_key: str, stages: dict[str, float],
                       exc: BaseException, version: int, docs: list[Document], srcs: list,
                       dead: list[DeadLetter], targets: list | None = None
                       ) -> tuple[list[int], list[int], np.ndarray | None, int, tuple | None]:
        """The model raised on a batch: dead-letter the documents it raises on and learn the rest.

        Narrowing: each document alone is tokenized and predicted without learning; the ones
        that raise are dead letters (``model_error``), and the batch is learned without them.
        When the update itself had already run, or no single document raises, or the rest
        raises again, the whole batch is dead-lettered (it is never retried: no restart loop).
        """
        self._gil_free.set()
        self.metrics.model_errors.inc()
        log.error("the model raised on a batch; dead-lettering the documents it fails on",
                  extra={"error": repr(exc), "batch_key": batch_key, "docs": len(texts)}, exc_info=exc)
        every = list(range(len(texts)))
        bad: list[int] = []
        # The failed step may have grown the vocabulary and counted the batch's words
        # (prepare) before raising: undo that, or a retry would count them twice. When it
        # cannot be undone (words evicted, or the update ran), nothing is retried.
        mark, self._prepare_mark = self._prepare_mark, None
        untouched = model.version == version and (mark is None or model.undo_prepare(mark))
        if untouched:
            vocab = model.vocab
            for i in every:
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
        result = None
        error = exc
        if bad and len(bad) < len(texts) and untouched:
            rest = [i for i in every if i not in set(bad)]
            try:
                result = self._model_step(model, [texts[i] for i in rest], rest, batch_key, stages,
                                          None if targets is None else {i: targets[i] for i in rest})
            except Exception as exc2:  # noqa: BLE001
                error = exc2
                if self._prepare_mark is not None and model.version == version:
                    model.undo_prepare(self._prepare_mark)  # the batch is dead-lettered whole
                self._prepare_mark = None
                log.error("the batch without the failing documents raised again; dead-lettering it all",
                          extra={"error": repr(exc2), "batch_key": batch_key})
        if result is None:
            bad = every
        detail = f"the model raised {type(error).__name__}: {error}"
        for i in bad:
            rec, idx = srcs[i]
            dead.append(DeadLetter("model_error", detail, idx, rec.topic, rec.partition, rec.offset,
                                   rec.value if idx is None else encode_document(docs[i])))
        return result if result is not None else ([], [], None, 0, None)

    def _encode_batch(self, dead: list[DeadLetter], ids: list, theta: np.ndarray | None, version: int,
                      now: float, sup: tuple | None = None, label_names: list | None = None) -> list[OutMessage]:
        """The batch's messages (runs on the publisher thread): dead letters, then predictions."""
        out: list[OutMessage] = []
        max_raw = self._max_raw_bytes()
        dl_topic, out_topic = self.cfg.topics.dead_letter, self.cfg.topics.output
        for dl in dead:
            out.append(OutMessage(dl_topic, encode_dead_letter(dl, ts=now, max_raw_bytes=max_raw), key=dl.key,
                                  headers=dl.headers))
        if theta is not None:
            extras = self._label_fields(sup, len(ids), label_names or [])
            for doc_id, row, extra in zip(ids, _top_topics(theta), extras):
                out.append(OutMessage(out_topic, encode_prediction(doc_id, row, model_version=version, ts=now,
                                                                   **extra),
                                      key=prediction_key(doc_id)))
        return out

    # -- supervised ----------------------------------------------------------------------

    def _targets(self, docs: list[Document]) -> list | None:
        """Each document's training target for a supervised model (None where it has none)."""
        sup = self.cfg.model.supervision
        if sup == "none":
            return None
        if sup == "regression":
            return [d.response for d in docs]
        return [d.labels if d.labels is not None else d.label for d in docs]

    @staticmethod
    def _label_fields(sup: tuple | None, n: int, names: list) -> list[dict]:
        """``label``/``labels``/``scores``/``response`` of each prediction message; ``names``:
        the labels the scores are over (taken with the batch, never from the live model)."""
        if sup is None:
            return [{}] * n
        scores, predicted = sup
        out = []
        for i in range(n):
            p = predicted[i]
            extra: dict[str, Any] = {}
            if isinstance(p, (list, tuple)):  # multi-label
                extra["labels"] = [str(x) for x in p]
            elif isinstance(p, str):
                extra["label"] = p
            elif p is not None:
                extra["response"] = float(p)
            if scores is not None and names:
                extra["scores"] = dict(zip(names, scores[i].tolist()))
            out.append(extra)
        return out

    def _score_prequential(self, sup: tuple, truths: list) -> None:
        """Predictions made before learning vs the labels that came with the documents."""
        _, predicted = sup
        window = self._prequential
        for p, y in zip(predicted, truths):
            if y is None or p is None or isinstance(y, float):
                continue
            if isinstance(y, (list, tuple)):
                window.append(set(map(str, p if isinstance(p, (list, tuple)) else [p])) == set(map(str, y)))
            else:
                window.append(str(p) == str(y))
        if window:
            acc = sum(window) / len(window)
            self.metrics.prequential_accuracy.set(acc)
            self.metrics.prequential_window_documents.set(len(window))
            self._prequential_accuracy = acc
            self._prequential_curve.append((int(self.model.state.docs_seen), acc))

    def _observe_inference(self, st: dict) -> None:
        m = self.metrics
        iterations = st.get("iterations")
        if iterations is not None:
            for it in np.asarray(iterations).tolist():
                m.local_iterations.observe(it)
        if st.get("restarts_tried"):
            m.restart_acceptance_ratio.set(st["restarts_accepted"] / st["restarts_tried"])
        obj = st.get("objective_per_token")
        if obj is not None and math.isfinite(obj):
            m.objective_per_token.set(obj)
        for proposal, ratio in (st.get("mh_acceptance") or {}).items():  # alias engine
            if proposal in PROPOSALS and ratio is not None and math.isfinite(ratio):
                m.set_mh_acceptance(proposal, ratio)
        if st.get("alias_rebuilds"):
            m.alias_rebuilds.inc(st["alias_rebuilds"])

    def _collect(self) -> None:
        """Acknowledged batches: commit their offsets (advisory) and count them."""
        if self.pipeline is None:
            return
        m = self.metrics
        commit: dict[TopicPartition, int] = {}
        for job in self.pipeline.completed():
            meta = job.meta
            if not job.ok:
                self._publish_failed = True
                if not self._stop.is_set():
                    # Not a shutdown: publishing itself broke. Learning on without publishing or
                    # snapshotting would help nobody; stop, and let a restart replay from the snapshot.
                    self.error = RuntimeError("publishing failed")
                    log.error("publishing failed: stopping (a restart resumes from the last snapshot)")
                    self._stop.set()
                continue
            if meta is None:  # a snapshot announcement
                continue
            commit[meta.tp] = meta.next_offset
            self.acked[_tp_key(meta.tp.topic, meta.tp.partition)] = meta.next_offset
            m.observe_batch(meta.docs, meta.tokens)
            for stage, sec in meta.stages.items():
                m.observe_stage(stage, sec)
            m.observe_stage("publish", job.publish_seconds)
            for origin in meta.origins:
                if origin == origin:  # not NaN
                    m.end_to_end_latency.observe(max(0.0, job.acked_at - origin))
            for reason in meta.dead:
                m.dead_letter(reason)
                self.dead_by_reason[reason] = self.dead_by_reason.get(reason, 0) + 1
            c = self.counts
            c["documents"] += meta.docs
            c["tokens"] += meta.tokens
            c["batches"] += 1
            c["dead_letters"] += len(meta.dead)
            c["predictions"] += meta.docs
            self._rate_docs += meta.docs
            self._rate_tokens += meta.tokens
            self._last_batch_at = job.acked_mono
            m.observe_stage("total", time.perf_counter() - meta.started)
        if commit:
            faults.hit("collected")
        m.producer_pending.set(self.pipeline.pending_messages)

    def _commit_durable(self, sync: bool = False) -> None:
        """Tell the group the offsets of the newest snapshot (never more: see CommitGate)."""
        if self.consumer is None:
            return
        keys = {_tp_key(tp.topic, tp.partition): tp for tp in self._assigned}
        pending = self.gate.pending(list(keys))
        if not pending:
            return
        offsets = {keys[k]: v for k, v in pending.items()}
        t0 = time.perf_counter()
        if sync:
            if self.consumer.commit(offsets, timeout_s=5.0):
                self.gate.committed(pending)
        else:
            self.consumer.commit_async(offsets)
            self.gate.committed(pending)
        faults.hit("committed")
        self.metrics.observe_stage("commit", time.perf_counter() - t0)

    def _max_raw_bytes(self) -> int:
        kw = self.cfg.kafka.extra_producer
        limit = int(kw.get("max_request_size", 1048576))
        return max(1024, min(limit, self.cfg.limits.max_message_bytes) - 16384)

    # -- periodic work -----------------------------------------------------------------

    def _housekeeping(self) -> None:
        m = self.metrics
        c = self.consumer
        faults.hit("housekeeping")
        self._collect()
        self.lock.heartbeat()
        up = c.connected() and (self.publisher.healthy if self.publisher is not None else False)
        if up != self._broker_up:
            log.log(logging.INFO if up else logging.WARNING, "broker up" if up else "broker unreachable",
                    extra={"bootstrap": self.cfg.kafka.bootstrap_servers})
        self._broker_up = up
        m.set_broker_up(up)
        self._count_recreations()
        self._maybe_recreate_topics(time.monotonic())
        ok, _ = self.readiness()
        if ok != m.is_ready:
            log.info("ready" if ok else "not ready", extra=self.readiness()[1])
        m.set_ready(ok)
        lag = c.lag()
        for p, v in lag.items():
            m.set_lag(p, v)
        now = time.monotonic()
        dt = now - self._rate_t
        if dt >= 0.5:
            a = 1.0 - math.exp(-dt / RATE_TAU_S)
            self._docs_rate += a * (self._rate_docs / dt - self._docs_rate)
            self._tokens_rate += a * (self._rate_tokens / dt - self._tokens_rate)
            self._rate_t, self._rate_docs, self._rate_tokens = now, 0, 0
            m.documents_per_second.set(self._docs_rate)
            m.tokens_per_second.set(self._tokens_rate)
        self._maybe_snapshot()
        self._publish_status(lag)
        if now - self._last_progress_log >= PROGRESS_LOG_S:
            self._last_progress_log = now
            log.info("progress", extra={
                **self.counts, "docs_per_s": round(self._docs_rate, 1), "lag": lag,
                "model_version": self.model.version, "vocabulary": len(self.model.vocab),
                "broker_up": up, "ready": ok})

    def _update_model_metrics(self) -> None:
        self.metrics.vocabulary_size.set(len(self.model.vocab))
        self.metrics.model_version.set(self.model.version)

    def _publish_status(self, lag: dict[int, int]) -> None:
        st = {
            **self.counts,
            "dead_by_reason": dict(self.dead_by_reason),
            "offsets": dict(self.acked),  # published and acknowledged
            "model_offsets": dict(self.offsets),  # learned by the model in memory
            "lag": dict(lag),
            "docs_per_s": self._docs_rate,
            "tokens_per_s": self._tokens_rate,
            "vocabulary": len(self.model.vocab),
            "model_version": self.model.version,
            "docs_seen": int(self.model.state.docs_seen),
            "broker_up": self._broker_up,
            "ready": self.metrics.is_ready,
            "assigned": [tp.partition for tp in self._assigned],
            "last_snapshot": str(self.last_snapshot) if self.last_snapshot else None,
            "first_batch_at": self._first_batch_at,
            "last_batch_at": self._last_batch_at,
            "prequential_accuracy": self._prequential_accuracy,
            "prequential_curve": list(self._prequential_curve),
        }
        now = time.monotonic()
        if self.track_topics and self.model.state.initialized:
            if now - self._last_status_words >= 1.0 or "top_words" not in self._status:
                k = min(self.track_topics, self.model.n_topics)
                st["top_words"] = {t: self.model.top_words(t, 8) for t in range(k)}
                self._last_status_words = now
            else:
                st["top_words"] = self._status.get("top_words")
        self._status = st

    # -- snapshots ---------------------------------------------------------------------

    def _maybe_snapshot(self, force: bool = False) -> None:
        sc = self.cfg.snapshot
        now = time.monotonic()
        by_batches = sc.every_batches > 0 and self._batches_since_snapshot >= sc.every_batches
        by_time = sc.every_seconds > 0 and now - self._last_snapshot_mono >= sc.every_seconds
        # A young model is covered at once: the first learned batch gets a snapshot (the cadence
        # counts on from start-up, unchanged), so a crash never meets a model without one.
        first = self.last_snapshot is None and self._dirty and now >= self._snapshot_retry_at
        if first and not (force or by_batches or by_time):
            self.snapshot(early=True)
            return
        if not (force or by_batches or by_time):
            return
        if not self._dirty:
            # The newest snapshot already holds the whole state: nothing would be replayed.
            if by_time:
                self.metrics.snapshot_succeeded(None)
                self._last_snapshot_mono = now
            return
        if self._publish_failed or (not force and now < self._snapshot_retry_at):
            return
        self.snapshot()

    def snapshot(self, early: bool = False) -> Path | None:
        """Write a snapshot of the model with its offsets now, once every learned batch's
        predictions are acknowledged, then commit its offsets to the group. Returns the path,
        or None when it could not be written. ``early``: an extra snapshot that leaves the
        cadence's counters alone."""
        if self.pipeline is not None:
            # Normally milliseconds (the last batch's acks). While the broker is away: postpone.
            idle = self.pipeline.wait_idle(None if self._stop.is_set() else SNAPSHOT_ACK_WAIT_S,
                                           heartbeat=self._tick_blocked)
            self._collect()
            if not idle:
                self._snapshot_retry_at = time.monotonic() + SNAPSHOT_ACK_WAIT_S
                log.warning("snapshot postponed: predictions of learned batches are not acknowledged yet",
                            extra={"pending": self.pipeline.pending_messages})
                return None
        if self._publish_failed:
            log.warning("not snapshotting: predictions of a learned batch were not acknowledged")
            return None
        t0 = time.perf_counter()
        self._tick()
        offsets = self.ledger.positions()
        seq = self.lineage.seq + 1
        extra = {"daemon": {
            "instance": self.instance, "version": __version__, "lineage": self.lineage.id, "seq": seq,
            "ledger": self.ledger.to_dict(), "epochs": self.ledger.epochs(),
            "topic_ids": {k.rpartition(":")[0]: self.ledger.topic_id(k) for k in self.ledger.keys()
                          if self.ledger.topic_id(k) is not None},
            "group_id": self.cfg.kafka.group_id, "input": self.cfg.topics.input,
            "batches": self.counts["batches"], "documents": self.counts["documents"],
            "dead_letters": self.counts["dead_letters"]}}
        if self.explorer is not None and self.explorer.summary() is not None:
            extra["daemon"]["quality"] = self.explorer.summary()
        try:
            faults.hit("snapshot_begin")
            path, nbytes = self.store.write(self.model, offsets, extra)
        except SnapshotWriteError as exc:
            reason = self.metrics.snapshot_failed(exc.reason)
            self._after_failed_snapshot()
            log.error("snapshot failed; keeping the previous snapshots and running on",
                      extra={"reason": reason, "error": str(exc)})
            return None
        except Exception as exc:  # noqa: BLE001
            reason = self.metrics.snapshot_failed(exc)
            self._after_failed_snapshot()
            log.exception("snapshot failed; keeping the previous snapshots and running on",
                          extra={"reason": reason, "error": repr(exc)})
            return None
        dt = time.perf_counter() - t0
        faults.hit("snapshot_written")
        self._tick()
        self.metrics.snapshot_succeeded(dt)
        self.last_snapshot = path
        self.lineage.seq = seq
        self._known_snapshots.add(path.name)
        self._dirty = False
        if not early:
            self._batches_since_snapshot = 0
            self._last_snapshot_mono = time.monotonic()
        # Durable now: the group may be told these offsets (and never anything newer).
        self.gate.durable(offsets)
        if not self._stop.is_set():
            self._commit_durable()
        removed = self.store.prune()
        faults.hit("snapshot_pruned")
        log.info("snapshot written", extra={
            "path": str(path), "version": self.model.version, "bytes": nbytes, "seconds": round(dt, 4),
            "offsets": offsets, "seq": seq, "early": early, "pruned": [p.name for p in removed]})
        if self.cfg.topics.snapshots and self.pipeline is not None:
            ann = msgpack.packb({"path": str(path.resolve()), "version": self.model.version,
                                 "offsets": offsets, "lineage": self.lineage.id, "seq": seq,
                                 "ts": time.time()}, use_bin_type=True)
            self.pipeline.submit(PublishJob([OutMessage(self.cfg.topics.snapshots, ann, key=b"snapshot")]))
        return path

    def _after_failed_snapshot(self) -> None:
        # Try again at the next trigger, not after every batch.
        self._batches_since_snapshot = 0
        self._last_snapshot_mono = time.monotonic()
        self._snapshot_retry_at = time.monotonic() + min(30.0, self.cfg.snapshot.every_seconds or 30.0)

    # -- shutdown ----------------------------------------------------------------------

    def _shutdown(self) -> bool:
        """Finish: last acknowledgements, final snapshot, commit of the snapshot's offsets.
        Returns False when learned batches are in no snapshot (the final one failed)."""
        self.metrics.set_ready(False)
        self._gil_free.set()
        final_ok = True
        try:
            faults.hit("shutdown")
            if self.pipeline is not None:
                # Broker up: the last predictions are acknowledged within milliseconds. Broker away:
                # the publisher gives up (stop is set) and the final snapshot is skipped.
                self.pipeline.wait_idle(heartbeat=self._tick_blocked)
                self._collect()
            if self.model is not None and self._dirty and self.lock.held:
                if self._publish_failed:
                    log.warning("final snapshot skipped: a learned batch has unacknowledged predictions; "
                                "it will be replayed from the previous snapshot")
                else:
                    final_ok = self.snapshot() is not None
                    if not final_ok:
                        log.error(
                            "final snapshot failed: the group's committed offsets stay at the last good "
                            "snapshot; what was learned since is read and learned again at the next start "
                            "(free the snapshot directory first). Exiting with status 1.",
                            extra={"last_snapshot": str(self.last_snapshot) if self.last_snapshot else None,
                                   "committed": dict(self.gate.snapshot_offsets),
                                   "learned": self.ledger.positions()})
            faults.hit("shutdown_commit")
            self._commit_durable(sync=True)
        except Exception as exc:  # noqa: BLE001
            final_ok = False
            log.exception("final snapshot or commit failed", extra={"error": repr(exc)})
        if self.pipeline is not None:
            self.pipeline.close()
        if self.publisher is not None:
            self.publisher.close(timeout_s=5.0)
        if self.consumer is not None:
            self.consumer.close()
        if self.server is not None:
            self.server.stop()
        self.lock.release()
        log.info("streamtopics daemon stopped", extra={
            **self.counts, "model_version": self.model.version if self.model is not None else None,
            "last_snapshot": str(self.last_snapshot) if self.last_snapshot else None})
        if self.model is not None:
            self._publish_status({})
        return final_ok


@dataclass
class _BatchMeta:
    tp: TopicPartition
    first_offset: int
    next_offset: int
    docs: int
    tokens: int
    dead: list[str]
    origins: list[float]
    stages: dict[str, float]
    started: float


def _top_topics(theta: np.ndarray) -> list[list[tuple[int, float]]]:
    """Per row: up to TOP_TOPICS (topic, proportion) pairs >= MIN_TOPIC_PROB, largest first (always >= 1)."""
    n, k = theta.shape
    top = min(TOP_TOPICS, k)
    idx = np.argpartition(-theta, top - 1, axis=1)[:, :top] if top < k else np.tile(np.arange(k), (n, 1))
    vals = np.take_along_axis(theta, idx, axis=1)
    order = np.argsort(-vals, axis=1, kind="stable")
    idx = np.take_along_axis(idx, order, axis=1)
    vals = np.take_along_axis(vals, order, axis=1)
    out = []
    for r in range(n):
        row = [(int(idx[r, j]), float(vals[r, j])) for j in range(top) if j == 0 or vals[r, j] >= MIN_TOPIC_PROB]
        out.append(row)
    return out
