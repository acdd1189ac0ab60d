"""Publishing with acknowledgements: the daemon commits offsets only after ``publish`` returns.

``Publisher.publish(messages)`` sends a batch's predictions and dead letters and
blocks until the broker has acknowledged every one of them (``acks=all``):

* **backpressure** — at most ``max_inflight`` messages are unacknowledged at any
  time; past that, sending waits for acknowledgements;
* **broker down** — a flush that times out marks the broker down (``healthy`` is
  False) and is retried with capped exponential backoff; the messages already
  handed to kafka-python stay in its buffer and are not sent twice;
* **failed deliveries** (delivery timeout, retriable broker errors) are re-sent;
  a non-retriable error, or a send that raises, closes the KafkaProducer and
  builds a new one (a producer can be broken for good, e.g. tansu loses
  producer state on restart) before re-sending;
* a message that can never be delivered (larger than the broker or client
  allows) is dropped with an error log rather than blocking the stream;
* ``abort()`` returning True while messages are still unacknowledged raises
  ``PublishAborted`` (shutdown while the broker is unreachable).

Never raises a Kafka error to the caller. Predictions are delivered at least
once: a re-send after an ambiguous failure can duplicate a message (downstream
deduplicates by document id).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kafka import KafkaProducer
from kafka import errors as kerrors

__all__ = ["OutMessage", "PublishAborted", "Publisher"]

log = logging.getLogger(__name__)


def _no_point(name: str) -> None:
    """No listener at a named point."""

# Messages handed to kafka-python between voluntary releases of the GIL. Sending is pure Python
# (~15 us a message); without a release a batch's 256 sends hold the GIL for ~4 ms at a stretch,
# and a thread of the model's kernels that wants it back between two ranges waits for the
# interpreter's 5 ms switch interval (bench_daemon.py --gil-probe: a Python thread busy 20 % of
# the time slowed 30 batches at threads=2 by 15-28 % holding the GIL, by 7-10 % releasing it
# every 0.75 ms, about the CPU it takes from the two cores).
YIELD_EVERY = 32

# Errors that re-sending the same bytes cannot fix.
_PERMANENT = (
    kerrors.MessageSizeTooLargeError,
    kerrors.RecordListTooLargeError,
    kerrors.InvalidRecordError,
)


@dataclass(slots=True)
class OutMessage:
    topic: str
    value: bytes
    key: bytes | None = None
    headers: list[tuple[str, bytes | None]] | None = None  # Kafka record headers (dead letters keep the source's)


class PublishAborted(Exception):
    """Shutdown was requested while some messages were still unacknowledged."""

    def __init__(self, unacked: int) -> None:
        super().__init__(f"{unacked} messages unacknowledged at shutdown")
        self.unacked = unacked


class Publisher:
    """A KafkaProducer that can be rebuilt, with bounded in-flight messages."""

    def __init__(
        self,
        producer_kwargs: dict[str, Any],
        *,
        max_inflight: int = 10000,
        flush_timeout_s: float = 5.0,
        max_backoff_s: float = 5.0,
        factory: Callable[..., Any] = KafkaProducer,
        point: Callable[[str], None] | None = None,
        on_drop: Callable[[str], None] | None = None,
    ) -> None:
        self._kwargs = dict(producer_kwargs)
        self._on_drop = on_drop  # called with the topic of each message dropped as undeliverable
        self._point = point or _no_point  # named points for the daemon's hooks (fault drills)
        self.max_inflight = max(1, int(max_inflight))
        self.flush_timeout_s = float(flush_timeout_s)
        self.max_backoff_s = float(max_backoff_s)
        self._factory = factory
        self._producer: Any = None
        self._lock = threading.Lock()
        self._inflight = 0
        self.healthy = True
        self.recreated = 0
        self.dropped = 0
        self.last_error: str | None = None

    # -- lifecycle ---------------------------------------------------------------------

    def _ensure(self) -> Any:
        if self._producer is None:
            self._producer = self._factory(**self._kwargs)
        return self._producer

    def connect(self) -> None:
        """Build the KafkaProducer now (raises the client's error if it cannot bootstrap)."""
        self._ensure()

    def _recreate(self, why: str) -> None:
        old, self._producer = self._producer, None
        self.recreated += 1
        log.warning("recreating Kafka producer", extra={"reason": why, "recreated": self.recreated})
        if old is not None:
            try:
                old.close(timeout=0)
            except Exception as exc:  # noqa: BLE001 - a broken producer may fail to close
                log.debug("closing the old producer failed: %r", exc)
        with self._lock:
            self._inflight = 0  # its futures have failed or been abandoned

    def close(self, timeout_s: float = 5.0) -> None:
        p, self._producer = self._producer, None
        if p is None:
            return
        try:
            p.flush(timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001
            log.warning("final producer flush failed", extra={"error": repr(exc)})
            # What it holds will not be delivered (the broker away at a stop): abandon it, or close()
            # waits another flush, raises from it, leaves the producer open, and its __del__ raises
            # again at exit (a "KafkaTimeoutError ... Exception ignored" traceback in the log).
            sender = getattr(p, "_sender", None)  # kafka-python internals
            if sender is not None and hasattr(sender, "force_close"):
                sender.force_close()  # its thread aborts the pending batches as it ends
                sender.join(2.0)
                timeout_s = 0.0
        try:
            p.close(timeout=timeout_s)
        except Exception as exc:  # noqa: BLE001
            log.warning("closing the producer failed", extra={"error": repr(exc)})

    # -- state -------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Messages sent and not yet acknowledged (or failed)."""
        return self._inflight

    def _done(self, _value: Any = None) -> None:
        with self._lock:
            self._inflight = max(0, self._inflight - 1)

    # -- sending -----------------------------------------------------------------------

    def _send(self, msg: OutMessage) -> Any:
        """Hand one message to kafka-python, waiting for room first (backpressure)."""
        p = self._ensure()
        if self._inflight >= self.max_inflight:
            deadline = time.monotonic() + self.flush_timeout_s
            p.flush(timeout=self.flush_timeout_s)  # raises KafkaTimeoutError when the broker is away
            while self._inflight >= self.max_inflight and time.monotonic() < deadline:
                time.sleep(0.001)  # callbacks run on the producer's IO thread
        fut = p.send(msg.topic, value=msg.value, key=msg.key, headers=msg.headers or None)
        with self._lock:
            self._inflight += 1
        fut.add_both(self._done)
        return fut

    def publish(self, messages: Sequence[OutMessage], abort: Callable[[], bool] = lambda: False) -> int:
        """Send ``messages`` and block until every one is acknowledged (or permanently refused).

        Returns the number of messages dropped as undeliverable. Raises
        ``PublishAborted`` only when ``abort()`` is True while messages are unacknowledged.
        """
        todo = list(messages)
        futures: list[tuple[OutMessage, Any]] = []
        attempt = 0
        dropped = 0
        while todo or futures:
            recreate: str | None = None
            # 1. hand the messages to the client
            while todo:
                msg = todo[0]
                try:
                    futures.append((msg, self._send(msg)))
                    todo.pop(0)
                    if len(futures) % YIELD_EVERY == 0:
                        time.sleep(0)  # releases the GIL (see YIELD_EVERY)
                except _PERMANENT as exc:
                    todo.pop(0)
                    dropped += 1
                    self._drop(msg, exc)
                except kerrors.KafkaTimeoutError as exc:  # no metadata / full buffer: broker away
                    self._mark_down(exc)
                    break
                except Exception as exc:  # noqa: BLE001 - closed or broken producer
                    recreate = f"send failed: {exc!r}"
                    break
            # 2. wait for acknowledgements
            if futures:
                self._point("publish_sent")
            if futures and recreate is None:
                try:
                    self._ensure().flush(timeout=self.flush_timeout_s)
                except kerrors.KafkaTimeoutError as exc:
                    self._mark_down(exc)
                except Exception as exc:  # noqa: BLE001
                    recreate = f"flush failed: {exc!r}"
            # 3. sort out what happened
            still: list[tuple[OutMessage, Any]] = []
            for msg, fut in futures:
                if not fut.is_done:
                    still.append((msg, fut))
                elif fut.failed():
                    exc = fut.exception
                    if isinstance(exc, _PERMANENT):
                        dropped += 1
                        self._drop(msg, exc)
                        continue
                    todo.append(msg)
                    self.last_error = repr(exc)
                    if not getattr(exc, "retriable", False):
                        recreate = recreate or f"delivery failed: {exc!r}"
            if recreate is not None:
                # Anything not yet acknowledged goes again through the new producer.
                todo = [m for m, _ in still] + todo
                still = []
                self._recreate(recreate)
            futures = still
            if not todo and not futures:
                break
            if abort():
                raise PublishAborted(len(todo) + len(futures))
            attempt += 1
            if todo or recreate is not None:
                delay = min(self.max_backoff_s, 0.05 * 2 ** min(attempt, 10))
                log.warning("publishing is retrying", extra={
                    "attempt": attempt, "unacked": len(todo) + len(futures), "backoff_s": round(delay, 3),
                    "error": self.last_error})
                time.sleep(delay)
        self.dropped += dropped
        if not self.healthy:
            log.info("broker acknowledges again")
        self.healthy = True
        return dropped

    def _mark_down(self, exc: BaseException) -> None:
        self.last_error = repr(exc)
        if self.healthy:
            log.warning("broker not acknowledging", extra={"error": repr(exc)})
        self.healthy = False

    def _drop(self, msg: OutMessage, exc: BaseException) -> None:
        log.error("message dropped: it can never be delivered", extra={
            "topic": msg.topic, "bytes": len(msg.value), "key": (msg.key or b"")[:100].decode("utf-8", "replace"),
            "error": repr(exc)})
        if self._on_drop is not None:
            self._on_drop(msg.topic)


@dataclass
class PublishJob:
    """One batch's messages, published in submission order by a ``PublishPipeline``."""

    messages: list[OutMessage]
    meta: Any = None
    # Optional: builds the messages on the publisher thread (encoding is GIL-bound Python that
    # then overlaps the caller's kernels); ``size`` is their number, for backpressure.
    build: Callable[[], list[OutMessage]] | None = None
    size: int = 0
    # Optional: called on the publisher thread once every message is acknowledged, before the job
    # counts as finished (``completed``, ``wait_idle``): what must follow an acknowledgement at once.
    on_ok: Callable[[], None] | None = None
    acked_at: float | None = None   # wall clock when the broker had acknowledged every message
    acked_mono: float | None = None  # the same moment on the monotonic clock
    publish_seconds: float = 0.0    # submission to acknowledgement
    ok: bool = False
    dropped: int = 0
    _submitted: float = 0.0


class PublishPipeline:
    """Publishes jobs in order on one background thread.

    The daemon hands over a learned batch's messages and goes on with the next batch
    while kafka-python sends them (its Python-side work overlaps the numba kernels,
    which release the GIL). ``completed()`` returns acknowledged jobs in order; the
    caller commits offsets and snapshots only what is acknowledged. Backpressure:
    ``submit`` blocks while more than ``max_pending`` messages are unacknowledged.
    A job that could not be published (``PublishAborted`` at shutdown) fails it and
    every later job: ``failed`` stays True.

    ``gate`` (optional): an Event the caller clears while it runs GIL-bound Python and sets
    while it runs GIL-free kernels (or idles); publishing waits for it, at most
    ``max_gate_wait_s``, so both threads do not fight over the GIL.
    """

    def __init__(self, publisher: Publisher, *, abort: Callable[[], bool], max_pending: int = 10000,
                 gate: threading.Event | None = None, max_gate_wait_s: float = 0.25,
                 point: Callable[[str], None] | None = None) -> None:
        self.publisher = publisher
        self._point = point or _no_point
        self._abort = abort
        # While ``gate`` is clear the caller runs GIL-bound Python (tokenizing): publishing then
        # would only slow it down, so wait (bounded) until it runs GIL-free numba kernels again.
        self._gate = gate
        self.max_gate_wait_s = float(max_gate_wait_s)
        self.max_pending = max(1, int(max_pending))
        self._cond = threading.Condition()
        self._queue: list[PublishJob] = []
        self._done: list[PublishJob] = []
        self._busy: PublishJob | None = None
        self._pending = 0
        self._closed = False
        self.failed = False
        self._thread = threading.Thread(target=self._run, name="streamtopics-publisher", daemon=True)
        self._thread.start()

    @property
    def pending_messages(self) -> int:
        return self._pending

    @property
    def idle(self) -> bool:
        with self._cond:
            return not self._queue and self._busy is None

    def submit(self, job: PublishJob, heartbeat: Callable[[], None] = lambda: None) -> bool:
        """Queue ``job``; waits (backpressure) while too much is unacknowledged. False if it cannot be queued."""
        n = job.size = job.size if job.build is not None else len(job.messages)
        with self._cond:
            while (self._pending > 0 and self._pending + n > self.max_pending and not self.failed
                   and not self._closed):
                if self._abort():
                    break
                self._cond.wait(0.1)
                heartbeat()
            if self.failed or self._closed or (self._pending > 0 and self._pending + n > self.max_pending):
                self.failed = True
                return False
            job._submitted = time.perf_counter()
            self._queue.append(job)
            self._pending += n
            self._cond.notify_all()
        return True

    def completed(self) -> list[PublishJob]:
        """Jobs finished since the last call (acknowledged or failed), in submission order."""
        with self._cond:
            out, self._done = self._done, []
        return out

    def wait_idle(self, timeout_s: float | None = None, heartbeat: Callable[[], None] = lambda: None) -> bool:
        """Wait until every submitted job has finished. True when idle."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy is not None:
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                self._cond.wait(0.1)
                heartbeat()
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
                job = self._busy = self._queue.pop(0)
            if self._gate is not None:
                self._gate.wait(self.max_gate_wait_s)
            if not self.failed:
                try:
                    self._point("publish_build")
                    if job.build is not None:
                        job.messages = job.build()
                    job.dropped = self.publisher.publish(job.messages, abort=self._abort)
                    self._point("publish_acked")
                    job.ok = True
                    job.acked_at, job.acked_mono = time.time(), time.monotonic()
                    if job.on_ok is not None:
                        job.on_ok()
                except PublishAborted:
                    self.failed = True
                except Exception as exc:  # noqa: BLE001 - a bug here must not kill the thread silently
                    log.exception("publishing failed", extra={"error": repr(exc)})
                    self.failed = True
            job.publish_seconds = time.perf_counter() - job._submitted
            with self._cond:
                self._busy = None
                self._pending -= job.size
                self._done.append(job)
                self._cond.notify_all()
