"""Every Prometheus metric of the daemon, and its HTTP endpoints.

One place defines all names so dashboards and alerts (deploy/) can be checked
against it. Each ``Metrics`` owns its own ``CollectorRegistry``: tests and
embedded uses create several without clashing in the global registry.

Conventions (prometheus-client): the unit is in the name, counters end in
``_total``, and every label has a small fixed value set, pre-created at zero
so that ``rate()`` and alerts see the series before the first event.

Exposed series (a histogram ``X`` also yields ``X_bucket``, ``X_sum``, ``X_count``):

=============================================  =========  =====================
name                                           type       labels
=============================================  =========  =====================
streamtopics_documents_total                   counter
streamtopics_tokens_total                      counter
streamtopics_batches_total                     counter
streamtopics_batch_duration_seconds            histogram  stage (STAGES)
streamtopics_end_to_end_latency_seconds        histogram
streamtopics_consumer_lag_messages             gauge      partition
streamtopics_local_iterations                  histogram
streamtopics_restart_acceptance_ratio          gauge
streamtopics_mh_acceptance_ratio               gauge      proposal (PROPOSALS)
streamtopics_alias_rebuilds_total              counter
streamtopics_topic_births_total                counter
streamtopics_objective_per_token               gauge
streamtopics_prequential_accuracy              gauge
streamtopics_prequential_window_documents      gauge
streamtopics_snapshot_age_seconds              gauge      (computed at scrape)
streamtopics_snapshot_duration_seconds         histogram
streamtopics_snapshots_total                   counter
streamtopics_snapshot_failures_total           counter    reason (SNAPSHOT_FAILURE_REASONS)
streamtopics_snapshot_load_failures_total      counter
streamtopics_dead_letters_total                counter    reason (codec's codes)
streamtopics_vocabulary_size                   gauge
streamtopics_vocabulary_dropped_tokens_total   counter
streamtopics_vocabulary_evicted_words_total    counter
streamtopics_model_version                     gauge
streamtopics_topics_seeded                     gauge
streamtopics_documents_per_second              gauge
streamtopics_tokens_per_second                 gauge
streamtopics_broker_up                         gauge
streamtopics_ready                             gauge
streamtopics_producer_pending_messages         gauge
streamtopics_model_errors_total                counter
streamtopics_partition_resets_total            counter
streamtopics_continuity_checks_total           counter
streamtopics_partition_quarantined             gauge      partition
streamtopics_offsets_skipped_total             counter    reason (ledger's SKIP_REASONS)
streamtopics_kafka_client_recreations_total    counter    client (consumer, producer)
streamtopics_consumer_joins_abandoned_total    counter
streamtopics_consumer_assignments_refused_total counter
streamtopics_topic_creations_total             counter
streamtopics_snapshot_consecutive_failures     gauge
streamtopics_build_info                        info       version, engine, update
streamtopics_topic_coherence_npmi              gauge      topic (0..K-1, set per batch)
streamtopics_topic_coherence_npmi_mean         gauge
streamtopics_topic_diversity                   gauge
streamtopics_topic_quality_window_documents    gauge
streamtopics_topic_prevalence                  gauge      topic (0..K-1)
streamtopics_trending_topic                    gauge      direction (TREND_DIRECTIONS), rank (1..TREND_RANKS)
streamtopics_trending_topic_change             gauge      direction, rank
streamtopics_topic_monitor_duration_seconds    histogram
streamtopics_topic_events_total                counter
streamtopics_messages_dropped_total            counter    topic (output, dead letters)
streamtopics_update_log_offset                 gauge
streamtopics_update_log_lag_records            gauge
streamtopics_update_staleness_records          gauge
streamtopics_update_log_waiting_seconds        gauge
streamtopics_update_computed_behind_records    histogram
streamtopics_update_apply_seconds              histogram
streamtopics_updates_published_total           counter
streamtopics_updates_applied_total             counter    result (applied, skipped, foreign)
streamtopics_update_unlearned_offsets          gauge
streamtopics_update_log_rebases_total          counter
streamtopics_update_log_truncations_total      counter
=============================================  =========  =====================
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import prometheus_client.exposition as _expo
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    generate_latest,
)

from .snapshot import write_failure_reason

log = logging.getLogger(__name__)

# generate_latest() writes the classic text format (our names need no UTF-8
# escaping); label it 0.0.4, which every Prometheus 2.x and 3.x scraper accepts.
# prometheus-client >= 0.22 labels CONTENT_TYPE_LATEST as 1.0.0 instead.
CONTENT_TYPE = getattr(_expo, "CONTENT_TYPE_PLAIN_0_0_4", _expo.CONTENT_TYPE_LATEST)

__all__ = [
    "Metrics",
    "MetricsServer",
    "METRIC_NAMES",
    "STAGES",
    "PROPOSALS",
    "SNAPSHOT_FAILURE_REASONS",
    "TREND_DIRECTIONS",
    "TREND_RANKS",
    "snapshot_failure_reason",
]

TREND_DIRECTIONS = ("rising", "fading")
TREND_RANKS = 5
STAGES = ("decode", "predict", "publish", "learn", "commit", "total")
PROPOSALS = ("word", "doc", "exp")
SNAPSHOT_FAILURE_REASONS = ("disk_full", "permission", "io_error", "other")
CLIENTS = ("consumer", "producer")

# Stage times run from sub-millisecond decode to multi-second learn steps.
_BATCH_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                  1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# End-to-end reaches minutes while a backlog is replayed after a restart.
_E2E_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0, 300.0, 1800.0)
_ITER_BUCKETS = (1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 100, 200)
_SNAPSHOT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_BEHIND_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128)
_MONITOR_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Metrics:
    """All daemon metrics, registered in a private registry (``self.registry``).

    Attributes are the prometheus-client objects themselves (``documents``,
    ``batch_duration`` ...), so callers can use ``.inc()``, ``.labels()``,
    ``.observe()`` directly; the helper methods below add validation where a
    typo would silently create an unbounded or misleading series.

    ``dead_letter_reasons``: the codec's fixed set of reason codes
    (``streamtopics.stream.codec.REASONS``), pre-created at zero. ``dead_letter()``
    accepts any string, but callers must only pass codes from that fixed set to
    keep the label's cardinality bounded.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        dead_letter_reasons: Iterable[str] = (),
    ) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        self._ready_flag = False
        self._created_at = time.time()
        self._last_snapshot_at: float | None = None
        self._build_stream(r)
        self._build_model(r)
        self._build_snapshots(r)
        self._build_health(r)
        self._build_topics(r)
        self._build_replication(r)
        self._initial_values(dead_letter_reasons)

    def _build_stream(self, r: CollectorRegistry) -> None:
        """Throughput and latency of the stream."""
        # Throughput.
        self.documents = Counter("streamtopics_documents_total",
                                 "Documents processed (predicted and learned).", registry=r)
        self.tokens = Counter("streamtopics_tokens_total",
                              "Tokens in processed documents.", registry=r)
        self.batches = Counter("streamtopics_batches_total", "Batches processed.", registry=r)
        self.documents_per_second = Gauge("streamtopics_documents_per_second",
                                          "Documents per second, smoothed by the daemon.",
                                          registry=r)
        self.tokens_per_second = Gauge("streamtopics_tokens_per_second",
                                       "Tokens per second, smoothed by the daemon.", registry=r)

        # Latency.
        self.batch_duration = Histogram(
            "streamtopics_batch_duration_seconds",
            "Time spent per batch in each stage of the loop ('total' is the whole batch).",
            ["stage"], buckets=_BATCH_BUCKETS, registry=r)
        self.end_to_end_latency = Histogram(
            "streamtopics_end_to_end_latency_seconds",
            "Kafka message timestamp to prediction acknowledged by the broker.",
            buckets=_E2E_BUCKETS, registry=r)
        self.consumer_lag = Gauge("streamtopics_consumer_lag_messages",
                                  "Messages behind the high watermark, per assigned partition.",
                                  ["partition"], registry=r)
        self.producer_pending = Gauge("streamtopics_producer_pending_messages",
                                      "Predictions sent but not yet acknowledged.", registry=r)

    def _build_replication(self, r: CollectorRegistry) -> None:
        """Replicas sharing one model through the update log (docs/scale-out.md)."""
        self.update_log_lag = Gauge("streamtopics_update_log_lag_records",
                                    "Update-log records this replica has not applied yet.", registry=r)
        self.update_log_waiting = Gauge("streamtopics_update_log_waiting_seconds",
                                        "How long the batch being computed has waited for update-log records it "
                                        "must be computed after (0: not waiting); not ready meanwhile.", registry=r)
        self.update_log_rebases = Counter("streamtopics_update_log_rebases_total",
                                          "Times this replica found its update log lost (a broker that lost its "
                                          "data, the topic created again) and offered its snapshot as the new "
                                          "log's base.", registry=r)
        self.update_log_truncations = Counter(
            "streamtopics_update_log_truncations_total",
            "Starts at which retention had deleted update-log records after this replica's snapshot and it "
            "continued from the newest snapshot shipped to Kafka (without one it refuses to start).", registry=r)
        self.update_staleness = Gauge("streamtopics_update_staleness_records",
                                      "Records between the log's end and the model the last batch was computed "
                                      "against.", registry=r)
        self.update_behind = Histogram("streamtopics_update_computed_behind_records",
                                       "Update-log records between the model one of this replica's batches was "
                                       "computed against and the batch's own place in the log, observed when it is "
                                       "learned: the staleness it was learned with, this replica's own records "
                                       "still in flight included.", buckets=_BEHIND_BUCKETS, registry=r)
        self.updates_applied = Counter("streamtopics_updates_applied_total",
                                       "Update-log records applied, or skipped: result=\"skipped\" when their "
                                       "source range was learned already or a later claim took their partition, "
                                       "\"foreign\" when they were computed under other model settings (a "
                                       "misconfigured replica).", ["result"], registry=r)
        self.update_apply_duration = Histogram("streamtopics_update_apply_seconds",
                                               "Time to apply one update-log record.",
                                               buckets=_MONITOR_BUCKETS, registry=r)
        self.updates_published = Counter("streamtopics_updates_published_total",
                                         "Update records this replica published to the log.", registry=r)
        self.update_log_offset = Gauge("streamtopics_update_log_offset",
                                       "The update-log offset this replica's model has applied up to.", registry=r)
        self.update_unlearned = Gauge("streamtopics_update_unlearned_offsets",
                                      "Input offsets of skipped update records that no learned range covers (a "
                                      "zombie's record overlapping the learned ranges only in part).", registry=r)
        for result in ("applied", "skipped", "foreign"):
            self.updates_applied.labels(result=result)

    def _build_model(self, r: CollectorRegistry) -> None:
        """Inference, model quality and size."""
        # Inference.
        self.local_iterations = Histogram("streamtopics_local_iterations",
                                          "Local-step iterations per document.",
                                          buckets=_ITER_BUCKETS, registry=r)
        self.restart_acceptance_ratio = Gauge(
            "streamtopics_restart_acceptance_ratio",
            "Share of local-step restarts accepted in the last batch.", registry=r)
        self.mh_acceptance_ratio = Gauge("streamtopics_mh_acceptance_ratio",
                                         "Metropolis-Hastings acceptance ratio per proposal.",
                                         ["proposal"], registry=r)
        self.alias_rebuilds = Counter("streamtopics_alias_rebuilds_total",
                                      "Alias tables rebuilt.", registry=r)
        self.topic_births = Counter("streamtopics_topic_births_total",
                                    "Dead topics replaced by a newborn seeded from the batch (births.py).",
                                    registry=r)

        # Model quality and size.
        self.objective_per_token = Gauge("streamtopics_objective_per_token",
                                         "Training objective (ELBO or log-likelihood) per token.",
                                         registry=r)
        self.prequential_accuracy = Gauge(
            "streamtopics_prequential_accuracy",
            "Accuracy of predictions made before learning each labelled document "
            "(sliding window).", registry=r)
        self.prequential_window_documents = Gauge(
            "streamtopics_prequential_window_documents",
            "Labelled documents currently in the prequential window.", registry=r)
        self.vocabulary_size = Gauge("streamtopics_vocabulary_size", "Words in the vocabulary.",
                                     registry=r)
        self.vocabulary_dropped_tokens = Counter(
            "streamtopics_vocabulary_dropped_tokens_total",
            "Tokens of learned documents whose word the full vocabulary refused (vocabulary.policy = "
            "\"ignore\" at its cap): those words are never modelled. A steady rise means the cap is full.",
            registry=r)
        self.vocabulary_evicted_words = Counter(
            "streamtopics_vocabulary_evicted_words_total",
            "Words evicted to make room for new ones (vocabulary.policy = \"evict\" at its cap).", registry=r)
        self.model_version = Gauge("streamtopics_model_version",
                                   "Global updates applied to the model.", registry=r)
        self.topics_seeded = Gauge(
            "streamtopics_topics_seeded",
            "Topics holding a seed document. Below n_topics while a stream's first batches, fewer "
            "distinct documents than topics, are still seeding them (seeding.py).", registry=r)

    def _build_snapshots(self, r: CollectorRegistry) -> None:
        """Snapshots."""
        # Snapshots.
        self.snapshot_age = Gauge(
            "streamtopics_snapshot_age_seconds",
            "Seconds since the last successful snapshot (since start if none yet).",
            registry=r)
        self.snapshot_age.set_function(self._snapshot_age)
        self.snapshot_duration = Histogram("streamtopics_snapshot_duration_seconds",
                                           "Time to write one snapshot.",
                                           buckets=_SNAPSHOT_BUCKETS, registry=r)
        self.snapshots = Counter("streamtopics_snapshots_total", "Snapshots written.", registry=r)
        self.snapshot_failures = Counter("streamtopics_snapshot_failures_total",
                                         "Snapshot attempts that failed, by cause.",
                                         ["reason"], registry=r)
        self.snapshot_load_failures = Counter(
            "streamtopics_snapshot_load_failures_total",
            "Snapshot files skipped at start-up because they were corrupt, truncated or unreadable.",
            registry=r)

    def _build_health(self, r: CollectorRegistry) -> None:
        """Input quality, health, and faults survived."""
        # Input quality.
        self.dead_letters = Counter(
            "streamtopics_dead_letters_total",
            "Records sent to the dead-letter topic, by codec reason code (fixed set).",
            ["reason"], registry=r)

        self.messages_dropped = Counter(
            "streamtopics_messages_dropped_total",
            "Predictions or dead letters the broker refused for good (e.g. over its message size); "
            "each is logged with its key. Should stay 0.", ["topic"], registry=r)

        # Health.
        self.broker_up = Gauge("streamtopics_broker_up",
                               "1 if the Kafka broker answered the last request.", registry=r)
        self.ready = Gauge("streamtopics_ready",
                           "1 once the daemon consumes and publishes normally.", registry=r)
        self.build_info = Info("streamtopics_build", "Version and configuration.", registry=r)

        # Faults survived (hardening).
        self.model_errors = Counter(
            "streamtopics_model_errors_total",
            "Batches on which the model raised; their failing documents went to the dead-letter topic.",
            registry=r)
        self.partition_resets = Counter(
            "streamtopics_partition_resets_total",
            "Partition logs found recreated behind the daemon's offset (topic recreated, or a broker "
            "that lost its data): the partition is re-read from its beginning.", registry=r)
        self.continuity_checks = Counter(
            "streamtopics_continuity_checks_total",
            "Times a lost broker connection made the consumer read each assigned partition's last "
            "record again, which must come back unchanged (else the partition counts as reset).",
            registry=r)
        self.partition_quarantined = Gauge(
            "streamtopics_partition_quarantined",
            "1 while a partition is quarantined: its log was reset too often in a short window, "
            "so the daemon stopped re-reading it (see /readyz and the logs).", ["partition"], registry=r)
        self.offsets_skipped = Counter(
            "streamtopics_offsets_skipped_total",
            "Records not learned because the model had learned their offsets of this log already "
            "(re-read after a reset) or they came out of order.", ["reason"], registry=r)
        for reason in ("already_learned", "non_monotonic"):
            self.offsets_skipped.labels(reason=reason)
        self.client_recreations = Counter(
            "streamtopics_kafka_client_recreations_total",
            "Kafka clients rebuilt after fatal errors.", ["client"], registry=r)
        self.joins_abandoned = Counter(
            "streamtopics_consumer_joins_abandoned_total",
            "Consumer group joins that did not complete in 3 session timeouts of polling; the consumer "
            "was rebuilt (also counted in streamtopics_kafka_client_recreations_total).", registry=r)
        self.assignments_refused = Counter(
            "streamtopics_consumer_assignments_refused_total",
            "Group assignments the coordinator handed this member other than it computed as the group's "
            "leader (a broker fault, stream/assignment_check.py); the consumer was rebuilt (also counted in "
            "streamtopics_kafka_client_recreations_total).", registry=r)
        self.topic_creations = Counter(
            "streamtopics_topic_creations_total",
            "Times the daemon (re)created missing topics (start-up, or a broker that lost them).",
            registry=r)
        self.snapshot_consecutive_failures = Gauge(
            "streamtopics_snapshot_consecutive_failures",
            "Snapshot attempts that failed since the last success (0 = the last one succeeded).",
            registry=r)
        for client in CLIENTS:
            self.client_recreations.labels(client=client)

    def _initial_values(self, dead_letter_reasons: Iterable[str]) -> None:
        # Pre-create labelled series at 0 so rate() and absent() behave from the start.
        for stage in STAGES:
            self.batch_duration.labels(stage=stage)
        for reason in SNAPSHOT_FAILURE_REASONS:
            self.snapshot_failures.labels(reason=reason)
        for reason in dead_letter_reasons:
            self.dead_letters.labels(reason=reason)
        # Unknown until measured: NaN shows as a gap, not as a misleading 0.
        for g in (self.objective_per_token, self.prequential_accuracy,
                  self.restart_acceptance_ratio):
            g.set(math.nan)
        for proposal in PROPOSALS:
            self.mh_acceptance_ratio.labels(proposal=proposal).set(math.nan)

    def _build_topics(self, r: CollectorRegistry) -> None:
        """Topics (the explorer's monitor: streamtopics.quality / streamtopics.trends)."""
        # Topics (the explorer's monitor: streamtopics.quality / streamtopics.trends).
        self.topic_npmi = Gauge(
            "streamtopics_topic_coherence_npmi",
            "NPMI coherence of each topic's top-10 words over the sliding window of the stream "
            "(boolean documents; docs/topic-quality.md).", ["topic"], registry=r)
        self.topic_npmi_mean = Gauge("streamtopics_topic_coherence_npmi_mean",
                                     "Mean NPMI coherence of the topics' top-10 words.", registry=r)
        self.topic_diversity = Gauge("streamtopics_topic_diversity",
                                     "Unique share of all topics' top-25 words.", registry=r)
        self.topic_quality_window = Gauge(
            "streamtopics_topic_quality_window_documents",
            "Documents in the sliding window the coherence is measured on.", registry=r)
        self.topic_prevalence = Gauge(
            "streamtopics_topic_prevalence",
            "Smoothed share of the token mass per topic.", ["topic"], registry=r)
        self.trending_topic = Gauge(
            "streamtopics_trending_topic",
            "Topic id of the rank-th most rising / fading topic (NaN: none).",
            ["direction", "rank"], registry=r)
        self.trending_topic_change = Gauge(
            "streamtopics_trending_topic_change",
            "Recent prevalence change of the rank-th most rising / fading topic.",
            ["direction", "rank"], registry=r)
        self.topic_monitor_duration = Histogram(
            "streamtopics_topic_monitor_duration_seconds",
            "Time per batch spent updating topic quality, trends and the explorer view.",
            buckets=_MONITOR_BUCKETS, registry=r)
        self.topic_events = Counter("streamtopics_topic_events_total",
                                    "Topic change events published.", registry=r)
        for g in (self.topic_npmi_mean, self.topic_diversity):
            g.set(math.nan)
        for direction in TREND_DIRECTIONS:
            for rank in range(1, TREND_RANKS + 1):
                self.trending_topic.labels(direction=direction, rank=str(rank)).set(math.nan)
                self.trending_topic_change.labels(direction=direction, rank=str(rank)).set(math.nan)

    def observe_topics(self, npmi, diversity: float, window_documents: int, prevalence,
                       rising: list, fading: list, seconds: float | None = None) -> None:
        """Per-batch topic quality and trends (``rising``/``fading``: [(topic, change)])."""
        for k, v in enumerate(npmi):
            self.topic_npmi.labels(topic=str(k)).set(float(v))
        finite = [float(v) for v in npmi if math.isfinite(v)]
        self.topic_npmi_mean.set(sum(finite) / len(finite) if finite else math.nan)
        self.topic_diversity.set(diversity)
        self.topic_quality_window.set(window_documents)
        for k, v in enumerate(prevalence):
            self.topic_prevalence.labels(topic=str(k)).set(float(v))
        for direction, items in (("rising", rising), ("fading", fading)):
            for rank in range(1, TREND_RANKS + 1):
                k, ch = items[rank - 1] if rank <= len(items) else (math.nan, math.nan)
                self.trending_topic.labels(direction=direction, rank=str(rank)).set(k)
                self.trending_topic_change.labels(direction=direction, rank=str(rank)).set(ch)
        if seconds is not None:
            self.topic_monitor_duration.observe(seconds)

    # -- helpers with validation -----------------------------------------

    def observe_stage(self, stage: str, seconds: float) -> None:
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; expected one of {STAGES}")
        self.batch_duration.labels(stage=stage).observe(seconds)

    def observe_batch(self, documents: int, tokens: int) -> None:
        self.batches.inc()
        self.documents.inc(documents)
        self.tokens.inc(tokens)

    def observe_end_to_end(self, message_timestamp_ms: int, now: float | None = None) -> float:
        """Record latency from a Kafka record timestamp (ms since epoch); returns seconds.

        Clock skew between producer and daemon can make it negative: clamped to 0.
        """
        now = time.time() if now is None else now
        latency = max(0.0, now - message_timestamp_ms / 1000.0)
        self.end_to_end_latency.observe(latency)
        return latency

    def set_mh_acceptance(self, proposal: str, ratio: float) -> None:
        if proposal not in PROPOSALS:
            raise ValueError(f"unknown proposal {proposal!r}; expected one of {PROPOSALS}")
        self.mh_acceptance_ratio.labels(proposal=proposal).set(ratio)

    def set_lag(self, partition: int, lag: int) -> None:
        self.consumer_lag.labels(partition=str(int(partition))).set(lag)

    def set_quarantined(self, partition: int, on: bool) -> None:
        self.partition_quarantined.labels(partition=str(int(partition))).set(1 if on else 0)

    def forget_partition(self, partition: int) -> None:
        """Drop a revoked partition's lag series (it would otherwise freeze at its last value)."""
        try:
            self.consumer_lag.remove(str(int(partition)))
        except KeyError:
            pass

    def dead_letter(self, reason: str, n: int = 1) -> None:
        """Count dead letters; ``reason`` must come from the codec's fixed set of codes."""
        self.dead_letters.labels(reason=reason).inc(n)

    def snapshot_succeeded(self, duration_s: float | None = None, at: float | None = None) -> None:
        """Record a snapshot written (or, with duration None, loaded at startup) at ``at``."""
        if duration_s is not None:
            self.snapshots.inc()
            self.snapshot_duration.observe(duration_s)
            self.snapshot_consecutive_failures.set(0)
        self._last_snapshot_at = time.time() if at is None else float(at)

    def snapshot_failed(self, reason: str | BaseException) -> str:
        """Count a failed snapshot; accepts a reason code or the exception. Returns the code."""
        code = reason if isinstance(reason, str) else snapshot_failure_reason(reason)
        if code not in SNAPSHOT_FAILURE_REASONS:
            code = "other"
        self.snapshot_failures.labels(reason=code).inc()
        self.snapshot_consecutive_failures.inc()
        return code

    def set_broker_up(self, up: bool) -> None:
        self.broker_up.set(1 if up else 0)

    def set_ready(self, ready: bool) -> None:
        self._ready_flag = bool(ready)
        self.ready.set(1 if ready else 0)

    @property
    def is_ready(self) -> bool:
        return self._ready_flag

    def follow_readiness(self, ready: HealthCallback) -> None:
        """The ready gauge reads ``ready()`` (the ``/readyz`` callback) at every scrape; a
        callback that raises reads as not ready, as on ``/readyz``."""
        def value() -> float:
            try:
                return 1.0 if ready()[0] else 0.0
            except Exception:  # noqa: BLE001 - a failing probe is "not ready", never a failed scrape
                return 0.0
        self.ready.set_function(value)

    def set_build_info(self, version: str, engine: str, update: str) -> None:
        self.build_info.info({"version": str(version), "engine": str(engine),
                              "update": str(update)})

    def _snapshot_age(self) -> float:
        since = self._last_snapshot_at if self._last_snapshot_at is not None else self._created_at
        return max(0.0, time.time() - since)

    def exposition(self) -> bytes:
        """The Prometheus text format of this registry."""
        return generate_latest(self.registry)


# The errno -> reason mapping lives in snapshot.py (one place, used by the writer and here).
snapshot_failure_reason = write_failure_reason


# Metric family names as exposed; tests check dashboards and alerts against them.
METRIC_NAMES: dict[str, str] = {
    "streamtopics_documents_total": "counter",
    "streamtopics_tokens_total": "counter",
    "streamtopics_batches_total": "counter",
    "streamtopics_batch_duration_seconds": "histogram",
    "streamtopics_end_to_end_latency_seconds": "histogram",
    "streamtopics_consumer_lag_messages": "gauge",
    "streamtopics_local_iterations": "histogram",
    "streamtopics_restart_acceptance_ratio": "gauge",
    "streamtopics_mh_acceptance_ratio": "gauge",
    "streamtopics_alias_rebuilds_total": "counter",
    "streamtopics_topic_births_total": "counter",
    "streamtopics_objective_per_token": "gauge",
    "streamtopics_prequential_accuracy": "gauge",
    "streamtopics_prequential_window_documents": "gauge",
    "streamtopics_snapshot_age_seconds": "gauge",
    "streamtopics_snapshot_duration_seconds": "histogram",
    "streamtopics_snapshots_total": "counter",
    "streamtopics_snapshot_failures_total": "counter",
    "streamtopics_snapshot_load_failures_total": "counter",
    "streamtopics_dead_letters_total": "counter",
    "streamtopics_messages_dropped_total": "counter",
    "streamtopics_vocabulary_size": "gauge",
    "streamtopics_vocabulary_dropped_tokens_total": "counter",
    "streamtopics_vocabulary_evicted_words_total": "counter",
    "streamtopics_model_version": "gauge",
    "streamtopics_topics_seeded": "gauge",
    "streamtopics_documents_per_second": "gauge",
    "streamtopics_tokens_per_second": "gauge",
    "streamtopics_broker_up": "gauge",
    "streamtopics_ready": "gauge",
    "streamtopics_producer_pending_messages": "gauge",
    "streamtopics_build_info": "info",
    "streamtopics_model_errors_total": "counter",
    "streamtopics_partition_resets_total": "counter",
    "streamtopics_continuity_checks_total": "counter",
    "streamtopics_partition_quarantined": "gauge",
    "streamtopics_offsets_skipped_total": "counter",
    "streamtopics_kafka_client_recreations_total": "counter",
    "streamtopics_consumer_joins_abandoned_total": "counter",
    "streamtopics_consumer_assignments_refused_total": "counter",
    "streamtopics_topic_creations_total": "counter",
    "streamtopics_snapshot_consecutive_failures": "gauge",
    "streamtopics_topic_coherence_npmi": "gauge",
    "streamtopics_topic_coherence_npmi_mean": "gauge",
    "streamtopics_topic_diversity": "gauge",
    "streamtopics_topic_quality_window_documents": "gauge",
    "streamtopics_topic_prevalence": "gauge",
    "streamtopics_trending_topic": "gauge",
    "streamtopics_trending_topic_change": "gauge",
    "streamtopics_topic_monitor_duration_seconds": "histogram",
    "streamtopics_topic_events_total": "counter",
    "streamtopics_update_log_lag_records": "gauge",
    "streamtopics_update_staleness_records": "gauge",
    "streamtopics_update_log_waiting_seconds": "gauge",
    "streamtopics_update_log_rebases_total": "counter",
    "streamtopics_update_log_truncations_total": "counter",
    "streamtopics_update_computed_behind_records": "histogram",
    "streamtopics_updates_applied_total": "counter",
    "streamtopics_update_unlearned_offsets": "gauge",
    "streamtopics_update_apply_seconds": "histogram",
    "streamtopics_updates_published_total": "counter",
    "streamtopics_update_log_offset": "gauge",
}

HealthCallback = Callable[[], tuple[bool, dict]]
# Extra read-only GET routes: path -> (status, body, content type), or None when not handled.
RouteCallback = Callable[[str], "tuple[int, bytes, str] | None"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True  # a stuck scrape never blocks shutdown
    allow_reuse_address = True


class MetricsServer:
    """HTTP endpoints on a daemon thread: ``/metrics``, ``/healthz``, ``/readyz``.

    Binds and starts serving in the constructor (``port=0`` picks a free port,
    see ``.port``). ``health``/``ready`` return ``(ok, details)``; the endpoint
    answers 200 or 503 with ``{"status": "ok"|"fail", **details}``. A callback
    that raises counts as not ok. Defaults: always healthy; ready follows
    ``metrics.set_ready()``. Given a ``ready`` callback, the ``streamtopics_ready`` gauge reads it
    at each scrape, so the gauge and ``/readyz`` never disagree (a gauge the loop set went stale
    while the loop waited, e.g. in a recovery).
    """

    def __init__(
        self,
        metrics: Metrics,
        host: str = "127.0.0.1",
        port: int = 0,
        health: HealthCallback | None = None,
        ready: HealthCallback | None = None,
        routes: RouteCallback | None = None,
    ) -> None:
        self.metrics = metrics
        self._routes = routes
        self._health = health or (lambda: (True, {}))
        self._ready = ready or (lambda: (metrics.is_ready, {}))
        if ready is not None:
            metrics.follow_readiness(ready)
        handler = _make_handler(self)
        server_cls = _Server
        if ":" in host:  # IPv6 literal
            server_cls = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        try:
            self._server = server_cls((host, port), handler)
        except OSError as exc:  # say which setting: the bare errno names neither the address nor the key
            raise OSError(exc.errno, f"metrics endpoint {host}:{port}: {exc.strerror or exc} (set [metrics] host "
                                     f"and port; port = 0 takes any free port)") from exc
        self.host = host
        self.port: int = self._server.server_address[1]
        self._stopped = False
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
            name=f"metrics-http-{self.port}", daemon=True)
        self._thread.start()
        log.info("metrics endpoint on http://%s:%d/metrics", host, self.port)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        """Stop serving and close the socket. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _make_handler(owner: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        timeout = 10  # a client that never finishes its request frees the thread
        server_version = "streamtopics"

        head_only = False

        def do_HEAD(self) -> None:  # noqa: N802 - health checkers that ask for the headers only
            self.head_only = True
            self.do_GET()

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            path = urlsplit(self.path).path
            if path == "/metrics":
                try:
                    body = owner.metrics.exposition()
                except Exception:
                    log.exception("metrics exposition failed")
                    self._send(500, b"exposition failed\n", "text/plain; charset=utf-8")
                    return
                self._send(200, body, CONTENT_TYPE)
            elif path == "/healthz":
                self._probe(owner._health)
            elif path == "/readyz":
                self._probe(owner._ready)
            elif owner._routes is not None and (answer := self._route(path)) is not None:
                self._send(*answer)
            else:
                self._send(404, b"not found\n", "text/plain; charset=utf-8")

        def _route(self, path: str):
            try:
                return owner._routes(path)
            except Exception:
                log.exception("route %s failed", path)
                return 500, b"internal error\n", "text/plain; charset=utf-8"

        def _probe(self, callback: HealthCallback) -> None:
            try:
                ok, details = callback()
            except Exception as exc:  # a broken check must read as "not ok", not a 500
                log.warning("probe callback failed: %r", exc)
                ok, details = False, {"error": repr(exc)}
            payload = {"status": "ok" if ok else "fail", **(details or {})}
            body = (json.dumps(payload, default=str, sort_keys=True) + "\n").encode()
            self._send(200 if ok else 503, body, "application/json")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            if not self.head_only:
                self.wfile.write(body)

        def log_message(self, fmt: str, *args) -> None:
            # http.server writes every request to stderr by default; scrapes are noise.
            log.debug("%s - %s", self.address_string(), fmt % args)

    return Handler
