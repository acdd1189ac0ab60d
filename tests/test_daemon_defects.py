"""Daemon defects found by reading the code (issue 14, item 4), each pinned by a test that
failed before its fix. No broker needed: the batch processor, the prediction encoder and the
telemetry are called through their public seams."""
from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import numpy as np
import pytest

from streamtopics.config import Config
from streamtopics.config import model_from_config
from streamtopics.daemon import Daemon
from streamtopics.service.predictions import PredictionEncoder
from streamtopics.service.processor import BatchProcessor, Decoded
from streamtopics.stream.codec import Document

GOOD = [
    "oil prices rose sharply after the opec meeting in vienna",
    "the central bank cut interest rates to support growth",
    "wheat and corn exports fell as the harvest was delayed",
]
FIRST = [
    "crude oil supply opec output barrels market",
    "bank rates inflation growth economy central",
    "grain harvest wheat corn farmers exports",
    "shares profit company quarterly earnings rose",
]


def _cfg(tmp_path, **metrics) -> Config:
    return Config.from_dict({"snapshot": {"dir": str(tmp_path)}, "topics": {"input": "docs"},
                             "model": {"n_topics": 4, "sparsity": 4, "seed": 1},
                             "metrics": {"port": 0, **metrics}}, env={})


def _poisoned(model):
    """The model raises on any batch holding the word 'poisonword' (in its learn step too)."""
    orig = model.process

    def process(batch, *a, **kw):
        pid = model.vocab.get("poisonword")
        if pid >= 0 and (np.asarray(batch.word_ids) == pid).any():
            raise ValueError("poisoned document")
        return orig(batch, *a, **kw)

    model.process = process
    return model


def test_model_error_retry_does_not_count_the_batch_twice(tmp_path):
    """The failed step's prepare(grow=True) had already grown the vocabulary and added the
    batch's word counts (with a decay step); the retry without the failing document did it
    again, so the model differed from one that simply learned the good documents. Before the
    fix the vocabulary counts of the good words were counted twice and 'poisonword' stayed in
    the vocabulary (checked: this test failed on the old code)."""
    cfg = _cfg(tmp_path)
    model = _poisoned(model_from_config(cfg.model))
    ref = model_from_config(cfg.model)
    for m in (model, ref):  # the same first batch (initialises the topics)
        m.process(m.prepare(m.tokenize(FIRST)), learn=True, batch_key="k0")

    texts = GOOD[:2] + ["poisonword " + GOOD[2]]
    records = [SimpleNamespace(topic="docs", partition=0, offset=i, value=b"x", timestamp=0) for i in range(3)]
    decoded = [Decoded([Document(str(i), t, None, None, None, None, None)], [], [None])
               for i, t in enumerate(texts)]
    out = BatchProcessor().run(model, records, decoded, "k1")
    assert isinstance(out.error, ValueError)  # the poisoned batch raised, and was narrowed down
    assert [dl.reason for dl in out.dead] == ["model_error"] and out.dead[0].offset == 2
    assert out.step.keep == [0, 1] and out.step.theta.shape[0] == 2 and out.ids == ["0", "1"]

    ref.process(ref.prepare(ref.tokenize(GOOD[:2])), learn=True, batch_key="k1")
    assert model.vocab.words == ref.vocab.words  # 'poisonword' and the third text's words are gone
    np.testing.assert_allclose(model.vocab.counts, ref.vocab.counts, rtol=0, atol=1e-12)
    assert model.state.n_words == ref.state.n_words
    np.testing.assert_allclose(model.state.lam(), ref.state.lam(), rtol=0, atol=1e-9)
    np.testing.assert_allclose(model.state.lam_totals(), ref.state.lam_totals(), rtol=0, atol=1e-9)


def test_prediction_scores_use_the_batch_label_names_not_the_live_model(tmp_path):
    """The publisher thread encoded scores with ``self.model.label_names`` read while the loop
    added labels or swapped the model (adopting a snapshot): scores could be paired with the
    wrong names. The batch now carries the names its scores are over (checked: failed on the
    old code, which had no way to pass them and read the live model)."""
    encoder = PredictionEncoder.from_config(_cfg(tmp_path))  # reads nothing live: every value is passed
    sup = (np.array([[0.9, 0.1], [0.2, 0.8]]), ["acq", "earn"])
    out = encoder.encode([], ["a", "b"], np.full((2, 4), 0.25), 7, 0.0, sup, ["acq", "earn"])
    from streamtopics.stream.codec import decode_prediction

    preds = [decode_prediction(m.value) for m in out]
    assert [sorted(p["scores"]) for p in preds] == [["acq", "earn"], ["acq", "earn"]]
    assert preds[0]["scores"]["acq"] == 0.9 and preds[1]["label"] == "earn"


def test_metrics_prequential_window_is_read(tmp_path):
    """``[metrics] prequential_window`` was never read (the window came from the model
    section only). Checked: failed on the old code (maxlen 1000)."""
    assert Daemon(_cfg(tmp_path, prequential_window=7), serve_metrics=False).telemetry.prequential.maxlen == 7
    assert Daemon(_cfg(tmp_path), serve_metrics=False).telemetry.prequential.maxlen == 1000


def test_topic_creation_refused_is_logged_and_start_up_goes_on(monkeypatch, caplog):
    """A broker that refuses to create topics (no permission on a managed cluster) is logged and
    start-up goes on; an unreachable broker is raised for the caller's retry. (The handler once
    named kafka-python 2's NoBrokersAvailable, gone in 3.x: any error became an AttributeError
    and start-up retried "cannot reach Kafka" forever.)"""
    import pytest
    from kafka import errors as kerrors

    from streamtopics.service import session

    def refuse(*a, **k):
        raise kerrors.TopicAuthorizationFailedError("not allowed")

    s = session.KafkaSession.__new__(session.KafkaSession)
    s.cfg, s.telemetry, s.consumer = Config(), None, None
    monkeypatch.setattr(session, "ensure_topics", refuse)
    with caplog.at_level("ERROR", logger="streamtopics"):
        s.ensure_topics()  # returns
    assert any("could not create topics" in r.getMessage() and "TopicAuthorizationFailedError" in r.error
               for r in caplog.records)

    def unreachable(*a, **k):
        raise ConnectionError("no broker reachable at 127.0.0.1:1")

    monkeypatch.setattr(session, "ensure_topics", unreachable)
    with pytest.raises(ConnectionError):
        s.ensure_topics()


def _labelled(texts_labels, offset0=0):
    """(records, decoded) of one document per record: (text, label str or labels list)."""
    records = [SimpleNamespace(topic="docs", partition=0, offset=offset0 + i, value=b"x", timestamp=0)
               for i in range(len(texts_labels))]
    decoded = [Decoded([Document(str(offset0 + i), t, None, lab if isinstance(lab, str) else None,
                                 lab if isinstance(lab, list) else None, None, None)], [], [None])
               for i, (t, lab) in enumerate(texts_labels)]
    return records, decoded


def test_a_document_of_the_other_label_form_cannot_fail_a_batch_or_the_stream(tmp_path):
    """A stray multi-label document first in a multi-class stream fixed the classifier as
    multi-label, and every later batch of 'label' documents failed (model_error, all of them,
    for good); a 'labels' document in a multi-class stream failed its batch the same way. Now a
    'label' is a one-label list for a multi-label model, a one-label 'labels' is the label of a
    multi-class one, and several labels for a multi-class model are a bad_label dead letter."""
    cfg = _cfg(tmp_path)
    classes = ["oil", "rates", "grain", "shares"]
    proc = BatchProcessor()

    model = model_from_config(dataclasses.replace(cfg.model, supervision="hinge"))
    records, decoded = _labelled([(FIRST[0], ["oil"])] + [(t, c) for t, c in zip(FIRST[1:], classes[1:])])
    out = proc.run(model, records, decoded, "k0")
    assert out.error is None and out.dead == [] and out.step.keep == [0, 1, 2, 3]
    assert model.head.task == "multilabel" and sorted(model.label_names) == sorted(classes)
    records, decoded = _labelled([(t, c) for t, c in zip(GOOD, classes)], offset0=4)
    out = proc.run(model, records, decoded, "k1")  # 'label' documents go on training it
    assert out.error is None and out.dead == [] and out.step.keep == [0, 1, 2]

    model = model_from_config(dataclasses.replace(cfg.model, supervision="hinge"))
    records, decoded = _labelled([(t, c) for t, c in zip(FIRST, classes)])
    assert proc.run(model, records, decoded, "k0").error is None and model.head.task == "multiclass"
    records, decoded = _labelled([(GOOD[0], "oil"), (GOOD[1], ["rates", "grain"]), (GOOD[2], ["newlabel"])],
                                 offset0=4)
    out = proc.run(model, records, decoded, "k1")
    assert out.error is None and out.step.keep == [0, 1]  # the two-label document is out of the batch
    (dl,) = out.dead
    assert (dl.reason, dl.offset) == ("bad_label", 5) and "'labels' has 2 labels" in dl.detail
    assert "newlabel" in model.label_names  # the one-label list trained as its label


def test_the_same_stop_signal_delivered_twice_keeps_the_graceful_stop():
    """`timeout -s TERM`, a shell's Ctrl-C and container runtimes signal the process and its group,
    so the daemon got SIGTERM twice in the same millisecond and took the second as "exit now",
    losing the final snapshot. A repeat within SAME_REQUEST_S is the same request; a later one
    still exits at once."""
    import signal
    import threading

    from streamtopics.daemon import SAME_REQUEST_S, signal_handler

    now, exits = [100.0], []
    stop = threading.Event()
    handler = signal_handler(stop, clock=lambda: now[0], exit_now=exits.append)
    handler(signal.SIGTERM, None)
    assert stop.is_set() and exits == []
    now[0] += 0.001
    handler(signal.SIGTERM, None)  # the group's copy of the same signal
    now[0] += SAME_REQUEST_S / 2
    handler(signal.SIGINT, None)
    assert exits == []
    now[0] += SAME_REQUEST_S
    handler(signal.SIGINT, None)  # the operator insists
    assert exits == [128 + signal.SIGINT]


def test_a_label_past_the_cap_is_a_dead_letter_not_a_failed_batch(tmp_path):
    """With [model.supervision] max_labels (overflow refused) a batch holding more new labels
    than room failed whole in the model, every time, so the classifier never learned a label and
    the daemon nothing. Now new labels are admitted in batch order while there is room and the
    documents past the cap are bad_label dead letters."""
    cfg = _cfg(tmp_path)
    model = model_from_config(dataclasses.replace(cfg.model, supervision="hinge", sup_max_labels=2))
    labels = ["oil", "rates", "grain", "oil", "shares"]
    records, decoded = _labelled(list(zip(FIRST + GOOD[:1], labels)))
    out = BatchProcessor().run(model, records, decoded, "k0")
    assert out.error is None and out.step.keep == [0, 1, 2]
    assert [(dl.reason, dl.offset) for dl in out.dead] == [("bad_label", 2), ("bad_label", 4)]
    assert "would exceed the classifier's max_labels = 2" in out.dead[0].detail
    assert model.label_names == ["oil", "rates"] and model.state.docs_seen == 3


def test_sighup_is_a_graceful_stop_like_sigterm():
    """A closed terminal or ssh session sent SIGHUP, whose default killed the daemon without its
    final snapshot (exit 129): the records since the last snapshot were predicted again."""
    import signal
    import threading

    from streamtopics.daemon import install_signal_handlers

    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    stop = threading.Event()
    try:
        install_signal_handlers(stop)
        signal.raise_signal(signal.SIGHUP)
        assert stop.is_set()
    finally:
        for s, h in saved.items():
            signal.signal(s, h)


def _refused(cfg, caplog) -> str:
    """Run a daemon that must refuse to start: exit 2 and one error line without a traceback."""
    import logging

    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="streamtopics.daemon"):
        assert Daemon(cfg).run() == 2
    (rec,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert rec.exc_info is None and rec.getMessage().startswith("refusing to start: ")
    return rec.getMessage()


def _dir_cfg(snaps, **extra):
    return Config.from_dict({"snapshot": {"dir": str(snaps)}, "topics": {"input": "docs"},
                             "metrics": {"port": 0}, "kafka": {"bootstrap_servers": "127.0.0.1:1"}, **extra}, env={})


def test_an_unusable_snapshot_directory_is_a_one_line_refusal_with_exit_2(tmp_path, caplog):
    """A file where the directory should be, or a read-only mount, gave 'daemon failed' with a
    traceback and exit 1 (a crash loop under Restart=on-failure with nothing to read)."""
    (tmp_path / "taken").write_text("not a directory")
    assert _refused(_dir_cfg(tmp_path / "taken"), caplog).startswith(
        f"refusing to start: snapshot directory {tmp_path / 'taken'} cannot be used: a file stands where it should be")


def test_a_full_snapshot_file_system_at_start_is_a_refusal_not_a_crash(tmp_path, caplog):
    """A snapshot directory on a full disk crashed the start with a traceback and exit 1 (the lock
    file's write was not mapped to a refusal), and its ftruncate had already erased the previous
    owner's record. The lock file here is a link to /dev/full: every write is ENOSPC."""
    from streamtopics.service.checkpoint import LOCK_NAME

    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    (snaps / LOCK_NAME).symlink_to("/dev/full")
    assert _refused(_dir_cfg(snaps), caplog).startswith(
        f"refusing to start: snapshot directory {snaps} cannot be used: its file system is full")


def test_a_second_daemon_with_the_same_config_is_refused_for_the_directory_not_the_port(tmp_path, caplog):
    """The README promises a second daemon on the same configuration is refused, naming the owner,
    with exit 2. It bound the metrics endpoint first, so with a fixed port (the shipped config's)
    it died on 'Address already in use' with a traceback and exit 1."""
    import socket
    import threading

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = _dir_cfg(tmp_path / "snaps", metrics={"host": "127.0.0.1", "port": port})
    owner = Daemon(cfg)
    t = threading.Thread(target=owner.run, daemon=True)
    t.start()
    try:
        assert owner.wait_started(60) and owner.server is not None
        assert "another streamtopics daemon" in _refused(cfg, caplog) and owner.server is not None
        other = _dir_cfg(tmp_path / "other", metrics={"host": "127.0.0.1", "port": port})
        # its own directory, the owner's port: a one-line refusal too
        assert f"metrics endpoint 127.0.0.1:{port}" in _refused(other, caplog)
    finally:
        owner.stop()
        t.join(30)


def test_a_rebuilt_consumer_does_not_report_the_broker_unreachable_before_its_first_poll():
    """Every consumer rebuild (a group join given up) logged 'broker unreachable' and flipped
    streamtopics_broker_up to 0 then 1, though the broker was fine: the new client had not
    connected yet. For REBUILT_GRACE_S the last state stands; a client that stays unconnected
    still counts as the broker gone."""
    import threading

    from streamtopics.service.session import REBUILT_GRACE_S, KafkaSession
    from streamtopics.service.telemetry import Telemetry

    cfg = Config.from_dict({"topics": {"input": "docs"}, "kafka": {"create_topics": False}}, env={})
    tel = Telemetry()
    s = KafkaSession(cfg, tel, stop=threading.Event(), gil_free=threading.Event(), tick=lambda: None,
                     point=lambda _n: None)
    consumer = SimpleNamespace(connected=lambda: True, recreated=0, joins_abandoned=0, rewinds=0)
    s.consumer, s.publisher = consumer, SimpleNamespace(healthy=True, recreated=0)
    assert s.check(True, 100.0) and tel.broker_up
    consumer.connected, consumer.recreated = (lambda: False), 1  # rebuilt, not connected yet
    assert s.check(True, 101.0) and tel.broker_up and s.up(101.0 + REBUILT_GRACE_S - 1)
    assert not s.check(True, 101.0 + REBUILT_GRACE_S + 1) and not tel.broker_up
    consumer.connected = lambda: True
    assert s.check(True, 120.0) and tel.broker_up


def test_a_replica_the_group_gives_no_partition_is_a_ready_standby():
    """More replicas than input partitions (compose --scale): a replica with no partition answered
    /readyz 503 for good and StreamtopicsNotReady paged, though it follows the update log and
    holds the shared model. Once its group is stable it is a ready standby; a daemon without
    replication, or a group still joining, is not ready without partitions, as before."""
    from streamtopics.service.ledger import OffsetLedger
    from streamtopics.service.telemetry import Telemetry

    tel = Telemetry()
    tel.on_broker(True)
    book = SimpleNamespace(assigned=[], ledger=OffsetLedger())
    model = SimpleNamespace(version=7)
    joining = SimpleNamespace(join_progress=lambda: {"joining_s": 3.0, "stable": False})
    stable = SimpleNamespace(join_progress=lambda: {"joining_s": 0.0, "stable": True})
    assert not tel.readiness(book, model, False, stable)[0]  # not a replica: no partition, not ready
    tel.standby_ready = True
    assert not tel.readiness(book, model, False, joining)[0]
    ok, out = tel.readiness(book, model, False, stable)
    assert ok and out["standby"] and out["partitions"] == []
    assert not tel.readiness(book, model, True, stable)[0]  # stopping
    tel.on_broker(False)
    assert not tel.readiness(book, model, False, stable)[0]


def test_end_to_end_latency_starts_at_the_kafka_timestamp_not_the_event_time(tmp_path):
    """The latency histogram is documented as Kafka message timestamp to acknowledged prediction,
    but took the document's event time 'ts' first: a backfill of week-old events landed every
    observation in +Inf (the dashboard's mean became days), future ones at 0."""
    cfg = _cfg(tmp_path)
    model = model_from_config(cfg.model)
    week_ago = 1_700_000_000.0
    records = [SimpleNamespace(topic="docs", partition=0, offset=i, value=b"x", timestamp=1_800_000_000_000 + i)
               for i in range(3)]
    decoded = [Decoded([Document(str(i), t, None, None, None, None, week_ago)], [], [None])
               for i, t in enumerate(FIRST[:3])]
    out = BatchProcessor().run(model, records, decoded, "k0")
    assert out.origins() == [1_800_000_000.0, 1_800_000_000.001, 1_800_000_000.002]
    records[1].timestamp = -1  # no timestamp: not observed
    assert np.isnan(BatchProcessor().run(model, records, decoded, "k1").origins()[1])


def test_words_the_full_vocabulary_refuses_are_counted_and_logged_once(caplog):
    """At its cap under policy "ignore" the vocabulary dropped new words with no trace: one-off
    tokens (ids, URLs) filled a 200k cap and later words were never modelled (operator audit)."""
    import logging

    from streamtopics.model import TopicModel
    from streamtopics.service.telemetry import Telemetry

    tel = Telemetry()

    def counter(name):
        return tel.metrics.registry.get_sample_value(name) or 0.0

    m = TopicModel(n_topics=2, vocab_cap=3, vocab_policy="ignore", seed=0)
    with caplog.at_level(logging.WARNING, logger="streamtopics"):
        m.partial_fit([["aa", "bb", "cc", "aa"]])
        tel.on_inference(m.last_stats)
        assert counter("streamtopics_vocabulary_dropped_tokens_total") == 0
        m.partial_fit([["dd", "aa", "dd", "ee"]])  # dd twice and ee: three tokens refused
        tel.on_inference(m.last_stats)
        m.partial_fit([["ff", "bb"]])
        tel.on_inference(m.last_stats)
    assert counter("streamtopics_vocabulary_dropped_tokens_total") == 4
    assert sum("vocabulary is full" in r.getMessage() for r in caplog.records) == 1

    ev = TopicModel(n_topics=2, vocab_cap=3, vocab_policy="evict", seed=0)
    ev.partial_fit([["aa", "bb", "cc"]])
    ev.partial_fit([["dd", "ee"]])
    tel.on_inference(ev.last_stats)
    assert counter("streamtopics_vocabulary_evicted_words_total") == 2


def test_the_checkpointer_forgets_the_snapshots_it_pruned(tmp_path):
    """``Checkpointer.known`` (snapshot files this process wrote, loaded or rejected) kept the name
    of every snapshot ever written: one entry more per snapshot for as long as the daemon ran
    (operator memory audit). Names of pruned files go; the files still in the directory stay known,
    so none of them is taken for a newer snapshot of the lineage."""
    from streamtopics.service.checkpointer import Checkpointer
    from streamtopics.service.ledger import OffsetLedger
    from streamtopics.service.telemetry import Telemetry

    cfg = Config.from_dict({"snapshot": {"dir": str(tmp_path), "keep": 2}, "topics": {"input": "docs"},
                            "model": {"n_topics": 4, "sparsity": 4, "seed": 1}}, env={})
    cp = Checkpointer(cfg.snapshot, "instance", Telemetry(), lambda name: None)
    model = model_from_config(cfg.model)
    ledger = OffsetLedger()
    for i in range(6):  # six snapshots of six model versions
        model.partial_fit(FIRST)
        ledger.learned("docs:0", i, i + 1)
        path = cp.write(model, ledger, {})
        cp.prune(path, model.version, early=False)
    on_disk = {p.name for p in cp.store.files()}
    assert len(on_disk) == 2 and path.name in on_disk
    assert cp.known == on_disk
    assert cp.newer_of_lineage(int(model.state.docs_seen)) is None


def test_targets_of_the_other_kind_are_learned_as_unlabelled_with_a_warning(tmp_path, caplog):
    """Bad-input audit: a ``label`` sent to a regression model (300 documents), or a ``response`` to a
    classifier, was ignored with no trace but a NaN prequential accuracy. It is still learned as
    unlabelled (documented), now with a WARNING naming the count, at most once a minute."""
    from streamtopics.service.processor import misfit_targets

    def doc(i, label=None, labels=None, response=None):
        return Document(str(i), FIRST[i % len(FIRST)], None, label, labels, response, None)
    docs = [doc(0, label="a"), doc(1, labels=["a"]), doc(2, response=1.5), doc(3, label="a", response=2.0), doc(4)]
    assert misfit_targets(docs, "regression") == 2 and misfit_targets(docs, "hinge") == 1
    assert misfit_targets(docs, "none") == 0
    cfg = _cfg(tmp_path)
    model = model_from_config(dataclasses.replace(cfg.model, supervision="regression"))
    records = [SimpleNamespace(topic="docs", partition=0, offset=i, value=b"x", timestamp=0) for i in range(5)]
    decoded = [Decoded([d], [], [None]) for d in docs]
    proc = BatchProcessor()
    with caplog.at_level("WARNING", logger="streamtopics.daemon"):
        proc.run(model, records, decoded, "k0")
        proc.run(model, records, decoded, "k1")
    warned = [r for r in caplog.records if "a target of the other kind" in r.getMessage()]
    assert len(warned) == 1 and warned[0].documents == 2 and "'response'" in warned[0].getMessage()
