"""/healthz's verdict: a busy loop is alive (first batch compiling, big batches), a stuck one is not."""
from __future__ import annotations

import pytest

from streamtopics.service import liveness as lv
from streamtopics.service.liveness import BUSY_FACTOR, STARTUP_GRACE_S, Liveness


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(lv.time, "monotonic", lambda: now[0])
    return now


def test_startup_grace_covers_the_first_compile_then_the_base_limit_applies(clock):
    live = Liveness(10.0)
    clock[0] += 60.0  # numba compiling inside the first batch, or a large snapshot loading
    assert live.check(False)[0]
    clock[0] += STARTUP_GRACE_S
    alive, detail = live.check(False)
    assert not alive and detail["stale_after_s"] == STARTUP_GRACE_S and detail["batches"] == 0
    live.tick()
    live.batch_done(0.4)
    clock[0] += 9.0
    assert live.check(False)[0]
    clock[0] += 2.0  # 11 s without a beat after small batches: stuck
    alive, detail = live.check(False)
    assert not alive and detail["stale_after_s"] == 10.0


def test_big_batches_raise_the_limit_and_a_one_off_slow_batch_fades(clock):
    live = Liveness(10.0)
    live.batch_done(12.0)  # K=1000, 20,000 documents per batch
    live.tick()
    clock[0] += 40.0
    assert live.check(False)[0] and live.limit_s() == BUSY_FACTOR * 12.0
    clock[0] += 25.0
    assert not live.check(False)[0]
    for _ in range(1000):
        live.batch_done(0.3)
    assert live.limit_s() == 10.0


def test_a_finished_loop_is_not_alive(clock):
    live = Liveness(10.0)
    assert not live.check(True)[0]
