"""fit(docs, labels=None, ...) on every engine (issue 15): the variational engine's batch mode is
memoized laps with stable keys, so it must equal the same laps of partial_fit exactly."""
import numpy as np
import pytest

from streamtopics import TopicModel


def _corpus(n=240, seed=0):
    rng = np.random.default_rng(seed)
    docs, labels = [], []
    for i in range(n):
        g = i % 3
        words = rng.choice(40, size=rng.integers(15, 40)) + 40 * g
        noise = rng.choice(120, size=5)
        docs.append([f"w{v}" for v in np.concatenate([words, noise])])
        labels.append(f"g{g}")
    return docs, labels


def _laps(model, docs, labels, laps, bs):
    for _ in range(laps):
        for i, lo in enumerate(range(0, len(docs), bs)):
            model.partial_fit(docs[lo:lo + bs], labels=None if labels is None else labels[lo:hi(lo, bs, docs)],
                              batch_key=i)
    return model


def hi(lo, bs, docs):
    return min(lo + bs, len(docs))


@pytest.mark.parametrize("supervision", [None, "hinge", "logistic"])
def test_lsparse_fit_equals_memoized_laps_of_partial_fit(supervision):
    docs, labels = _corpus()
    y = labels if supervision else None
    f = TopicModel(n_topics=4, seed=3, update="memoized", supervision=supervision)
    f.fit(docs, labels=y, n_iter=3, batch_size=64, tol=0)
    assert f.last_stats["laps"] == 3 and f.last_stats["objective_kind"] == "elbo"
    p = _laps(TopicModel(n_topics=4, seed=3, update="memoized", supervision=supervision), docs, y, 3, 64)
    np.testing.assert_array_equal(f.state.mu, p.state.mu)
    assert f.vocabulary == p.vocabulary and f.elbo() == p.elbo()
    if supervision:
        np.testing.assert_array_equal(f.head.eta_mean, p.head.eta_mean)
        np.testing.assert_array_equal(f.head.A, p.head.A)


def test_lsparse_fit_stochastic_equals_laps_of_partial_fit():
    """Stochastic laps are the model's own partial_fit laps; with labels the classifier keeps one
    record per batch (a lap replaces it), so equality with plain partial_fit holds for lap 1."""
    docs, labels = _corpus()
    for y, laps in [(None, 2), (labels, 1)]:
        sup = None if y is None else "logistic"
        f = TopicModel(n_topics=4, seed=3, supervision=sup).fit(docs, labels=y, n_iter=laps, batch_size=64, tol=0)
        assert f.last_stats["laps"] == laps and f.last_stats["objective_kind"] == "local objective per token"
        p = TopicModel(n_topics=4, seed=3, supervision=sup)
        for _ in range(laps):
            for lo in range(0, len(docs), 64):
                p.partial_fit(docs[lo:lo + 64], labels=None if y is None else y[lo:lo + 64])
        np.testing.assert_array_equal(f.state.mu, p.state.mu)
        if y is not None:
            np.testing.assert_array_equal(f.head.eta_mean, p.head.eta_mean)
            assert f.head.memo_keys() == [0, 1, 2, 3]  # one classifier record per batch


def test_lsparse_fit_stochastic_laps_replace_the_classifier_statistics():
    docs, labels = _corpus()
    f = TopicModel(n_topics=4, seed=3, supervision="hinge").fit(docs, labels=labels, n_iter=3, batch_size=64, tol=0)
    one = TopicModel(n_topics=4, seed=3, supervision="hinge").fit(docs, labels=labels, n_iter=1, batch_size=64)
    assert f.head.memo_keys() == [0, 1, 2, 3]
    # a lap replaced each batch's classifier record: the carried statistics are those records' sum
    assert f.head.n_updates == 12 and len(f.head.memo_keys()) == 4
    assert not np.allclose(f.head.eta_mean, one.head.eta_mean)


@pytest.mark.parametrize("update", ["memoized", "stochastic"])
def test_lsparse_fit_stops_on_relative_objective_change_and_restarts_from_scratch(update):
    docs, _ = _corpus()
    m = TopicModel(n_topics=4, seed=0, update=update)
    m.fit(docs, n_iter=20, tol=1e-2)
    st = m.last_stats
    assert st["converged"] and 2 <= st["laps"] < 20
    e = st["objective"]
    assert e[-1] - e[-2] < 1e-2 * abs(e[-2])
    if update == "memoized":
        assert all(b - a >= -1e-6 * abs(a) for a, b in zip(e, e[1:]))  # memoized laps never lower the ELBO
    mu = m.state.mu.copy()
    m.fit(docs, n_iter=20, tol=1e-2)  # a second fit starts from scratch: same result
    np.testing.assert_array_equal(m.state.mu, mu)
    m.partial_fit(docs[:32], batch_key="more")  # and streaming continues afterwards
    with pytest.raises(ValueError, match="batch_size"):
        m.fit(docs, batch_size=0)


@pytest.mark.parametrize("engine", ["lsparse", "alias"])
@pytest.mark.parametrize("supervision", ["hinge", "logistic"])
def test_supervised_fit_both_engines_defaults(engine, supervision):
    docs, labels = _corpus(300)
    test, ytest = _corpus(90, seed=1)
    m = TopicModel(n_topics=6, engine=engine, supervision=supervision, seed=0)
    m.fit(docs, labels=labels, n_iter=None if engine == "lsparse" else 30)
    acc = np.mean([p == t for p, t in zip(m.predict(test), ytest)])
    assert acc >= 0.9, acc
