"""The streamtopics command: check-config, inspect, produce (real broker) and a small demo."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import msgpack
from kafka import KafkaConsumer, TopicPartition

from streamtopics import TopicModel, load_snapshot
from streamtopics.cli import main
from streamtopics.config import load_config
from streamtopics.corpora import load_reuters_r8

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streamtopics.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))


# --------------------------------------------------------------------------- check-config


def test_check_config_prints_the_effective_config_with_secrets_masked(tmp_path, monkeypatch, capsys):
    path = tmp_path / "prod.toml"
    path.write_text('[kafka]\nsecurity_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-512"\n'
                    'sasl_plain_username = "svc"\n[model]\nn_topics = 42\n')
    monkeypatch.setenv("STREAMTOPICS_KAFKA__SASL_PLAIN_PASSWORD", "hunter2-secret")
    monkeypatch.setenv("STREAMTOPICS_BATCH__MAX_DOCS", "128")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hunter2" not in out
    assert 'sasl_plain_password = "***"' in out
    assert "STREAMTOPICS_BATCH__MAX_DOCS" in out  # overrides are named
    shown = tomllib.loads(out)  # the printout is itself a TOML file
    assert shown["model"]["n_topics"] == 42 and shown["batch"]["max_docs"] == 128
    assert shown == load_config(path).to_dict()


def test_check_config_names_what_a_kept_snapshot_model_differs_in(tmp_path, capsys):
    """The daemon keeps a snapshot's model over a changed [model]; check-config said nothing of
    it, so a user who switched supervision or n_topics learned it only from a start-up WARNING."""
    from streamtopics import TopicModel
    from streamtopics.service.checkpoint import snapshot_name

    snaps = tmp_path / "snaps"
    snaps.mkdir()
    m = TopicModel(n_topics=6, seed=0)
    m.partial_fit(["oil prices rose", "bank rates fell", "wheat exports rose"] * 3)
    m.save(snaps / snapshot_name(m.version))
    path = tmp_path / "c.toml"
    path.write_text(f'[model]\nn_topics = 6\n[snapshot]\ndir = "{snaps}"\n')
    assert main(["check-config", str(path)]) == 0
    assert "snapshot.dir holds a model" not in capsys.readouterr().out  # the same settings
    path.write_text(f'[model]\nn_topics = 6\nbeta = {1 / 6!r}\n[snapshot]\ndir = "{snaps}"\n')
    assert main(["check-config", str(path)]) == 0
    assert "snapshot.dir holds a model" not in capsys.readouterr().out  # beta 1/K is what None means
    path.write_text(f'[model]\nn_topics = 8\nsupervision = "hinge"\n[snapshot]\ndir = "{snaps}"\n')
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# snapshot.dir holds a model (model-" in out and "that the daemon keeps over [model]" in out
    assert "[model] (not what the daemon runs: it keeps the snapshot's model, below):" in out  # docs audit
    assert "#   n_topics: snapshot 6, [model] 8" in out and "#   supervision: snapshot None, [model] 'hinge'" in out
    assert tomllib.loads(out)["model"]["n_topics"] == 8  # still a TOML file (the note is comments)


def test_check_config_errors_exit_2_with_one_line_each(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text('[model]\nn_topic = 10\nengine = "gibbs"\n[batch]\nmax_docs = 0\n')
    assert main(["check-config", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert all(ln.startswith("config error: ") for ln in lines) and len(lines) == 3
    assert any("model.n_topic" in ln and "did you mean model.n_topics" in ln for ln in lines)
    assert any("model.engine" in ln for ln in lines) and any("batch.max_docs" in ln for ln in lines)
    # Supervised settings are validated like every other key.
    path.write_text('[model]\nsupervision = "hinge"\nsup_c = -1.0\n')
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "model.sup_c" in err and "model.supervision" not in err
    path.write_text('[model]\nsupervision = "hinge"\nsup_c = 16.0\n')
    assert main(["check-config", str(path)]) == 0
    # every problem at once: a [model] table field of another kind is named beside another section's
    # error (docs audit: it appeared only once the [kafka] error was fixed)
    path.write_text('[kafka]\nbogus = 1\n[model.engine]\nkind = "lsparse"\nburn_in = 4\n')
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown key kafka.bogus" in err and "model.engine.burn_in does not apply" in err


def test_entry_point_runs_as_a_module(tmp_path):
    ok = _run("check-config", str(ROOT / "config" / "production.example.toml"),
              env={"STREAMTOPICS_KAFKA__SASL_PLAIN_PASSWORD": "pw"})
    assert ok.returncode == 0, ok.stderr
    missing = _run("run", "--config", str(tmp_path / "nope.toml"))
    assert missing.returncode == 2 and "cannot read" in missing.stderr
    assert _run("--help").returncode == 0


# --------------------------------------------------------------------------- inspect


def test_inspect_shows_model_facts_and_top_words(tmp_path, capsys):
    docs = [d.text for d in load_reuters_r8("train")[:200]]
    m = TopicModel(n_topics=6, seed=1)
    for i in range(0, len(docs), 50):
        m.partial_fit(docs[i:i + 50])
    path = tmp_path / "m.stsnap"
    m.save(path, offsets={"documents:0": 200})
    assert main(["inspect", str(path), "--top", "4"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^version\s+4 global updates", out, re.M)
    assert re.search(r"^documents\s+200 seen", out, re.M)
    assert "K=6 topics" in out and f"V={len(m.vocab):,} words" in out and "engine=lsparse" in out
    assert "documents:0 -> 200" in out
    rows = re.findall(r"^\s+(\d)\s+(.+)$", out, re.M)
    assert [int(k) for k, _ in rows] == list(range(6))
    # each row: topic, prevalence, NPMI ("-": not measured in this snapshot), top words
    assert all(w.split()[0].endswith("%") and w.split()[1] == "-" for _, w in rows)
    assert [w.split()[2:] for _, w in rows] == [m.top_words(k, 4) for k in range(6)]

    assert main(["inspect", str(path), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["version"] == 4 and facts["docs_seen"] == 200 and facts["offsets"] == {"documents:0": 200}
    assert len(facts["top_words"]) == 6

    path.write_bytes(path.read_bytes()[:500])
    assert main(["inspect", str(path)]) == 2
    assert "truncated" in capsys.readouterr().err
    assert facts["classifier"] is None and facts["alpha_learned"] is True  # unsupervised: no classifier lines


def test_inspect_json_is_strict_json_for_a_model_with_no_words(tmp_path, capsys):
    """An untrained model has no diversity to measure: --json printed a bare NaN, which strict
    parsers refuse (export --format json printed null)."""
    path = tmp_path / "empty.stsnap"
    TopicModel(n_topics=5).save(path)
    assert main(["inspect", str(path), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert facts["diversity_top25"] is None and facts["vocabulary"] == 0


def test_inspect_shows_the_classifier_and_each_labels_strongest_topics(tmp_path, capsys):
    """A supervised snapshot says what its classifier is and, per label, which topics raise the
    label's score most (largest posterior mean weight first), and the alpha it actually uses."""
    docs = load_reuters_r8("train")[:300]
    m = TopicModel(n_topics=6, seed=1, supervision="logistic")
    for i in range(0, len(docs), 100):
        m.partial_fit([d.text for d in docs[i:i + 100]], labels=[d.label for d in docs[i:i + 100]])
    path = tmp_path / "sup.stsnap"
    m.save(path)
    assert main(["inspect", str(path), "--json"]) == 0
    c = json.loads(capsys.readouterr().out)["classifier"]
    assert (c["loss"], c["task"], c["features"], c["labelled_docs"], c["updates"]) == (
        "logistic", "multiclass", "unsupervised", 300, 3)
    assert [x["label"] for x in c["labels"]] == m.label_names and c["n_labels"] == len(m.label_names)
    for x, row in zip(c["labels"], m.head.eta_mean):
        assert [k for k, _ in x["topics"]] == [int(k) for k in (-row).argsort(kind="stable")[:3]]
        assert [w for _, w in x["topics"]] == sorted((w for _, w in x["topics"]), reverse=True)

    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"alpha=1 \(fixed\)", out)
    assert re.search(rf"^classifier\s+logistic \(multiclass\), {len(m.label_names)} labels, 300 labelled documents "
                     r'in 3 updates, features "unsupervised"$', out, re.M)
    top = c["labels"][0]["topics"][0][0]
    assert re.search(rf"^\s+{re.escape(m.label_names[0])}\s+{top} \([+-]\d+\.\d\d\),.*  "
                     + re.escape(" ".join(m.top_words(top, 4))) + "$", out, re.M)


# --------------------------------------------------------------------------- produce


def _count(bootstrap: str, topic: str, want: int) -> list[dict]:
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest",
                      fetch_max_wait_ms=100)
    out = []
    try:
        c.assign([TopicPartition(topic, 0)])
        c.seek_to_beginning()
        deadline = time.monotonic() + 10
        while len(out) < want and time.monotonic() < deadline:
            out += [msgpack.unpackb(r.value) for rs in c.poll(timeout_ms=100).values() for r in rs]
        out += [msgpack.unpackb(r.value) for rs in c.poll(timeout_ms=300).values() for r in rs]
    finally:
        c.close()
    return out


def test_produce_jsonl_text_and_corpus(broker, tmp_path, capsys):
    jl = tmp_path / "docs.jsonl"
    jl.write_text('{"id": "a", "text": "wheat exports rose"}\nnot json\n\n{"id": 2, "tokens": ["oil", "price"]}\n'
                  '5\n"just a string"\nnull\n[]\n')  # JSON, but no document maps: skipped too (docs audit)
    txt = tmp_path / "lines.txt"
    txt.write_text("first document here\n\nsecond document\n")
    topic = f"cli-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    assert main(["produce", "--bootstrap", broker.bootstrap, "--topic", topic, str(jl)]) == 0
    assert main(["produce", "--bootstrap", broker.bootstrap, "--topic", topic, str(txt)]) == 0
    assert main(["produce", "--bootstrap", broker.bootstrap, "--topic", topic, "--corpus", "r8",
                 "--limit", "25"]) == 0
    captured = capsys.readouterr()
    assert "5 lines skipped" in captured.out and "not JSON" in captured.err
    assert "a JSON number, not a document map" in captured.err and "a JSON null" in captured.err
    got = _count(broker.bootstrap, topic, 2 + 2 + 25)
    assert len(got) == 29
    assert got[:4] == [{"id": "a", "text": "wheat exports rose"}, {"id": 2, "tokens": ["oil", "price"]},
                       {"id": "lines:1", "text": "first document here"}, {"id": "lines:3", "text": "second document"}]
    r8 = load_reuters_r8("train")[:25]
    assert got[4:] == [{"id": d.id, "text": d.text, "label": d.label} for d in r8]
    assert main(["produce", "--bootstrap", broker.bootstrap, "--topic", topic]) == 2  # neither file nor corpus


def test_the_demo_sends_json_to_a_configuration_that_reads_json(broker):
    """demo --config with input.format = "json" sent msgpack, so every document was a
    malformed_json dead letter and the demo ended with an empty model and exit 0."""
    from streamtopics.cli import _demo_produce
    from streamtopics.stream.codec import Limits, decode_message

    r8 = load_reuters_r8("train")[:3]
    from streamtopics.testing.broker import create_topics

    topic = f"cli-json-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    create_topics(broker.bootstrap, {topic: 1})  # the demo creates its topics first too
    _demo_produce(broker.bootstrap, topic, r8, json_text=True)
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    try:
        c.assign([TopicPartition(topic, 0)])
        raws, deadline = [], time.monotonic() + 10
        while len(raws) < 3 and time.monotonic() < deadline:
            raws += [r.value for rs in c.poll(timeout_ms=200).values() for r in rs]
    finally:
        c.close()
    docs = [decode_message(v, Limits(), fmt="json") for v in raws]
    assert [(d[0][0].id, d[0][0].label, d[1]) for d in docs] == [(x.id, x.label, []) for x in r8]


# --------------------------------------------------------------------------- demo


def test_demo_keeps_the_table_fields_of_the_file_it_is_given(tmp_path):
    """demo --config wrote the old flat sparsity and min_word_len, which win over the table
    fields: a file's [model.engine] sparsity = 2 and [model.text] min_word_len = 6 became 5
    and 3. Now the file's own field is changed, and only to clamp it (sparsity <= K, min 3)."""
    import argparse
    import warnings

    from streamtopics.cli import _demo_config
    from streamtopics.config import model_from_config

    def run(text: str, topics):
        f = tmp_path / "c.toml"
        f.write_text(text)
        args = argparse.Namespace(config=str(f), topics=topics, unsupervised=True, batch=None)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing ignored with a warning either
            return model_from_config(_demo_config("127.0.0.1:9", args, tmp_path / "s")[0].model)

    m = run("[model]\n[model.engine]\nkind = \"lsparse\"\nsparsity = 2\n[model.text]\nmin_word_len = 6\n", 5)
    assert (m.n_topics, m.sparsity, m.min_word_len) == (5, 2, 6)
    m = run("[model]\n[model.engine]\nsparsity = 16\n[model.text]\nmin_word_len = 2\n", 5)
    assert (m.sparsity, m.min_word_len) == (5, 3)
    m = run("[model]\nsparsity = 2\nmin_word_len = 4\n", 6)  # flat keys of earlier files
    assert (m.sparsity, m.min_word_len) == (2, 4)
    m = run("[model]\n[model.engine]\nkind = \"alias\"\n[model.text]\nmin_word_len = 5\n", 5)
    assert (m.engine, m.min_word_len) == ("alias", 5)
    shipped = run((ROOT / "streamtopics" / "data" / "streamtopics.toml").read_text(), 20)
    assert (shipped.n_topics, shipped.sparsity, shipped.min_word_len) == (20, 8, 3)


def test_demo_end_to_end_small(tmp_path):
    """The embedded default on 300 documents: own broker, produce, daemon, summary, snapshot."""
    t0 = time.monotonic()
    res = _run("demo", "--docs", "300", "--topics", "5", "--batch", "50", "--no-color", "--dir",
               str(tmp_path / "demo"), timeout=170)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    out = res.stdout
    assert re.search(r"predictions\s+300\b", out) and re.search(r"dead letters\s+0\b", out)
    assert re.search(r"docs\s+300/300", out)  # a progress line reached the end
    assert len(re.findall(r"^\s+[0-4]\s+\d+\.\d%\s+\w+( \w+){9}$", out, re.M)) == 5  # share + ten top words per topic
    snap = re.search(r"^snapshot\s+(\S+\.stsnap)$", out, re.M).group(1)
    m = load_snapshot(snap)
    assert m.state.docs_seen == 300 and m.n_topics == 5
    assert (tmp_path / "demo" / "daemon.log").stat().st_size > 0
    assert time.monotonic() - t0 < 170


def test_export_and_counts_fail_cleanly(tmp_path, capsys):
    """A model with no words exported as JSON wrote NaN (not JSON) and as pyLDAvis a traceback; an
    unwritable output path a traceback; negative counts (--top -3) were taken. Now: valid JSON
    (null where a figure is undefined), one-line errors with exit 2, and argparse refusals."""
    import pytest

    empty = tmp_path / "empty.stsnap"
    TopicModel(n_topics=3).save(empty)
    assert main(["export", str(empty), "--format", "json"]) == 0
    view = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert view["diversity_top25"] is None and view["docs_seen"] == 0
    assert main(["export", str(empty), "--format", "pyldavis"]) == 2
    assert "no vocabulary yet" in capsys.readouterr().err
    m = TopicModel(n_topics=3)
    m.partial_fit(["space shuttle orbit nasa launch", "court judge law ruling appeal"])
    m.save(tmp_path / "m.stsnap")
    assert main(["export", str(tmp_path / "m.stsnap"), "--format", "csv", "-o", str(tmp_path / "no" / "x.csv")]) == 2
    assert capsys.readouterr().err.startswith(f"error: cannot write {tmp_path / 'no' / 'x.csv'}")
    for argv in (["export", str(tmp_path / "m.stsnap"), "--format", "csv", "--top", "-3"],
                 ["inspect", str(tmp_path / "m.stsnap"), "--top", "0"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2 and "must be at least 1" in capsys.readouterr().err


def test_python_dash_m_runs_the_command_line():
    out = subprocess.run([sys.executable, "-m", "streamtopics", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "check-config" in out.stdout


def test_check_config_warns_when_both_snapshot_triggers_are_off(tmp_path, capsys):
    """Both triggers at 0 is valid (snapshots after the first batch and at a graceful stop) but a
    crash then replays everything since the start: check-config said nothing (operator audit)."""
    path = tmp_path / "c.toml"
    path.write_text("[snapshot]\nevery_batches = 0\nevery_seconds = 0\n")
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "# warning: snapshot.every_batches = 0 and snapshot.every_seconds = 0" in out
    tomllib.loads(out)  # still a TOML file
    path.write_text("[snapshot]\nevery_batches = 0\n")
    assert main(["check-config", str(path)]) == 0
    assert "warning" not in capsys.readouterr().out
