"""The offset ledger, the snapshot-directory lock, lineages and the commit gate: no Kafka."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamtopics.service.checkpoint import (
    LOCK_NAME,
    CommitGate,
    DirectoryLock,
    Lineage,
    LockHeld,
    parse_snapshot_name,
    snapshot_name,
)
from streamtopics.service.ledger import OffsetLedger, fingerprint

ROOT = Path(__file__).resolve().parents[1]


def _prints(offsets, tag=b"a", ts=1):
    return [fingerprint(tag + str(o).encode(), ts) for o in offsets]


def test_learned_offsets_are_never_admitted_again_whatever_the_broker_returns():
    led = OffsetLedger()
    k = "docs:0"
    assert led.admit(k, [0, 1, 2], _prints([0, 1, 2])).keep == [True] * 3
    led.learned(k, 0, 3, _prints([0])[0])
    led.learned(k, 3, 6, _prints([3])[0])
    assert led.position(k) == 6 and led.ranges(k) == [(0, 6)]
    # The same log served again from its beginning (a reset of the same log): skipped.
    adm = led.admit(k, [0, 1, 2, 3, 4, 5, 6], _prints(range(7)))
    assert adm.keep == [False] * 6 + [True] and adm.skipped == {"already_learned": 6} and not adm.new_epoch
    # Duplicate and non-monotonic offsets inside one batch.
    adm = led.admit(k, [6, 7, 7, 5, 8], _prints([6, 7, 7, 5, 8]))
    assert adm.keep == [True, True, False, False, True]
    assert adm.skipped == {"non_monotonic": 1, "already_learned": 1}


def test_a_new_log_at_the_same_offsets_starts_a_new_epoch():
    led = OffsetLedger()
    k = "docs:0"
    led.learned(k, 0, 50, _prints([0])[0], topic_id="t1")
    # Other contents at offset 0 (a broker that lost its data, the producer wrote anew).
    adm = led.admit(k, [0, 1, 2], _prints([0, 1, 2], tag=b"b", ts=2))
    assert adm.new_epoch and adm.keep == [True] * 3 and led.epoch(k) == 1 and led.position(k) is None
    led.learned(k, 0, 3, _prints([0], tag=b"b", ts=2)[0])
    assert led.position(k) == 3 and led.learned_count(k) == 53
    # No stored head among the records: only another topic id proves a new log.
    led2 = OffsetLedger()
    led2.learned(k, 0, 50, _prints([0])[0], topic_id="t1")
    assert led2.admit(k, [10, 11], _prints([10, 11]), topic_id="t1").skipped == {"already_learned": 2}
    assert led2.admit(k, [10, 11], _prints([10, 11]), topic_id=None).skipped == {"already_learned": 2}
    adm = led2.admit(k, [10, 11], _prints([10, 11]), topic_id="t2")
    assert adm.new_epoch and adm.keep == [True, True]


def test_resets_beyond_the_limit_quarantine_the_partition():
    now = [0.0]
    led = OffsetLedger(max_resets=3, window_s=60, clock=lambda: now[0])
    k = "docs:0"
    for _ in range(3):
        assert not led.note_reset(k)
        now[0] += 1
    assert led.note_reset(k, "expected 10, found 0")  # the 4th within 60 s
    assert led.is_quarantined(k) and "4 log resets within 60 s" in led.quarantined()[k]
    assert not led.note_reset(k)  # reported once
    led.release(k)
    now[0] += 100
    assert not led.note_reset(k) and not led.is_quarantined(k)
    # Resets that each lead to a new log (broker restarts losing data) are not a loop.
    led3 = OffsetLedger(max_resets=2, window_s=600, clock=lambda: now[0])
    for i in range(10):
        assert not led3.note_reset(k)
        led3.new_epoch(k, f"t{i}")
    assert not led3.is_quarantined(k)
    # Spread out: never quarantined.
    led2 = OffsetLedger(max_resets=2, window_s=10, clock=lambda: now[0])
    for _ in range(10):
        now[0] += 20
        assert not led2.note_reset(k)


def test_ledger_round_trips_and_reads_old_snapshots():
    led = OffsetLedger()
    led.learned("a:0", 0, 10, 7, topic_id="x")
    led.learned("a:0", 20, 30, 8)
    led.new_epoch("a:1", "y")
    led.learned("a:1", 5, 9, 9)
    d = json.loads(json.dumps(led.to_dict()))  # msgpack-safe plain types
    back = OffsetLedger.from_dict(d)
    assert back.to_dict() == led.to_dict()
    assert back.positions() == {"a:0": 30, "a:1": 9} and back.epochs() == {"a:1": 1}
    old = OffsetLedger.from_offsets({"a:0": 100}, {"a:0": 2}, {"a": "tid"})
    assert old.position("a:0") == 100 and old.epoch("a:0") == 2 and old.topic_id("a:0") == "tid"
    assert old.admit("a:0", [99, 100], [1, 2]).keep == [False, True]


def test_the_record_before_the_position_is_remembered_saved_and_forgotten_with_its_epoch():
    led = OffsetLedger()
    k = "docs:0"
    assert led.tail(k, 10) is None
    led.learned(k, 0, 10, 1, tail_print=91)
    led.learned(k, 10, 20, 2, tail_print=92)
    assert led.tail(k, 20) == 92 and led.tail(k, 10) is None  # only the record before the position
    led.learned(k, 30, 40, 3)  # learned without its last record's fingerprint: unknown
    assert led.tail(k, 40) is None
    led.learned(k, 40, 50, 4, tail_print=94)
    led.learned(k, 20, 30, 5, tail_print=93)  # an older range filled in: the position's tail stays
    assert led.position(k) == 50 and led.tail(k, 50) == 94
    back = OffsetLedger.from_dict(json.loads(json.dumps(led.to_dict())))
    assert back.tail(k, 50) == 94 and back.to_dict() == led.to_dict()
    led.new_epoch(k, "t2")
    assert led.tail(k, 50) is None


def test_ranges_stay_bounded():
    led = OffsetLedger()
    for i in range(500):
        led.learned("a:0", 10 * i, 10 * i + 5)
    assert len(led.ranges("a:0")) <= 64 and led.position("a:0") == 4995


def test_snapshot_names_parse_back():
    name = snapshot_name(42, now=0)
    assert parse_snapshot_name(name) == 42 and parse_snapshot_name("model-1.stsnap") is None


def test_lineage_adopts_only_a_newer_snapshot_of_its_own_history():
    mine = Lineage("L", 5)
    assert mine.may_adopt(Lineage("L", 6), 100, 90)[0]
    assert not mine.may_adopt(Lineage("L", 4), 100, 90)[0]     # older (the failover bug: B's v8)
    assert not mine.may_adopt(Lineage("L", 6), 80, 90)[0]      # fewer documents
    assert not mine.may_adopt(Lineage("M", 60), 900, 90)[0]    # another writer's history
    assert not mine.may_adopt(None, 900, 90)[0]


def test_commit_gate_never_passes_the_durable_snapshot():
    g = CommitGate()
    assert g.pending(["a:0"]) == {}
    g.durable({"a:0": 100, "a:1": 7})
    assert g.pending(["a:0"]) == {"a:0": 100}
    g.committed({"a:0": 100})
    assert g.pending(["a:0", "a:1"]) == {"a:1": 7}
    g.forget()
    assert g.pending(["a:0"]) == {"a:0": 100}


def test_directory_lock_refuses_a_second_owner_and_is_released(tmp_path):
    a = DirectoryLock(tmp_path, "inst-a")
    a.acquire()
    owner = json.loads((tmp_path / LOCK_NAME).read_text())
    assert owner["instance"] == "inst-a" and owner["pid"] == os.getpid() and owner["host"]
    b = DirectoryLock(tmp_path, "inst-b")
    with pytest.raises(LockHeld) as ei:
        b.acquire()
    assert "inst-a" in str(ei.value) and "in use by another streamtopics daemon" in str(ei.value)
    a.heartbeat(force=True)
    a.release()
    b.acquire()
    assert json.loads((tmp_path / LOCK_NAME).read_text())["instance"] == "inst-b"
    b.release()


def test_lock_of_a_killed_owner_is_taken_over_at_once(tmp_path):
    code = ("import sys, os, signal; from streamtopics.service.checkpoint import DirectoryLock; "
            f"DirectoryLock({str(tmp_path)!r}, 'dead').acquire(); os.kill(os.getpid(), signal.SIGKILL)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert json.loads((tmp_path / LOCK_NAME).read_text())["instance"] == "dead"
    c = DirectoryLock(tmp_path, "next")
    c.acquire()  # same host, no fcntl lock held: the owner is gone
    c.release()


def test_lock_of_another_host_waits_for_the_stale_timeout(tmp_path):
    (tmp_path / LOCK_NAME).write_text(json.dumps({"host": "elsewhere", "pid": 1, "instance": "remote"}))
    with pytest.raises(LockHeld, match="heartbeat"):
        DirectoryLock(tmp_path, "me", stale_s=60).acquire()
    old = time.time() - 120
    os.utime(tmp_path / LOCK_NAME, (old, old))
    d = DirectoryLock(tmp_path, "me", stale_s=60)
    d.acquire()
    d.release()
