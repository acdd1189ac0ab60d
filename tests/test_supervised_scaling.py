"""Self-scaling supervised defaults (docs/supervised.md §7, supervised/scaling.py)."""
import numpy as np
import pytest

from streamtopics import TopicModel, load_snapshot
from streamtopics.supervised import SupervisedHead
from streamtopics.supervised.scaling import ScaleStats, auto_constants


def test_rule_scales_with_document_length_topics_and_response():
    h1, h2 = auto_constants("hinge", 50, 40.0), auto_constants("hinge", 50, 400.0)
    assert h2["c"] == pytest.approx(10 * h1["c"]) and h1["ell"] == 1.0
    assert h1["c"] * h1["ell"] == pytest.approx(40.0)
    assert auto_constants("logistic", 200, 40.0)["prior_var"] == pytest.approx(4 * auto_constants("logistic", 50, 40.0)["prior_var"])
    assert auto_constants("logistic", 50, 140.0)["c"] == pytest.approx(140.0)
    # regression: (y, eps, nu) -> s (y, eps, nu), c -> c / s
    r1 = auto_constants("regression", 20, 100.0, response_sd=1.5, response_rms=2.0)
    r2 = auto_constants("regression", 20, 100.0, response_sd=15.0, response_rms=20.0)
    assert r2["c"] == pytest.approx(r1["c"] / 10) and r2["epsilon"] == pytest.approx(10 * r1["epsilon"])
    assert r2["prior_var"] == pytest.approx(100 * r1["prior_var"])
    st = ScaleStats()
    st.observe([10, 30], [1.0, 3.0])
    # robust: median 2, MAD 1 (x 1.4826 for a normal sd), rms sqrt(median^2 + sd^2)
    assert st.mean_doc_len == 20.0 and st.response_moments() == pytest.approx((1.4826, np.hypot(2.0, 1.4826)))


def test_head_calibrates_on_labelled_documents_and_explicit_values_override():
    h = SupervisedHead(8, "logistic", c="auto", prior_var="auto")
    tg = h.encode_targets(["a", None, "b"], grow=True)
    h.calibrate([10, 1000, 30], tg)  # the unlabelled 1000-token document does not count
    assert h.c == pytest.approx(20.0) and h.prior_var == pytest.approx(8.0)
    assert h.get_params()["c"] == "auto"
    fixed = SupervisedHead(8, "logistic", c=5.0, prior_var="auto")
    fixed.calibrate([10, 1000, 30], fixed.encode_targets(["a", None, "b"], grow=True))
    assert fixed.c == 5.0 and fixed.get_params()["c"] == 5.0
    with pytest.raises(ValueError, match="auto"):
        SupervisedHead(8, "hinge", c="big")


def test_model_defaults_track_the_stream_and_survive_a_snapshot(tmp_path):
    rng = np.random.default_rng(0)
    docs = [[f"w{v}" for v in rng.choice(30, 20) + 30 * (i % 2)] for i in range(120)]
    m = TopicModel(n_topics=4, supervision="hinge", seed=0)
    m.partial_fit(docs[:60], labels=[f"c{i % 2}" for i in range(60)])
    assert m.head.c == pytest.approx(20.0) and m.head.ell == 1.0 and m.head.prior_var == pytest.approx(4.0)
    m.save(tmp_path / "m.stsnap")
    r = load_snapshot(tmp_path / "m.stsnap")
    assert r.head.c == m.head.c and r.head.auto_constants == m.head.auto_constants
    longer = [d * 3 for d in docs[60:]]
    for mm in (m, r):
        mm.partial_fit(longer, labels=[f"c{i % 2}" for i in range(60)])
    assert m.head.c == pytest.approx(40.0)  # mean over all labelled documents: (60 * 20 + 60 * 60) / 120
    np.testing.assert_array_equal(m.head.eta_mean, r.head.eta_mean)
    explicit = TopicModel(n_topics=4, supervision="hinge", sup_c=3.0, sup_ell=2.0, sup_prior_var=5.0)
    explicit.partial_fit(docs[:60], labels=[f"c{i % 2}" for i in range(60)])
    assert (explicit.head.c, explicit.head.ell, explicit.head.prior_var) == (3.0, 2.0, 5.0)


def test_regression_defaults_are_invariant_to_the_response_unit():
    """y in other units (x 10, and far from 1: a 1e-12 floor on the response's sd took a response in
    units of 1e-15 for a constant and predicted it 1e12 sds off): with c, eps and nu^2 scaling
    themselves the predictions scale too."""
    rng = np.random.default_rng(1)
    docs, y = [], []
    for i in range(160):
        g = rng.random()
        n1 = int(30 * g)
        docs.append([f"a{v}" for v in rng.choice(15, n1)] + [f"b{v}" for v in rng.choice(15, 30 - n1)])
        y.append(2.0 * g - 0.5 + 0.05 * rng.normal())
    preds = []
    scales = (1.0, 10.0, 1e-15, 1e90)  # |response| <= 1e100 (targets.MAX_RESPONSE)
    for s in scales:
        m = TopicModel(n_topics=3, supervision="regression", seed=0)
        for lo in range(0, 120, 40):
            m.partial_fit(docs[lo:lo + 40], labels=[s * v for v in y[lo:lo + 40]])
        preds.append(np.array(m.predict(docs[120:])))
    for s, p in zip(scales[1:], preds[1:]):
        np.testing.assert_allclose(p / s, preds[0], rtol=1e-6, atol=1e-9)
    yt = np.array(y[120:])
    assert 1 - np.sum((yt - preds[0]) ** 2) / np.sum((yt - yt.mean()) ** 2) > 0.8


def _unit_regression_docs(n=160, seed=1):
    rng = np.random.default_rng(seed)
    docs, y = [], []
    for _ in range(n):
        g = rng.random()
        n1 = int(30 * g)
        docs.append([f"a{v}" for v in rng.choice(15, n1)] + [f"b{v}" for v in rng.choice(15, 30 - n1)])
        y.append(2.0 * g - 0.5 + 0.05 * rng.normal())
    return docs, y


def test_one_stray_response_does_not_set_the_regression_scale():
    """A response of 1e6 among values near 1 (a price in cents, a typo) once set the response's
    sd from a sum of squares: c fell 10^4-fold, nu^2 grew 10^9-fold, and the regressor's R^2 went
    to -145x the oracle's for the rest of the stream. The scale is now robust (median, MAD)."""
    docs, y = _unit_regression_docs()
    r2 = {}
    for name, stray in (("clean", None), ("stray", 1e6)):
        labels = list(y)
        if stray is not None:
            labels[7] = stray
        m = TopicModel(n_topics=3, supervision="regression", seed=0)
        for lo in range(0, 120, 40):
            m.partial_fit(docs[lo:lo + 40], labels=labels[lo:lo + 40])
        yt, p = np.array(y[120:]), np.array(m.predict(docs[120:]))
        r2[name] = 1 - np.sum((yt - p) ** 2) / np.sum((yt - yt.mean()) ** 2)
        if stray is not None:
            sd, rms = m.head.scale_stats.response_moments()
            assert sd < 2.0 and rms < 2.0  # the sum of squares gives sd ~ 1e6 / sqrt(120)
    assert r2["clean"] > 0.8 and r2["stray"] > r2["clean"] - 0.05, r2


def test_a_stray_response_among_the_first_does_not_carry_the_regressor_off():
    """Engines audit: with the stray among a stream's first 1-3 responses (a mostly unlabelled
    start) the scale could not be robust yet, and the regressor learned from 1e6 at full weight:
    R^2 of the next batch -1.4e12 (one response first), -4e4 (three), back above 0 only 5 batches
    later. Now the head learns no response before 5 were seen, and clips what it learns to Tukey's
    far-out fences of the responses seen; the stray stream predicts like the clean one."""
    docs, y = _unit_regression_docs(n=280, seed=2)
    r2 = {}
    for first in (1, 3):
        for name, stray in (("clean", None), ("stray", 1e6)):
            m = TopicModel(n_topics=3, supervision="regression", seed=0)
            labels = [None] * 40
            labels[:first] = y[:first]
            if stray is not None:
                labels[0] = stray
            m.partial_fit(docs[:40], labels=labels)
            scores = []
            for lo in range(40, 280, 40):
                yt, p = np.array(y[lo:lo + 40]), np.array(m.predict(docs[lo:lo + 40]), dtype=float)
                scores.append(1 - np.sum((yt - p) ** 2) / np.sum((yt - yt.mean()) ** 2))
                m.partial_fit(docs[lo:lo + 40], labels=y[lo:lo + 40])
            r2[first, name] = scores
        clean, stray = r2[first, "clean"], r2[first, "stray"]
        assert min(stray[1:]) > 0.5 and abs(np.mean(stray[1:]) - np.mean(clean[1:])) < 0.05, r2


def test_the_regressor_learns_responses_within_tukeys_far_out_fences():
    from streamtopics.supervised.scaling import MIN_RESPONSES, ScaleStats

    st = ScaleStats()
    assert st.response_range() == (-np.inf, np.inf)  # no response measured (explicit constants)
    for i in range(MIN_RESPONSES):
        assert st.response_range() is None or i == 0
        st.observe([10.0], [1e6 if i == 0 else float(i)])
    lo, hi = st.response_range()
    assert lo < 1.0 and 4.0 < hi < 1e3  # the stray is outside, the others inside
    # a response with several modes (a class index) keeps its outer modes
    st = ScaleStats()
    st.observe(np.full(100, 10.0), [0.0] * 30 + [2.0] * 50 + [6.0] * 10 + [7.0] * 10)
    lo, hi = st.response_range()
    assert lo <= 0.0 and hi >= 7.0
    # ties (90 % of the responses equal: the IQR is 0): the spread of the others gives the width,
    # so the rare ratings 1 and 9 around 5 are kept (the MAD fallback's sd clipped them to 2.6 and
    # 7.4) and a stray among them is not
    st = ScaleStats()
    st.observe(np.full(101, 10.0), [5.0] * 90 + list(np.linspace(1, 9, 10)) + [1e6])
    lo, hi = st.response_range()
    assert lo <= 1.0 and 9.0 <= hi < 100.0


def test_the_response_sample_is_even_deterministic_and_bounded():
    """Every replica applying the same responses, in whatever batches, holds the same sample:
    the responses at indices 0, stride, 2 stride, ... of the stream."""
    from streamtopics.supervised.scaling import SAMPLE_CAP, robust_scale

    y = np.random.default_rng(0).normal(3.0, 2.0, size=5 * SAMPLE_CAP + 17)
    a, b = ScaleStats(), ScaleStats()
    a.observe(np.ones(y.size), y)
    for lo, hi in ((0, 5), (5, 300), (300, 4099), (4099, y.size)):
        b.observe(np.ones(hi - lo), y[lo:hi])
    assert a.stride == b.stride == 8 and a.sample.size <= SAMPLE_CAP  # 10,257 / 4 > 2,048
    np.testing.assert_array_equal(a.sample, y[::8])
    np.testing.assert_array_equal(a.sample, b.sample)
    assert a.response_moments() == b.response_moments()
    sd, rms = a.response_moments()
    # the rms of the responses as learned, less the offset: the median of the first 16 (however batched)
    assert a.offset == b.offset == np.median(y[:16])
    assert sd == pytest.approx(2.0, rel=0.1) and rms == pytest.approx(np.hypot(3.0 - a.offset, 2.0), rel=0.1)
    # ties: most responses one value (a rating); the MAD is 0, the trimmed sd is not
    ratings = np.r_[np.full(70, 5.0), np.full(20, 4.0), np.full(10, 1.0)]
    center, sd = robust_scale(ratings)
    assert center == 5.0 and sd == pytest.approx(ratings.std(), rel=0.3) and sd > 0
    # a state from before the sample (5 numbers): the moments, until responses arrive
    old = ScaleStats.restore([2, 20.0, 2, 4.0, 10.0])
    assert old.response_moments() == pytest.approx((1.0, np.sqrt(5.0)))
    back = ScaleStats.restore(a.state())
    assert back.stride == a.stride and np.array_equal(back.sample, a.sample)


def _short_labelled_docs(n_docs=256, V=200, K0=5, seed=0):
    """Short documents (5-39 tokens) from K0 topics, each labelled by its dominant topic."""
    rng = np.random.default_rng(seed)
    phi = rng.dirichlet(np.full(V, 0.05), size=K0)
    docs, labels = [], []
    for _ in range(n_docs):
        k = int(rng.integers(K0))
        theta = rng.dirichlet(np.full(K0, 0.2))
        theta[k] += 2.0
        z = rng.choice(K0, size=int(rng.integers(5, 40)), p=theta / theta.sum())
        docs.append([f"w{rng.choice(V, p=phi[t])}" for t in z])
        labels.append(f"c{k}")
    return docs, labels


@pytest.mark.parametrize("prior_var", [100.0, 1e4])
def test_a_strong_label_term_keeps_the_topics_finite(prior_var):
    """A large c (or prior variance) on short documents puts every winner of a token thousands of
    nats below the document's best topic; the sum of their exps went subnormal, 1/z overflowed and
    the first batch left NaN in the topics (20NG with c = 2 Nbar: chance-level accuracy). The
    L-sparse pass now recomputes such tokens in the log domain (lsparse.Z_NORMAL)."""
    docs, labels = _short_labelled_docs()
    m = TopicModel(n_topics=20, supervision="hinge", sup_c=2000.0, sup_prior_var=prior_var, seed=1)
    m.partial_fit(docs, labels=labels)
    m.partial_fit(docs, labels=labels)
    assert np.isfinite(m.state.mu).all() and np.isfinite(m.head.eta_mean).all()
    assert len(set(m.predict(docs))) > 1


def test_a_non_finite_local_step_is_refused_before_anything_is_learned(monkeypatch):
    """Whatever breaks numerically in a local step, its NaN must not reach the topics: process()
    raises FloatingPointError and the model is left as it was (the daemon dead-letters the batch)."""
    docs, labels = _short_labelled_docs(64)
    m = TopicModel(n_topics=8, supervision="logistic", seed=0)
    m.partial_fit(docs, labels=labels)
    mu, version, eta = m.state.mu.copy(), m.state.version, m.head.eta_mean.copy()
    infer = m.local_step.infer

    def poisoned(state, batch, **kw):
        out = infer(state, batch, **kw)
        if out.summary is not None:
            out.summary.values[0] = np.nan
        return out

    monkeypatch.setattr(m.local_step, "infer", poisoned)
    with pytest.raises(FloatingPointError, match="non-finite expected counts"):
        m.partial_fit(docs, labels=labels)
    assert m.state.version == version and np.array_equal(m.state.mu, mu) and np.array_equal(m.head.eta_mean, eta)
