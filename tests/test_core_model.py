"""TopicModel public API on synthetic LDA corpora with known topics (and a little Reuters R8)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from streamtopics.corpora import load_reuters_r8
from streamtopics.model import TopicModel

K_TRUE = 5
V_TRUE = 100


def make_lda(n_topics=K_TRUE, n_words=V_TRUE, n_docs=300, doc_len=80, alpha=0.05, block_mass=0.95, seed=0):
    """Documents from LDA with well-separated topics: topic k puts block_mass on its own block of words."""
    rng = np.random.default_rng(seed)
    block = n_words // n_topics
    phi = np.full((n_topics, n_words), (1 - block_mass) / (n_words - block))
    for k in range(n_topics):
        phi[k, k * block:(k + 1) * block] = block_mass * rng.dirichlet(np.ones(block))
    phi /= phi.sum(axis=1, keepdims=True)
    theta = rng.dirichlet(np.full(n_topics, alpha), size=n_docs)
    words = [f"w{v:03d}" for v in range(n_words)]
    docs = []
    for d in range(n_docs):
        ids = rng.choice(n_words, size=rng.poisson(doc_len) + 5, p=theta[d] @ phi)
        docs.append([words[i] for i in ids])
    return phi, theta, docs, words


@pytest.fixture(scope="module")
def lda():
    return make_lda(seed=1)


def fit(docs, update="stochastic", passes=4, batch=50, **kw):
    params = dict(n_topics=K_TRUE, sparsity=3, update=update, alpha=0.1, beta=0.01, seed=0)
    params.update(kw)
    m = TopicModel(**params)
    for _ in range(passes):
        for b in range(0, len(docs), batch):
            m.partial_fit(docs[b:b + batch], batch_key=b if update == "memoized" else None)
    return m


def aligned_topics(m: TopicModel, words) -> np.ndarray:
    idx = [m.vocab.get(w) for w in words]
    assert min(idx) >= 0
    return m.topic_word()[:, idx]


def cosine(a, b):
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return a @ b.T


# -- API contract ---------------------------------------------------------------------------------

def test_api_shapes_and_normalisation(lda):
    _, _, docs, words = lda
    m = TopicModel(n_topics=K_TRUE, engine="lsparse", sparsity=2, update="stochastic", alpha=0.1, beta=0.01, seed=0)
    assert m.partial_fit(docs[:50]) is m
    assert m.partial_fit(docs[50:100]) is m
    V = len(m.vocabulary)
    assert V == len(set(m.vocabulary)) and set(m.vocabulary) <= set(words)
    tw = m.topic_word()
    assert tw.shape == (K_TRUE, V) and np.all(tw > 0)
    np.testing.assert_allclose(tw.sum(axis=1), 1.0, rtol=1e-12)
    theta = m.transform(docs[100:140] + [[], ["unknown", "tokens"]])
    assert theta.shape == (42, K_TRUE) and np.all(theta > 0)
    np.testing.assert_allclose(theta.sum(axis=1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(theta[40], 1.0 / K_TRUE)  # empty doc -> the prior mean
    np.testing.assert_allclose(theta[41], 1.0 / K_TRUE)  # unknown words only
    assert len(m.vocabulary) == V  # transform never grows the vocabulary
    for k in range(K_TRUE):
        top = m.top_words(k, 5)
        assert len(top) == 5 == len(set(top))
        row = tw[k]
        assert [row[m.vocab.get(w)] for w in top] == sorted(row[[m.vocab.get(w) for w in top]], reverse=True)
        assert row[m.vocab.get(top[-1])] >= np.sort(row)[-5]
    assert len(m.top_words(0, 10 ** 6)) == V
    with pytest.raises(IndexError):
        m.top_words(K_TRUE)
    assert m.version == 2 and m.state.docs_seen == 100


def test_prequential_predictions_come_before_learning(lda):
    _, _, docs, _ = lda
    m = fit(docs[:100], passes=1)
    ref = fit(docs[:100], passes=1)
    before = ref.transform(docs[100:150])
    theta = m.partial_fit_transform(docs[100:150])
    np.testing.assert_array_equal(theta, before)
    assert m.version == ref.version + 1


def test_real_text_smoke():
    docs = [d.text for d in load_reuters_r8("train", seed=0)[:300]]
    m = TopicModel(n_topics=8, sparsity=4, seed=0)
    for b in range(0, 240, 60):
        m.partial_fit(docs[b:b + 60])
    theta = m.transform(docs[240:300])
    np.testing.assert_allclose(theta.sum(axis=1), 1.0, rtol=1e-12)
    assert m.last_stats["docs"] == 60 and m.last_stats["tokens"] > 1000
    assert m.last_stats["mean_iterations"] >= 1
    assert all(w not in {"the", "and", "of"} for k in range(8) for w in m.top_words(k, 20))
    ll = m.heldout_loglik(docs[240:300])
    assert math.isfinite(ll) and ll > -math.log(len(m.vocabulary))


# -- learning quality -------------------------------------------------------------------------------

@pytest.mark.parametrize("update", ["stochastic", "memoized"])
def test_recovers_well_separated_topics(lda, update):
    phi, _, docs, words = lda
    m = fit(docs, update=update, passes=4)
    cos = cosine(phi, aligned_topics(m, words))
    best = cos.max(axis=1)
    assert np.all(best > 0.9), best
    # One-to-one: each true topic matched by a different learned topic.
    assert len(set(cos.argmax(axis=1).tolist())) == K_TRUE


def test_heldout_loglik_improves_with_learning(lda):
    phi, _, docs, words = lda
    train, test = docs[:250], docs[250:]
    # Untrained: vocabulary known, topics at the prior (all uniform) -> exactly -log V per token.
    blank = TopicModel(n_topics=K_TRUE, sparsity=3, alpha=0.1, beta=0.01, seed=0)
    blank.prepare(blank.tokenize(train))
    V = len(blank.vocabulary)
    ll_blank = blank.heldout_loglik(test)
    assert ll_blank == pytest.approx(-math.log(V), abs=1e-12)
    # Initialised (k-means++ seeds + smoothing) but no update yet.
    init = TopicModel(n_topics=K_TRUE, sparsity=3, alpha=0.1, beta=0.01, seed=0)
    init.prepare(init.tokenize(train))
    first = init.prepare(init.tokenize(train[:50]))
    init.initialize(first)
    ll_init = init.heldout_loglik(test)
    trained = fit(train, passes=3)
    ll_trained = trained.heldout_loglik(test)
    assert all(math.isfinite(x) for x in (ll_blank, ll_init, ll_trained))
    assert ll_init > ll_blank
    assert ll_trained > ll_init + 0.2, (ll_blank, ll_init, ll_trained)
    # The generating topics are an upper reference point the trained model gets close to.
    from streamtopics.evaluate import heldout_loglik_arrays

    true_tw = np.zeros((K_TRUE, V))
    true_tw[:, [trained.vocab.get(w) for w in words]] = phi
    batch = trained.prepare(trained.tokenize(test), grow=False)
    ll_true = heldout_loglik_arrays(true_tw, batch, 0.1)
    assert ll_trained > ll_true - 0.1, (ll_trained, ll_true)
    # Same seed for the split -> the score is deterministic.
    assert trained.heldout_loglik(test) == ll_trained


def test_memoized_and_stochastic_learn_comparable_models(lda):
    _, _, docs, _ = lda
    test = docs[250:]
    ll = {u: fit(docs[:250], update=u, passes=3).heldout_loglik(test) for u in ("stochastic", "memoized")}
    assert abs(ll["stochastic"] - ll["memoized"]) < 0.1, ll


def test_sparsity_one_and_dense_both_learn(lda):
    phi, _, docs, words = lda
    for L in (1, K_TRUE):
        m = fit(docs, passes=3, sparsity=L)
        assert cosine(phi, aligned_topics(m, words)).max(axis=1).min() > 0.8, L


# -- determinism ----------------------------------------------------------------------------------

@pytest.mark.parametrize("update", ["stochastic", "memoized"])
def test_same_seed_same_model(lda, update):
    _, _, docs, _ = lda
    a = fit(docs[:150], update=update, passes=2, seed=7)
    b = fit(docs[:150], update=update, passes=2, seed=7)
    assert a.state.mu.tobytes() == b.state.mu.tobytes()
    assert a.state.mu_totals.tobytes() == b.state.mu_totals.tobytes()
    assert a.vocabulary == b.vocabulary
    c = fit(docs[:150], update=update, passes=2, seed=8)
    assert c.state.mu.tobytes() != a.state.mu.tobytes()


# -- parameter validation ---------------------------------------------------------------------------

VALID_BAD = [
    ("n_topics", 1), ("n_topics", 2.5), ("engine", "gibbs"), ("sparsity", 0), ("sparsity", 1.5),
    ("update", "online"), ("alpha", 0.0), ("alpha", -1.0), ("beta", 0.0), ("max_iter", 0), ("tol", 0.0),
    ("active_eps", -0.1), ("init", "kmeans"), ("delay", -1.0), ("forgetting_rate", 0.4),
    ("forgetting_rate", 1.5), ("rho_min", 1.0), ("corpus_size", 0), ("stopwords", "klingon"),
]


@pytest.mark.parametrize("name,value", VALID_BAD, ids=[f"{n}={v!r}" for n, v in VALID_BAD])
def test_invalid_parameter_raises_value_error_naming_it(name, value):
    with pytest.raises(ValueError, match=name):
        TopicModel(**{name: value})


MISNAMED = [
    ("memo_window", 0, {"update": "memoized"}, "message says 'memoized window'"),
    ("vocab_cap", 0, {}, "message says 'vocabulary cap'"),
    ("vocab_policy", "lru", {}, "message says 'vocabulary policy'"),
    ("vocab_decay", 0.0, {}, "message says 'vocabulary decay'"),
    ("min_word_len", 0, {}, "message says 'min_len'"),
    ("max_word_len", 1, {"min_word_len": 2}, "message says 'max_len'"),
]


@pytest.mark.parametrize("name,value,extra,what", MISNAMED, ids=[m[0] for m in MISNAMED])
def test_invalid_parameter_named_by_its_keyword(name, value, extra, what):
    with pytest.raises(ValueError, match=name):
        TopicModel(**{name: value}, **extra)


def test_invalid_parameters_of_other_components_still_raise_value_error():
    for kw in ({"update": "memoized", "memo_window": 0}, {"vocab_cap": 0}, {"vocab_policy": "lru"},
               {"vocab_decay": 1.5}, {"min_word_len": 0}, {"min_word_len": 5, "max_word_len": 3}):
        with pytest.raises(ValueError):
            TopicModel(**kw)


UNCHECKED = [
    ("restart_iters", 0, {}), ("restart_trials", -1, {}), ("init_smoothing", -1.0, {}),
    ("forgetting_rate", 5.0, {"update": "memoized"}), ("memo_window", 0, {"update": "stochastic"}),
]


@pytest.mark.parametrize("name,value,extra", UNCHECKED, ids=[f"{n}={v!r}" for n, v, _ in UNCHECKED])
def test_unchecked_parameters_are_rejected(name, value, extra):
    with pytest.raises(ValueError, match=name):
        TopicModel(**{name: value}, **extra)


def test_memoized_batch_key_type_is_checked(lda):
    _, _, docs, _ = lda
    m = TopicModel(n_topics=3, update="memoized")
    with pytest.raises(TypeError, match="batch_key"):
        m.partial_fit(docs[:10], batch_key=("a", 1))
    with pytest.raises(RuntimeError, match="memoized"):
        TopicModel(n_topics=3).elbo()


@pytest.mark.parametrize("engine", ["lsparse", "alias"])
def test_inference_before_any_topics_says_so(engine):
    """A model that has learned no topics raised ZeroDivisionError from deep in a kernel on
    transform, predict and a partial_fit of wordless documents; now NotFittedError says what to
    do. fit on a corpus without words leaves the model as it was, on both engines."""
    from streamtopics import NotFittedError

    m = TopicModel(n_topics=5, engine=engine)
    with pytest.raises(NotFittedError, match="no topics yet"):
        m.transform(["space nasa"])
    assert m.partial_fit(["", "   "]).version == 0  # nothing to learn from: a no-op, as fit([]) is
    with pytest.raises(NotFittedError):
        TopicModel(n_topics=5, engine=engine, supervision="hinge").predict(["space nasa"])
    assert m.fit([]).version == 0 and m.fit(["", " "]).version == 0
    m.partial_fit(["space shuttle orbit nasa launch", "court judge law ruling"])
    assert m.transform(["space nasa"]).shape == (1, 5)


def test_the_library_on_odd_inputs_answers_as_the_daemon_does():
    """Found on the user's path: partial_fit([]) on a fresh model raised NotFittedError (a no-op
    once fitted); inf was taken for beta, init_smoothing and corpus_size (a useless model);
    generator labels were refused while generator docs were taken; a one-label list for a
    multi-class model raised TypeError though the daemon takes it; heldout_loglik gave NaN with
    a numpy warning for no known word, and before any topics."""
    import warnings

    from streamtopics import NotFittedError

    m = TopicModel(n_topics=3, seed=0)
    assert m.partial_fit_transform([]).shape == (0, 3) and m.partial_fit_transform([""]).shape == (1, 3)
    assert not m.state.initialized and m.state.docs_seen == 0
    for kw in ({"beta": float("inf")}, {"init_smoothing": float("inf")}, {"corpus_size": float("inf")},
               {"alpha": float("nan")}):
        with pytest.raises(ValueError, match="finite|>= 1"):
            TopicModel(**kw)
    docs = ["oil wheat price crude", "bank rate money loans", "oil price crude barrels", "bank loans rate"]
    with pytest.raises(NotFittedError):
        m.heldout_loglik(docs)
    h = TopicModel(n_topics=3, supervision="hinge", seed=0)
    h.partial_fit(iter(docs), labels=(x for x in ["oil", "bank", "oil", "bank"]))
    h.partial_fit(docs, labels=[["oil"], "bank", None, ("bank",)])  # one-label lists are labels
    assert h.head.task == "multiclass" and h.label_names == ["oil", "bank"] and h.head.docs_seen == 7
    with pytest.raises(ValueError, match="document 0: 'labels' has 2 labels, but this model is multi-class"):
        h.partial_fit(docs, labels=[["oil", "bank"], "bank", None, "oil"])
    ml = TopicModel(n_topics=3, supervision="logistic", seed=0)
    ml.partial_fit(docs, labels=[["oil"], ["bank", "money"], "oil", None])  # a label is a one-label list
    assert ml.head.task == "multilabel" and sorted(ml.label_names) == ["bank", "money", "oil"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning either
        with pytest.raises(ValueError, match="no word of these documents"):
            h.heldout_loglik(["zzz qqq", ""])
        one_type = [docs[0].split()[0], " ".join([docs[1].split()[0]] * 3) + " zzz"]  # < 2 known types each
        with pytest.raises(ValueError, match="no document has two distinct words"):
            h.heldout_loglik(one_type)
        assert np.isfinite(h.heldout_loglik(docs))


def test_top_words_checks_its_arguments():
    """A negative n returned the vocabulary minus |n| words; a float or string topic gave numpy's
    errors (library audit, 2026-11-29)."""
    m = TopicModel(n_topics=3, threads=1, seed=0).fit(["apple banana cherry dates", "cherry dates eggs figs",
                                                       "xray yacht zebra apple"] * 10)
    assert len(m.top_words(0, 2)) == 2 and m.top_words(1, 0) == [] and len(m.top_words(np.int64(2), np.int64(3))) == 3
    with pytest.raises(ValueError, match="n must be an integer >= 0"):
        m.top_words(0, -3)
    for topic in (1.0, "0", 3, -1, True):
        with pytest.raises(IndexError, match=r"topic must be an integer in \[0, 3\)"):
            m.top_words(topic)


def test_scikit_learn_clone_protocol_get_params_deep_and_set_params():
    """``sklearn.base.clone(model)`` failed: get_params had no ``deep`` and there was no set_params
    (library audit). clone rebuilds from get_params(deep=False) and checks every parameter comes
    back as the same object; searches call set_params."""
    m = TopicModel(n_topics=7, alpha=0.3, supervision="hinge", sparsity=6, seed=4)
    params = m.get_params(deep=False)
    twin = TopicModel(**params)
    assert all(twin.get_params(deep=False)[k] is v or twin.get_params(deep=False)[k] == v for k, v in params.items())
    assert m.set_params(n_topics=9, sup_c=2.0) is m
    assert m.n_topics == 9 and m.sparsity == 6 and m.seed == 4 and m.get_params()["sup_c"] == 2.0
    assert m.state.n_topics == 9 and not m.state.initialized
