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
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from kafka import TopicPartition

from . import __version__
from .config import Config, ConfigError, check_daemon_config, config_warnings, model_from_config, param_differences, prequential_window
from .explore import TopicExplorer
from .jit_cache import active_dir
from .metrics import Metrics, MetricsServer
from .model import TopicModel
from .service.checkpoint import SnapshotStore, StartRefused
from .service.checkpointer import Checkpointer
from .service.hooks import Hooks
from .service.liveness import Liveness
from .service.ledger import OffsetLedger
from .service.partitions import PartitionBook, Span, tp_key
from .service.outbox import Outbox
from .service.processor import BatchProcessor, RecordDecoder, StepInterrupted
from .service.replica_sync import ReplicaMode
from .service.session import KafkaSession, ensure_topics
from .service.telemetry import Telemetry
from .stream.consumer import RecordBatch

__all__ = ["Daemon", "SnapshotStore", "ensure_topics"]

log = logging.getLogger(__name__)

SNAPSHOT_ACK_WAIT_S = 5.0  # a due snapshot waits this long for acknowledgements, then is postponed


class MetricsEndpointUnusable(StartRefused):
    """The metrics endpoint cannot listen where it is configured (the daemon exits 2 saying so)."""


def serve_metrics(metrics: Metrics, mcfg, **kw) -> MetricsServer:
    """The metrics endpoint of ``[metrics]`` (``mcfg``), or ``MetricsEndpointUnusable``."""
    try:
        return MetricsServer(metrics, mcfg.host, mcfg.port, **kw)
    except OSError as exc:
        raise MetricsEndpointUnusable(str(exc)) from None


def log_start(cfg: Config, instance: str, metrics_url: str | None) -> None:
    """The start-up record (version, instance, effective configuration) and the configuration's
    warnings (``config_warnings``)."""
    log.info("streamtopics daemon starting", extra={
        "version": __version__, "instance": instance, "config": cfg.to_dict(),
        "metrics_url": metrics_url, "kernel_cache": active_dir()})
    for line in config_warnings(cfg):
        log.warning("configuration: %s", line)


def untrained_takes_config(model: TopicModel, ledger, path: Path, m) -> tuple:
    """A snapshot whose model learned nothing (a replica that applied only claims, a daemon stopped
    before its first batch) does not keep its [model] settings over the configuration's, as a
    trained one does: the configured model takes its place, with the snapshot's offsets and what
    it says of the update log. (Fleet audit: a replica refused for another n_topics and then given
    the log's stayed refused, its empty snapshot's settings kept.)"""
    differences = param_differences(model, m) if model.state.docs_seen == 0 else {}
    if not differences:
        return model, ledger, path
    fresh = model_from_config(m)
    fresh.snapshot_info = model.snapshot_info
    log.info("the snapshot's model learned nothing; the [model] settings are used instead of its own",
             extra={"path": str(path), "differences": sorted(differences)})
    return fresh, ledger, path


class Daemon:
    """The composition: a Kafka session, a partition book, a batch processor, a checkpointer
    and telemetry around one model; ``run()`` is the loop. See the module docstring."""

    def __init__(self, cfg: Config, *, metrics: Metrics | None = None, serve_metrics: bool = True,
                 track_topics: int = 0, hooks: Hooks | None = None) -> None:
        errs = check_daemon_config(cfg)
        if errs:
            raise ConfigError(errs)
        self.cfg = cfg
        self.hooks = hooks or Hooks.default()
        # topic quality, trends and the /topics explorer (telemetry updates it per batch)
        self.explorer = TopicExplorer.from_config(cfg) if cfg.metrics.explorer else None
        self.telemetry = Telemetry(metrics, prequential_window=prequential_window(cfg), track_topics=track_topics,
                                   explorer=self.explorer)
        self.metrics = self.telemetry.metrics
        self.serve_metrics = serve_metrics
        self.instance = uuid.uuid4().hex
        self.server: MetricsServer | None = None
        self.model: TopicModel | None = None
        self.checkpoints = Checkpointer(cfg.snapshot, self.instance, self.telemetry, self.hooks.point)
        self.book = PartitionBook(self.telemetry, changed=self._mark_dirty)
        self._stop = threading.Event()
        self._started = threading.Event()
        self._finished = threading.Event()
        # Set while this thread runs GIL-free (numba kernels, or blocked waiting for records);
        # the publisher thread does its GIL-bound encoding and sending only then (PublishPipeline).
        self._gil_free = threading.Event()
        self._gil_free.set()
        self.session = KafkaSession(cfg, self.telemetry, stop=self._stop, gil_free=self._gil_free,
                                    tick=self._tick, point=self.hooks.point)
        # replicas (docs/scale-out.md): the model learns only from the update log
        self.replicas = ReplicaMode(cfg, self.telemetry, self.checkpoints, tick=self._tick, gil_free=self._gil_free,
                                    stopping=self._stop.is_set) \
            if cfg.replication.enabled else None
        self.book.through_log = None if self.replicas is None else self.replicas.renew_epoch
        self.processor = BatchProcessor(point=self.hooks.point, gil_free=self._set_gil_free,
                                        prefetch=lambda: self.session.consumer.prefetch(),
                                        compute=None if self.replicas is None else lambda tokens, labels:
                                        self.replicas.compute(tokens, self.book.in_batch, self.book.ledger, labels))
        self.decoder = RecordDecoder(cfg.limits(), cfg.input.format, self._tokenizer, self.hooks.point)
        self.outbox = Outbox(cfg, self.session, self.telemetry, self.hooks.point)
        if self.replicas is not None:
            self.outbox.on_acked = self.replicas.acked
            self.outbox.encoder = self.outbox.encoder.named(self.replicas.replica_id)
        self.liveness = Liveness(max(10.0, 5 * cfg.batch.max_wait_ms / 1000.0))
        self.error: BaseException | None = None
        self._poll_tick_s = min(0.5, max(0.05, cfg.batch.max_wait_ms / 1000.0))

    # -- collaborators' state, for callers and tests -------------------------------------

    @property
    def last_snapshot(self) -> Path | None:
        return self.checkpoints.last_snapshot

    @property
    def offsets(self) -> dict[str, int]:
        """``"topic:partition" -> next offset`` the model has learned up to (current epochs)."""
        return self.book.ledger.positions()

    def status(self) -> dict[str, Any]:
        """A consistent copy of the progress counters (safe from other threads)."""
        return self.telemetry.status()

    # -- control -------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask for a graceful stop (thread- and signal-safe): finish the batch, publish, commit, snapshot."""
        self._stop.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT -> graceful stop; a later second signal exits at once (``signal_handler``)."""
        install_signal_handlers(self._stop)

    def wait_started(self, timeout: float | None = None) -> bool:
        """Wait until the metrics endpoint answers and the model is loaded (Kafka may still be away)."""
        return self._started.wait(timeout)

    @property
    def metrics_url(self) -> str | None:
        return self.server.url if self.server is not None else None

    # -- health --------------------------------------------------------------------------

    def health(self) -> tuple[bool, dict]:
        return self.liveness.check(self._finished.is_set())

    def readiness(self) -> tuple[bool, dict]:
        return self.telemetry.readiness(self.book, self.model, self._stop.is_set(), self.session.consumer)

    # -- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Run until stopped. Returns the process exit code: 0 after a graceful stop whose final
        snapshot holds everything learned; 1 on errors, or when the final snapshot failed (the
        group's offsets then stay at the last good snapshot); 2 when another daemon owns the
        snapshot directory or it cannot be used."""
        rc = 0
        try:
            try:
                self._startup()
                while not self._stop.is_set():
                    self._tick()
                    self.hooks.point("poll")
                    rb = self.session.consumer.next_batch(self._poll_tick_s, should_stop=self._stop.is_set)
                    self._tick()
                    t0 = time.monotonic()
                    if rb is not None:
                        self._process(rb)
                    self._housekeeping()
                    if rb is not None:
                        self.liveness.batch_done(time.monotonic() - t0)
                rc = 0 if self.error is None else 1
            except StartRefused as exc:
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
        self.liveness.tick()

    def _tick_blocked(self) -> None:
        """Heartbeat while the loop waits on the publisher: keep broker_up and /readyz honest."""
        self.liveness.tick()
        up = self.session.up()
        if up != self.telemetry.broker_up:
            self.telemetry.on_broker(up)
            self.telemetry.on_ready(self.readiness()[0])

    def _set_gil_free(self, free: bool) -> None:
        (self._gil_free.set if free else self._gil_free.clear)()

    def _tokenizer(self):
        return self.model.tokenizer if self.model is not None else None

    def _mark_dirty(self) -> None:
        self.checkpoints.dirty = True

    def _startup(self) -> None:
        cfg = self.cfg
        self.hooks.point("startup")
        self.telemetry.on_start(__version__, cfg.model.engine, cfg.model.update)
        # StartRefused: another daemon's directory (before its metrics port is found taken), or an unusable one
        self.checkpoints.lock.acquire()
        if self.serve_metrics:
            self.server = serve_metrics(self.metrics, cfg.metrics, health=self.health, ready=self.readiness,
                                        routes=self.explorer.route if self.explorer is not None else None)
        log_start(cfg, self.instance, self.metrics_url)
        if self.replicas is not None:
            self.replicas.fetch_snapshot(self.checkpoints.store)
        found = self.checkpoints.load()
        if found is None:
            self.model = model_from_config(cfg.model)
            self.book.adopt(OffsetLedger())
        else:
            self._adopt(*untrained_takes_config(*found, cfg.model))
        self.telemetry.on_model(self.model)
        self.hooks.point("model_loaded")
        self._started.set()  # the metrics endpoint answers and the model is loaded
        self.session.connect(decode=self.decoder, start_offset=self._start_offset, on_assigned=self._on_assigned,
                             on_revoked=self._on_revoked, on_reset=self._on_reset,
                             before_offset=lambda tp, start: self.book.before(tp.topic, tp.partition, start))
        if self.replicas is not None:
            self.replicas.join(self.model, self.book.ledger, adopt=lambda m, lg: self._adopt(m, lg, "update log base"))
        self.hooks.point("connected")

    @property
    def replica(self):
        return self.replicas.replica if self.replicas is not None else None

    @property
    def sync(self):
        return self.replicas.sync if self.replicas is not None else None

    def _adopt(self, model: TopicModel, ledger, path: Path) -> None:
        model.set_threads(self.cfg.model.threads or None)  # how to run is this host's choice, not the snapshot's
        self.model = model
        self.book.adopt(ledger)
        self.checkpoints.log_adopted(model, path, param_differences(model, self.cfg.model))

    # -- consumer callbacks (on the loop's thread) ----------------------------------------

    def _start_offset(self, tp: TopicPartition) -> int | None:
        if self.sync is not None:
            # Replica mode: claim the partition in the update log, then resume where the log's
            # coverage of it ends (nothing covered -> its beginning): docs/scale-out.md, "Claims".
            self.replicas.claim(*self.book.claim_epoch(*tp, self.session.topic_id(tp.topic)))
            return self.book.start_offset(*tp, self.session.topic_id(tp.topic), have_snapshot=False)
        if self.book.in_batch is None and self.model is not None:
            # The model may be swapped only between batches.
            found = self.checkpoints.newer_of_lineage(int(self.model.state.docs_seen))
            if found is not None:
                self._adopt(*found)
                self.telemetry.on_model(self.model)
        return self.book.start_offset(tp.topic, tp.partition, self.session.topic_id(tp.topic),
                                      have_snapshot=self.checkpoints.last_snapshot is not None)

    def _on_assigned(self, tps: list[TopicPartition]) -> None:
        self.checkpoints.gate.forget()
        for topic, partition in self.book.assign([(tp.topic, tp.partition) for tp in tps]):
            self.session.consumer.hold(TopicPartition(topic, partition))
        self.hooks.point("assigned")

    def _on_revoked(self, tps: list[TopicPartition]) -> None:
        if self.replicas is not None:  # acknowledged batches' records in the log before the next owner reads it
            self.outbox.wait_idle(SNAPSHOT_ACK_WAIT_S, heartbeat=self._tick_blocked)
            self._collect()
            self.replicas.revoked({f"{tp.topic}:{tp.partition}" for tp in tps})
        self.book.revoke([(tp.topic, tp.partition) for tp in tps])
        for tp in tps:
            self.telemetry.on_revoked(tp.partition)

    def _on_reset(self, tp: TopicPartition, expected: int, highwater: int) -> None:
        if self.book.on_reset(tp.topic, tp.partition, expected, highwater) and self.session.consumer is not None:
            self.session.consumer.hold(tp)

    # -- one batch -----------------------------------------------------------------------

    def _process(self, rb: RecordBatch) -> None:
        """Admit, predict and learn one batch, record its offsets with the model, then publish it."""
        self.telemetry.on_batch_started()
        t_start, now, span = time.perf_counter(), time.time(), Span.of(rb)
        self.session.recheck_topics()  # after a log reset: the output topics exist before we publish
        rb = self.book.admit(rb, client_tid := self.session.topic_id(rb.topic))
        if rb is None:  # nothing new in it (or the partition is quarantined)
            return self._collect()
        self.book.in_batch = span = span.read_from(self.book.current_topic_id(rb.topic, client_tid))
        self.telemetry.on_lag(self.session.consumer.lag())  # housekeeping's comes after: a first batch compiles
        self.hooks.point("batch_received")
        try:
            batch_key = self.book.batch_key(rb.topic, rb.partition, rb.first_offset)
            try:
                out = self.processor.run(self.model, rb.records, rb.decoded, batch_key, rb.decode_seconds)
            except StepInterrupted as exc:  # neither learned nor dead-lettered: read again after a restart
                if not self._stop.is_set():  # a newer update-log format (NewerUpdateFormat): the daemon stops
                    raise
                log.info("batch left for the restart", extra={"reason": str(exc), "first_offset": rb.first_offset})
                return self._collect()
            self.hooks.point("learned")
            # Model and offsets move together, in memory, before anything else can happen (unless the log
            # was found reset during the batch). A replica's ledger moves by the log: records carry the topic id.
            if self.replicas is not None:
                out.version = self.replicas.predicted_at  # predictions name the update offset they were made at
            elif self.book.learned(self.book.in_batch):
                self.book.record_topic_id(span.key, rb.topic, client_tid)
        finally:
            self.book.in_batch = None
        self.checkpoints.dirty = True
        self.telemetry.on_model(self.model)
        self.hooks.point("offsets_advanced")
        self.telemetry.on_processed(out, int(self.model.state.docs_seen))
        self.outbox.submit_batch(rb, out, now, t_start, heartbeat=self._tick_blocked)
        step = out.step
        self.outbox.submit_events(self.telemetry.on_learned(self.model, step.batch, step.theta, out.ids,
                                                            [out.texts[i] for i in step.keep],
                                                            events=bool(self.cfg.topics.events)))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("batch learned", extra={
                "partition": rb.partition, "first_offset": rb.first_offset, "next_offset": rb.next_offset,
                "docs": len(step.keep), "dead_letters": len(out.dead), "tokens": step.n_tokens,
                "version": self.model.version, "complete": rb.complete})
        self.checkpoints.batches_since += 1
        self._collect()
        self._maybe_snapshot()

    def _collect(self) -> None:
        if not self.outbox.collect(stopping=self._stop.is_set()):
            # Publishing itself broke: learning on without publishing or snapshotting would help
            # nobody; stop, and let a restart replay from the snapshot.
            self.error = RuntimeError("publishing failed")
            log.error("publishing failed: stopping (a restart resumes from the last snapshot)")
            self._stop.set()

    def _commit_durable(self, sync: bool = False) -> None:
        """Tell the group the offsets of the newest snapshot (never more: see CommitGate)."""
        assigned = {tp_key(t, p): TopicPartition(t, p) for t, p in self.book.assigned}
        self.checkpoints.commit(self.session.consumer, assigned, sync=sync)

    # -- periodic work -------------------------------------------------------------------

    def _housekeeping(self) -> None:
        self.hooks.point("housekeeping")
        self._collect()
        self.checkpoints.lock.heartbeat()
        if self.replicas is not None:
            self.replicas.apply_log()
        now = time.monotonic()
        up = self.session.check(bool(self.book.assigned), now)
        ok, info = self.readiness()
        self.telemetry.on_ready(ok, info)
        lag = self.session.consumer.lag()
        self.telemetry.on_lag(lag)
        self.telemetry.on_tick(now)
        self._maybe_snapshot()
        self._publish_status(lag)
        self.telemetry.maybe_log_progress(now, lag=lag, model_version=self.model.version,
                                          vocabulary=len(self.model.vocab), broker_up=up, ready=ok)

    def _publish_status(self, lag: dict[int, int]) -> None:
        last = self.checkpoints.last_snapshot
        self.telemetry.publish_status(
            self.model, model_offsets=dict(self.offsets), lag=dict(lag),
            assigned=[p for _, p in self.book.assigned], last_snapshot=str(last) if last else None)

    # -- snapshots -----------------------------------------------------------------------

    def _maybe_snapshot(self, force: bool = False) -> None:
        due = self.checkpoints.due(force, self.outbox.failed)
        if due is not None:
            self.snapshot(early=due == "early")

    def snapshot(self, early: bool = False) -> Path | None:
        """Write a snapshot of the model with its offsets now, once every learned batch's
        predictions are acknowledged, then commit its offsets to the group. Returns the path,
        or None when it could not be written. ``early``: an extra snapshot that leaves the
        cadence's counters alone."""
        # Normally milliseconds (the last batch's acks). While the broker is away: postpone.
        idle = self.outbox.wait_idle(None if self._stop.is_set() else SNAPSHOT_ACK_WAIT_S, heartbeat=self._tick_blocked)
        self._collect()
        if not idle:
            self.checkpoints.postpone(SNAPSHOT_ACK_WAIT_S)
            log.warning("snapshot postponed: predictions of learned batches are not acknowledged yet",
                        extra={"pending": self.outbox.pending})
            return None
        if self.outbox.failed:
            log.warning("not snapshotting: predictions of a learned batch were not acknowledged")
            return None
        self._tick()
        extra = self.telemetry.snapshot_extra(self.instance, __version__, self.cfg)
        if self.replicas is not None:
            extra.update(self.replicas.snapshot_extra())
        path = self.checkpoints.write(self.model, self.book.ledger, extra, early=early)
        if path is None:
            return None
        self._tick()
        if not self._stop.is_set():
            self._commit_durable()
        self.checkpoints.prune(path, self.model.version, early)
        if self.replicas is not None:
            self.replicas.ship(path)
        self.outbox.announce_snapshot(path, self.model.version, self.offsets, self.checkpoints.lineage)
        return path

    # -- shutdown ------------------------------------------------------------------------

    def _shutdown(self) -> bool:
        """Finish: last acknowledgements, final snapshot, commit of the snapshot's offsets.
        Returns False when learned batches are in no snapshot (the final one failed)."""
        self.telemetry.on_ready(False)
        self._gil_free.set()
        final_ok = True
        try:
            self.hooks.point("shutdown")
            # Broker up: the last predictions are acknowledged within milliseconds. Broker away:
            # the publisher gives up (stop is set) and the final snapshot is skipped.
            self.outbox.wait_idle(None, heartbeat=self._tick_blocked)
            self._collect()
            if self.replicas is not None:
                self.replicas.finish()
            final_ok = self._final_snapshot()
            self.hooks.point("shutdown_commit")
            self._commit_durable(sync=True)
        except Exception as exc:  # noqa: BLE001
            final_ok = False
            log.exception("final snapshot or commit failed", extra={"error": repr(exc)})
        self.session.close()
        if self.replicas is not None:
            self.replicas.close()
        if self.server is not None:
            self.server.stop()
        self.checkpoints.lock.release()
        last = self.checkpoints.last_snapshot
        log.info("streamtopics daemon stopped", extra={
            **self.telemetry.counts, "model_version": self.model.version if self.model is not None else None,
            "last_snapshot": str(last) if last else None})
        if self.model is not None:
            self._publish_status({})
        return final_ok

    def _final_snapshot(self) -> bool:
        if self.model is None or not self.checkpoints.dirty or not self.checkpoints.lock.held:
            return True
        if self.outbox.failed:
            self.checkpoints.log_final_skipped(self.offsets)  # rule 5: learned batches in no snapshot
            return False
        if self.snapshot() is not None:
            return True
        self.checkpoints.log_final_failure(self.offsets)
        return False


# A signal this soon after the first is the same request delivered twice, not an operator's
# "now": `timeout`, a shell's Ctrl-C and a container runtime signal the process and its group.
SAME_REQUEST_S = 2.0


def signal_handler(stop: threading.Event, clock=time.monotonic, exit_now=os._exit):
    """The handler ``install_signal_handlers`` installs: the first SIGTERM/SIGINT sets ``stop`` (a
    graceful stop); another one more than ``SAME_REQUEST_S`` later exits at once (the last snapshot
    stays valid); one sooner is the same request again and is only logged."""
    first: list[float] = []

    def handler(signum, _frame):
        now = clock()
        if stop.is_set() and first and now - first[0] > SAME_REQUEST_S:
            log.warning("second signal: exiting without the final snapshot", extra={"signal": signum})
            exit_now(128 + signum)
            return
        if stop.is_set():
            log.info("signal again within %.0f s of the first: the same stop request (send it later to exit at "
                     "once, without the final snapshot)", SAME_REQUEST_S, extra={"signal": signum})
            return
        first.append(now)
        log.info("signal received: stopping after the current batch", extra={"signal": signum})
        stop.set()

    return handler


def install_signal_handlers(stop: threading.Event) -> None:
    """SIGTERM/SIGINT/SIGHUP set ``stop`` (a graceful stop); a later second signal exits at once
    (``signal_handler``). SIGHUP too: a closed terminal or ssh session otherwise killed the
    daemon without its final snapshot (it has no configuration to reload)."""
    handler = signal_handler(stop)
    for sig in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, handler)
