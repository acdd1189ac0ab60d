"""Configuration: shipped files, defaults, env overrides, error messages, Kafka kwargs, masking."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from streamtopics.config import (
    Config,
    ConfigError,
    KafkaConfig,
    LimitsConfig,
    load_config,
)
from streamtopics.engines.alias_core import MAX_DOC_TRIES, resolve_steps, resolve_tries
from streamtopics.stream.codec import Limits

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TOML = ROOT / "config" / "streamtopics.toml"
PROD_TOML = ROOT / "config" / "production.example.toml"
PROD_ENV = {"STREAMTOPICS_KAFKA__SASL_PLAIN_PASSWORD": "s3cret-pw"}


def errors_of(data: dict, env: dict | None = None) -> list[str]:
    with pytest.raises(ConfigError) as ei:
        Config.from_dict(data, env or {})
    assert str(ei.value) == "\n".join(ei.value.errors)
    assert all(e.startswith("config error: ") for e in ei.value.errors)
    return ei.value.errors


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.toml"
    p.write_text(text, encoding="utf-8")
    return p


# --------------------------------------------------------------------------- shipped files


def test_default_file_equals_code_defaults_and_lists_every_key():
    assert load_config(DEFAULT_TOML, env={}) == Config()
    raw = tomllib.loads(DEFAULT_TOML.read_text())
    for name, section in Config().to_dict().items():
        assert set(raw[name]) == set(section), name  # every key present in the shipped file


def test_production_example_loads_with_password_from_env():
    cfg = load_config(PROD_TOML, env=PROD_ENV)
    k = cfg.kafka
    assert len(k.bootstrap_servers.split(",")) == 3
    assert (k.security_protocol, k.sasl_mechanism) == ("SASL_SSL", "SCRAM-SHA-512")
    assert k.ssl_cafile and k.sasl_plain_password == "s3cret-pw"
    assert cfg.model.update == "memoized" and cfg.metrics.host == "0.0.0.0"


def test_production_example_without_password_names_the_variable():
    with pytest.raises(ConfigError) as ei:
        load_config(PROD_TOML, env={})
    (err,) = ei.value.errors
    assert "kafka.sasl_plain_password" in err and "STREAMTOPICS_KAFKA__SASL_PLAIN_PASSWORD" in err


def test_no_file_means_defaults():
    cfg = load_config(None, env={})
    assert cfg == Config()
    assert cfg.kafka.bootstrap_servers == "127.0.0.1:9092"
    assert cfg.kafka.compression_type == "zstd" and cfg.kafka.enable_idempotence is False
    assert cfg.topics.input == "documents" and cfg.topics.snapshots == ""
    assert cfg.model.engine == "lsparse" and cfg.model.n_topics == 100 and cfg.model.forgetting_rate == 0.7
    assert cfg.batch.max_docs == 256 and cfg.snapshot.dir == "var/snapshots"
    assert cfg.metrics.port == 9464 and cfg.logging.level == "INFO"


def test_limits_section_mirrors_codec_limits():
    assert [f.name for f in dataclasses.fields(LimitsConfig)] == [f.name for f in dataclasses.fields(Limits)]
    assert Config().limits() == Limits()
    cfg = Config.from_dict({"limits": {"max_tokens": 7}})
    assert cfg.limits() == Limits(max_tokens=7) and cfg.limits.max_tokens == 7


def test_missing_or_invalid_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "nope.toml", env={})
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(write(tmp_path, "[model\n"), env={})


# --------------------------------------------------------------------------- env overrides


def test_env_overrides_parse_types(tmp_path):
    path = write(tmp_path, '[model]\nn_topics = 20\nengine = "lsparse"\n')  # restarts: an lsparse field
    env = {
        "STREAMTOPICS_KAFKA__BOOTSTRAP_SERVERS": "10.0.0.1:9092,10.0.0.2:9092",
        "STREAMTOPICS_MODEL__N_TOPICS": "50",  # env beats the file
        "STREAMTOPICS_MODEL__ALPHA": "0.5",
        "STREAMTOPICS_MODEL__RESTARTS": "no",
        "STREAMTOPICS_KAFKA__CREATE_TOPICS": "0",
        "STREAMTOPICS_KAFKA__SSL_CHECK_HOSTNAME": "Yes",
        "STREAMTOPICS_SNAPSHOT__EVERY_SECONDS": "5",
        "STREAMTOPICS_KAFKA__EXTRA_CONSUMER": "{max_poll_records = 100}",
        "STREAMTOPICS_CONFIG": "/ignored/not/a/key.toml",  # no "__": not a config key
        "HOME": "/root",
    }
    cfg = load_config(path, env=env)
    assert cfg.kafka.bootstrap_servers == "10.0.0.1:9092,10.0.0.2:9092"
    assert cfg.model.n_topics == 50 and cfg.model.engine == "lsparse"
    assert cfg.model.alpha == 0.5
    assert cfg.model.restarts is False and cfg.kafka.create_topics is False and cfg.kafka.ssl_check_hostname is True
    assert cfg.snapshot.every_seconds == 5.0 and isinstance(cfg.snapshot.every_seconds, float)
    assert cfg.kafka.extra_consumer == {"max_poll_records": 100}


def test_env_errors_name_the_variable():
    errs = errors_of({}, {
        "STREAMTOPICS_MODEL__N_TOPICS": "many",
        "STREAMTOPICS_MODEL__RESTARTS": "maybe",
        "STREAMTOPICS_MODEL__ENGINE": "gibbs",
        "STREAMTOPICS_MODEL__NTOPICS": "5",
        "STREAMTOPICS_MODLE__N_TOPICS": "5",
    })
    text = "\n".join(errs)
    assert 'model.n_topics (from STREAMTOPICS_MODEL__N_TOPICS) must be an integer in 2..100000 (got "many")' in text
    assert "model.restarts (from STREAMTOPICS_MODEL__RESTARTS) must be a boolean: one of true, false" in text
    assert 'model.engine (from STREAMTOPICS_MODEL__ENGINE) = "gibbs" is not one of: lsparse, alias' in text
    assert "STREAMTOPICS_MODEL__NTOPICS: unknown key model.ntopics (did you mean STREAMTOPICS_MODEL__N_TOPICS?)" in text
    assert "STREAMTOPICS_MODLE__N_TOPICS: unknown section 'modle' (did you mean STREAMTOPICS_MODEL__N_TOPICS?)" in text
    assert len(errs) == 5


# --------------------------------------------------------------------------- error messages


def test_error_names_key_and_allowed_values():
    assert errors_of({"model": {"engine": "gibbs"}}) == [
        'config error: model.engine = "gibbs" is not one of: lsparse, alias'
    ]
    assert errors_of({"batch": {"max_docs": 0}}) == ["config error: batch.max_docs must be an integer >= 1 (got 0)"]
    assert errors_of({"model": {"forgetting_rate": 0.5}}) == [
        "config error: model.forgetting_rate must be a number in (0.5, 1] (got 0.5)"
    ]
    assert errors_of({"metrics": {"port": 70000}}) == [
        "config error: metrics.port must be an integer in 0..65535 (got 70000)"
    ]
    assert errors_of({"model": {"n_topics": 2.5}}) == [
        "config error: model.n_topics must be an integer in 2..100000 (got 2.5)"
    ]
    assert errors_of({"model": {"restarts": "yes"}}) == ['config error: model.restarts must be true or false (got "yes")']
    assert errors_of({"model": {"alpha": float("inf")}}) == ["config error: model.alpha must be a number >= 0 (got inf)"]
    assert errors_of({"kafka": {"sasl_mechanism": "MD5"}})[0].startswith(
        'config error: kafka.sasl_mechanism = "MD5" is not one of: "" (empty), PLAIN, SCRAM-SHA-256'
    )
    assert errors_of({"topics": {"input": 5}}) == ["config error: topics.input must be a string (got 5)"]


def test_numbers_are_coerced_sensibly():
    cfg = Config.from_dict({"model": {"alpha": 1, "rho_min": 0}})
    assert cfg.model.alpha == 1.0 and isinstance(cfg.model.alpha, float)
    assert errors_of({"batch": {"max_docs": True}}) == ["config error: batch.max_docs must be an integer >= 1 (got true)"]


def test_unknown_keys_suggest_the_close_one():
    assert errors_of({"model": {"n_topic": 5}}) == [
        "config error: unknown key model.n_topic (did you mean model.n_topics?)"
    ]
    assert errors_of({"modle": {}}) == ["config error: unknown section [modle] (did you mean [model]?)"]
    assert errors_of({"model": {"zzz": 1}}) == ["config error: unknown key model.zzz"]
    assert errors_of({"kafka": {"extra_consumer": {"max_poll_record": 5}}}) == [
        "config error: kafka.extra_consumer.max_poll_record is not a kafka-python KafkaConsumer setting "
        "(did you mean kafka.extra_consumer.max_poll_records?)"
    ]


def test_a_flat_key_of_another_kind_is_an_error_unless_at_its_default():
    """[model] memo_window = 16 with the stochastic update was valid to check-config and ignored by
    the daemon without a word (the library warns; [model.update] memo_window was an error)."""
    assert errors_of({"model": {"memo_window": 16}}) == [
        'config error: model.memo_window = 16 does not apply to model.update = "stochastic" (the model would '
        "ignore it; it sets: births, corpus_size, delay, forgetting_rate, rho_min)"]
    assert errors_of({}, {"STREAMTOPICS_MODEL__BURN_IN": "9"})[0].startswith(
        'config error: model.burn_in = 9 does not apply to model.engine = "lsparse"')
    # an old full file lists every key at its default: nothing to say
    assert Config.from_dict({"model": {"memo_window": 256, "burn_in": 4}}, {}).model.memo_window == 256
    assert Config.from_dict({"model": {"update": "memoized", "memo_window": 16}}, {}).model.memo_window == 16


def test_a_key_above_every_section_names_its_section():
    # A user's first file often starts "n_topics = 50": TOML reads it as a top-level key, which
    # was reported as an unknown section with a suggestion of [topics] (the Kafka topic names).
    assert errors_of({"n_topics": 50}) == [
        "config error: n_topics = 50 is outside every [section]: keys go under their section's header "
        "(did you mean model.n_topics under [model]?)"
    ]
    assert errors_of({"bootstrap_servers": "h:9092"}) == [
        'config error: bootstrap_servers = "h:9092" is outside every [section]: keys go under their '
        "section's header (did you mean kafka.bootstrap_servers under [kafka]?)"
    ]
    assert errors_of({"zzz": 1}) == ["config error: unknown section [zzz]"]


def test_a_single_underscore_override_is_an_error_not_silence():
    # STREAMTOPICS_MODEL_N_TOPICS=50 was ignored without a word: the model ran with 100 topics.
    assert errors_of({}, {"STREAMTOPICS_MODEL_N_TOPICS": "50", "STREAMTOPICS_SNAPSHOT_EVERY_SECONDS": "5"}) == [
        "config error: STREAMTOPICS_MODEL_N_TOPICS is not read: a double underscore separates section and key "
        "(did you mean STREAMTOPICS_MODEL__N_TOPICS?)",
        "config error: STREAMTOPICS_SNAPSHOT_EVERY_SECONDS is not read: a double underscore separates section "
        "and key (did you mean STREAMTOPICS_SNAPSHOT__EVERY_SECONDS?)",
    ]
    # the tools' own variables are not config keys and stay untouched
    cfg = Config.from_dict({}, {"STREAMTOPICS_DATA_DIR": "/x", "STREAMTOPICS_BROKER_DIR": "/y",
                                "STREAMTOPICS_CONFIG": "c.toml", "STREAMTOPICS_MODEL__N_TOPICS": "7"})
    assert cfg.model.n_topics == 7


def test_all_errors_reported_together(tmp_path):
    path = write(
        tmp_path,
        """
        [model]
        engine = "gibbs"
        n_topics = 1
        n_topic = 3
        [batch]
        max_docs = 0
        [logging]
        level = "verbose"
        [snapshots]
        dir = "x"
        """,
    )
    with pytest.raises(ConfigError) as ei:
        load_config(path, env={"STREAMTOPICS_METRICS__PORT": "-1"})
    errs = ei.value.errors
    assert len(errs) == 7, errs
    msg = str(ei.value)
    for part in ("model.engine", "model.n_topics", "model.n_topic ", "batch.max_docs", "logging.level",
                 "[snapshots] (did you mean [snapshot]?)", "STREAMTOPICS_METRICS__PORT"):
        assert part in msg, part


def test_cross_field_rules():
    errs = "\n".join(errors_of({
        "kafka": {"heartbeat_interval_ms": 10000, "session_timeout_ms": 5000, "fetch_max_wait_ms": 40000},
        "topics": {"output": "documents", "dead_letter": "bad topic!"},
        "batch": {"max_docs": 500, "max_inflight_predictions": 100},
    }))
    assert "kafka.heartbeat_interval_ms (10000) must be less than kafka.session_timeout_ms (5000)" in errs
    assert "kafka.fetch_max_wait_ms (40000) must be less than kafka.request_timeout_ms (30000)" in errs
    assert "topics.output and topics.input must differ" in errs
    assert 'topics.dead_letter = "bad topic!" is not a valid Kafka topic name' in errs
    assert "batch.max_inflight_predictions (100) must be >= batch.max_docs (500)" in errs


def test_replication_topics_are_checked_with_the_others():
    """updates_topic = the input topic was valid to check-config; at run time the daemon read its
    own update records as documents (150 errors, records dead-lettered); = the output topic wrote
    them into the predictions; an invalid name left the replica never ready (replicas audit)."""
    errs = errors_of({"replication": {"enabled": True, "updates_topic": "documents", "snapshots_topic": "upd log!"}})
    assert errs == [
        'config error: replication.snapshots_topic = "upd log!" is not a valid Kafka topic name '
        "(1-249 characters from A-Z a-z 0-9 . _ -)",
        'config error: replication.updates_topic and topics.input must differ (both "documents")',
    ]
    # off, the replication table is not read
    assert Config.from_dict({"replication": {"updates_topic": "documents"}}, {}).replication.enabled is False


@pytest.mark.parametrize("engine", ["lsparse", "alias"])
def test_fewer_topics_than_the_sparsity_is_the_dense_step(engine):
    """n_topics below the default sparsity (8) loads as the library takes it: sparsity >= n_topics
    is the exact dense step (README). The config refused it, and for the alias engine offered no
    key to lower the sparsity with ([model.engine] sparsity does not apply to it)."""
    from streamtopics.config import model_from_config
    from streamtopics.model import TopicModel

    cfg = Config.from_dict({"model": {"n_topics": 2, "engine": {"kind": engine}}})
    assert model_from_config(cfg.model).get_params() == TopicModel(n_topics=2, engine=engine).get_params()


def test_security_consistency_rules():
    errs = "\n".join(errors_of({"kafka": {"security_protocol": "SASL_SSL"}}))
    assert "kafka.sasl_mechanism must be set when kafka.security_protocol = \"SASL_SSL\"" in errs
    errs = "\n".join(errors_of({"kafka": {"sasl_mechanism": "PLAIN", "ssl_cafile": "ca.pem"}}))
    assert "kafka.sasl_mechanism is set but kafka.security_protocol = \"PLAINTEXT\" does not use SASL" in errs
    assert "kafka.ssl_cafile is set but kafka.security_protocol = \"PLAINTEXT\" does not use TLS" in errs
    errs = errors_of({"kafka": {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                                "sasl_plain_password": "hunter2"}})
    assert errs == ['config error: kafka.sasl_plain_username must be set for kafka.sasl_mechanism = "SCRAM-SHA-256"']


def test_settings_the_daemons_guarantees_rest_on_cannot_be_overridden_and_brokers_are_host_port():
    """extra_consumer = { enable_auto_commit = true } was passed verbatim ("they win") and silently
    committed offsets no snapshot held; a bootstrap entry like "not a host" was accepted."""
    errs = "\n".join(errors_of({"kafka": {"extra_consumer": {"enable_auto_commit": True, "group_id": "x",
                                                             "max_poll_records": 10},
                                          "extra_producer": {"acks": 1, "linger_ms": 0}}}))
    assert "kafka.extra_consumer.enable_auto_commit cannot be set: offsets are committed only once" in errs
    assert "kafka.extra_consumer.group_id cannot be set: use kafka.group_id" in errs
    assert "kafka.extra_producer.acks cannot be set" in errs
    assert "max_poll_records" not in errs and "linger_ms" not in errs
    for bad in ("not a host", "h:0", "h:x", "a:1,,b:2", ":9092", "h:99999"):
        assert "kafka.bootstrap_servers entry" in "\n".join(errors_of({"kafka": {"bootstrap_servers": bad}})), bad
    for good in ("127.0.0.1:9092", "broker-1.example.com:9093, broker-2:9093", "[::1]:9092", "kafka", "::1"):
        assert Config.from_dict({"kafka": {"bootstrap_servers": good}}, env={}).kafka.bootstrap_servers == good


def test_secret_never_appears_in_errors():
    errs = "\n".join(errors_of({"kafka": {"sasl_plain_password": 123456}}))
    assert "kafka.sasl_plain_password must be a string (got ***)" in errs and "123456" not in errs


# --------------------------------------------------------------------------- kafka kwargs


def test_kafka_kwargs_plaintext_defaults():
    k = KafkaConfig()
    c, p, a = k.consumer_kwargs(), k.producer_kwargs(), k.admin_kwargs()
    for kw in (c, p, a):
        assert kw["bootstrap_servers"] == "127.0.0.1:9092" and kw["security_protocol"] == "PLAINTEXT"
        assert "" not in kw.values()
        assert not any(key.startswith(("sasl_", "ssl_")) for key in kw)
    assert c["enable_auto_commit"] is False and c["auto_offset_reset"] == "earliest"
    assert c["group_id"] == "streamtopics" and c["session_timeout_ms"] == 10000 and c["fetch_max_wait_ms"] == 100
    # metadata at most 30 s old (kafka-python: 5 min): new partitions of the input are read soon
    assert c["metadata_max_age_ms"] == p["metadata_max_age_ms"] == 30000
    assert "value_deserializer" not in c and "value_serializer" not in p
    assert p["acks"] == "all" and p["enable_idempotence"] is False
    assert p["compression_type"] == "zstd" and p["linger_ms"] == 10 and p["batch_size"] == 262144
    assert p["max_in_flight_requests_per_connection"] == 5
    assert "compression_type" not in Config.from_dict({"kafka": {"compression_type": "none"}}).kafka.producer_kwargs()


def test_kafka_kwargs_carry_sasl_ssl_settings():
    cfg = load_config(PROD_TOML, env=PROD_ENV)
    for kw in (cfg.kafka.consumer_kwargs(), cfg.kafka.producer_kwargs(), cfg.kafka.admin_kwargs()):
        assert kw["security_protocol"] == "SASL_SSL"
        assert kw["sasl_mechanism"] == "SCRAM-SHA-512"
        assert kw["sasl_plain_username"] == "streamtopics" and kw["sasl_plain_password"] == "s3cret-pw"
        assert kw["ssl_cafile"] == "/etc/streamtopics/tls/ca.pem" and kw["ssl_check_hostname"] is True
        assert "ssl_certfile" not in kw and "ssl_keyfile" not in kw  # empty ones omitted
    assert cfg.kafka.consumer_kwargs()["max_poll_records"] == 1000  # extra_consumer passed through
    assert cfg.kafka.producer_kwargs()["delivery_timeout_ms"] == 120000


def test_extra_tables_win():
    k = Config.from_dict({"kafka": {"extra_producer": {"enable_idempotence": True, "linger_ms": 0}}}).kafka
    assert k.producer_kwargs()["enable_idempotence"] is True and k.producer_kwargs()["linger_ms"] == 0


def test_kwargs_are_known_to_kafka_python():
    kafka = pytest.importorskip("kafka")
    cfg = load_config(PROD_TOML, env=PROD_ENV)
    assert set(cfg.kafka.consumer_kwargs()) <= set(kafka.KafkaConsumer.DEFAULT_CONFIG)
    assert set(cfg.kafka.producer_kwargs()) <= set(kafka.KafkaProducer.DEFAULT_CONFIG)
    assert set(cfg.kafka.admin_kwargs()) <= set(kafka.KafkaAdminClient.DEFAULT_CONFIG)


# --------------------------------------------------------------------------- to_dict


def test_to_dict_masks_password_and_is_plain():
    cfg = load_config(PROD_TOML, env=PROD_ENV | {
        "STREAMTOPICS_KAFKA__EXTRA_PRODUCER": '{ssl_password = "keypw", linger_ms = 3}',
    })
    d = cfg.to_dict()
    assert d["kafka"]["sasl_plain_password"] == "***"
    assert d["kafka"]["extra_producer"] == {"ssl_password": "***", "linger_ms": 3}
    dumped = json.dumps(d)  # plain types only: goes into logs and snapshot headers
    assert "s3cret-pw" not in dumped and "keypw" not in dumped
    assert set(d) == {"kafka", "topics", "input", "model", "batch", "snapshot", "metrics", "logging", "limits",
                      "replication"}
    assert Config().to_dict()["kafka"]["sasl_plain_password"] == ""  # unset stays visibly unset


def test_config_is_immutable():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Config().model.n_topics = 3  # type: ignore[misc]


def test_alias_settings_reach_the_model():
    """The [model] alias keys build the engine the daemon runs (0 = the library's auto choice)."""
    from streamtopics.config import model_from_config

    base = {"model": {"engine": "alias", "n_topics": 512, "burn_in": 1, "sample_sweeps": 2, "mh_steps": 3}}
    m = model_from_config(Config.from_dict(base).model)
    assert (m.burn_in, m.sample_sweeps, m.mh_steps, m.tries) == (1, 2, 3, None)
    assert resolve_tries(m.local_step.tries, 512) == (2, 3)
    # a kind left at 0 keeps the library's rule, which may depend on the documents (alpha, lengths)
    m = model_from_config(Config.from_dict({"model": {**base["model"], "tries": 3}}).model)
    assert m.tries == (3, None)
    assert resolve_tries(m.tries, 512) == (3, 3)
    short = np.array([0, 4, 8, 12])  # 4-token documents, K alpha = 256: the rule's cap
    assert resolve_steps(m.mh_steps, m.tries, 512, short, 0.5) == (3, (3, MAX_DOC_TRIES))
    m = model_from_config(Config.from_dict({"model": {**base["model"], "doc_tries": 2}}).model)
    assert m.tries == (None, 2)
    assert resolve_tries(m.tries, 512) == (2, 2) and resolve_tries(m.tries, 100) == (1, 2)
    m = model_from_config(Config.from_dict({"model": {**base["model"], "tries": 4, "doc_tries": 5}}).model)
    assert m.tries == (4, 5)
    # mh_steps = 0 is the library's auto: 1 step with (2, 3) at K >= 256, 2 steps with (1, 1) below
    m = model_from_config(Config.from_dict({"model": {**base["model"], "mh_steps": 0}}).model)
    assert m.mh_steps is None
    assert resolve_steps(m.mh_steps, m.tries, 512) == (1, (2, 3))
    assert resolve_steps(None, None, 100) == (2, (1, 1))
    assert resolve_steps(None, (2, 1), 512) == (2, (2, 1))  # tries chosen by hand: 2 steps, as before
    with pytest.raises(ValueError, match="mh_steps"):
        resolve_steps(0, None, 512)
    with pytest.raises(ConfigError, match="doc_tries"):
        Config.from_dict({"model": {**base["model"], "doc_tries": 65}})


@pytest.mark.parametrize("engine", ["lsparse", "alias"])
@pytest.mark.parametrize("supervision", ["hinge", "logistic", "regression"])
def test_a_loss_alone_gives_the_library_model(tmp_path, capsys, supervision, engine):
    """Choosing the loss (and the engine) and leaving every other key to the library gives the
    model ``TopicModel(supervision=..., engine=...)`` builds: each config default is a value the
    option objects accept. (pg_method's once was None, and every logistic configuration failed to
    load.) ``check-config`` says what the library makes of alpha and the classifier's features."""
    from streamtopics.cli import main
    from streamtopics.config import model_from_config
    from streamtopics.model import TopicModel

    cfg = Config.from_dict({"model": {"supervision": supervision, "engine": engine}})
    assert model_from_config(cfg.model).get_params() == TopicModel(supervision=supervision, engine=engine).get_params()
    path = write(tmp_path, f'[model]\nsupervision = "{supervision}"\n\n[model.engine]\nkind = "{engine}"\n')
    assert main(["check-config", str(path)]) == 0
    out = capsys.readouterr().out
    features = "mean-field" if engine == "alias" else "unsupervised"
    assert f'model.supervision.features = "auto" -> "{features}" (engine "{engine}")' in out
    alpha = "1, fixed" if engine == "lsparse" else "learned from the stream, from 1/100"
    assert f"model.alpha = 0 -> {alpha}" in out


def test_input_format_and_segmentation_keys():
    """issue 14: input.format (msgpack | json | auto) and model.segmentation reach the daemon's parts."""
    from streamtopics.config import model_from_config

    cfg = load_config(None, env={"STREAMTOPICS_INPUT__FORMAT": "auto", "STREAMTOPICS_MODEL__SEGMENTATION": "cjk_bigrams"})
    assert cfg.input.format == "auto" and cfg.model.segmentation == "cjk_bigrams"
    assert model_from_config(cfg.model).tokenizer("机器学习") == ["机器", "器学", "学习"]
    assert Config().input.format == "msgpack" and Config().model.segmentation == "whitespace"
    errs = "\n".join(errors_of({"input": {"format": "xml"}, "model": {"segmentation": "icu"}}))
    assert 'input.format = "xml" is not one of: msgpack, json, auto' in errs
    assert 'model.segmentation = "icu" is not one of: whitespace, cjk_bigrams' in errs


def test_the_shipped_short_form_and_its_table_together_say_which_line_to_delete(tmp_path):
    """The shipped file sets supervision = "none" and shows a [model.supervision] table in a
    comment; uncommenting the table alone gave TOML's bare 'Cannot overwrite a value'."""
    shipped = (Path(__file__).parents[1] / "streamtopics" / "data" / "streamtopics.toml").read_text()
    f = tmp_path / "c.toml"
    f.write_text(shipped + '\n[model.supervision]\nkind = "hinge"\n')
    with pytest.raises(ConfigError) as e:
        load_config(f, env={})
    msg = str(e.value)
    assert "[model.supervision] table while [model] sets supervision = ... already" in msg
    assert "delete the supervision = ... line" in msg
    f.write_text(shipped.replace('\nsupervision = "none"\n', "\n") + '\n[model.supervision]\nkind = "hinge"\n')
    from streamtopics.config import model_from_config

    assert model_from_config(load_config(f, env={}).model).supervision == "hinge"


def test_more_threads_than_cores_is_warned_about(monkeypatch):
    """threads = 1000 on a 2-core machine was taken without a word (999 helper threads taking turns)."""
    from streamtopics import config as config_mod
    from streamtopics import parallel

    monkeypatch.setattr(parallel, "available_cores", lambda: 2)
    warned = config_mod.config_warnings(Config.from_dict({"model": {"threads": 1000}}, env={}))
    assert any("model.threads = 1000 is more than the 2 cores" in w for w in warned), warned
    for ok in (0, 1, 2):
        assert not any("model.threads" in w for w in
                       config_mod.config_warnings(Config.from_dict({"model": {"threads": ok}}, env={})))


def test_fields_of_the_kind_an_environment_override_switched_away_from_are_warned_about():
    """STREAMTOPICS_MODEL__ENGINE__KIND=lsparse over a file of the alias engine dropped the file's
    sample_sweeps without a word (engines audit); it stays valid (the override is the point) and
    says what it ignores."""
    from streamtopics.config import config_warnings

    data = {"model": {"n_topics": 20, "engine": {"kind": "alias", "sample_sweeps": 8}}}
    assert config_warnings(Config.from_dict(data, env={})) == []
    cfg = Config.from_dict(data, env={"STREAMTOPICS_MODEL__ENGINE__KIND": "lsparse"})
    assert cfg.model.engine == "lsparse"
    warned = [w for w in config_warnings(cfg) if "sample_sweeps" in w]
    assert len(warned) == 1 and "comes from the environment, so it is ignored" in warned[0]
    # without the override the same file with kind = "lsparse" is an error, as before
    with pytest.raises(ConfigError, match="sample_sweeps does not apply"):
        Config.from_dict({"model": {"engine": {"kind": "lsparse", "sample_sweeps": 8}}}, env={})
