"""Issue 17's acceptance run: 3 replica processes, 4 input partitions, >= 20,000 documents, one
replica SIGKILLed mid-stream and a new one started later (slow: ~3-5 minutes).

Shows: every document predicted at least once; learned exactly once (documents summed over
the applied updates = distinct documents); every live replica at the same update offset holds
a bit-identical model (sha256 of topics, vocabulary, counts, alpha, counters); held-out score
within 1 % of a single replica over the same stream.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
import time
import tomllib
import uuid
from pathlib import Path

import msgpack
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_daemon import ROOT, _Proc, _wait, _write_toml  # noqa: E402

from streamtopics import load_snapshot  # noqa: E402
from streamtopics.corpora import load_20newsgroups, load_reuters_r8  # noqa: E402
from streamtopics.service.replication import digest  # noqa: E402

PARTITIONS = 4
READY_S = 300
# When the replica is killed, as the share of the stream predicted by then (a third by default);
# other fault timings: STREAMTOPICS_TEST_KILL_AT=0.02 (early: topics barely seeded), 0.9 (near the end).
KILL_AT = float(os.environ.get("STREAMTOPICS_TEST_KILL_AT", "0.3333"))
_STARTED: list = []


@pytest.fixture(autouse=True)
def _reap():
    """Replica processes a failed test leaves behind (a frozen one too) are killed."""
    yield
    while _STARTED:
        p = _STARTED.pop().p
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait(10)


def _starter(bootstrap: str, topics: dict, updates: str, tmp_path: Path):
    """start(rid): a replica process of one group and update log, with the shipped config."""
    group = f"g-{uuid.uuid4().hex[:8]}"

    def start(rid: str) -> _Proc:
        cfg = _write_toml(tmp_path / f"{rid}.toml",
                          _config(bootstrap, topics, updates, group, tmp_path / f"snaps-{rid}", rid))
        return _proc(cfg, tmp_path / f"{rid}.log")

    start.group = group
    return start


def _proc(config: Path, log: Path) -> _Proc:
    proc = _Proc(config, log)
    _STARTED.append(proc)
    return proc


def _corpus() -> tuple[list[dict], list[str]]:
    """20NG (train + test) and R8 train, shuffled into one stream; 500 of them held out."""
    docs = [("n", d) for d in load_20newsgroups("train") + load_20newsgroups("test")]
    docs += [("r", d) for d in load_reuters_r8("train")]
    values = [{"id": f"{tag}{i}", "text": d.text} for i, (tag, d) in enumerate(docs)]
    random.Random(17).shuffle(values)
    return values[500:], [v["text"] for v in values[:500]]


def _config(bootstrap: str, topics: dict, updates: str, group: str, snaps: Path, rid: str) -> dict:
    with open(ROOT / "config" / "streamtopics.toml", "rb") as f:
        d = tomllib.load(f)
    d["kafka"].update(bootstrap_servers=bootstrap, group_id=group, session_timeout_ms=6000,
                      heartbeat_interval_ms=1000, create_topics=False)
    d["topics"].update(topics)
    d["snapshot"]["dir"] = str(snaps)
    d["metrics"]["port"] = 0
    d["replication"].update(enabled=True, updates_topic=updates, replica_id=rid)
    return d


def _log_end(bootstrap: str, topic: str) -> int:
    """The update log's end offset (its one partition)."""
    c = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        return int(c.end_offsets([TopicPartition(topic, 0)])[TopicPartition(topic, 0)])
    finally:
        c.close()


def _final(proc: _Proc) -> tuple:
    """(update offset, digest, docs_seen, model) of the replica's final snapshot."""
    stopped = next(e for e in reversed(proc.logs()) if e.get("msg") == "streamtopics daemon stopped")
    m = load_snapshot(stopped["last_snapshot"])
    return int(m.snapshot_info["extra"]["daemon"]["update_offset"]), digest(m), int(m.state.docs_seen), m


def _stream(bootstrap: str, topic: str, values: list[dict], rate: float | None = None,
            partitions: int = PARTITIONS) -> threading.Thread:
    """Produce ``values`` round-robin over ``partitions``, at ``rate`` documents/s (None: at once)."""
    def run():
        p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, enable_idempotence=False)
        chunk = 500
        for j in range(0, len(values), chunk):
            t0 = time.monotonic()
            for i in range(j, min(j + chunk, len(values))):
                p.send(topic, msgpack.packb(values[i]), partition=i % partitions)
            p.flush(timeout=120)
            if rate:
                time.sleep(max(0.0, chunk / rate - (time.monotonic() - t0)))
        p.close(timeout=10)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


class _Ids:
    """Ids seen on a topic (all partitions), read incrementally."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                               auto_offset_reset="earliest", fetch_max_wait_ms=100)
        parts = self.c.partitions_for_topic(topic) or {0}
        self.c.assign([TopicPartition(topic, p) for p in sorted(parts)])
        self.c.seek_to_beginning()
        self.ids: set = set()
        self.n = 0

    def poll(self) -> set:
        for recs in self.c.poll(timeout_ms=500, max_records=20000).values():
            for r in recs:
                m = msgpack.unpackb(r.value)
                if "reason" in m:  # a dead letter: the document's id is in its raw record
                    m = msgpack.unpackb(m["raw"])
                self.ids.add(m["id"])
                self.n += 1
        return self.ids

    def close(self) -> None:
        self.c.close()


def _all_predicted(bootstrap: str, dead_letter: str, values: list[dict], preds: _Ids, timeout_s: float) -> tuple:
    """Wait until every document is predicted or dead-lettered; returns (dead ids, predicted-to-be
    ids). Dead letters are read while waiting: the replicas may still be behind the producer (a
    cold numba cache), and a dead letter written after a single read was never seen (a helper's
    rolling-restart drill hit it: the test then waited its whole timeout)."""
    dl = _Ids(bootstrap, dead_letter)
    ids = {v["id"] for v in values}
    try:
        _wait(lambda: ids - dl.poll() <= preds.poll(), timeout_s, "every document predicted", interval=1.0)
    finally:
        dl.close()
    return set(dl.ids), ids - dl.ids


@pytest.mark.slow
def test_three_replicas_one_killed_learn_one_model_exactly_once(broker, fresh_topic, tmp_path):
    values, heldout = _corpus()
    n = len(values)
    assert n >= 20000
    topics = {"input": fresh_topic(partitions=PARTITIONS, prefix="in"),
              "output": fresh_topic(partitions=PARTITIONS, prefix="out"), "dead_letter": fresh_topic(prefix="dlq")}
    upd = fresh_topic(prefix="upd")
    start = _starter(broker.bootstrap, topics, upd, tmp_path)
    procs = {rid: start(rid) for rid in ("a", "b", "c")}
    for p in procs.values():
        p.wait_ready(READY_S)
    t0 = time.monotonic()
    pacer = _stream(broker.bootstrap, topics["input"], values, rate=600.0)  # about 40 s of stream
    preds = _Ids(broker.bootstrap, topics["output"])
    _wait(lambda: len(preds.poll()) >= int(n * KILL_AT), READY_S, f"{KILL_AT:.0%} of the stream predicted",
          interval=0.5)
    assert procs["c"].finish(signal.SIGKILL) == -signal.SIGKILL  # mid-stream
    killed_at, at_kill = time.monotonic() - t0, len(preds.ids)
    time.sleep(5)
    procs["d"] = start("d")  # joins later, replays the log
    procs["d"].wait_ready(READY_S)
    pacer.join(300)
    dead, want = _all_predicted(broker.bootstrap, topics["dead_letter"], values, preds, 900)  # e.g. no token left
    preds.close()
    time.sleep(5)  # the last records reach every replica's log reader
    end = _log_end(broker.bootstrap, upd)
    finals = {}
    for rid in ("a", "b", "d"):
        assert procs[rid].finish(signal.SIGTERM) == 0
        finals[rid] = _final(procs[rid])
    offsets = {f[0] for f in finals.values()}
    digests = {f[1] for f in finals.values()}
    seen = {f[2] for f in finals.values()}
    print("\nreplicas: " + json.dumps({rid: {"update_offset": f[0], "docs_seen": f[2], "digest": f[1][:16]}
                                       for rid, f in finals.items()})
          + f"; killed c at {killed_at:.1f} s with {at_kill:,} of {n:,} documents predicted; "
            f"{len(dead)} dead letters; {preds.n:,} predictions for {len(want):,} documents")
    # all at least at the log's end as it stood once the stream was learned (stopping one by one,
    # the later replicas also apply the claims the rebalances of the earlier stops write)
    assert min(offsets) >= end, (offsets, end)
    assert len(digests) == 1, digests      # bit-identical models
    assert seen == {len(want)}, seen       # learned exactly once: documents summed over applied updates

    # one replica alone over the same stream
    topics1 = {"input": fresh_topic(partitions=PARTITIONS, prefix="in1"),
               "output": fresh_topic(partitions=PARTITIONS, prefix="out1"), "dead_letter": fresh_topic(prefix="dlq1")}
    upd1 = fresh_topic(prefix="upd1")
    one = _proc(_write_toml(tmp_path / "one.toml", _config(broker.bootstrap, topics1, upd1, f"g1-{start.group}",
                                                           tmp_path / "snaps-one", "one")), tmp_path / "one.log")
    one.wait_ready(READY_S)
    _stream(broker.bootstrap, topics1["input"], values, rate=600.0).join(300)  # paced as above
    preds1 = _Ids(broker.bootstrap, topics1["output"])
    _wait(lambda: want <= preds1.poll(), 900, "single replica: every document predicted", interval=1.0)
    preds1.close()
    time.sleep(3)
    assert one.finish(signal.SIGTERM) == 0
    single = _final(one)
    assert single[2] == len(want)
    h_rep = finals["a"][3].heldout_loglik(heldout)
    h_one = single[3].heldout_loglik(heldout)
    print(f"held-out (500 documents of the same mix): 3 replicas {h_rep:.4f}, one replica {h_one:.4f}, "
          f"ratio {h_rep / h_one:.4f}")
    # Replication must cost no more than 1 % of held-out score. In three runs the replicas scored
    # better, by 0.7-1.2 % (-8.5376 vs -8.5945, -8.4961 vs -8.5942, -8.5045 vs -8.6040): which
    # documents seed the topics and how the batches are cut differ between the runs (a replica's
    # first batch comes from its own partitions). Better is not a failure of replication, so the
    # check is one-sided. Since a first poll of a few documents no longer seeds all K topics from
    # copies of them (seeding.py), the one-replica reference moves by 0.4 % between runs instead
    # of 1.6 %: ratios 0.9943, 0.9980, 0.9959, 0.9892 in four runs (docs/scale-out.md).
    assert h_rep >= h_one - 0.01 * abs(h_one)


@pytest.mark.slow
def test_a_paused_replica_comes_back_as_a_zombie_and_is_fenced(broker, fresh_topic, tmp_path):
    """Replica a is frozen (SIGSTOP) past its session timeout mid-stream: b takes its partitions
    and claims them in the update log. When a runs again (SIGCONT) it finishes and publishes the
    batches it was in: every replica skips those records (computed under a's old claim), b has
    learned those offsets itself, and at the end both hold one model that learned every document
    exactly once."""
    values, _ = _corpus()
    values = values[:6000]
    n = len(values)
    topics = {"input": fresh_topic(partitions=2, prefix="in"), "output": fresh_topic(partitions=2, prefix="out"),
              "dead_letter": fresh_topic(prefix="dlq")}
    start = _starter(broker.bootstrap, topics, fresh_topic(prefix="upd"), tmp_path)
    procs = {rid: start(rid) for rid in ("a", "b")}
    for p in procs.values():
        p.wait_ready(READY_S)
    pacer = _stream(broker.bootstrap, topics["input"], values, rate=300.0, partitions=2)  # about 20 s of stream
    preds = _Ids(broker.bootstrap, topics["output"])
    _wait(lambda: len(preds.poll()) >= n // 4, READY_S, "a quarter of the stream predicted", interval=0.2)
    procs["a"].p.send_signal(signal.SIGSTOP)  # frozen mid-batch: no heartbeat, no poll
    time.sleep(12)  # past the 6 s session timeout: b owns both partitions and has claimed them
    procs["a"].p.send_signal(signal.SIGCONT)
    pacer.join(300)
    dead, want = _all_predicted(broker.bootstrap, topics["dead_letter"], values, preds, 600)
    preds.close()
    time.sleep(5)
    finals = {}
    for rid in ("a", "b"):
        assert procs[rid].finish(signal.SIGTERM) == 0
        finals[rid] = _final(procs[rid])
    fenced = {rid: sum("older claim" in str(e.get("msg")) for e in procs[rid].logs()) for rid in ("a", "b")}
    claims = sum(e.get("msg") == "claimed an input partition in the update log" for e in procs["b"].logs())
    print(f"\nzombie: fenced records seen by a {fenced['a']}, by b {fenced['b']}; b's claims {claims}; "
          + json.dumps({rid: {"update_offset": f[0], "docs_seen": f[2], "digest": f[1][:16]}
                        for rid, f in finals.items()}))
    assert claims >= 2  # b claimed a's partition after the session timed out
    assert len({f[0] for f in finals.values()}) == 1 and len({f[1] for f in finals.values()}) == 1
    assert {f[2] for f in finals.values()} == {len(want)}  # learned exactly once, nothing lost
    assert fenced["a"] == fenced["b"]  # whatever was fenced, both decided alike
