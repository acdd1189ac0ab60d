"""Two daemons in one consumer group share one model through the update log (issue 17).

Real broker on loopback; both replicas run in this process (threads). Before the update log,
each replica learned only its own partition and the two models had nothing in common (the
same document got the same top topic from both in 1.2 % of cases).
"""
from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

import msgpack
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_daemon import _cfg, _docs, _get, _read_all, _running, _wait  # noqa: E402

from streamtopics import load_snapshot  # noqa: E402
from streamtopics.daemon import Daemon  # noqa: E402
from streamtopics.service.replication import digest  # noqa: E402


def _topics(fresh_topic) -> dict:
    return {"input": fresh_topic(partitions=2, prefix="in"), "output": fresh_topic(partitions=2, prefix="out"),
            "dead_letter": fresh_topic(prefix="dlq")}


def _learned(d) -> int:
    return int(d.model.state.docs_seen) if d.model is not None else -1


def test_two_replicas_learn_one_model_exactly_once(broker, fresh_topic, tmp_path):
    topics = _topics(fresh_topic)
    updates = fresh_topic(prefix="upd")
    n = 1800
    docs = _docs(n)
    common = dict(kafka={"group_id": f"g-rep-{updates}"}, replication={"enabled": True, "updates_topic": updates,
                                                                       "max_staleness": 2})
    cfg_a = _cfg(broker.bootstrap, topics, tmp_path / "a", replication={**common["replication"], "replica_id": "a"},
                 kafka=common["kafka"])
    cfg_b = _cfg(broker.bootstrap, topics, tmp_path / "b", replication={**common["replication"], "replica_id": "b"},
                 kafka=common["kafka"])
    from kafka import KafkaProducer

    prod = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i, x in enumerate(docs):
        prod.send(topics["input"], msgpack.packb(x), partition=i % 2)
    prod.flush(timeout=30)
    prod.close(timeout=5)
    with _running(cfg_a) as a, _running(cfg_b) as b:
        _wait(lambda: len(a.book.assigned) + len(b.book.assigned) == 2 and a.book.assigned and b.book.assigned,
              60, "one partition each")
        # every document learned exactly once, by the model both replicas hold
        _wait(lambda: _learned(a) >= n and _learned(b) >= n, 120, "all documents learned")
        _wait(lambda: a.replica.offset == b.replica.offset == a.sync.end_offset(), 30, "both at the log's end")
        time.sleep(0.5)
        assert a.replica.offset == b.replica.offset
        # the gauge is the offset each model has applied up to (it was the offset at the replica's
        # own last publish, 0 on a replica that only applied: StreamtopicsReplicasDisagree misfired)
        _wait(lambda: all(d.metrics.registry.get_sample_value("streamtopics_update_log_offset") == a.replica.offset
                          for d in (a, b)), 10, "the applied offsets on /metrics")
        # and on /readyz, where model_version counts global updates, not the predictions' update offset
        assert all(json.loads(_get(d.metrics_url + "/readyz")[1])["update_offset"] == a.replica.offset for d in (a, b))
        assert _learned(a) == _learned(b) == n  # distinct documents, none twice
        assert digest(a.model) == digest(b.model)
        # each partition claimed in the log by the replica that reads it; no record fenced
        keys = {f"{topics['input']}:{p}" for p in (0, 1)}
        assert set(a.replica.owners) == keys and a.replica.owners == b.replica.owners
        assert {k for k in keys if a.replica.claimed(k)} | {k for k in keys if b.replica.claimed(k)} == keys
        assert a.replica.fenced == b.replica.fenced == 0
        # one replicated ledger: the same ranges, epochs and topic ids on both, each partition's log
        # id known from the records (no replica writes it on its own)
        assert a.replica.ledger.to_dict() == b.replica.ledger.to_dict()
        assert all(a.replica.ledger.topic_id(k) == a.session.topic_id(topics["input"]) is not None for k in keys)
        published = a.sync.published + b.sync.published
        assert a.sync.published > 0 and b.sync.published > 0  # both computed batches
        assert a.replica.applied + a.replica.skipped <= published
        # the same document gets the same top topic from both replicas
        test = [d["text"] for d in _docs(200, offset=3000)]
        ta, tb = a.model.transform(test), b.model.transform(test)
        assert np.array_equal(ta.argmax(axis=1), tb.argmax(axis=1))
        # the explorer and topic metrics follow a replica's batches (they stayed empty: no batch
        # reached them), its top words those of the model it holds
        for d in (a, b):
            # records applied after the replica's own last batch: the view follows within a
            # quiet second (TopicExplorer.refresh), so it is of the model the replica holds
            _wait(lambda: d.explorer.view.get("model_version") == d.model.version, 15, "the explorer follows")
            view = d.explorer.view
            assert view["status"] == "ok" and len(view["topics"]) == a.model.n_topics, view.get("status")
            assert d.explorer.monitor.last is not None and np.isfinite(d.explorer.monitor.last.diversity)
            top = [t["top_words"][:5] for t in view["topics"]]
            assert all(set(w) <= set(d.model.top_words(k, 10)) for k, w in enumerate(top))
            # the local step's diagnostics reach /metrics from a replica's computation too
            # (iterations per document were never observed with the log on)
            assert d.metrics.registry.get_sample_value("streamtopics_local_iterations_count") > 0
            assert d.metrics.registry.get_sample_value("streamtopics_objective_per_token") < 0
            # the staleness its own batches were learned with (own records in flight included)
            assert d.metrics.registry.get_sample_value("streamtopics_update_computed_behind_records_count") > 0
    # every document predicted at least once, by the model version (update offset) it was made at
    preds = [msgpack.unpackb(r.value) for r in _read_all(broker.bootstrap, topics["output"], want=n, timeout_s=30)]
    assert {p["id"] for p in preds} == {d["id"] for d in docs}
    assert max(p["model_version"] for p in preds) <= a.replica.offset
    assert {p["replica"] for p in preds} == {"a", "b"}  # who predicted it, at which update offset


def test_a_replica_with_no_disk_of_its_own_starts_from_a_snapshot_shipped_through_kafka(broker, fresh_topic,
                                                                                         tmp_path):
    from kafka import KafkaProducer

    from streamtopics.testing.broker import create_topics

    topics = _topics(fresh_topic)
    updates = fresh_topic(prefix="upd")
    snaps_topic = fresh_topic(prefix="snapshots")
    create_topics(broker.bootstrap, {snaps_topic + "-manifests": 1})
    rep = {"enabled": True, "updates_topic": updates, "snapshots_topic": snaps_topic}
    kafka = {"group_id": f"g-ship-{updates}"}
    n = 1200
    prod = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i, x in enumerate(_docs(n)):
        prod.send(topics["input"], msgpack.packb(x), partition=i % 2)
    prod.flush(timeout=30)
    prod.close(timeout=5)
    with _running(_cfg(broker.bootstrap, topics, tmp_path / "a", replication={**rep, "replica_id": "a"},
                       kafka=kafka)) as a:
        _wait(lambda: _learned(a) >= n, 120, "all documents learned")
        _wait(lambda: a.replicas.shipper.shipped >= 1, 60, "a snapshot shipped")
        a.replicas.shipper.wait()
        shipped_at = a.replica.offset
        # b: another machine, empty snapshot directory
        with _running(_cfg(broker.bootstrap, topics, tmp_path / "b", replication={**rep, "replica_id": "b"},
                           kafka=kafka)) as b:
            _wait(lambda: b.replica is not None and b.replica.offset == a.replica.offset == a.sync.end_offset(), 60,
                  "b at the log's end")
            time.sleep(0.5)
            assert digest(a.model) == digest(b.model) and _learned(b) == n
            started_from = b.model.snapshot_info["extra"]["daemon"]
            assert started_from["replica_id"] == "a" and 0 < started_from["update_offset"] <= shipped_at
            assert b.replica.applied < shipped_at  # it replayed only the log after the shipped snapshot


def test_a_replica_whose_snapshot_retention_has_passed_goes_on_from_the_newest_shipped_one(broker, fresh_topic,
                                                                                           tmp_path, monkeypatch):
    """A replica restarting from a snapshot at update offset X1 while retention has deleted the
    log's records up to past X1 cannot catch up by the log. It used to apply the log from its new
    beginning as if it followed X1 (a model no other replica holds, silently). Now, with
    ``snapshots_topic``, it continues from the newest shipped snapshot (the same model as the
    others at the log's end); without one it refuses to start (exit 2) saying how to go on."""
    import shutil

    from kafka import KafkaProducer

    from streamtopics.service import replica_sync
    from streamtopics.service.checkpoint import StartRefused
    from streamtopics.testing.broker import create_topics
    from test_update_log import _RetainedFrom

    topics = _topics(fresh_topic)
    updates = fresh_topic(prefix="upd")
    snaps_topic = fresh_topic(prefix="snapshots")
    create_topics(broker.bootstrap, {snaps_topic + "-manifests": 1})
    rep = {"enabled": True, "updates_topic": updates, "snapshots_topic": snaps_topic, "replica_id": "a"}
    kafka = {"group_id": f"g-ret-{updates}"}
    prod = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")

    def produce(lo, hi):
        for i, x in enumerate(_docs(hi - lo, offset=lo)):
            prod.send(topics["input"], msgpack.packb(x), partition=i % 2)
        prod.flush(timeout=30)

    produce(0, 600)
    cfg_a = _cfg(broker.bootstrap, topics, tmp_path / "a", replication=rep, kafka=kafka)
    with _running(cfg_a) as a:
        _wait(lambda: _learned(a) >= 600, 120, "the first documents learned")
    x1 = a.replica.offset
    for name in ("b", "c"):  # two hosts restored from a's snapshot at x1
        shutil.copytree(tmp_path / "a", tmp_path / name, ignore=shutil.ignore_patterns(".streamtopics.lock"))
    produce(600, 1200)
    with _running(cfg_a) as a:
        _wait(lambda: _learned(a) >= 1200, 120, "the next documents learned")
        _wait(lambda: a.replicas.shipper.shipped >= 1, 60, "a snapshot shipped past x1")
        a.replicas.shipper.wait()
    prod.close(timeout=5)
    end = a.replica.offset
    assert end > x1 + 2
    real = replica_sync.KafkaConsumer
    monkeypatch.setattr(replica_sync, "KafkaConsumer", lambda **kw: _RetainedFrom(real(**kw), updates, x1 + 1))
    cfg_b = _cfg(broker.bootstrap, topics, tmp_path / "b", replication={**rep, "replica_id": "b"}, kafka=kafka)
    with _running(cfg_b) as b:
        _wait(lambda: b.replica is not None and b.replica.offset == end and b.model is b.replica.model, 60,
              "b joined, at the log's end")
        assert digest(b.model) == digest(a.model) and _learned(b) == 1200
        assert b.model.snapshot_info["extra"]["daemon"]["update_offset"] > x1  # the shipped one
        assert b.metrics.registry.get_sample_value("streamtopics_update_log_truncations_total") == 1
    no_ship = {k: v for k, v in rep.items() if k != "snapshots_topic"}
    c = Daemon(_cfg(broker.bootstrap, topics, tmp_path / "c", replication={**no_ship, "replica_id": "c"},
                    kafka=kafka))
    assert c.run() == 2 and isinstance(c.error, StartRefused)
    assert f"begins at offset {x1 + 1}" in str(c.error) and "newer snapshot" in str(c.error), str(c.error)
    assert c.replica.offset == x1 and c.replica.applied == 0


def test_supervised_replicas_share_one_classifier(broker, fresh_topic, tmp_path):
    """supervision = "hinge": the classifier's statistics travel in the update records, so both
    replicas end with one model and one classifier (same labels, same eta, bit for bit), and
    every prediction names a label from it."""
    from kafka import KafkaProducer

    from streamtopics.corpora import load_reuters_r8

    topics = _topics(fresh_topic)
    updates = fresh_topic(prefix="upd")
    corpus = load_reuters_r8("train")  # sorted by label: a fixed shuffle
    n = 1200
    docs = [{"id": d.id, "text": d.text, "label": d.label}
            for d in (corpus[i] for i in np.random.default_rng(1).permutation(len(corpus))[:n])]
    rep = {"enabled": True, "updates_topic": updates, "max_staleness": 2}
    kafka = {"group_id": f"g-sup-{updates}"}
    model = {"supervision": "hinge"}
    prod = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
    for i, x in enumerate(docs):
        prod.send(topics["input"], msgpack.packb(x), partition=i % 2)
    prod.flush(timeout=30)
    prod.close(timeout=5)
    cfg = [_cfg(broker.bootstrap, topics, tmp_path / r, replication={**rep, "replica_id": r}, kafka=kafka,
                model=model) for r in "ab"]
    with _running(cfg[0]) as a, _running(cfg[1]) as b:
        _wait(lambda: _learned(a) >= n and _learned(b) >= n, 120, "all documents learned")
        _wait(lambda: a.replica.offset == b.replica.offset == a.sync.end_offset(), 30, "both at the log's end")
        time.sleep(0.5)
        assert digest(a.model) == digest(b.model)  # topics, vocabulary and the whole classifier
        assert a.model.head.docs_seen == b.model.head.docs_seen == n
        assert sorted(a.model.label_names) == sorted({d["label"] for d in docs})
        assert a.sync.published > 0 and b.sync.published > 0
    preds = [msgpack.unpackb(r.value) for r in _read_all(broker.bootstrap, topics["output"], want=n, timeout_s=30)]
    assert {p["id"] for p in preds} == {d["id"] for d in docs}
    labelled = [p for p in preds if "label" in p]
    assert {p["replica"] for p in labelled} == {"a", "b"}
    truth = {d["id"]: d["label"] for d in docs}
    late = [p for p in labelled if p["model_version"] >= 4]
    # prequential accuracy of the shared classifier, after its first few updates
    assert late and np.mean([p["label"] == truth[p["id"]] for p in late]) > 0.5
    assert all(set(p["scores"]) <= set(truth.values()) for p in labelled)


def test_a_new_replica_sends_one_batch_of_tokens_before_it_has_topics(broker, fresh_topic, tmp_path):
    """A model with no topics computes records that carry their tokens: applying one runs the
    whole local step on every replica, and its replica runs it once more for the predictions.
    Computing on at the staleness bound sent four of them before the first came back; the
    second batch now waits for the first record's topics, so the log holds exactly one."""
    from streamtopics.service.replication import Assembler, decode

    topics = {"input": fresh_topic(prefix="in"), "output": fresh_topic(prefix="out"),
              "dead_letter": fresh_topic(prefix="dlq")}
    updates = fresh_topic(prefix="upd")
    n = 12 * 64
    from test_daemon import _produce  # noqa: E402

    _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(n)])  # all there before it starts
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "a", batch={"max_docs": 64},
               replication={"enabled": True, "updates_topic": updates, "max_staleness": 4, "replica_id": "a"})
    with _running(cfg) as d:
        _wait(lambda: _learned(d) >= n, 120, "all documents learned")
        assert d.replica.applied == 12  # one record per batch (its claim is not counted)
    asm, kinds = Assembler(), []
    for r in _read_all(broker.bootstrap, updates, want=13, timeout_s=30):
        rec = asm.add(*decode(r.value))
        if rec is not None and rec.kind != "claim":
            kinds.append(rec.kind)
    assert kinds == ["batch"] + ["summary"] * 11


def _one_replica(broker, fresh_topic, tmp_path) -> tuple[dict, str, object]:
    """(topics, update-log topic, config) of one replica on one input partition, batches of 64."""
    topics = {"input": fresh_topic(prefix="in"), "output": fresh_topic(prefix="out"),
              "dead_letter": fresh_topic(prefix="dlq")}
    updates = fresh_topic(prefix="upd")
    cfg = _cfg(broker.bootstrap, topics, tmp_path / "a", batch={"max_docs": 64},
               replication={"enabled": True, "updates_topic": updates, "replica_id": "a"})
    return topics, updates, cfg


def _silence(d, silent) -> list:
    """Make the replica's staleness wait raise as a log that does not deliver in time would, on the
    calls (1, 2, ...) for which ``silent(call)`` is true; returns the list of calls so far."""
    _wait(lambda: d.sync is not None, 30, "joined the update log")
    sync, calls = d.sync, []
    bounded = sync.bounded

    def fake(*a, **kw):
        calls.append(1)
        if silent(len(calls)):
            raise TimeoutError(f"update log: at offset {sync.replica.offset}, waiting for {sync.replica.offset + 5}")
        return bounded(*a, **kw)

    sync.bounded = fake
    return calls


def _no_dead_letters_all_predicted(broker, topics: dict, n: int) -> None:
    assert _read_all(broker.bootstrap, topics["dead_letter"], timeout_s=3) == []
    preds = [msgpack.unpackb(r.value) for r in _read_all(broker.bootstrap, topics["output"], want=n, timeout_s=30)]
    assert {p["id"] for p in preds} == {x["id"] for x in _docs(n)}


def test_a_batch_waiting_for_a_silent_update_log_is_not_dead_lettered(broker, fresh_topic, tmp_path):
    """Before computing a batch a replica applies the log up to its staleness bound, waiting up to
    30 s (``ReplicaSync.catch_up``). A log that did not deliver in that time (the broker away)
    made the wait raise inside the model's step, and the batch processor took that for the model
    failing on the batch's documents: they went to the dead-letter topic, never learned. The
    replica now waits on: every document is learned once and predicted, none is dead-lettered."""
    from test_daemon import _produce  # noqa: E402

    topics, _, cfg = _one_replica(broker, fresh_topic, tmp_path)
    n = 8 * 64
    with _running(cfg) as d:
        calls = _silence(d, lambda call: call in (2, 3))  # the second batch meets a log silent twice
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(n)])
        _wait(lambda: _learned(d) >= n, 120, "all documents learned")
        time.sleep(1.0)
        assert _learned(d) == n and len(calls) >= 10  # each batch once, the two waits retried
        assert d.readiness()[0] and d.metrics.registry.get_sample_value("streamtopics_update_log_waiting_seconds") == 0
    _no_dead_letters_all_predicted(broker, topics, n)


def test_stopping_while_a_batch_waits_for_the_update_log_leaves_it_for_the_restart(broker, fresh_topic, tmp_path):
    """A stop while a batch waits for the log gives up the wait: the batch is neither learned nor
    dead-lettered, the daemon stops cleanly, and the next start learns it, every document once."""
    from test_daemon import _produce  # noqa: E402

    topics, _, cfg = _one_replica(broker, fresh_topic, tmp_path)
    n = 4 * 64
    with _running(cfg) as d:
        calls = _silence(d, lambda call: call >= 2)  # from the second batch on the log never delivers
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(n)])
        _wait(lambda: len(calls) >= 4, 60, "a batch waiting for the log")
        ok, info = d.readiness()  # visible: not ready, and for how long it has waited
        assert not ok and info["waiting_for_update_log_s"] >= 0.0 and info["broker_up"]
        assert d.metrics.registry.get_sample_value("streamtopics_update_log_waiting_seconds") > 0.0
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 15  # the wait gave up within a slice (BOUND_WAIT_S)
    assert d.error is None
    assert _learned(d) == 64  # the first batch only
    with _running(cfg) as d2:  # the same snapshot directory: the rest is read again and learned
        _wait(lambda: _learned(d2) >= n, 120, "all documents learned after the restart")
        time.sleep(1.0)
        assert _learned(d2) == n
    _no_dead_letters_all_predicted(broker, topics, n)


def test_a_record_of_a_newer_wire_format_stops_the_replica_with_the_reason(broker, fresh_topic, tmp_path):
    """A record that a newer release wrote (wire format version above this one's) is neither
    skipped, which would leave this replica behind the ones that apply it, nor dead-letters
    anything: the daemon stops with the reason (upgrade it), its model where the record begins."""
    from test_daemon import _produce  # noqa: E402

    from streamtopics.service.replica_sync import NewerUpdateFormat
    from streamtopics.service.replication import FORMAT_VERSION

    topics, updates, cfg = _one_replica(broker, fresh_topic, tmp_path)
    n = 2 * 64
    with _running(cfg) as d:
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(n)])
        _wait(lambda: _learned(d) >= n, 120, "the documents learned")
        logged = _read_all(broker.bootstrap, updates, timeout_s=5)
        newer = msgpack.unpackb(logged[-1].value)
        newer["v"] = FORMAT_VERSION + 1
        at = _produce(broker.bootstrap, updates, [msgpack.packb(newer)])[0]
        _wait(lambda: d.error is not None, 30, "the replica to stop")
        assert isinstance(d.error, NewerUpdateFormat) and f"offset {at}" in str(d.error)
        assert d.replica.offset == at and _learned(d) == n
    assert _read_all(broker.bootstrap, topics["dead_letter"], timeout_s=3) == []


def test_a_replica_with_other_model_settings_refuses_to_join_the_log(broker, fresh_topic, tmp_path):
    """A replica configured with another number of topics than the log's model stops at join,
    exit 2, naming the setting, before it joins the consumer group, claims or publishes anything (it used to skip the
    others' records with an IndexError, stay ready, and have its own records applied into their
    models). The log's replica goes on unharmed."""
    from test_daemon import _produce  # noqa: E402

    from streamtopics.service.replica_sync import ForeignUpdateLog

    topics, updates, cfg = _one_replica(broker, fresh_topic, tmp_path)
    n = 2 * 64
    with _running(cfg) as d:
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(n)])
        _wait(lambda: _learned(d) >= n, 120, "the documents learned")
        odd_cfg = _cfg(broker.bootstrap, topics, tmp_path / "odd", model={"n_topics": 7},
                       replication={"enabled": True, "updates_topic": updates, "replica_id": "odd"},
                       kafka={"group_id": cfg.kafka.group_id})
        revoked: list[int] = []
        on_revoked = d.telemetry.on_revoked
        d.telemetry.on_revoked = lambda p: (revoked.append(p), on_revoked(p))
        odd = Daemon(odd_cfg)
        assert odd.run() == 2
        assert isinstance(odd.error, ForeignUpdateLog)
        assert "n_topics = 10 in the log, 7 here" in str(odd.error), str(odd.error)
        assert f"update offset {odd.replica.offset}," in str(odd.error)  # it stopped before that record
        assert odd.replica.model.state.docs_seen == 0 and odd.replicas.sync.published == 0
        before = digest(d.model)
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(64, offset=n)])
        _wait(lambda: _learned(d) >= n + 64, 60, "the log's replica goes on")
        assert d.error is None and digest(d.model) != before and d.replica.foreign == 0
        # the odd replica refused at join, before its first poll: it never joined the consumer group,
        # so the fleet did not rebalance for it (the group join happens in a consumer's polls)
        assert revoked == []
        # given the log's settings, it joins (whatever an untrained snapshot of its own says)
        with _running(_cfg(broker.bootstrap, topics, tmp_path / "odd",
                           replication={"enabled": True, "updates_topic": updates, "replica_id": "odd"},
                           kafka={"group_id": cfg.kafka.group_id})) as fixed:
            _wait(lambda: fixed.replica is not None and fixed.replica.offset >= d.replica.offset
                  and fixed.model is fixed.replica.model, 60, "the fixed replica joined")
            assert fixed.error is None and fixed.model.n_topics == d.model.n_topics


def test_a_snapshot_of_another_fleet_is_refused_not_offered_as_the_base_of_a_healthy_log(broker, fresh_topic,
                                                                                        tmp_path):
    """Fleet audit: a snapshot directory copied from another fleet met this fleet's update log as
    'the log lost' (another topic id) and published a rebase into it: every replica of the healthy
    fleet stopped for it and would have restarted into the other fleet's model. A snapshot of
    another consumer group or input topic is now refused (exit 2), nothing published."""
    import shutil

    from test_daemon import _produce  # noqa: E402

    from streamtopics.service.checkpoint import StartRefused

    n = 2 * 64
    other_topics, other_updates, other_cfg = _one_replica(broker, fresh_topic, tmp_path / "other")
    with _running(other_cfg) as x:
        _produce(broker.bootstrap, other_topics["input"], [msgpack.packb(v) for v in _docs(n)])
        _wait(lambda: _learned(x) >= n, 120, "the other fleet learned")
    topics, updates, cfg = _one_replica(broker, fresh_topic, tmp_path)
    with _running(cfg) as a:
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(v) for v in _docs(n, offset=n)])
        _wait(lambda: _learned(a) >= n, 120, "this fleet learned")
        shutil.copytree(tmp_path / "other" / "a", tmp_path / "c", ignore=shutil.ignore_patterns(".streamtopics.lock"))
        c = Daemon(_cfg(broker.bootstrap, topics, tmp_path / "c", batch={"max_docs": 64},
                        kafka={"group_id": cfg.kafka.group_id},
                        replication={"enabled": True, "updates_topic": updates, "replica_id": "c"}))
        rc = []
        t = threading.Thread(target=lambda: rc.append(c.run()), daemon=True)
        t.start()
        t.join(60)
        if t.is_alive():  # it joined (and rebased the log, before the fix): stop it, then fail
            c.stop()
            t.join(60)
        assert rc == [2] and isinstance(c.error, StartRefused), (rc, c.error)
        assert "another deployment" in str(c.error) and other_topics["input"] in str(c.error), str(c.error)
        end = a.sync.end_offset()
        time.sleep(1.0)
        assert a.error is None and a.replicas.rebase_offset is None and a.sync.end_offset() == end


def test_an_update_log_lost_with_the_broker_stops_the_replica_and_its_restart_rebases_the_new_log(tmp_path):
    """tansu restarted (memory storage: the update log, the input and the claims gone). Before,
    the replica took the new log for the continuation of the old one from its offset on: it
    skipped the new log's first records, applied a few batches of it, then learned nothing more,
    silently (measured: 250 of 600 new documents, /readyz "ok"). Now it stops with the reason,
    having learned nothing from the new log; its restart offers its snapshot as the new log's
    base (a rebase), adopts the first base in the log, and learns the new documents exactly once
    (docs/scale-out.md, "When the update log is lost")."""
    from test_daemon import _produce  # noqa: E402

    from streamtopics import load_snapshot
    from streamtopics.service.replica_sync import UpdateLogReset
    from streamtopics.testing.broker import EmbeddedBroker

    b = EmbeddedBroker()
    try:
        b.start()
        topics = {"input": "docs", "output": "preds", "dead_letter": "dlq"}
        cfg = _cfg(b.bootstrap, topics, tmp_path / "snaps", kafka={"create_topics": True, "group_id": "g-lost"},
                   replication={"enabled": True, "updates_topic": "upd", "replica_id": "a"})
        n = 300
        with _running(cfg) as d:
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(n)])
            _wait(lambda: _learned(d) >= n, 120, "the documents learned")
            old_offset, old_digest = d.replica.offset, digest(d.model)
            b.stop(grace_s=0)
            time.sleep(2)
            b.start()
            _wait(lambda: d.error is not None, 60, "the replica to stop on the lost log")
            assert isinstance(d.error, UpdateLogReset), repr(d.error)
            assert _learned(d) == n and d.replica.offset == old_offset  # nothing of the new log applied
        saved = load_snapshot(d.last_snapshot)
        assert saved.state.docs_seen == n
        assert saved.snapshot_info["extra"]["daemon"]["update_offset"] == old_offset
        assert digest(saved) == old_digest
        new = _docs(n, offset=n)
        _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in new])
        with _running(cfg) as d:  # into its group again (stay_in_group_on_close)
            _wait(lambda: _learned(d) >= 2 * n, 120, "the new documents learned on the rebased log")
            time.sleep(1.0)  # a document learned twice would show here
            assert _learned(d) == 2 * n
            assert d.replicas.rebase_offset is not None and d.replica.offset > d.replicas.rebase_offset
            assert d.metrics.registry.get_sample_value("streamtopics_update_log_rebases_total") == 1
        info = load_snapshot(d.last_snapshot).snapshot_info["extra"]["daemon"]
        assert info["rebase_offset"] == d.replicas.rebase_offset
        preds = {msgpack.unpackb(r.value)["id"] for r in _read_all(b.bootstrap, "preds", want=n, timeout_s=30)}
        assert {x["id"] for x in new} <= preds
    finally:
        b.cleanup()


def test_two_replicas_restarted_on_a_lost_update_log_adopt_one_base_and_stay_identical(tmp_path):
    """Both replicas find the log lost and both offer their snapshots as its base; the first in
    the log is adopted by both, the other skipped by both, so they hold one model again and learn
    the new documents exactly once between them."""
    from test_daemon import _produce  # noqa: E402

    from streamtopics.service.replica_sync import UpdateLogReset
    from streamtopics.testing.broker import EmbeddedBroker

    b = EmbeddedBroker()
    try:
        b.start()
        topics = {"input": "docs", "output": "preds", "dead_letter": "dlq"}

        def cfg(rid):
            return _cfg(b.bootstrap, topics, tmp_path / rid, kafka={"create_topics": True, "group_id": "g-lost2"},
                        replication={"enabled": True, "updates_topic": "upd", "replica_id": rid})

        n = 400
        with _running(cfg("a")) as a, _running(cfg("b")) as r:
            _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in _docs(n)])
            _wait(lambda: _learned(a) >= n and _learned(r) >= n, 120, "the documents learned")
            b.stop(grace_s=0)
            time.sleep(2)
            b.start()
            _wait(lambda: a.error is not None and r.error is not None, 60, "both replicas to stop")
            assert isinstance(a.error, UpdateLogReset) and isinstance(r.error, UpdateLogReset)
        new = _docs(n, offset=n)
        _produce(b.bootstrap, "docs", [msgpack.packb(x) for x in new])
        with _running(cfg("a")) as a:
            _wait(lambda: a.replicas.rebase_offset is not None, 60, "a rebased")
            with _running(cfg("b")) as r:
                _wait(lambda: r.replicas.rebase_offset is not None, 60, "b rebased")
                _both_learn_the_new_documents(a, r, n)
    finally:
        b.cleanup()


def _both_learn_the_new_documents(a, r, n):
    """Two replicas on one rebased log: one base, the new documents learned once, one model."""
    assert a.replicas.rebase_offset == r.replicas.rebase_offset  # one base for both
    try:
        _wait(lambda: _learned(a) >= 2 * n and _learned(r) >= 2 * n, 120, "the new documents learned")
    except AssertionError as exc:
        raise AssertionError(f"{exc}: a {_learned(a)}, b {_learned(r)} of {2 * n}") from None
    _wait(lambda: a.replica.offset == r.replica.offset == a.sync.end_offset(), 30, "both at the log's end")
    time.sleep(0.5)
    assert _learned(a) == _learned(r) == 2 * n
    assert digest(a.model) == digest(r.model)
    rebases = [d.metrics.registry.get_sample_value("streamtopics_update_log_rebases_total") for d in (a, r)]
    assert rebases == [1, 1]


def test_a_running_replica_stops_for_the_first_rebase_of_its_log_and_adopts_it_at_restart(broker, fresh_topic,
                                                                                          tmp_path):
    """A replica already on the new log (it started after the loss) meets another replica's rebase:
    the model every replica continues from. It stops for it (its model cannot be swapped under a
    running loop) and adopts it at the restart; a second rebase in the same log is skipped."""
    from test_daemon import _produce  # noqa: E402

    from streamtopics import TopicModel
    from streamtopics.service.rebase import encode_rebase
    from streamtopics.service.replica_sync import UpdateLogRebased

    topics, updates, cfg = _one_replica(broker, fresh_topic, tmp_path)
    base = TopicModel(n_topics=5, seed=3)
    base.partial_fit([d["text"] for d in _docs(64, offset=5000)])
    path = tmp_path / "base.snap"
    base.save(path, offsets={}, extra={"daemon": {"update_offset": 99}})
    n = 128
    with _running(cfg) as d:
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in _docs(n)])
        _wait(lambda: _learned(d) >= n, 120, "the documents learned")
        # in parts, followed by another message (the rebasing replica's claims come right after it)
        parts = encode_rebase(path.read_bytes(), "z", 99, 8000)  # 64 KiB parts at least
        assert len(parts) >= 2
        offsets = _produce(broker.bootstrap, updates, parts + [b"not an update record"])
        first, at = offsets[0], offsets[len(parts) - 1]
        _wait(lambda: d.error is not None, 30, "the replica to stop for the rebase")
        assert isinstance(d.error, UpdateLogRebased), repr(d.error)
    # nothing past it applied, not even at the stop's catch-up; the final snapshot leads the
    # restart to the rebase's first part (fleet audit: it began past it and diverged for good)
    assert d.replica.offset == at and _learned(d) == n
    saved = load_snapshot(d.last_snapshot).snapshot_info["extra"]["daemon"]
    assert saved["update_offset"] == at and saved["read_from"] == first and saved["rebase_offset"] is None
    with _running(cfg) as d:
        _wait(lambda: d.replicas.rebase_offset == at and d.replica.offset > at and d.model is d.replica.model, 60,
              "the rebase adopted")  # (the daemon takes the replica's model once its join returns)
        assert d.model.n_topics == 5  # the base's model (the config's has more topics)
        _produce(broker.bootstrap, updates, encode_rebase(path.read_bytes(), "y", 7, 900000))  # a later one
        more = _docs(64, offset=n)
        _produce(broker.bootstrap, topics["input"], [msgpack.packb(x) for x in more])
        _wait(lambda: _learned(d) >= int(base.state.docs_seen) + 64, 120, "documents learned after the rebase")
        assert d.error is None and d.replicas.rebase_offset == at
