"""Defaults that need no knowledge of the stream, and one source of them (docs/defaults.md)."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from streamtopics import TopicModel
from streamtopics.config import Config, load_config
from streamtopics.hyper import alpha_gradient, alpha_step
from streamtopics.updates import RARE_WORD_COUNTS, STEP_DOCS, StochasticUpdate, corpus_size_floor, step_size_floor

ROOT = Path(__file__).resolve().parents[1]


def _lda_corpus(rng, K=8, V=400, n_docs=1500, length=60, alpha=0.1, beta=0.05):
    phi = rng.dirichlet(np.full(V, beta), size=K)
    words = [f"w{v}" for v in range(V)]
    docs = []
    for _ in range(n_docs):
        theta = rng.dirichlet(np.full(K, alpha))
        z = rng.choice(K, size=length, p=theta)
        docs.append([words[rng.choice(V, p=phi[k])] for k in z])
    return phi, words, docs


def _recovery(model: TopicModel, phi: np.ndarray, words: list[str]) -> float:
    """Mean over generating topics of the best total-variation match among learned topics."""
    tw = model.topic_word()
    cols = model.vocab.ids(words)
    learned = np.zeros((tw.shape[0], len(words)))
    ok = cols >= 0
    learned[:, ok] = tw[:, cols[ok]]
    learned /= learned.sum(axis=1, keepdims=True)
    tv = 0.5 * np.abs(phi[:, None, :] - learned[None, :, :]).sum(axis=2)
    return float(np.mean(1.0 - tv.min(axis=1)))


def _one_pass(docs, n_topics=8, **kw) -> TopicModel:
    m = TopicModel(n_topics=n_topics, seed=0, **kw)
    for lo in range(0, len(docs), 100):
        m.partial_fit(docs[lo:lo + 100])
    return m


def test_defaults_recover_topics_better_than_a_wrong_corpus_size():
    """A corpus with fewer tokens than topic-word entries (N Lbar < K V), like 20NG at K=100:
    the regime where D matters.  "seen" (D = n_t) and a D 200x too large both recover the
    generating topics worse than the default rule, which is told nothing."""
    phi, words, docs = _lda_corpus(np.random.default_rng(3), K=20, V=2000, n_docs=1000, length=40)
    default = _recovery(_one_pass(docs, 20), phi, words)
    too_small = _recovery(_one_pass(docs, 20, corpus_size="seen"), phi, words)
    too_large = _recovery(_one_pass(docs, 20, corpus_size=len(docs) * 200), phi, words)
    assert default > too_small + 0.02, (default, too_small)
    assert default > too_large + 0.02, (default, too_large)


def test_effective_corpus_size_rule():
    """D_t = max(n_t, min(c H(V_t) V_t / Lbar_t, (c/2)|B|/rho_t)); capped at the rho_min window; fixed or
    "seen" on request."""
    m = TopicModel(n_topics=20, seed=0)
    docs = [[f"w{i % 50}", f"w{(i * 7) % 50}", f"w{(i * 3) % 50}", "x"] for i in range(40)]
    m.partial_fit(docs)
    st = m.last_stats
    V = len(m.vocabulary)
    zipf = RARE_WORD_COUNTS * (np.log(V) + 0.5772156649) * V / 4.0
    step = RARE_WORD_COUNTS / 2 * 40 / m.updater.step(0.0, 40)
    assert st["corpus_size"] == pytest.approx(max(40, min(zipf, step)))
    upd = StochasticUpdate(rho_min=0.1)
    big = type("S", (), {"docs_seen": 10**6, "tokens_seen": 4e6, "n_topics": 20, "n_words": 51})()
    summ = type("B", (), {"n_docs": 100, "n_tokens": 400.0})()
    assert upd.effective_corpus_size(big, summ, 0.1) == pytest.approx(STEP_DOCS * 1.9 / 0.1)
    assert StochasticUpdate(corpus_size="seen").effective_corpus_size(big, summ, 0.5) == 10**6 + 100
    assert StochasticUpdate(corpus_size=1234).effective_corpus_size(big, summ, 0.5) == 1234
    with pytest.raises(ValueError, match="corpus_size"):
        TopicModel(corpus_size=0)
    with pytest.raises(ValueError, match="corpus_size"):
        TopicModel(corpus_size="all")


def test_default_corpus_size_does_not_scale_with_the_number_of_topics():
    """The floor counts expected counts per WORD or per occurrence, never per (word, topic)
    entry (a word occupies a few topics whatever K is): the same stream gives the same D_t at
    K=5 and K=50, and the floor is the smaller of the Zipf estimate c H(V) V / Lbar and the
    step's (c/2)|B|/rho_t."""
    rng = np.random.default_rng(0)
    docs = [[f"w{int(v)}" for v in rng.zipf(1.3, size=30) % 3000] for _ in range(200)]
    Ds = {}
    for K in (5, 50):
        m = TopicModel(n_topics=K, seed=0)
        Ds[K] = []
        for lo in range(0, len(docs), 50):
            m.partial_fit(docs[lo:lo + 50])
            Ds[K].append(m.last_stats["corpus_size"])
    assert Ds[5] == pytest.approx(Ds[50])
    V = len(m.vocabulary)
    assert Ds[50][-1] == pytest.approx(min(corpus_size_floor(V, 30.0), step_size_floor(50, m.updater.step(3 * 50 / STEP_DOCS, 50))))
    assert Ds[50][-1] > 4 * len(docs)  # still on the floor: a short stream is not taken for the whole corpus
    # the floor grows like V log V with the vocabulary, so n_t takes over on a long stream
    assert corpus_size_floor(2 * V, 30.0) / corpus_size_floor(V, 30.0) == pytest.approx(
        2 * (np.log(2 * V) + 0.5772156649) / (np.log(V) + 0.5772156649))


def test_floor_takes_the_smaller_claim():
    """Short documents over a large vocabulary: the Zipf estimate claims many corpora's worth
    (over-claiming costs most there: docs/defaults.md), and the step's floor is taken; long
    documents over a small vocabulary: the Zipf estimate is smaller and is taken; a long stream
    leaves both behind (D_t = n_t)."""
    upd = StochasticUpdate(delay=10.0, forgetting_rate=0.6)
    summ = type("B", (), {"n_docs": 256, "n_tokens": 256 * 10.0})()
    short = type("S", (), {"docs_seen": 5000, "tokens_seen": 5e4, "n_words": 20000})()
    rho = upd.rho(21)
    D = upd.effective_corpus_size(short, summ, rho)
    assert D == pytest.approx(step_size_floor(256, rho)) and D < corpus_size_floor(20000, 10.0) / 5
    summ_long = type("B", (), {"n_docs": 256, "n_tokens": 256 * 500.0})()
    long_docs = type("S", (), {"docs_seen": 1000, "tokens_seen": 5e5, "n_words": 5000})()
    D = upd.effective_corpus_size(long_docs, summ_long, rho)
    assert D == pytest.approx(corpus_size_floor(5000, 500.0)) and D < step_size_floor(256, rho)
    late = type("S", (), {"docs_seen": 10**7, "tokens_seen": 1e8, "n_words": 20000})()
    t = 10**7 // 256
    assert upd.effective_corpus_size(late, summ, upd.rho(t)) == 10**7 + 256
    # the step's floor: one occurrence learned at step t adds c/2 expected counts to its entry
    assert upd.rho(21) * step_size_floor(256, upd.rho(21)) / 256 == pytest.approx(RARE_WORD_COUNTS / 2)


def test_alpha_newton_step_finds_the_generating_concentration():
    """Documents drawn with a known symmetric alpha: the online Newton steps converge to it."""
    rng = np.random.default_rng(0)
    K, true_alpha = 10, 0.3
    alpha = 1.0 / K
    for t in range(200):
        theta = rng.dirichlet(np.full(K, true_alpha), size=200)
        counts = np.array([rng.multinomial(500, p) for p in theta], dtype=np.float64)
        alpha = alpha_step(alpha, counts, rho=(10 + t) ** -0.7)
    assert alpha == pytest.approx(true_alpha, rel=0.15)
    g, h = alpha_gradient(counts, 0.3)
    assert h < 0


def test_alpha_auto_is_learned_and_saved(tmp_path):
    phi, words, docs = _lda_corpus(np.random.default_rng(5), n_docs=400)
    m = _one_pass(docs)
    assert m.alpha is None and m.alpha_learned and m.state.alpha != pytest.approx(1.0 / 8)
    m.save(tmp_path / "m.stsnap")
    from streamtopics import load_snapshot

    m2 = load_snapshot(tmp_path / "m.stsnap")
    assert m2.state.alpha == m.state.alpha and m2.alpha_learned


def test_a_supervised_model_keeps_alpha_at_one_unless_told():
    """With supervision the variational engine's default alpha is the flat Dirichlet, fixed
    (docs/supervised.md §9); alpha="auto" still learns it, a number still fixes it."""
    docs = [[f"w{(i * j) % 40}" for j in range(12)] for i in range(200)]
    labels = ["a" if i % 2 else "b" for i in range(200)]
    for alpha, learned in ((None, False), ("auto", True), (0.3, False)):
        m = TopicModel(n_topics=5, seed=0, supervision="hinge", alpha=alpha)
        start = m.state.alpha
        assert m.alpha_learned is learned and start == {None: 1.0, "auto": 1.0 / 5, 0.3: 0.3}[alpha]
        m.partial_fit(docs[:100], labels=labels[:100])
        m.partial_fit(docs[100:], labels=labels[100:])
        assert (m.state.alpha != start) is learned
    assert TopicModel(n_topics=5).alpha_learned  # without supervision the default learns alpha
    # and so does the sampler's: it weighs topics by n_dk + alpha, linearly (no annihilation)
    m = TopicModel(n_topics=5, engine="alias", supervision="hinge")
    assert m.alpha_learned and m.state.alpha == 1.0 / 5


def test_library_config_and_daemon_defaults_are_one():
    """The daemon's model from the packaged config equals TopicModel() with its defaults."""
    from streamtopics.cli import DEFAULT_CONFIG
    from streamtopics.config import model_from_config

    assert DEFAULT_CONFIG.is_file() and DEFAULT_CONFIG.parent.name == "data"
    assert (ROOT / "config" / "streamtopics.toml").resolve() == DEFAULT_CONFIG.resolve()
    cfg = load_config(DEFAULT_CONFIG, env={})
    assert cfg == Config()
    from_config = model_from_config(cfg.model).get_params()
    library = TopicModel().get_params()
    assert from_config == library, {k: (from_config[k], library[k]) for k in library if from_config[k] != library[k]}


@pytest.mark.skipif(os.environ.get("STREAMTOPICS_SKIP_WHEEL_TEST") == "1", reason="STREAMTOPICS_SKIP_WHEEL_TEST=1")
def test_installed_wheel_uses_the_packaged_config(tmp_path):
    """Built as a wheel and installed elsewhere, the commands read the config inside the package."""
    wheels = tmp_path / "wheels"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0 and "No matching distribution" in r.stderr:
        pytest.skip("no package index reachable to build the wheel: " + r.stderr[-200:])
    assert r.returncode == 0, r.stderr
    (wheel,) = wheels.glob("streamtopics-*.whl")
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMTOPICS_")}
    env["PYTHONPATH"] = str(target)
    probe = ("import streamtopics.cli as c, tomllib; p = c.DEFAULT_CONFIG; print(p); "
             "print(tomllib.loads(p.read_text())['model']['update']['corpus_size'])")
    out = subprocess.run([sys.executable, "-c", probe], cwd=outside, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    assert Path(out[0]).is_relative_to(target) and out[1] == "0"
    shown = subprocess.run([sys.executable, "-m", "streamtopics.cli", "check-config"], cwd=outside, env=env,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert str(target) in shown.stdout
    packaged = tomllib.loads((target / "streamtopics" / "data" / "streamtopics.toml").read_text())
    assert f"corpus_size = {packaged['model']['update']['corpus_size']}" in shown.stdout
    assert f"n_topics = {packaged['model']['n_topics']}" in shown.stdout


def test_prequential_theta_uses_the_alpha_of_its_local_step():
    """alpha="auto" moves alpha in the update; the batch's predictions keep the alpha they were made with."""
    docs = [[f"w{(i * j) % 40}" for j in range(12)] for i in range(200)]
    m = TopicModel(n_topics=5, seed=0)
    m.partial_fit(docs[:100])
    before = m.state.alpha
    ref = m.transform(docs[100:])
    res = m.process(m.prepare(m.tokenize(docs[100:])), learn=True)
    assert res.alpha == before and m.state.alpha != before
    np.testing.assert_allclose(m.theta(res.doc_topic, res.alpha), ref, atol=1e-12)
    np.testing.assert_allclose(m.partial_fit_transform(docs[:10]).sum(axis=1), 1.0)


def test_a_stream_cut_into_small_batches_learns_as_well_as_batches_of_256():
    """The daemon cuts a slow stream by time (batch.max_wait_ms), so its batches are small. A batch is a
    fraction of a schedule step (docs/defaults.md §5): R8, K=20, one pass in batches of 32 scores within
    0.08 nats/token of batches of 256 (when every call was one step it was 0.21 behind: -6.41 vs -6.20)."""
    from streamtopics.corpora import load_reuters_r8
    train = [d.text for d in load_reuters_r8("train")]
    test = [d.text for d in load_reuters_r8("test")][:1000]
    scores = {}
    for size in (256, 32):
        m = TopicModel(n_topics=20, seed=0)
        for lo in range(0, len(train), size):
            m.partial_fit(train[lo:lo + size])
        scores[size] = m.heldout_loglik(test)
    assert scores[32] > scores[256] - 0.08, scores
