"""Structured logs: one JSON object per line with ts, level, logger, msg and the extra fields."""
from __future__ import annotations

import io
import json
import logging
import re

import numpy as np
import pytest

from streamtopics.logs import setup_logging


@pytest.fixture(autouse=True)
def _restore_levels():
    root, kafka = logging.getLogger(), logging.getLogger("kafka")
    levels = root.level, kafka.level
    yield
    root.setLevel(levels[0])
    kafka.setLevel(levels[1])


def _emit(fmt: str, fn) -> str:
    buf = io.StringIO()
    handler = setup_logging("DEBUG", fmt, stream=buf)
    try:
        fn(logging.getLogger("streamtopics.test"))
    finally:
        logging.getLogger().removeHandler(handler)
    return buf.getvalue()


def test_json_lines_carry_fields_and_survive_odd_values():
    def emit(log):
        log.info("batch processed", extra={"docs": np.int64(256), "rate": np.float32(1.5),
                                           "offsets": {"docs:0": 512}, "nan": float("nan"), "tags": {"a"}})
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception("it failed", extra={"partition": 3})

    lines = _emit("json", emit).splitlines()
    assert len(lines) == 2
    first, second = map(json.loads, lines)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["ts"])
    assert (first["level"], first["logger"], first["msg"]) == ("INFO", "streamtopics.test", "batch processed")
    assert first["docs"] == 256 and first["rate"] == 1.5 and first["offsets"] == {"docs:0": 512}
    assert first["nan"] == "nan" and first["tags"] == ["a"]
    assert second["level"] == "ERROR" and second["partition"] == 3
    assert second["exc_type"] == "ValueError" and "boom" in second["traceback"]


def test_text_format_and_setup_is_idempotent():
    out = _emit("text", lambda log: log.warning("broker unreachable", extra={"bootstrap": "h:1"}))
    assert "WARNING" in out and "streamtopics.test: broker unreachable" in out and 'bootstrap="h:1"' in out
    buf1, buf2 = io.StringIO(), io.StringIO()
    setup_logging("INFO", "json", stream=buf1)
    h = setup_logging("INFO", "json", stream=buf2)  # replaces the first handler
    try:
        logging.getLogger("streamtopics.test").info("once")
    finally:
        logging.getLogger().removeHandler(h)
    assert buf1.getvalue() == "" and json.loads(buf2.getvalue())["msg"] == "once"
    assert logging.getLogger("kafka").level >= logging.WARNING


def test_the_kafka_clients_short_slow_task_warnings_are_dropped_and_long_ones_kept():
    """kafka-python warns about any event-loop step over 0.1 s; on a busy machine that is its
    thread waiting for a CPU beside the kernels (0.1-0.44 s seen in a three-replica drill)."""
    buf = io.StringIO()
    h = setup_logging("INFO", "json", stream=buf)
    sel = logging.getLogger("kafka.net.selector")
    try:
        for secs in (0.231, 1.502):
            sel.warning("Task <Task poll> ran for %.3fs (>%.3fs threshold). It is blocking the event loop "
                        "-- likely a tight sync loop inside a coroutine. Other pollers will time out." % (secs, 0.1))
        sel.warning("some other client warning")
    finally:
        logging.getLogger().removeHandler(h)
    msgs = [json.loads(line)["msg"] for line in buf.getvalue().splitlines()]
    assert len(msgs) == 2 and "ran for 1.502s" in msgs[0] and msgs[1] == "some other client warning"


def test_what_python_prints_raw_goes_through_the_json_handler():
    """An exception in a ``__del__`` (kafka-python's producer, collected after its close timed out)
    and an uncaught exception in a thread were printed raw, breaking one JSON object per line."""
    import gc
    import sys
    import threading

    class Closing:
        def __del__(self):
            raise TimeoutError("Timeout waiting for future")

    buf = io.StringIO()
    saved = sys.unraisablehook, threading.excepthook
    h = setup_logging("INFO", "json", stream=buf)
    try:
        Closing()
        gc.collect()
        t = threading.Thread(target=lambda: 1 / 0, name="worker")
        t.start()
        t.join()
    finally:
        logging.getLogger().removeHandler(h)
        sys.unraisablehook, threading.excepthook = saved
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]  # every line is JSON
    assert [x["exc_type"] for x in lines] == ["TimeoutError", "ZeroDivisionError"]
    assert "Closing.__del__" in lines[0]["msg"] and lines[1]["thread_name"] == "worker"
