"""The shipped snapshot cadence is by time: a snapshot is the whole model, so a batch-count trigger
wrote one every few seconds at high throughput (operator audit: K = 100, a full 200k vocabulary,
`every_batches = 50`: 164 MB every ~12 s at 1,000 docs/s, ~1 TB a day)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from streamtopics.config import load_config
from streamtopics.service.checkpointer import Checkpointer
from streamtopics.service.telemetry import Telemetry

SHIPPED = Path(__file__).resolve().parents[1] / "config" / "streamtopics.toml"


def _checkpointer(tmp_path, **snapshot):
    cfg = load_config(SHIPPED)
    snap = dataclasses.replace(cfg.snapshot, dir=str(tmp_path), **snapshot)
    return Checkpointer(snap, "test", Telemetry(), point=lambda _n: None)


def test_shipped_cadence_writes_by_time_not_by_batch_count(tmp_path):
    cp = _checkpointer(tmp_path)
    assert cp.due() is None  # nothing learned yet
    cp.dirty = True
    assert cp.due() == "early"  # the first learned batch is covered at once
    cp.last_snapshot = tmp_path / "first.stsnap"
    cp._last_mono = time.monotonic()
    cp.batches_since = 10_000  # a fast stream: ten thousand batches within the minute
    assert cp.due() is None
    cp._last_mono = time.monotonic() - cp.cfg.every_seconds - 1
    assert cp.due() == "regular"
    assert cp.due(force=True) == "regular"  # shutdown


def test_a_batch_count_trigger_still_works_when_set(tmp_path):
    cp = _checkpointer(tmp_path, every_batches=5)
    cp.dirty, cp.last_snapshot, cp._last_mono = True, tmp_path / "first.stsnap", time.monotonic()
    cp.batches_since = 4
    assert cp.due() is None
    cp.batches_since = 5
    assert cp.due() == "regular"
