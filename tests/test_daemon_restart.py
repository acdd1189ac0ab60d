"""A daemon restarted on its snapshot directory with a changed [model] (found on the user's
path): the snapshot's model is kept, so the documents must be read as that model takes them,
its explorer and metrics must show it from the start, and build_info must name it."""
from __future__ import annotations

import json

import msgpack

from streamtopics.config import Config
from test_daemon import _cfg, _consumed, _docs, _get, _produce, _running, _samples, _topics, _wait  # noqa: E402


def _labelled(n: int, offset: int) -> list[bytes]:
    return [msgpack.packb(d) for d in _docs(n, offset)]


def _dead(d) -> int:
    return sum(v for (n, _), v in _samples(d.metrics_url).items() if n == "streamtopics_dead_letters_total")


def test_a_changed_supervision_reads_documents_as_the_kept_model_takes_them(broker, fresh_topic, tmp_path):
    topics = _topics(fresh_topic)
    snap = tmp_path / "snap"
    base = dict(model={"n_topics": 6, "seed": 3}, snapshot={"every_batches": 2})

    def cfg(**model) -> Config:
        return _cfg(broker.bootstrap, topics, snap, **{**base, "model": {**base["model"], **model}})

    _produce(broker.bootstrap, topics["input"], _labelled(100, 0))
    with _running(cfg()) as d:  # an unsupervised model learns labelled documents (labels unused)
        _wait(lambda: _consumed(d, topics["input"], 100), 60, "the first 100 documents")
    # [model] now asks for the hinge; the snapshot's unsupervised model is kept. Its labelled
    # documents were all model_error dead letters (the processor read labels by the config).
    _produce(broker.bootstrap, topics["input"], _labelled(100, 100))
    with _running(cfg(supervision="hinge", engine={"kind": "alias"})) as d:
        url = d.metrics_url
        # before any new batch: the explorer shows the snapshot's topics and recorded coherence
        view = json.loads(_get(url + "/v1/topics")[1])
        assert view["status"] == "ok" and len(view["topics"]) == 6 and view["model_version"] == d.model.version
        assert view["quality"]["mean_npmi"] is not None and view["quality_version"] is not None
        assert _get(url + "/v1/topics/0")[0] == 200
        s = _samples(url)
        assert ("streamtopics_topic_coherence_npmi", (("topic", "0"),)) in s
        info = [k for k in s if k[0] == "streamtopics_build_info"]
        assert info and dict(info[0][1])["engine"] == "lsparse"  # the running model's, not [model]'s
        _wait(lambda: _consumed(d, topics["input"], 200), 60, "the next 100 documents")
        assert d.model.supervision is None and d.model.state.docs_seen == 200 and _dead(d) == 0
    # the other way: a supervised snapshot and [model] without supervision - the classifier
    # went on predicting, but learned nothing more (labels were dropped without a word)
    snap = tmp_path / "snap2"
    topics = _topics(fresh_topic)
    _produce(broker.bootstrap, topics["input"], _labelled(100, 200))
    with _running(cfg(supervision="hinge")) as d:
        _wait(lambda: _consumed(d, topics["input"], 100), 60, "100 labelled documents")
        labelled = d.model.head.docs_seen
    _produce(broker.bootstrap, topics["input"], _labelled(100, 300))
    with _running(cfg()) as d:
        _wait(lambda: _consumed(d, topics["input"], 200), 60, "100 more")
        assert d.model.supervision == "hinge" and d.model.head.docs_seen == labelled + 100 and _dead(d) == 0


def test_a_new_model_killed_after_its_first_snapshot_learns_every_partition_not_the_old_groups_share(
        broker, fresh_topic, tmp_path, monkeypatch):
    """A new model (new snapshot.dir) in a group whose offsets an earlier model committed, 4 input
    partitions, SIGKILLed right after its first snapshot (one partition's batch). The restart read
    the other three partitions from the old model's committed offsets: their records were never
    learned by the new model, silently (a fault audit: 502 of 2,000 documents learned)."""
    import signal
    import uuid

    from kafka import KafkaProducer

    from streamtopics.testing.faults import ENV
    from test_daemon import _Proc, _cfg_dict, _write_toml

    topics = {**_topics(fresh_topic), "input": fresh_topic(partitions=4, prefix="in")}
    n = 400
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", linger_ms=5, enable_idempotence=False)
    try:
        for i, v in enumerate(msgpack.packb(d) for d in _docs(n)):
            p.send(topics["input"], v, partition=i % 4)
        p.flush(timeout=30)
    finally:
        p.close(timeout=5)
    group = f"g-{uuid.uuid4().hex[:8]}"
    kafka = {"group_id": group}

    def docs_seen(d) -> int:
        return int(d.model.state.docs_seen) if d.model is not None else -1

    with _running(Config.from_dict(_cfg_dict(broker.bootstrap, topics, tmp_path / "a", kafka=kafka), env={})) as a:
        _wait(lambda: docs_seen(a) >= n, 120, "model A learned the stream")   # commits at its final snapshot
    cfg_b = _cfg_dict(broker.bootstrap, topics, tmp_path / "b", kafka=kafka, snapshot={"every_batches": 1000})
    monkeypatch.setenv(ENV, "snapshot_written:1:kill")
    b = _Proc(_write_toml(tmp_path / "b.toml", cfg_b), tmp_path / "b.log")
    assert b.p.wait(timeout=300) == -signal.SIGKILL, b.log_path.read_text()[-2000:]
    b.fh.close()
    monkeypatch.delenv(ENV)
    with _running(Config.from_dict(cfg_b, env={})) as b2:
        _wait(lambda: docs_seen(b2) >= n, 120, "model B learned every partition")
        positions = b2.book.ledger.positions()
    assert docs_seen(b2) == n and sorted(positions.values()) == [100] * 4, positions


def test_an_untrained_snapshot_does_not_pin_its_settings_over_the_config(tmp_path):
    """A snapshot whose model learned nothing (a replica refused after applying claims only, a daemon
    stopped before its first batch) gives way to the [model] settings; a trained one keeps its own."""
    from streamtopics import TopicModel
    from streamtopics.config import Config
    from streamtopics.daemon import untrained_takes_config
    from streamtopics.service.ledger import OffsetLedger

    m = Config.from_dict({"model": {"n_topics": 10}}, env={}).model
    untrained = TopicModel(n_topics=7)
    untrained.snapshot_info = {"extra": {"daemon": {"update_offset": 6}}}
    model, ledger, _ = untrained_takes_config(untrained, OffsetLedger(), tmp_path / "s", m)
    assert model.n_topics == 10 and model.snapshot_info["extra"]["daemon"]["update_offset"] == 6
    trained = TopicModel(n_topics=7, seed=0)
    trained.partial_fit(["alpha beta gamma delta", "beta gamma delta epsilon"] * 20)
    assert untrained_takes_config(trained, OffsetLedger(), tmp_path / "s", m)[0] is trained
