"""The model's option objects (streamtopics.options): validation, equivalence with the flat
keywords, the config tables that map onto them, and the typed batch result."""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

from streamtopics import TopicModel, load_snapshot
from streamtopics.config import Config, ConfigError, model_from_config
from streamtopics.options import (FLAT, AliasMH, Hinge, Logistic, LSparse, Memoized, OptionError, Regression,
                                  Stochastic, Text, Vocabulary)
from streamtopics.results import BatchResult


def _docs(n=240, V=120, seed=0):
    rng = np.random.default_rng(seed)
    docs, labels = [], []
    for i in range(n):
        c = i % 3
        docs.append([f"w{c * 40 + rng.integers(40)}" if rng.random() < 0.7 else f"w{rng.integers(V)}"
                     for _ in range(25)])
        labels.append(f"c{c}")
    return docs, labels


def _stream(m, docs, labels=None, size=60):
    for lo in range(0, len(docs), size):
        m.partial_fit(docs[lo:lo + size], labels=None if labels is None else labels[lo:lo + size])
    return m


# -- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("make,text", [
    (lambda: LSparse(sparsity=0), "LSparse: sparsity must be an integer >= 1 (got 0)"),
    (lambda: LSparse(tol=0.0), "LSparse: tol must be > 0"),
    (lambda: AliasMH(tries=(1, 65)), "AliasMH: tries must be None, an integer in [1, 64]"),
    (lambda: AliasMH(proposal="both"), "AliasMH: proposal must be one of ('cycle', 'mixture')"),
    (lambda: Stochastic(forgetting_rate=0.5), "Stochastic: forgetting_rate must be in (0.5, 1]"),
    (lambda: Stochastic(corpus_size=0), "Stochastic: corpus_size must be None, 'seen'"),
    (lambda: Memoized(memo_window=0), "Memoized: memo_window must be None or >= 1"),
    (lambda: Hinge(ell=0.0), "Hinge: ell must be > 0 for the hinge loss"),
    (lambda: Logistic(c=0.5, pg_method="exact"), "Logistic: c must be >= 1 for exact Polya-Gamma"),
    (lambda: Regression(sweeps=0), "Regression: sweeps must be an integer >= 1"),
    (lambda: Text(min_word_len=5, max_word_len=3), "Text: max_word_len must be >= min_word_len (5)"),
    (lambda: Text(stopwords="klingon"), "Text: stopwords must be 'english', 'none'"),
    (lambda: Vocabulary(policy="lru"), "Vocabulary: policy must be one of ('ignore', 'evict')"),
])
def test_option_objects_validate_once_with_a_message_naming_the_field(make, text):
    with pytest.raises(OptionError) as e:
        make()
    assert str(e.value).startswith(text), str(e.value)
    assert isinstance(e.value, ValueError)


def test_options_are_frozen_and_normalised():
    a = AliasMH(tries=2)
    assert a.tries == (2, 2) and AliasMH(tries=[3, 1]).tries == (3, 1)
    assert AliasMH(tries=(3, None)).tries == (3, None) and AliasMH(tries=(None, None)).tries is None
    with pytest.raises(AttributeError):
        a.burn_in = 9  # type: ignore[misc]
    assert Text(stopwords={"b", "a"}).stopwords == ("a", "b")
    assert LSparse() == LSparse(sparsity=8) and hash(LSparse()) == hash(LSparse())


def test_flat_keywords_name_themselves_and_conflict_with_an_option_object():
    with pytest.raises(ValueError, match="^sup_c must be None or a finite number > 0"):
        TopicModel(supervision="hinge", sup_c=-1.0)
    with pytest.raises(ValueError, match="^vocab_cap must be None or >= 1"):
        TopicModel(vocab_cap=0)
    with pytest.raises(ValueError, match="sparsity given beside engine=LSparse"):
        TopicModel(engine=LSparse(sparsity=4), sparsity=4)
    with pytest.raises(ValueError, match="engine must be one of \\('lsparse', 'alias'\\)"):
        TopicModel(engine=Stochastic())
    with pytest.raises(TypeError, match="sparsty"):
        TopicModel(sparsty=4)
    # a keyword of the other kind is checked, then ignored (as before the option objects), with
    # a warning unless it is at its default (get_params() lists every keyword and must rebuild
    # the model silently, also through JSON, where tuples come back as lists)
    with pytest.raises(ValueError, match="burn_in"):
        TopicModel(burn_in=-1)
    with pytest.warns(UserWarning, match="burn_in=7 is ignored with engine='lsparse': it applies to engine='alias'"):
        assert TopicModel(burn_in=7).options.engine == LSparse()
    with pytest.warns(UserWarning, match="sparsity=4 is ignored with engine='alias'"):
        TopicModel(engine="alias", sparsity=4)
    with pytest.warns(UserWarning, match="sup_c=5.0 is ignored with supervision=None"):
        TopicModel(sup_c=5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for m in (TopicModel(engine="alias", tries=(2, 3)), TopicModel(supervision="hinge", sparsity=4)):
            TopicModel(**m.get_params())
            TopicModel(**json.loads(json.dumps(m.get_params())))


# -- one model, two spellings -----------------------------------------------------------------

def test_option_objects_give_the_same_topics_as_the_flat_keywords_bit_for_bit():
    docs, labels = _docs()
    a = _stream(TopicModel(6, engine=LSparse(sparsity=4, max_iter=40), update=Stochastic(corpus_size=500),
                           text=Text(min_word_len=1), vocabulary=Vocabulary(cap=100, policy="evict"), seed=2), docs)
    b = _stream(TopicModel(6, sparsity=4, max_iter=40, corpus_size=500, min_word_len=1, vocab_cap=100,
                           vocab_policy="evict", seed=2), docs)
    assert np.array_equal(a.state.mu, b.state.mu) and a.vocabulary == b.vocabulary
    assert a.get_params() == b.get_params() and a.sparsity == 4 and a.corpus_size == 500
    h1 = _stream(TopicModel(5, supervision=Hinge(c=2.0, sweeps=4), update=Memoized(memo_window=3)), docs, labels)
    h2 = _stream(TopicModel(5, supervision="hinge", sup_c=2.0, sup_sweeps=4, update="memoized", memo_window=3),
                 docs, labels)
    assert np.array_equal(h1.state.mu, h2.state.mu) and np.array_equal(h1.head.eta_mean, h2.head.eta_mean)
    assert h1.predict(docs[:30]) == h2.predict(docs[:30]) and h1.supervision == "hinge"


def test_get_params_rebuilds_the_model_and_snapshots_list_the_options(tmp_path):
    m = TopicModel(4, engine=AliasMH(tries=(2, 1), burn_in=2), supervision=Logistic(pg_method="gamma_sum"))
    assert TopicModel(**m.get_params()).options == m.options
    assert set(m.get_params()) >= set(FLAT) and m.engine == "alias" and m.tries == (2, 1)
    docs, labels = _docs(60)
    m.partial_fit(docs, labels=[lab == "c0" and "yes" or "no" for lab in labels])
    m.save(tmp_path / "m.stsnap")
    r = load_snapshot(tmp_path / "m.stsnap")
    assert r.options == m.options and np.array_equal(r.state.mu, m.state.mu)
    header, _ = m.snapshot_parts()
    assert header["options"]["engine"] == {"kind": "alias", "burn_in": 2, "sample_sweeps": 4, "mh_steps": None,
                                           "proposal": "cycle", "table_draws": None, "alpha_proposal": "word",
                                           "tries": [2, 1], "kernel": "auto"}
    assert header["options"]["supervision"]["pg_method"] == "gamma_sum"


# -- the config tables -------------------------------------------------------------------------

TABLES = {"n_topics": 12, "engine": {"kind": "alias", "burn_in": 3, "tries": 2, "proposal": "mixture"},
          "update": {"kind": "memoized", "memo_window": 0},
          "supervision": {"kind": "regression", "c": 2.0, "epsilon": 0.1, "sweeps": 6, "local": False},
          "text": {"min_word_len": 3, "max_word_len": 20}, "vocabulary": {"cap": 5000, "decay": 0.99}}
FLAT_KEYS = {"n_topics": 12, "engine": "alias", "burn_in": 3, "tries": 2, "proposal": "mixture", "update": "memoized",
             "memo_window": 0, "supervision": "regression", "sup_c": 2.0, "sup_epsilon": 0.1, "sup_sweeps": 6,
             "sup_local": False, "min_word_len": 3, "max_word_len": 20, "vocab_cap": 5000, "vocab_decay": 0.99}


def test_config_tables_and_flat_keys_make_the_same_model():
    by_table = Config.from_dict({"model": TABLES})
    by_flat = Config.from_dict({"model": FLAT_KEYS})
    assert by_table == by_flat and by_table.model.engine == "alias"
    made = model_from_config(by_table.model)
    # doc_tries not set: (2, None), the doc kind at the library's default (1 at K = 12)
    library = TopicModel(12, engine=AliasMH(burn_in=3, tries=(2, None), proposal="mixture"),
                         update=Memoized(memo_window=None),
                         supervision=Regression(c=2.0, epsilon=0.1, sweeps=6, local=False),
                         text=Text(min_word_len=3, max_word_len=20), vocabulary=Vocabulary(cap=5000, decay=0.99))
    assert made.get_params() == library.get_params()
    shown = by_table.to_dict()["model"]
    assert shown["engine"]["kind"] == "alias" and shown["engine"]["burn_in"] == 3 and "sparsity" not in shown["engine"]
    assert shown["supervision"] == {"kind": "regression", "c": 2.0, "prior_var": 0.0, "decay": 0.0, "sweeps": 6,
                                    "burn_in": -1, "max_labels": 0, "features": "auto", "local": False,
                                    "epsilon": 0.1}
    # the printed tables load back to the same configuration
    assert Config.from_dict({"model": shown}) == by_table


def test_config_table_errors_name_the_table_key():
    def errors(model, env=None):
        with pytest.raises(ConfigError) as e:
            Config.from_dict({"model": model}, env=env or {})
        return e.value.errors

    assert errors({"engine": {"kind": "lsparse", "sparsity": 0}}) == [
        "config error: model.engine.sparsity must be an integer >= 1 (got 0)"]
    assert errors({"engine": {"kind": "lsparse", "burn_in": 3}})[0].startswith(
        'config error: model.engine.burn_in does not apply to model.engine.kind = "lsparse"')
    assert "did you mean model.engine.sparsity?" in errors({"engine": {"sparsty": 3}})[0]
    assert errors({"text": {"min_word_len": 5, "max_word_len": 3}}) == [
        "config error: model.text.max_word_len must be >= min_word_len (5) (got 3)"]
    assert "model.supervision.c" in errors({"supervision": {"kind": "logistic", "c": 0.5, "pg_method": "exact"}})[0]
    env = {"STREAMTOPICS_MODEL__ENGINE__SPARSITY": "0"}
    assert "model.engine.sparsity (from STREAMTOPICS_MODEL__ENGINE__SPARSITY)" in errors({}, env)[0]
    # the environment may switch the kind while the file lists the other kind's fields
    cfg = Config.from_dict({"model": {"engine": {"kind": "lsparse", "sparsity": 4}}},
                           env={"STREAMTOPICS_MODEL__ENGINE": "alias", "STREAMTOPICS_MODEL__ENGINE__BURN_IN": "2"})
    assert cfg.model.engine == "alias" and cfg.model.burn_in == 2


# -- the typed batch result --------------------------------------------------------------------

def test_process_returns_a_typed_batch_result():
    docs, labels = _docs(120)
    m = TopicModel(4, supervision="hinge")
    m.partial_fit(docs[:60], labels=labels[:60])
    before = m.version
    res = m.process(m.prepare(m.tokenize(docs[60:])), learn=True, labels=labels[60:])
    assert isinstance(res, BatchResult)
    assert res.version_before == before and res.version == m.version == before + 1
    np.testing.assert_array_equal(res.theta, m.theta(res.doc_topic, res.alpha))
    assert res.label_names == ["c0", "c1", "c2"] and res.scores.shape == (60, 3)
    assert res.predicted == [res.label_names[i] for i in np.argmax(res.scores, axis=1)]
    assert res.stats is m.last_stats and res.stats["docs"] == 60
    assert res.doc_topic_supervised is not None and res.doc_topic_supervised.shape == res.doc_topic.shape
    p = TopicModel(4)
    plain = p.process(p.prepare(p.tokenize(docs[:5])), learn=True)
    assert plain.scores is None and plain.predicted is None and plain.label_names == []


def test_alias_kernel_is_an_option_keyword_and_a_config_field():
    """AliasMH.kernel reaches the engine from the keyword and from [model.engine]; it is checked,
    and it belongs to the alias engine only."""
    m = TopicModel(n_topics=6, engine="alias", kernel="mh")
    assert m.local_step.kernel == "mh" and m.get_params()["kernel"] == "mh"
    with pytest.raises(ValueError, match="kernel"):
        TopicModel(n_topics=6, engine="alias", kernel="fast")
    cfg = Config.from_dict({"model": {"n_topics": 10, "engine": {"kind": "alias", "kernel": "dense"}}})
    assert model_from_config(cfg.model).local_step.kernel == "dense"
    with pytest.raises(Exception, match="kernel"):
        Config.from_dict({"model": {"n_topics": 10, "engine": {"kind": "lsparse", "kernel": "dense"}}})
