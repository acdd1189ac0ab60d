"""Topic births (streamtopics/births.py): a dead topic is replaced by one seeded from the batch."""
from __future__ import annotations

import numpy as np
import pytest

from streamtopics import TopicModel
from streamtopics.births import data_mass, propose_births, reset_topics, with_seeds
from streamtopics.service.replication import Assembler, Source, UpdateRecord, decode, encode

THEMES, WORDS = 10, 30


def _docs(rng, themes, n, length=50):
    """Documents of one theme each; themes have disjoint vocabularies (Zipfian within)."""
    out = []
    for _ in range(n):
        t = int(rng.choice(list(themes)))
        out.append([f"t{t}w{x}" for x in rng.zipf(1.5, size=length) % WORDS])
    return out


def _recovered(m) -> int:
    """Themes some topic puts more than 90 % of its mass on."""
    tw, idx = m.topic_word(), {w: i for i, w in enumerate(m.vocabulary)}
    got = 0
    for t in range(THEMES):
        cols = [idx[w] for w in (f"t{t}w{x}" for x in range(WORDS)) if w in idx]
        got += int((tw[:, cols].sum(axis=1) > 0.9).any())
    return got


def _late_themes(seed: int, births: bool) -> TopicModel:
    """The first 3 batches hold themes 0-4 only (k-means++ seeds the topics from them), the
    next 20 all ten: without births, the topics seeded twice on an early theme stay there."""
    rng = np.random.default_rng(seed)
    docs = _docs(rng, range(5), 3 * 64) + _docs(rng, range(THEMES), 20 * 64)
    m = TopicModel(n_topics=THEMES, seed=seed, births=births)
    for lo in range(0, len(docs), 64):
        m.partial_fit(docs[lo:lo + 64])
    return m


@pytest.mark.parametrize("seed", [0, 1])
def test_births_give_themes_that_arrive_late_their_own_topics(seed):
    without, with_births = _late_themes(seed, False), _late_themes(seed, True)
    assert _recovered(without) <= 6
    assert _recovered(with_births) >= 9
    assert with_births.last_stats is not None


def test_a_topic_that_wins_nothing_is_reborn_from_one_theme_of_the_batch():
    rng = np.random.default_rng(3)
    m = TopicModel(n_topics=6, seed=0, births=False)
    for _ in range(4):
        m.partial_fit(_docs(rng, range(6), 64))
    gone = int(m.top_words(2, 1)[0][1])  # topic 2's theme
    reset_topics(m.state, [2])  # topic 2 holds nothing now, and its theme is absent from the batch
    assert data_mass(m.state)[2] == pytest.approx(0.0, abs=1e-9)
    batch = m.prepare(_docs(rng, [t for t in range(6) if t != gone], 64), grow=True)
    res = m.local_steps(batch)[0]
    births = propose_births(m.state, m.updater, batch, res.summary, np.random.default_rng(0))
    assert births and births[0][0] == 2
    k, rows, seed = births[0]
    assert seed.sum() > 0 and np.all(seed > 0)
    # the seed is one theme's documents: its words share one theme prefix
    words = {m.vocabulary[int(batch.uniq[r])].split("w")[0] for r in rows}
    assert len(words) == 1
    merged = with_seeds(res.summary, births, m.n_topics)
    assert merged.topic_totals[2] == pytest.approx(res.summary.topic_totals[2] + seed.sum())
    assert merged.values.sum() == pytest.approx(res.summary.values.sum() + seed.sum())
    m.learn(merged, res.objective, res.doc_topic, batch.n_docs, batch.n_tokens, reborn=[2])
    top = m.top_words(2, 5)
    assert {w.split("w")[0] for w in top} == words


def test_no_births_without_a_dead_topic_or_outside_the_stochastic_lsparse_update():
    rng = np.random.default_rng(4)
    docs = _docs(rng, range(3), 256)
    for kw in ({"update": "memoized"}, {"engine": "alias"}, {"births": False}):
        m = TopicModel(n_topics=12, seed=0, **kw)
        for lo in range(0, 256, 64):
            m.partial_fit(docs[lo:lo + 64])
            assert "births" not in m.last_stats, kw
    m = TopicModel(n_topics=3, seed=0)  # three themes, three topics, none dead
    for lo in range(0, 256, 64):
        m.partial_fit(docs[lo:lo + 64])
        assert "births" not in m.last_stats


def test_reset_topics_checks_the_topic_ids():
    m = TopicModel(n_topics=4, seed=0).partial_fit(_docs(np.random.default_rng(0), range(4), 32))
    with pytest.raises(ValueError, match="outside"):
        reset_topics(m.state, [4])
    with pytest.raises(ValueError, match="births"):
        TopicModel(n_topics=4, births="yes")


def test_the_reborn_topics_travel_with_a_split_update_record():
    rng = np.random.default_rng(0)
    n = 400
    rec = UpdateRecord(source=Source("docs", 0, 0, 10), base=3, n_docs=10, n_tokens=100,
                       known=np.arange(n), indptr=np.arange(n + 1) * 3, topics=rng.integers(0, 8, 3 * n).astype(np.int32),
                       values=rng.random(3 * n), totals=rng.random(n), reborn=[5, 1])
    parts = encode(rec, max_bytes=4_000)
    assert len(parts) > 1
    asm, whole = Assembler(), None
    for raw in parts:
        whole = asm.add(*decode(raw))
    assert whole.reborn == [5, 1] and np.array_equal(whole.topics, rec.topics)


def test_no_births_in_the_laps_of_a_supervised_fit():
    """fit() with labels keeps one classifier record per batch; a reborn topic would change what
    the other batches' records refer to, so its laps (head_key given) reseed nothing."""
    from streamtopics.births import births_for

    rng = np.random.default_rng(5)
    docs = _docs(rng, range(4), 256)
    labels = [d[0].split("w")[0] for d in docs]
    m = TopicModel(n_topics=8, supervision="logistic", seed=0).fit(docs, labels=labels, n_iter=2)
    assert 0 in m.head.memo
    reset_topics(m.state, [3])  # a topic that holds nothing, the smallest after any update
    batch = m.prepare(docs[:64], grow=True)
    summary = m.local_steps(batch)[0].summary
    assert births_for(m, batch, summary, head_key=0)[1] == []
    assert births_for(m, batch, summary)[1][0] == 3


def _with_seeds_by_sort(summary, births):
    """The reference: every entry's row, one stable sort (summary entries, then births in order)."""
    U = summary.word_ids.size
    rows = [np.repeat(np.arange(U), np.diff(summary.indptr))] + [r for _, r, _ in births]
    topics = [summary.topics.astype(np.int32)] + [np.full(r.size, k, dtype=np.int32) for k, r, _ in births]
    values = [summary.values] + [v for _, _, v in births]
    row = np.concatenate(rows)
    order = np.argsort(row, kind="stable")
    indptr = np.zeros(U + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=U), out=indptr[1:])
    return indptr, np.concatenate(topics)[order], np.concatenate(values)[order]


def test_with_seeds_merges_each_row_like_one_stable_sort():
    from streamtopics.summary import Summary

    rng = np.random.default_rng(5)
    for _ in range(200):
        U, K = int(rng.integers(1, 40)), 8
        indptr = np.concatenate([[0], np.cumsum(rng.integers(0, 4, size=U))]).astype(np.int64)
        topics = rng.integers(0, K, size=indptr[-1]).astype(np.int32)
        values = rng.random(indptr[-1])
        s = Summary(word_ids=np.arange(U), indptr=indptr, topics=topics, values=values,
                    topic_totals=np.bincount(topics, weights=values, minlength=K), n_docs=2, n_tokens=9.0)
        births = [(int(rng.integers(0, K)), r, rng.random(r.size))
                  for r in (np.flatnonzero(rng.random(U) < 0.3) for _ in range(int(rng.integers(0, 3))))]
        merged = with_seeds(s, births, K)
        ptr, top, val = _with_seeds_by_sort(s, births)
        assert np.array_equal(merged.indptr, ptr) and np.array_equal(merged.topics, top)
        assert np.array_equal(merged.values, val)
        extra = np.bincount([k for k, _, _ in births], weights=[v.sum() for _, _, v in births], minlength=K)
        np.testing.assert_allclose(merged.topic_totals, s.topic_totals + extra)
    with pytest.raises(ValueError, match="ascending"):
        with_seeds(s, [(0, np.array([2, 1]), np.ones(2))], K)


def test_reset_topics_sets_the_columns_and_their_totals_only():
    rng = np.random.default_rng(6)
    m = TopicModel(n_topics=6, seed=0, births=False)
    m.partial_fit(_docs(rng, range(6), 64))
    before = m.state.mu[: m.state.n_words].copy()
    totals = m.state.mu_totals.copy()
    reset_topics(m.state, [1, 4])
    after = m.state.mu[: m.state.n_words]
    assert np.all(after[:, [1, 4]] == m.state.smoothing)
    assert np.array_equal(np.delete(after, [1, 4], axis=1), np.delete(before, [1, 4], axis=1))
    np.testing.assert_allclose(m.state.mu_totals, after.sum(axis=0), rtol=1e-12)
    assert np.array_equal(np.delete(m.state.mu_totals, [1, 4]), np.delete(totals, [1, 4]))


def test_a_replica_spares_the_newborns_of_its_records_still_in_flight():
    """A replica computes its next batch before its last record is back from the update log.
    That batch sees the topic its last record is about to rebirth still dead, the smallest,
    and had it reborn again: the newborn was reset before any update tested it ("acceptance is
    the next update"). Own records not yet applied now spare their newborns."""
    from streamtopics.service.replication import Replica

    for seed in (0, 1, 2):
        rng = np.random.default_rng(seed)
        docs = _docs(rng, range(5), 3 * 64) + _docs(rng, range(THEMES), 20 * 64)
        rep = Replica(TopicModel(n_topics=THEMES, seed=seed))
        pending, offset, reborn = [], 0, []
        for lo in range(0, len(docs), 64):
            rec, _ = rep.compute(docs[lo:lo + 64], Source("docs", 0, lo, lo + 64))
            pending.append(rec)
            while len(pending) > (1 if rec.kind == "summary" else 0):  # one own record in flight
                done = pending.pop(0)
                rep.apply(done, offset)
                offset += 1
                reborn.append(set(done.reborn))
        assert sum(map(len, reborn)) > 0, seed  # births happened
        # each record was computed before its predecessor was applied: it may not rebirth its topics
        assert not any(a & b for a, b in zip(reborn, reborn[1:])), (seed, reborn)


def test_spared_topics_do_not_die_even_when_smallest():
    rng = np.random.default_rng(3)
    m = TopicModel(n_topics=6, seed=0, births=False)
    for _ in range(4):
        m.partial_fit(_docs(rng, range(6), 64))
    reset_topics(m.state, [2, 4])  # 4 still wins tokens of this batch; 2 none
    batch = m.prepare(_docs(rng, range(6), 64), grow=True)
    res = m.local_steps(batch)[0]
    chosen = [k for k, _, _ in propose_births(m.state, m.updater, batch, res.summary, np.random.default_rng(0))]
    assert chosen == [2]
    spared = [k for k, _, _ in propose_births(m.state, m.updater, batch, res.summary, np.random.default_rng(0),
                                              spare=[2])]
    assert 2 not in spared  # the next smallest topic outweighs a seed here: no birth at all
    assert propose_births(m.state, m.updater, batch, res.summary, np.random.default_rng(0), spare=range(6)) == []
