"""Crash anywhere: SIGKILL the daemon subprocess at named points of its cycle, restart, compare.

The daemon runs as ``python -m streamtopics.cli run`` against the real bundled broker
(tansu, loopback). ``STREAMTOPICS_FAULT=point:n[:action]`` (``streamtopics.testing.faults``)
SIGKILLs the process the n-th time it reaches ``point``. One test = one chain of runs over
the same topics and snapshot directory: each run dies at its point, the next one resumes
from the newest valid snapshot. A last clean run finishes the input; then

* every document has at least one prediction (0 unpredicted), and
* the final model equals the one of an uninterrupted run on the same input (document
  counter, vocabulary, topic-word statistics to 1e-9): 0 documents learned twice or lost.

The default suite runs a few points; the full sweep (``@pytest.mark.slow``) runs every point.
"""
from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import msgpack
import numpy as np
import pytest

from streamtopics.config import Config
from streamtopics.daemon import SnapshotStore
from streamtopics.testing.faults import ENV, POINTS

from test_daemon import (  # noqa: E402 - the daemon tests' helpers (tests/ is on sys.path)
    BATCH,
    _cfg_dict,
    _docs,
    _model_arrays,
    _prediction_ids,
    _Proc,
    _produce,
    _running,
    _topics,
    _wait,
    _write_toml,
    _consumed,
)

# Every point with the arrival that fires and the action. Points reached only while stopping
# get a SIGTERM first. ``mid``: the kill lands while the thread goes on (inside the kernels).
FULL_SWEEP = [
    "startup:1", "model_loaded:1", "connected:1", "assigned:1", "poll:3", "decode:7", "batch_received:2",
    "tokenized:2", "prepared:3", "learn:2", "learn:3:mid", "learned:2", "offsets_advanced:3",
    "submitted:2", "publish_build:3", "publish_sent:2", "publish_acked:3", "collected:2", "committed:1",
    "snapshot_begin:1", "snapshot_write:1", "snapshot_mid_write:1", "snapshot_before_rename:1",
    "snapshot_after_rename:1", "snapshot_written:1", "snapshot_pruned:2", "housekeeping:4",
    "shutdown:1", "shutdown_commit:1",
]
FAST_SWEEP = ["learn:3:mid", "publish_acked:2", "snapshot_mid_write:1", "snapshot_after_rename:1"]
STOPPING_POINTS = {"shutdown", "shutdown_commit"}
CHUNK = 4 * BATCH  # documents produced whenever the unlearned backlog runs low
N_MAX = 3000


def _newest_offset(snaps: Path, topic: str) -> int:
    found = SnapshotStore(snaps, 100).load_newest()
    return 0 if found is None else int(found[0].snapshot_info["offsets"].get(f"{topic}:0", 0))


def _crash_chain(broker, fresh_topic, tmp_path, monkeypatch, sweep: list[str]) -> dict:
    topics = _topics(fresh_topic)
    snaps = tmp_path / "snaps"
    cfg = _cfg_dict(broker.bootstrap, topics, snaps, batch={"max_wait_ms": 3000},
                    snapshot={"every_batches": 2, "every_seconds": 0, "keep": 4})
    cfg_path = _write_toml(tmp_path / "daemon.toml", cfg)
    corpus = [msgpack.packb(x) for x in _docs(N_MAX)]
    produced = 0
    outcomes: dict[str, str] = {}
    t_start = time.monotonic()
    for i, spec in enumerate(sweep):
        # Keep >= 4 batches beyond the newest snapshot so every point has work to reach.
        while produced - _newest_offset(snaps, topics["input"]) < 4 * BATCH:
            assert produced + CHUNK <= N_MAX, "sweep needs more documents"
            _produce(broker.bootstrap, topics["input"], corpus[produced:produced + CHUNK])
            produced += CHUNK
        point = spec.split(":")[0]
        monkeypatch.setenv(ENV, spec)
        proc = _Proc(cfg_path, tmp_path / f"run{i:02d}-{point}.log")
        monkeypatch.delenv(ENV)
        if point in STOPPING_POINTS:
            proc.wait_ready()
            time.sleep(0.5)
            proc.p.send_signal(signal.SIGTERM)
        try:
            rc = proc.p.wait(timeout=40)
        except Exception:  # noqa: BLE001 - point not reached in time
            rc = proc.finish(signal.SIGTERM)
        else:
            proc.fh.close()
        fired = f"fault: {point}:" in proc.log_path.read_text(errors="replace")
        outcomes[spec] = "killed" if (rc == -signal.SIGKILL and fired) else f"not reached (rc={rc})"
    # A clean run finishes the input.
    final_proc = _Proc(cfg_path, tmp_path / "final.log")
    final_proc.wait_ready()
    want = {msgpack.unpackb(v)["id"] for v in corpus[:produced]}
    _wait(lambda: want <= set(_prediction_ids(broker.bootstrap, topics["output"])), 90,
          "every document predicted", interval=0.5)
    assert final_proc.finish(signal.SIGTERM) == 0
    stopped = next(e for e in reversed(final_proc.logs()) if e.get("msg") == "streamtopics daemon stopped")
    final = _model_arrays(stopped["last_snapshot"])
    preds = Counter(_prediction_ids(broker.bootstrap, topics["output"]))

    # The uninterrupted reference (in-process, own group and directory) on the same input.
    ref_cfg = _cfg_dict(broker.bootstrap, topics, tmp_path / "ref", batch={"max_wait_ms": 3000})
    ref_cfg["topics"]["output"] = fresh_topic(prefix="ref-out")
    with _running(Config.from_dict(ref_cfg, env={})) as ref:
        _wait(lambda: _consumed(ref, topics["input"], produced), 90, "reference run")
    clean = _model_arrays(ref.last_snapshot)
    return {"outcomes": outcomes, "final": final, "clean": clean, "produced": produced, "preds": preds,
            "want": want, "seconds": time.monotonic() - t_start}


def _check(res: dict, min_killed: int) -> None:
    outcomes = res["outcomes"]
    killed = sorted(s for s, o in outcomes.items() if o == "killed")
    print(f"\ncrash sweep: {len(killed)} of {len(outcomes)} kill points exercised, "
          f"{res['produced']} documents, {res['seconds']:.1f} s")
    for spec, o in outcomes.items():
        print(f"  {spec:28s} {o}")
    assert len(killed) >= min_killed, outcomes
    final, clean, preds = res["final"], res["clean"], res["preds"]
    unpredicted = res["want"] - set(preds)
    print(f"  unpredicted: {len(unpredicted)}; predicted more than once: "
          f"{sum(1 for n in preds.values() if n > 1)}; docs_seen {final[1]} vs reference {clean[1]}; "
          f"max |dlam| {float(np.abs(final[2] - clean[2]).max()):.2e}")
    assert not unpredicted
    assert final[1] == clean[1] == res["produced"]  # learned exactly once, each
    assert final[0].version == clean[0].version
    assert final[4] == clean[4]  # vocabulary, word for word
    np.testing.assert_allclose(final[2], clean[2], rtol=0, atol=1e-9)
    np.testing.assert_allclose(final[3], clean[3], rtol=0, atol=1e-9)


def test_every_sweep_point_is_a_known_fault_point():
    for spec in FULL_SWEEP + FAST_SWEEP:
        assert spec.split(":")[0] in POINTS, spec
    assert len({s.split(":")[0] for s in FULL_SWEEP}) >= 20


def test_crash_at_a_few_points_then_restart_learns_exactly_once(broker, fresh_topic, tmp_path, monkeypatch):
    _check(_crash_chain(broker, fresh_topic, tmp_path, monkeypatch, FAST_SWEEP), min_killed=len(FAST_SWEEP))


@pytest.mark.slow
def test_crash_anywhere_full_sweep(broker, fresh_topic, tmp_path, monkeypatch):
    _check(_crash_chain(broker, fresh_topic, tmp_path, monkeypatch, FULL_SWEEP), min_killed=20)


def test_a_corrupt_newest_snapshot_does_not_push_the_good_ones_out_of_the_rotation(tmp_path):
    """After a restart fell back past a corrupt newest snapshot, pruning counted that file among
    the ``keep`` newest and deleted good ones: with keep = 1 the snapshot just written, the one
    the group's offsets were then committed up to."""
    from streamtopics import TopicModel
    from streamtopics.service.checkpoint import snapshot_name

    snaps = tmp_path / "snaps"
    snaps.mkdir()
    model = TopicModel(n_topics=3, seed=0)
    model.partial_fit(["grain wheat corn harvest", "oil crude barrel prices"] * 4)
    store = SnapshotStore(snaps, keep=1)
    good, _ = store.write(model, {"docs:0": 8}, {})
    (snaps / snapshot_name(model.version + 50)).write_bytes(b"STSNAP but torn")   # newest, corrupt
    loaded, path = store.load_newest()
    assert path == good
    model.partial_fit(["corn harvest grain"])
    written, _ = store.write(model, {"docs:0": 9}, {})
    store.prune()
    names = sorted(p.name for p in snaps.iterdir())
    assert written.name in names and good.name not in names          # the rotation keeps the newest good one
    assert len(names) == 2 and SnapshotStore(snaps, keep=1).load_newest()[1] == written
