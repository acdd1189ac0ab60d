"""Structured logs: one JSON object per line (collectors) or readable text (terminals).

Every record carries ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``
and ``msg``; anything passed through ``extra=`` becomes a field of its own::

    log.info("batch processed", extra={"docs": 256, "partition": 0, "offset": 1024})
    {"ts": "2024-05-01T12:00:00.123Z", "level": "INFO", "logger": "streamtopics.daemon",
     "msg": "batch processed", "docs": 256, "partition": 0, "offset": 1024}

Exceptions add ``exc_type``, ``exc`` and ``traceback``. Values that JSON cannot hold
(numpy scalars, paths, exceptions) are converted with ``str``/``float``/``int``.
The text format prints the same fields as ``key=value`` after the message.
"""
from __future__ import annotations

import json
import logging
import math
import re
import sys
import threading
import time
import traceback
from typing import Any, TextIO

__all__ = ["JsonFormatter", "SlowClientTaskFilter", "TextFormatter", "setup_logging", "record_fields"]

# Attributes every LogRecord has; anything else came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


def _plain(v: Any) -> Any:
    """A JSON-safe version of ``v`` (numpy scalars, sets, paths, exceptions ...)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [_plain(x) for x in v]
    if hasattr(v, "item") and callable(v.item):  # numpy scalar
        try:
            return _plain(v.item())
        except Exception:  # noqa: BLE001 - fall through to str
            pass
    if isinstance(v, BaseException):
        return f"{type(v).__name__}: {v}"
    return str(v)


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra=`` fields of a record."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the extra fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record_fields(record).items():
            if k not in out:
                out[k] = _plain(v)
        if record.exc_info and record.exc_info[0] is not None:
            et, ev, tb = record.exc_info
            out["exc_type"] = et.__name__
            out["exc"] = str(ev)
            out["traceback"] = "".join(traceback.format_exception(et, ev, tb))
        return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``ts LEVEL logger: msg key=value ...`` for people reading a terminal."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={json.dumps(_plain(v), ensure_ascii=False)}"
                          for k, v in record_fields(record).items())
        line = f"{_iso(record.created)} {record.levelname:<7} {record.name}: {record.getMessage()}"
        if fields:
            line += " " + fields
        if record.exc_info and record.exc_info[0] is not None:
            line += "\n" + "".join(traceback.format_exception(*record.exc_info)).rstrip()
        return line


_HANDLER_TAG = "_streamtopics_handler"


class SlowClientTaskFilter(logging.Filter):
    """kafka-python's network thread warns when one step of its event loop took over 0.1 s ("Task
    ... ran for 0.23s (>0.100s threshold). It is blocking the event loop"). In this daemon that
    is the thread waiting for a CPU or the GIL beside the kernels, not a client fault: a helper's
    drill of three replicas on two cores logged a few per daemon, all 0.1-0.44 s. Steps under
    ``min_s`` are passed on at DEBUG when the root logger shows DEBUG, and dropped otherwise; a
    longer step (it risks the group session) stays a WARNING."""

    _RAN = re.compile(r"\bran for ([0-9.]+)s \(>")

    def __init__(self, min_s: float = 1.0) -> None:
        super().__init__()
        self.min_s = min_s

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        m = self._RAN.search(str(record.msg))
        if m is None or float(m.group(1)) >= self.min_s:
            return True
        if not logging.getLogger().isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


_SLOW_TASKS = SlowClientTaskFilter()


def setup_logging(level: str = "INFO", fmt: str = "json", stream: TextIO | None = None,
                  path: str | None = None) -> logging.Handler:
    """Route the root logger to one handler (stderr, ``stream`` or the file ``path``).

    Idempotent: a handler installed by an earlier call is replaced, other
    handlers (pytest's capture, for instance) are left alone. kafka-python's
    chatter is kept at WARNING and above.
    """
    if fmt not in ("json", "text"):
        raise ValueError(f"log format must be json or text (got {fmt!r})")
    root = logging.getLogger()
    for h in list(root.handlers):
        if getattr(h, _HANDLER_TAG, False):
            root.removeHandler(h)
            h.close()
    handler: logging.Handler
    if path is not None:
        handler = logging.FileHandler(path, encoding="utf-8")
    else:
        handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    setattr(handler, _HANDLER_TAG, True)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    # kafka-python logs every reconnect attempt at INFO/DEBUG; its warnings still pass, but for
    # its network thread's short waits for a CPU (SlowClientTaskFilter).
    logging.getLogger("kafka").setLevel(max(logging.WARNING, root.level))
    logging.getLogger("kafka.net.selector").addFilter(_SLOW_TASKS)
    # What Python itself would print raw to stderr (an exception in a __del__, e.g. a Kafka client
    # whose close timed out being collected; an uncaught exception in a thread) goes through the
    # handler too: one JSON object per line, always.
    sys.unraisablehook = _log_unraisable
    threading.excepthook = _log_thread_exception
    return handler


def _log_unraisable(u: Any) -> None:
    exc = (u.exc_type, u.exc_value, u.exc_traceback) if u.exc_type is not None else None
    obj = repr(u.object)[:200] if u.object is not None else None
    logging.getLogger("streamtopics.python").warning(
        f"{u.err_msg or 'Exception ignored in'}: {obj}" if obj else (u.err_msg or "Exception ignored"),
        extra={"object": obj}, exc_info=exc)


def _log_thread_exception(a: Any) -> None:
    if a.exc_type is SystemExit:
        return
    logging.getLogger("streamtopics.python").error(
        "uncaught exception in a thread", extra={"thread_name": a.thread.name if a.thread is not None else None},
        exc_info=(a.exc_type, a.exc_value, a.exc_traceback))
