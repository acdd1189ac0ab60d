"""Metrics registry and the HTTP endpoints, scraped over real loopback HTTP."""

from __future__ import annotations

import errno
import json
import math
import threading
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamtopics.metrics import (
    METRIC_NAMES,
    PROPOSALS,
    SNAPSHOT_FAILURE_REASONS,
    STAGES,
    Metrics,
    MetricsServer,
    snapshot_failure_reason,
)


def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as err:  # 4xx/5xx still carry a body
        with err:
            return err.code, dict(err.headers), err.read()


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def server():
    state = {"health": (True, {"pid": 1}), "ready": (False, {"reason": "warming up"})}
    m = Metrics(dead_letter_reasons=["bad_msgpack", "missing_text"])
    srv = MetricsServer(m, port=0, health=lambda: state["health"], ready=lambda: state["ready"])
    try:
        yield srv, m, state
    finally:
        srv.stop()


def test_metrics_endpoint_serves_values(server):
    srv, m, state = server
    assert srv.port > 0
    m.observe_batch(documents=7, tokens=250)
    m.observe_stage("predict", 0.004)
    m.observe_stage("total", 0.02)
    m.set_lag(0, 12)
    m.set_lag(1, 3)
    m.set_mh_acceptance("word", 0.6)
    m.dead_letter("bad_msgpack", 2)
    m.snapshot_failed(OSError(errno.ENOSPC, "no space"))
    m.vocabulary_size.set(1234)
    state["ready"] = (True, {})  # the gauge reads /readyz's callback
    m.set_build_info("0.1.0", "alias", "stochastic")
    latency = m.observe_end_to_end(message_timestamp_ms=1_000_000, now=1_000.25)
    assert latency == pytest.approx(0.25)

    status, headers, body = _get(f"{srv.url}/metrics")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain; version=0.0.4")
    s = _samples(body.decode())
    assert s[("streamtopics_documents_total", ())] == 7
    assert s[("streamtopics_tokens_total", ())] == 250
    assert s[("streamtopics_batches_total", ())] == 1
    assert s[("streamtopics_batch_duration_seconds_count", (("stage", "predict"),))] == 1
    assert s[("streamtopics_batch_duration_seconds_sum", (("stage", "total"),))] == 0.02
    for stage in STAGES:  # pre-created at zero so rate() works from the start
        assert ("streamtopics_batch_duration_seconds_count", (("stage", stage),)) in s
    assert s[("streamtopics_consumer_lag_messages", (("partition", "0"),))] == 12
    assert s[("streamtopics_consumer_lag_messages", (("partition", "1"),))] == 3
    assert s[("streamtopics_mh_acceptance_ratio", (("proposal", "word"),))] == 0.6
    assert math.isnan(s[("streamtopics_mh_acceptance_ratio", (("proposal", "doc"),))])
    assert s[("streamtopics_dead_letters_total", (("reason", "bad_msgpack"),))] == 2
    assert s[("streamtopics_dead_letters_total", (("reason", "missing_text"),))] == 0
    assert s[("streamtopics_snapshot_failures_total", (("reason", "disk_full"),))] == 1
    assert s[("streamtopics_vocabulary_size", ())] == 1234
    assert s[("streamtopics_ready", ())] == 1
    assert s[("streamtopics_end_to_end_latency_seconds_count", ())] == 1
    assert s[("streamtopics_build_info",
              (("engine", "alias"), ("update", "stochastic"), ("version", "0.1.0")))] == 1

    m.forget_partition(1)  # revoked partitions must not freeze at their last lag
    s = _samples(_get(f"{srv.url}/metrics")[2].decode())
    assert ("streamtopics_consumer_lag_messages", (("partition", "1"),)) not in s


def test_every_declared_metric_is_exposed():
    m = Metrics()
    families = {fam.name: fam.type for fam in m.registry.collect()}
    exposed = set()
    for name, kind in families.items():
        exposed.add(f"{name}_total" if kind == "counter" else
                    f"{name}_info" if kind == "info" else name)
    assert exposed == set(METRIC_NAMES)
    for name, kind in METRIC_NAMES.items():
        assert name.startswith("streamtopics_")
        assert name.endswith("_total") == (kind == "counter"), name


def test_the_module_table_lists_every_metric_with_its_type():
    """The README sends operators to metrics.py's table; it had left out the replication metrics
    and messages_dropped (docs audit)."""
    import re

    import streamtopics.metrics as module

    table = dict(re.findall(r"^(streamtopics_\w+)\s+(counter|gauge|histogram|info)\b", module.__doc__, re.M))
    assert table == dict(METRIC_NAMES)


def test_snapshot_age_is_computed_at_scrape_time():
    m = Metrics()
    m.snapshot_succeeded(duration_s=0.5, at=1000.0)
    s = _samples(m.exposition().decode())
    assert s[("streamtopics_snapshot_age_seconds", ())] > 1e9  # "now" minus t=1000
    assert s[("streamtopics_snapshots_total", ())] == 1
    assert s[("streamtopics_snapshot_duration_seconds_count", ())] == 1
    m.snapshot_succeeded(duration_s=0.1)
    age = _samples(m.exposition().decode())[("streamtopics_snapshot_age_seconds", ())]
    assert 0 <= age < 5


def test_registries_are_independent():
    a, b = Metrics(), Metrics()
    a.documents.inc(5)
    assert _samples(b.exposition().decode())[("streamtopics_documents_total", ())] == 0


def test_validation_and_failure_classification():
    m = Metrics()
    with pytest.raises(ValueError):
        m.observe_stage("sleep", 1.0)
    with pytest.raises(ValueError):
        m.set_mh_acceptance("gibbs", 0.5)
    assert snapshot_failure_reason(OSError(errno.ENOSPC, "x")) == "disk_full"
    assert snapshot_failure_reason(PermissionError(errno.EACCES, "x")) == "permission"
    assert snapshot_failure_reason(OSError(errno.EROFS, "x")) == "permission"
    assert snapshot_failure_reason(OSError(errno.EIO, "x")) == "io_error"
    assert snapshot_failure_reason(ValueError("x")) == "other"
    assert m.snapshot_failed("weird") == "other"  # unknown codes cannot grow the label set
    assert set(SNAPSHOT_FAILURE_REASONS) == {"disk_full", "permission", "io_error", "other"}
    assert set(PROPOSALS) == {"word", "doc", "exp"}


def test_health_and_ready_follow_callbacks(server):
    srv, _, state = server
    status, headers, body = _get(f"{srv.url}/healthz")
    assert status == 200 and headers["Content-Type"] == "application/json"
    assert json.loads(body) == {"status": "ok", "pid": 1}

    status, _, body = _get(f"{srv.url}/readyz")
    assert status == 503
    assert json.loads(body) == {"status": "fail", "reason": "warming up"}

    state["ready"] = (True, {})
    state["health"] = (False, {"broker": "down"})
    assert _get(f"{srv.url}/readyz")[0] == 200
    status, _, body = _get(f"{srv.url}/healthz")
    assert status == 503 and json.loads(body)["broker"] == "down"


def test_raising_callback_is_503_and_unknown_path_404():
    def boom():
        raise RuntimeError("check exploded")

    with MetricsServer(Metrics(), health=boom) as srv:
        status, _, body = _get(f"{srv.url}/healthz")
        assert status == 503 and "check exploded" in json.loads(body)["error"]
        # Default ready follows Metrics.set_ready.
        assert _get(f"{srv.url}/readyz")[0] == 503
        srv.metrics.set_ready(True)
        assert _get(f"{srv.url}/readyz")[0] == 200
        assert _get(f"{srv.url}/nope")[0] == 404
        assert _get(f"{srv.url}/metrics?x=1")[0] == 200


def test_ready_gauge_reads_the_readyz_callback_at_scrape():
    """The gauge and /readyz answer from one callback: a gauge set by the loop read 1 while /readyz
    said 503 when the loop was busy in a recovery (operator audit, 2026-11-28)."""
    state = {"ok": True}

    def ready():
        if state.get("raise"):
            raise RuntimeError("probe failed")
        return state["ok"], {}

    m = Metrics()
    m.set_ready(True)  # what the loop last set; the callback must win over it
    with MetricsServer(m, ready=ready) as srv:
        def gauge():
            text = _get(f"{srv.url}/metrics")[2].decode()
            return [ln for ln in text.splitlines() if ln.startswith("streamtopics_ready ")]
        assert gauge() == ["streamtopics_ready 1.0"] and _get(f"{srv.url}/readyz")[0] == 200
        state["ok"] = False
        assert gauge() == ["streamtopics_ready 0.0"] and _get(f"{srv.url}/readyz")[0] == 503
        state["raise"] = True
        assert gauge() == ["streamtopics_ready 0.0"] and _get(f"{srv.url}/readyz")[0] == 503


def test_concurrent_scrapes_and_stop():
    m = Metrics()
    srv = MetricsServer(m)
    codes: list[int] = []
    lock = threading.Lock()

    def scrape():
        for _ in range(10):
            code = _get(f"{srv.url}/metrics")[0]
            with lock:
                codes.append(code)

    threads = [threading.Thread(target=scrape) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert codes == [200] * 40
    srv.stop()
    srv.stop()  # idempotent
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{srv.url}/metrics", timeout=2)


def test_requests_are_not_logged_to_stderr(server, capfd):
    srv, _, _ = server
    _get(f"{srv.url}/metrics")
    _get(f"{srv.url}/nope")
    assert capfd.readouterr().err == ""


def test_a_metrics_port_in_use_names_the_address_and_the_setting():
    """The daemon died with a bare "[Errno 98] Address already in use", naming neither the
    address nor the key to change."""
    import socket

    import pytest

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(OSError, match=rf"metrics endpoint 127\.0\.0\.1:{port}: .*\[metrics\] host and port") as e:
            MetricsServer(Metrics(), "127.0.0.1", port)
        assert e.value.errno is not None


def test_head_requests_get_the_status_and_headers_without_a_body(server):
    """Health checkers that send HEAD got 501 'Unsupported method' from every endpoint."""
    srv, _, state = server
    for path, want in (("/healthz", 200), ("/readyz", 503), ("/metrics", 200), ("/nope", 404)):
        req = urllib.request.Request(f"{srv.url}{path}", method="HEAD")
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                status, length, body = r.status, int(r.headers["Content-Length"]), r.read()
        except urllib.error.HTTPError as err:
            with err:
                status, length, body = err.code, int(err.headers["Content-Length"]), err.read()
        assert (status, body) == (want, b"") and length > 0, path
    assert _get(f"{srv.url}/healthz")[2]  # GET still has its body
