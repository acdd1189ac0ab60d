"""The topics' seeding (streamtopics/seeding.py): one topic per distinct document of the first batch,
and, with the stochastic update, the rest seeded by the next batches before their local step."""
from __future__ import annotations

import numpy as np
import pytest

from streamtopics import TopicModel, load_snapshot
from streamtopics.births import births_for, propose_births
from streamtopics.corpora import load_reuters_r8
from streamtopics.service.replication import Replica, Source, decode, digest, encode


@pytest.fixture(scope="module")
def r8():
    """R8 train through the package's tokenizer, in a fixed shuffle: (train docs, test docs)."""
    docs = load_reuters_r8("train")
    docs = [docs[i].text for i in np.random.default_rng(0).permutation(len(docs))]
    return docs[:3000], docs[3000:3600]


def _stream(docs, first: int, K: int, seed: int, B: int = 128, **kw) -> TopicModel:
    m = TopicModel(n_topics=K, seed=seed, threads=1, **kw)
    m.partial_fit(docs[:first])
    for lo in range(first, len(docs), B):
        m.partial_fit(docs[lo:lo + B])
    return m


def test_a_first_batch_seeds_one_topic_per_distinct_document_and_later_batches_seed_the_rest(r8):
    train, _ = r8
    m = TopicModel(n_topics=20, seed=0, threads=1)
    m.partial_fit(train[:3] + [train[0], train[1]])  # two copies seed nothing of their own
    assert m.state.n_seeded == 3 and not m.state.fully_seeded
    lam = m.state.lam()
    prior = m.state.beta + m.state.scale * m.state.smoothing
    assert lam[:, :3].max() > 2 * prior  # seeded columns hold a document's counts
    assert lam[:, 3:].max() < 2 * prior  # the rest: the prior and its noise (no document's counts)
    m.partial_fit(train[5:9])
    assert m.state.n_seeded == 7
    m.partial_fit(train[9:100])
    assert m.state.n_seeded == 20 and m.state.fully_seeded
    m.partial_fit(train[100:200])  # nothing left to seed: nothing is reset
    assert m.state.n_seeded == 20


def test_a_first_batch_of_K_documents_or_more_seeds_every_topic_at_once(r8):
    train, _ = r8
    m = TopicModel(n_topics=20, seed=0, threads=1)
    m.partial_fit(train[:64])
    assert m.state.fully_seeded


def test_the_memoized_update_seeds_every_topic_from_the_first_batch():
    """A column reset would break the memoized update's exact sums: it seeds all K at once."""
    m = TopicModel(n_topics=10, update="memoized", seed=0, threads=1)
    m.partial_fit(["apple banana cherry", "dog cat mouse"], batch_key=0)
    assert m.state.fully_seeded and m.state.n_seeded == 10


@pytest.mark.parametrize("init", ["kmeans++", "random"])
def test_a_tiny_first_batch_learns_as_well_as_a_full_one(r8, init):
    """Before, a first batch of 2 documents seeded all K topics from copies of those two, and one
    pass did not recover: R8, K = 40, batches of 128, seeds 0 / 1 / 2, held-out 0.069 / 0.068 /
    0.059 below a first batch of 128 (random init 0.087 / 0.091 / 0.053). Now the batches after it
    seed the rest: -0.013 / +0.019 / +0.040 (random -0.044 / +0.025 / +0.003: one seed's spread;
    random picks distinct documents now, which made the first batch of 128 better too)."""
    train, test = r8
    K = 40
    gaps = []
    for seed in (0, 1, 2):
        tiny = _stream(train, 2, K, seed, init=init)
        full = _stream(train, 128, K, seed, init=init)
        assert tiny.state.n_seeded == K
        gaps.append(tiny.heldout_loglik(test) - full.heldout_loglik(test))
    assert np.mean(gaps) >= -0.03, gaps


def test_births_never_take_a_topic_that_waits_for_its_seed(r8):
    train, _ = r8
    m = TopicModel(n_topics=30, seed=0, threads=1, corpus_size="seen")
    m.partial_fit(train[:4])
    batch = m.prepare(m.tokenize(train[4:132]), grow=True)
    result = m.local_step.infer(m.state, batch, summarize=True)
    _, reborn = births_for(m, batch, result.summary)
    assert all(k < m.state.n_seeded for k in reborn)
    spare = range(m.state.n_seeded, 30)
    assert all(k not in spare for k, _, _ in propose_births(m.state, m.updater, batch, result.summary,
                                                            np.random.default_rng(0), max_births=30,
                                                            spare=spare))


def test_a_snapshot_taken_while_seeding_resumes_the_same_model(r8, tmp_path):
    train, _ = r8
    a = TopicModel(n_topics=20, seed=0, threads=1)
    a.partial_fit(train[:3])
    a.save(tmp_path / "s.stm")
    b = load_snapshot(tmp_path / "s.stm")
    assert b.state.n_seeded == 3
    for m in (a, b):
        m.partial_fit(train[3:131])
    assert b.state.n_seeded == 20
    np.testing.assert_array_equal(a.state.lam(), b.state.lam())


def test_replicas_seed_from_their_batch_records_and_stay_identical(r8):
    """While topics wait for a seed, a replica's record carries its batch's tokens (``kind="batch"``):
    applying it seeds from them on every replica alike; once all are seeded, records are summaries."""
    train, _ = r8
    tok = TopicModel(n_topics=16).tokenizer
    tokens = [t for t in (tok(d) for d in train[:700]) if t]
    cuts = [0, 2, 5, 37, 101, 165, 229, 293, 357, 421, 485, 549, 613]
    batches = [(Source("docs", i % 2, cuts[i], cuts[i + 1]), tokens[cuts[i]:cuts[i + 1]])
               for i in range(len(cuts) - 1)]
    reps = [Replica(TopicModel(n_topics=16, seed=3, threads=1)) for _ in range(2)]
    log, kinds = [], []
    for j, (src, toks) in enumerate(batches):
        rec, _ = reps[j % 2].compute(toks, src)
        kinds.append(rec.kind)
        log.append(encode(rec))
        for r in reps:  # one record in flight: computed against a model one record behind
            while r.offset < len(log) - 1:
                r.apply(decode(log[r.offset][0])[0], r.offset)
    for r in reps:
        while r.offset < len(log):
            r.apply(decode(log[r.offset][0])[0], r.offset)
    assert kinds[:3] == ["batch"] * 3 and kinds[-1] == "summary", kinds
    assert all(r.model.state.fully_seeded for r in reps)
    assert len({digest(r.model) for r in reps}) == 1
    late = Replica(TopicModel(n_topics=16, seed=3, threads=1))
    for off, raw in enumerate(log):
        late.apply(decode(raw[0])[0], off)
    assert digest(late.model) == digest(reps[0].model)
