"""Telemetry: every metric, counter, rate and status line of the daemon, as event hooks.

The other service parts say what happened (``on_broker(up)``, ``on_batch_acked(job)``,
``on_snapshot_failed(exc)``, ...) and never touch a Prometheus object; this class owns the
``Metrics`` registry (``metrics.py``), the progress counters, the docs/s and tokens/s moving
averages, the prequential (predict-then-learn) accuracy window and the ``status()`` copy that
other threads read. It is the faust ``Monitor`` pattern: one observer with hooks, not metric
calls sprinkled through the loop.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Any

import numpy as np

from ..export import snapshot_quality
from ..metrics import PROPOSALS, Metrics
from ..stream.codec import ALL_REASONS

__all__ = ["Telemetry", "RATE_TAU_S", "PROGRESS_LOG_S"]

log = logging.getLogger("streamtopics.daemon")

RATE_TAU_S = 10.0        # time constant of the docs/s and tokens/s moving averages
PROGRESS_LOG_S = 30.0    # an INFO "progress" line this often


class Telemetry:
    """Hooks that own every metric; see the module docstring."""

    def __init__(self, metrics: Metrics | None = None, *, prequential_window: int = 1000,
                 track_topics: int = 0, explorer=None) -> None:
        self.metrics = metrics or Metrics(dead_letter_reasons=sorted(ALL_REASONS))
        # topic quality, trends and the /topics explorer (explore.py): updated on the loop's
        # thread per batch, read by the HTTP thread only through the immutable view it publishes
        self.explorer = explorer
        self.track_topics = int(track_topics)
        self.counts = {"documents": 0, "tokens": 0, "batches": 0, "dead_letters": 0, "predictions": 0}
        self.dead_by_reason: dict[str, int] = {}
        self.acked: dict[str, int] = {}  # offsets whose predictions the broker has acknowledged
        self.first_batch_at = self.last_batch_at = None  # monotonic clock (float), for benchmarks and the demo
        self.broker_up = False
        self.docs_rate = self.tokens_rate = 0.0
        self._rate_t = time.monotonic()
        self._rate_docs = self._rate_tokens = 0
        self._last_progress_log = time.monotonic()
        self._last_status_words = 0.0
        self._status: dict[str, Any] = {}
        self._build: tuple[str, str, str] = ("", "", "")  # build_info's (version, engine, update)
        self.standby_ready = False  # replicas: a member with no partition is a ready standby (readiness)
        self.update_log_wait: float | None = None  # replicas: seconds a batch has waited for the log (readiness)
        self.update_offset: int | None = None  # replicas: the update offset applied (predictions' model_version)
        self.prequential: deque[bool] = deque(maxlen=prequential_window)
        self._vocabulary_full_logged = False
        self.prequential_accuracy: float | None = None
        # (documents learned, windowed accuracy) once per batch; bounded for a never-ending stream
        self.prequential_curve: deque[tuple[int, float]] = deque(maxlen=2000)

    # -- lifecycle and connection ------------------------------------------------------

    def on_start(self, version: str, engine: str, update: str) -> None:
        """Start-up, before a model is loaded: the configuration's engine and update, until
        ``on_model`` reports the running model's (a snapshot's model is kept over [model])."""
        self._build = (version, engine, update)
        self.metrics.set_build_info(version, engine, update)
        self.metrics.set_broker_up(False)
        self.metrics.set_ready(False)

    def on_broker(self, up: bool, bootstrap: str | None = None) -> None:
        """The broker is (un)reachable; logged on changes when ``bootstrap`` is given."""
        if bootstrap is not None and up != self.broker_up:
            log.log(logging.INFO if up else logging.WARNING, "broker up" if up else "broker unreachable",
                    extra={"bootstrap": bootstrap})
        self.broker_up = up
        self.metrics.set_broker_up(up)

    def on_ready(self, ok: bool, info: dict | None = None) -> None:
        if info is not None and ok != self.metrics.is_ready:
            log.info("ready" if ok else "not ready", extra=info)
        self.metrics.set_ready(ok)

    def readiness(self, book, model, stopping: bool, consumer=None) -> tuple[bool, dict]:
        """/readyz: partitions assigned, broker up, model loaded, not stopping, none quarantined, no
        batch waiting for the update log (replicas, which say their ``update_offset``). Without a
        partition, the ``consumer``'s group join progress says why. A replica
        (``standby_ready``) that the group gave no partition, once the group is stable, is a
        standby: ready, since it follows the update log and holds the shared model (more replicas
        than input partitions, e.g. compose --scale)."""
        quarantined = book.ledger.quarantined()
        up = self.broker_up
        join = consumer.join_progress() if consumer is not None and not book.assigned else None
        standby = bool(self.standby_ready and join is not None and join.get("stable"))
        waiting = self.update_log_wait
        ok = ((bool(book.assigned) or standby) and up and model is not None and not stopping and not quarantined
              and waiting is None)
        out = {"partitions": [p for _, p in book.assigned], "broker_up": up, "model_ready": model is not None,
               "model_version": model.version if model is not None else None, "stopping": stopping}
        if self.update_offset is not None:
            out["update_offset"] = self.update_offset
        if waiting is not None:
            out["waiting_for_update_log_s"] = round(waiting, 1)
        if quarantined:
            out["quarantined"] = quarantined
        if join is not None:
            out["group_join"] = join
            if standby:
                out["standby"] = True
        return ok, out

    @property
    def ready(self) -> bool:
        return self.metrics.is_ready

    def on_topics_created(self, names: list[str]) -> None:
        self.metrics.topic_creations.inc()

    def on_message_dropped(self, topic: str, n: int = 1) -> None:
        """A message the broker can never take (too large, ...): logged by the publisher, counted here."""
        self.metrics.messages_dropped.labels(topic=topic).inc(n)

    def on_client_recreated(self, client: str, n: int) -> None:
        self.metrics.client_recreations.labels(client=client).inc(n)

    def on_continuity_checks(self, n: int) -> None:
        self.metrics.continuity_checks.inc(n)

    def on_joins_abandoned(self, n: int) -> None:
        self.metrics.joins_abandoned.inc(n)

    def on_assignments_refused(self, n: int) -> None:
        self.metrics.assignments_refused.inc(n)

    def on_lag(self, lag: dict[int, int]) -> None:
        for p, v in lag.items():
            self.metrics.set_lag(p, v)

    # -- offsets -----------------------------------------------------------------------

    def on_partition_reset(self) -> None:
        self.metrics.partition_resets.inc()

    def on_quarantined(self, partition: int) -> None:
        self.metrics.set_quarantined(partition, True)

    def on_revoked(self, partition: int) -> None:
        self.metrics.forget_partition(partition)

    def on_offsets_skipped(self, skipped: dict[str, int]) -> None:
        for reason, n in skipped.items():
            self.metrics.offsets_skipped.labels(reason=reason).inc(n)

    # -- batches -----------------------------------------------------------------------

    def on_batch_started(self) -> None:
        if self.first_batch_at is None:
            self.first_batch_at = time.monotonic()

    def on_model(self, model) -> None:
        """The model was loaded, or changed between batches (a replica applied records): gauges,
        build_info, and the explorer's first view of a model with topics (a restart from a
        snapshot: its topics and the coherence the snapshot recorded, before any new batch)."""
        self.metrics.vocabulary_size.set(len(model.vocab))
        self.metrics.model_version.set(model.version)
        self.metrics.topics_seeded.set(model.state.topics_seeded)
        if self.explorer is not None and model.state.initialized and self.explorer.view.get("status") != "ok":
            try:
                obs = self.explorer.show(model, snapshot_quality(model))
            except Exception:  # noqa: BLE001 - a view is not worth the start
                log.exception("topic explorer: the snapshot's view failed")
                obs = None
            if obs is not None:
                q = obs.quality
                self.metrics.observe_topics(q.npmi, q.diversity, q.window_docs, obs.prevalence, obs.rising,
                                            obs.fading)
        build = (self._build[0], model.engine, model.update)
        if build != self._build:
            self._build = build
            self.metrics.set_build_info(*build)

    def on_model_error(self) -> None:
        self.metrics.model_errors.inc()

    def on_processed(self, out, docs_seen: int) -> None:
        """A batch went through the model (``processor.BatchOutcome``)."""
        if out.error is not None:
            self.on_model_error()
        if out.step.stats:
            self.on_inference(out.step.stats)
        if out.step.sup is not None and out.targets is not None:
            self.on_predictions(out.step.sup[1], [out.targets[i] for i in out.step.keep], docs_seen)

    def on_inference(self, st: dict) -> None:
        """The local step's diagnostics (``model.last_stats``)."""
        m = self.metrics
        iterations = st.get("iterations")
        if iterations is not None:
            for it in np.asarray(iterations).tolist():
                m.local_iterations.observe(it)
        self.on_vocabulary(st.get("dropped_tokens") or 0, st.get("evicted_words") or 0)
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
        if st.get("births"):
            m.topic_births.inc(len(st["births"]))

    def on_vocabulary(self, dropped_tokens: int, evicted_words: int) -> None:
        """Tokens the full vocabulary refused and words it evicted in a learned batch; the first
        refusal is logged (once per process), since those words are never modelled."""
        if dropped_tokens > 0:
            self.metrics.vocabulary_dropped_tokens.inc(dropped_tokens)
            if not self._vocabulary_full_logged:
                self._vocabulary_full_logged = True
                log.warning("the vocabulary is full: new words are not modelled (counted in "
                            "streamtopics_vocabulary_dropped_tokens_total); raise [model.vocabulary] cap, or "
                            "with policy = \"ignore\" set policy = \"evict\" (an evicting vocabulary drops "
                            "them only when one batch holds more distinct words than the cap)",
                            extra={"dropped_tokens": int(dropped_tokens)})
        if evicted_words > 0:
            self.metrics.vocabulary_evicted_words.inc(evicted_words)

    def on_predictions(self, predicted: list, truths: list, docs_seen: int) -> None:
        """Predictions made before learning vs the labels that came with the documents."""
        window = self.prequential
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
            self.prequential_accuracy = acc
            self.prequential_curve.append((int(docs_seen), acc))

    def on_learned(self, model, batch, theta, ids: list, texts: list, events: bool) -> list:
        """Topic quality, trends and the explorer's view after a learned batch (never fatal).
        Returns the topic change events to publish (when ``events``; counted here)."""
        if self.explorer is None or theta is None:
            return []
        try:
            obs = self.explorer.observe(model, batch, theta, ids, texts, status={
                "docs_per_s": self.docs_rate, "prequential_accuracy": self.prequential_accuracy,
                "prequential_curve": list(self.prequential_curve)[-300:]})
        except Exception:  # noqa: BLE001 - a view is not worth a batch
            log.exception("topic explorer update failed")
            return []
        if obs is None:
            return []
        q = obs.quality
        self.metrics.observe_topics(q.npmi, q.diversity, q.window_docs, obs.prevalence, obs.rising, obs.fading,
                                    obs.seconds)
        if not (events and obs.events):
            return []
        self.metrics.topic_events.inc(len(obs.events))
        return obs.events

    def refresh_topics(self, model) -> None:
        """Between batches: the explorer's view follows a model that changed without a batch
        (a replica applying the others' records; ``TopicExplorer.refresh``; never fatal)."""
        if self.explorer is None:
            return
        try:
            self.explorer.refresh(model)
        except Exception:  # noqa: BLE001 - a view is not worth the loop
            log.exception("topic explorer refresh failed")

    def quality_summary(self) -> dict | None:
        return self.explorer.summary() if self.explorer is not None else None

    def on_batch_acked(self, job, key: str) -> None:
        """A batch's predictions and dead letters are acknowledged (``job.meta``: BatchMeta)."""
        m, meta = self.metrics, job.meta
        self.acked[key] = meta.next_offset
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
        self.last_batch_at = job.acked_mono
        m.observe_stage("total", time.perf_counter() - meta.started)

    def on_pending(self, n: int) -> None:
        self.metrics.producer_pending.set(n)

    def on_commit(self, seconds: float) -> None:
        self.metrics.observe_stage("commit", seconds)

    # -- replication -------------------------------------------------------------------

    def on_update_applied(self, seconds: float, result: str, births: int = 0) -> None:
        """``result``: "applied", "skipped" (learned already, or fenced), "foreign" (other settings)."""
        self.metrics.updates_applied.labels(result=result).inc()
        if births:  # topics the applied record reset for newborns (births.py)
            self.metrics.topic_births.inc(births)
        self.metrics.update_apply_duration.observe(seconds)

    def on_update_unlearned(self, n: int) -> None:
        self.metrics.update_unlearned.set(n)

    def on_update_lag(self, n: int) -> None:
        self.metrics.update_log_lag.set(n)

    def on_staleness(self, n: int) -> None:
        self.metrics.update_staleness.set(n)

    def on_update_wait(self, seconds: float | None) -> None:
        """A batch has waited ``seconds`` for update-log records it must be computed after (None:
        it waits no more)."""
        self.update_log_wait = seconds
        self.metrics.update_log_waiting.set(seconds or 0.0)

    def on_update_log_lost(self, truncated: bool = False) -> None:
        """The update log was found lost (this replica offered its snapshot as the new log's base),
        or ``truncated`` past its snapshot by retention (it continues from a shipped snapshot)."""
        (self.metrics.update_log_truncations if truncated else self.metrics.update_log_rebases).inc()

    def on_own_update_learned(self, behind: int) -> None:
        """One of this replica's records was learned ``behind`` records after the model its batch
        was computed against (its log offset minus its base)."""
        self.metrics.update_behind.observe(behind)

    def on_update_published(self, offset: int) -> None:
        self.metrics.updates_published.inc()

    def on_update_offset(self, offset: int) -> None:
        """The update-log offset the replica's model has applied up to (every replica, whether it
        publishes or not: a standby's and a restarted replica's too)."""
        self.update_offset = int(offset)
        self.metrics.update_log_offset.set(offset)

    # -- snapshots ---------------------------------------------------------------------

    def on_snapshot_written(self, seconds: float | None, at: float | None = None) -> None:
        """Written (``seconds``), or found current / loaded at start (None)."""
        self.metrics.snapshot_succeeded(seconds, at=at)

    def on_snapshot_failed(self, exc: BaseException) -> str:
        from ..snapshot import SnapshotWriteError

        return self.metrics.snapshot_failed(exc.reason if isinstance(exc, SnapshotWriteError) else exc)

    def snapshot_extra(self, instance: str, version: str, cfg) -> dict:
        """What a snapshot says about the daemon that wrote it (its header's ``extra.daemon``)."""
        c = self.counts
        extra = {"instance": instance, "version": version, "group_id": cfg.kafka.group_id, "input": cfg.topics.input,
                 "batches": c["batches"], "documents": c["documents"], "dead_letters": c["dead_letters"]}
        if self.quality_summary() is not None:
            extra["quality"] = self.quality_summary()
        return extra

    def on_snapshot_load_failed(self) -> None:
        self.metrics.snapshot_load_failures.inc()

    # -- periodic ----------------------------------------------------------------------

    def on_tick(self, now: float) -> None:
        """Moving averages of docs/s and tokens/s (at most every half second)."""
        dt = now - self._rate_t
        if dt < 0.5:
            return
        a = 1.0 - math.exp(-dt / RATE_TAU_S)
        self.docs_rate += a * (self._rate_docs / dt - self.docs_rate)
        self.tokens_rate += a * (self._rate_tokens / dt - self.tokens_rate)
        self._rate_t, self._rate_docs, self._rate_tokens = now, 0, 0
        self.metrics.documents_per_second.set(self.docs_rate)
        self.metrics.tokens_per_second.set(self.tokens_rate)

    def maybe_log_progress(self, now: float, **fields: Any) -> None:
        if now - self._last_progress_log >= PROGRESS_LOG_S:
            self._last_progress_log = now
            log.info("progress", extra={**self.counts, "docs_per_s": round(self.docs_rate, 1), **fields})

    def publish_status(self, model, **fields: Any) -> None:
        """Replace the status copy that ``status()`` hands to other threads."""
        st = {
            **self.counts,
            "dead_by_reason": dict(self.dead_by_reason),
            "offsets": dict(self.acked),  # published and acknowledged
            **fields,
            "docs_per_s": self.docs_rate,
            "tokens_per_s": self.tokens_rate,
            "vocabulary": len(model.vocab),
            "model_version": model.version,
            "docs_seen": int(model.state.docs_seen),
            "broker_up": self.broker_up,
            "ready": self.metrics.is_ready,
            "first_batch_at": self.first_batch_at,
            "last_batch_at": self.last_batch_at,
            "prequential_accuracy": self.prequential_accuracy,
            "prequential_curve": list(self.prequential_curve),
        }
        now = time.monotonic()
        if self.track_topics and model.state.initialized:
            if now - self._last_status_words >= 1.0 or "top_words" not in self._status:
                k = min(self.track_topics, model.n_topics)
                st["top_words"] = {t: model.top_words(t, 8) for t in range(k)}
                self._last_status_words = now
            else:
                st["top_words"] = self._status.get("top_words")
        self._status = st

    def status(self) -> dict[str, Any]:
        """A consistent copy of the progress counters (safe from other threads)."""
        return dict(self._status)
