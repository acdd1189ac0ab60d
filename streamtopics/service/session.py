"""The daemon's Kafka session: topics, clients, back-off, and whether the broker is there.

``KafkaSession`` creates the daemon's topics (with the configured partition counts, before any
client could auto-create them), builds the publisher, the publish pipeline and the batching
consumer, retries with back-off while the broker is away, re-creates topics a broker lost, and
counts client re-creations. It runs the read-ahead thread that decodes and tokenizes buffered
records while the loop is in GIL-free kernels. Everything it observes goes to telemetry hooks.

Kafka errors never end the loop: the broker being away shows as ``streamtopics_broker_up 0``
and a failing ``/readyz``; polling and publishing retry with backoff, and clients are rebuilt
after fatal errors.
"""
from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections.abc import Callable

from ..config import Config, compression_kwargs
from ..stream.consumer import BatchingConsumer, heartbeats_unanswered
from ..stream.producer import PublishPipeline, Publisher

__all__ = ["KafkaSession", "ensure_topics", "log_reader_kwargs", "log_writer_kwargs", "reachable"]

log = logging.getLogger("streamtopics.daemon")


def reachable(bootstrap: str, timeout: float = 0.5) -> bool:
    """Whether any of the bootstrap addresses accepts a TCP connection."""
    for item in filter(None, (s.strip() for s in bootstrap.split(","))):
        host, _, port = item.rpartition(":") if item.count(":") == 1 or item.startswith("[") else (item, "", "9092")
        host = host.strip("[]") or item
        try:
            with socket.create_connection((host, int(port or 9092)), timeout=timeout):
                return True
        except (OSError, ValueError):
            continue
    return False


_MISMATCH_SAID: dict[str, int] = {}  # input topic -> the partition count last warned about


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
    if cfg.replication.enabled:
        wanted[cfg.replication.updates_topic] = 1  # the update log: one partition, totally ordered
        if cfg.replication.snapshots_topic:
            wanted[cfg.replication.snapshots_topic] = 1
            wanted[cfg.replication.snapshots_topic + "-manifests"] = 1
    if not reachable(k.bootstrap_servers):
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
        if name in counts and counts[name] != n and name == t.input and _MISMATCH_SAID.get(name) != counts[name]:
            _MISMATCH_SAID[name] = counts[name]  # once per count: it was said every 5 s while joining
            log.warning("input topic has another partition count than configured (it existed already)",
                        extra={"topic": name, "partitions": counts[name], "configured": n})
    return counts


# How long a rebuilt consumer may be without a broker connection before the broker counts as
# unreachable: its first poll connects (well under a second on a live broker).
REBUILT_GRACE_S = 10.0

_GROUP_KEYS = ("group_id", "enable_auto_commit", "auto_offset_reset", "max_poll_interval_ms",
               "session_timeout_ms", "heartbeat_interval_ms", "partition_assignment_strategy")


def log_reader_kwargs(k, fetch_bytes: int) -> dict:
    """A consumer reading a whole single-partition log it is assigned (the update log, shipped
    snapshots): the configured connection without group settings, from the earliest offset.

    Its records are large (an update record is ~0.4 MB), and kafka-python reads a response in
    as many Python-level steps as the socket hands it pieces: a receive buffer of a whole fetch
    took the CPU to consume a 450 kB record from 2.1 to 1.2 ms (zstd; 3.6 to 1.2 ms uncompressed).
    Small records (the input topic) gain nothing from it."""
    common = {key: v for key, v in k.consumer_kwargs().items() if key not in _GROUP_KEYS}
    return {**common, "group_id": None, "enable_auto_commit": False, "auto_offset_reset": "earliest",
            "max_partition_fetch_bytes": fetch_bytes, "receive_buffer_bytes": fetch_bytes}


def log_writer_kwargs(k, max_request_size: int, compression: str = "none") -> dict:
    """A producer of large, unbatched records acknowledged by every replica of the partition (a
    send buffer of a whole request: see ``log_reader_kwargs``), compressed by ``compression``
    (``[replication] compression_type``; shipped snapshots are compressed inside already)."""
    common = {key: v for key, v in k.producer_kwargs().items()
              if key not in ("linger_ms", "batch_size", "compression_type")}
    return {**common, **compression_kwargs(compression), "acks": "all", "linger_ms": 0, "max_request_size": max_request_size,
            "send_buffer_bytes": max_request_size}


class KafkaSession:
    """Topics, clients and back-off of one daemon; see the module docstring.

    ``stop``: the daemon's stop event (ends retries); ``gil_free``: set while the loop runs
    GIL-free (the publisher and the read-ahead work then); ``tick()``: the loop's heartbeat
    while waiting; ``point(name)``: the daemon's named hook points.
    """

    def __init__(self, cfg: Config, telemetry, *, stop: threading.Event, gil_free: threading.Event,
                 tick: Callable[[], None], point: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.telemetry = telemetry
        self._stop = stop
        self._gil_free = gil_free
        self._tick = tick
        self._point = point
        self.consumer: BatchingConsumer | None = None
        self.publisher: Publisher | None = None
        self.pipeline: PublishPipeline | None = None
        self._reader: threading.Thread | None = None
        self._topics_check_at = 0.0   # next check for topics a broker lost (create_topics)
        self._resets_checked = 0      # consumer log resets whose lost topics were re-created
        self._seen: dict[str, int] = {}  # the clients' counters as last reported to telemetry
        self._rebuilt_at = -math.inf   # when a rebuilt consumer was last seen (REBUILT_GRACE_S)

    # -- clients -------------------------------------------------------------------------

    def producer_kwargs(self) -> dict:
        kw = self.cfg.kafka.producer_kwargs()
        # Never block the loop for a minute on metadata while the broker is away.
        kw.setdefault("max_block_ms", 10000)
        if self.cfg.kafka.create_topics:
            # The daemon creates its topics (with the configured partitions), also after a broker
            # lost them: a client must not auto-create them first (tansu: 4 partitions).
            kw.setdefault("allow_auto_create_topics", False)
        return kw

    def consumer_kwargs(self) -> dict:
        kw = self.cfg.kafka.consumer_kwargs()
        if self.cfg.kafka.create_topics:
            kw.setdefault("allow_auto_create_topics", False)
        return kw

    def connect(self, *, decode: Callable, start_offset: Callable, on_assigned: Callable,
                on_revoked: Callable, on_reset: Callable,
                before_offset: Callable = lambda tp, start: None) -> None:
        """Create topics and clients, retrying with backoff while the broker is away."""
        cfg = self.cfg
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            self._tick()
            try:
                if cfg.kafka.create_topics:
                    self.ensure_topics()
                self.publisher = Publisher(self.producer_kwargs(), max_inflight=cfg.batch.max_inflight_predictions,
                                           flush_timeout_s=5.0, point=self._point,
                                           on_drop=self.telemetry.on_message_dropped)
                for topic in (cfg.topics.output, cfg.topics.dead_letter):
                    self.telemetry.on_message_dropped(topic, 0)  # the series exist from the start
                self.publisher.connect()
                self.pipeline = PublishPipeline(self.publisher, abort=self._stop.is_set,
                                                max_pending=cfg.batch.max_inflight_predictions,
                                                gate=self._gil_free, point=self._point)
                self.consumer = BatchingConsumer(
                    self.consumer_kwargs(), cfg.topics.input, max_docs=cfg.batch.max_docs,
                    max_wait_ms=cfg.batch.max_wait_ms, decode=decode, start_offset=start_offset,
                    on_assigned=on_assigned, on_revoked=on_revoked, on_reset=on_reset,
                    on_wait=self._gil_free.set, before_offset=before_offset)
                self.consumer.start()
                if self._reader is None:
                    self._reader = threading.Thread(target=self._read_ahead, name="streamtopics-read-ahead",
                                                    daemon=True)
                    self._reader.start()
                log.info("connected to Kafka", extra={"bootstrap": cfg.kafka.bootstrap_servers,
                                                      "input": cfg.topics.input, "group": cfg.kafka.group_id})
                return
            except Exception as exc:  # noqa: BLE001 - broker away, auth, ...: retry
                self._close_publishing(0)
                self.telemetry.on_broker(False)
                self._back_off(attempt, exc)

    def _back_off(self, attempt: int, exc: BaseException) -> None:
        delay = min(5.0, 0.25 * 2 ** min(attempt, 5))
        log.warning("cannot reach Kafka; retrying", extra={
            "bootstrap": self.cfg.kafka.bootstrap_servers, "error": repr(exc), "attempt": attempt,
            "backoff_s": delay})
        deadline = time.monotonic() + delay
        while not self._stop.wait(min(0.5, max(0.0, deadline - time.monotonic()))):
            self._tick()  # retrying is alive: /healthz stays green, /readyz says not ready
            if time.monotonic() >= deadline:
                break

    def ensure_topics(self, timeout_s: float = 15.0) -> None:
        """Create the topics; an unreachable broker is retried, anything else (say, no permission
        to create topics on a managed cluster) is logged and start-up goes on: they may exist."""
        from kafka import errors as kerrors

        created: list[str] = []
        try:
            ensure_topics(self.cfg, timeout_s=timeout_s, created=created)
            if created:
                self.telemetry.on_topics_created(created)
                log.log(logging.WARNING if self.consumer is not None else logging.INFO,
                        "created missing topics", extra={"topics": created})
                if self.consumer is not None:
                    self.consumer.refresh_metadata()
        except (ConnectionError, OSError, kerrors.KafkaConnectionError,
                kerrors.KafkaTimeoutError):
            raise
        except Exception as exc:  # noqa: BLE001
            log.error("could not create topics; going on (they may already exist)", extra={"error": repr(exc)})

    # -- health --------------------------------------------------------------------------

    def up(self, now: float | None = None) -> bool:
        """Both clients talk to the broker. A consumer rebuilt less than ``REBUILT_GRACE_S`` ago
        (a group join given up, say) has no connection until its first poll: for that long the
        last state stands, instead of a "broker unreachable" and a broker_up flap while the
        broker was fine."""
        if self.publisher is None or not self.publisher.healthy or self.consumer is None:
            return False
        if self.consumer.connected():  # and answering: a hung broker keeps its connections
            return not heartbeats_unanswered(self.consumer)
        now = time.monotonic() if now is None else now
        return self.telemetry.broker_up and now - self._rebuilt_at < REBUILT_GRACE_S

    def check(self, assigned: bool, now: float) -> bool:
        """Periodic: client re-creations counted, broker state to telemetry, lost topics
        re-created unless partitions are ``assigned`` and the broker is up. Returns whether
        the broker is up."""
        for name, client in (("consumer", self.consumer), ("producer", self.publisher)):
            if n := self._newly(name, getattr(client, "recreated", 0)):
                self.telemetry.on_client_recreated(name, n)
                if name == "consumer":
                    self._rebuilt_at = now
        if n := self._newly("joins_abandoned", getattr(self.consumer, "joins_abandoned", 0)):
            self.telemetry.on_joins_abandoned(n)
        if n := self._newly("assignments_refused", getattr(self.consumer, "assignments_refused", 0)):
            self.telemetry.on_assignments_refused(n)
        if n := self._newly("rewinds", getattr(self.consumer, "rewinds", 0)):
            self.telemetry.on_continuity_checks(n)
        up = self.up(now)
        self.telemetry.on_broker(up, self.cfg.kafka.bootstrap_servers)
        self._maybe_recreate_topics(now, assigned and up)
        return up

    def _newly(self, key: str, n: int) -> int:
        """How much the counter ``key`` grew since it was last reported (0 when it did not)."""
        grown = n - self._seen.get(key, 0)
        if grown <= 0:
            return 0
        self._seen[key] = n
        return grown

    def _maybe_recreate_topics(self, now: float, serving: bool) -> None:
        """While not serving with a broker that answers: topics it lost (tansu restarted) are
        created again, at most every 5 s (``kafka.create_topics``)."""
        if not self.cfg.kafka.create_topics or now < self._topics_check_at or serving:
            return
        if not (self.consumer is not None and self.consumer.connected()):
            return
        self._topics_check_at = now + 5.0
        self._create_lost_topics()

    def recheck_topics(self) -> None:
        """After the consumer found a partition log reset (a broker that lost its data), create the
        topics it no longer has before anything is published to them: tansu acknowledges records
        sent to a topic it does not have, and they are lost (measured: 20 of 20 acknowledged, none
        readable; Kafka refuses them as retriable instead). Retried at the next batch on failure."""
        resets = getattr(self.consumer, "resets", 0)
        if resets == self._resets_checked or not self.cfg.kafka.create_topics:
            return
        if self._create_lost_topics():
            self._resets_checked = resets

    def _create_lost_topics(self) -> bool:
        """``ensure_topics`` now, with the watchdog fed around it; False when it failed."""
        self._tick()
        try:
            self.ensure_topics(timeout_s=5.0)
            return True
        except Exception as exc:  # noqa: BLE001 - broker away again: next time
            log.info("topic check failed; retrying later", extra={"error": repr(exc)})
            return False
        finally:
            self._tick()

    def topic_id(self, topic: str) -> str | None:
        return self.consumer.topic_id(topic) if self.consumer is not None else None

    # -- read-ahead ----------------------------------------------------------------------

    def _read_ahead(self) -> None:
        """Decode and tokenize buffered records while the batch loop is GIL-free.

        Tokenizing and decoding are GIL-bound Python on the batch loop's critical path; done
        here, during the loop's numba kernels (``gil_free`` set), they overlap with them
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

    # -- shutdown ------------------------------------------------------------------------

    def _close_publishing(self, timeout_s: float) -> None:
        if self.pipeline is not None:
            self.pipeline.close()
            self.pipeline = None
        if self.publisher is not None:
            self.publisher.close(timeout_s=timeout_s)
            self.publisher = None

    def close(self) -> None:
        if self.pipeline is not None:
            self.pipeline.close()
        if self.publisher is not None:
            self.publisher.close(timeout_s=5.0)
        if self.consumer is not None:
            self.consumer.close()
