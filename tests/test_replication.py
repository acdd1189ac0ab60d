"""Replicas as deterministic state machines over an update log (service/replication.py).

No broker: the log is a Python list here; the Kafka wiring is the daemon's (issue 17). What
these tests pin down is the part that makes replicas agree: whoever computes what, against
whichever stale model, every replica that applied the same log prefix holds the same model bit
for bit, and a source range is learned once however often it is published.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from streamtopics import TopicModel
from streamtopics.corpora import load_reuters_r8
from streamtopics.service.replication import (FORMAT_VERSION, RECORD_VERSION, Assembler, NewerFormat, Replica,
                                              Source, UpdateRecord, decode, digest, encode)

K = 12
B = 64


@pytest.fixture(scope="module")
def corpus():
    docs = [d.text for d in load_reuters_r8("train")[:1600]]
    tok = TopicModel(n_topics=K).tokenizer
    tokens = [t for t in (tok(d) for d in docs) if t]
    return tokens[:1280], tokens[1280:1500]


@pytest.fixture(scope="module")
def labelled():
    """R8 token lists with their labels: (train tokens, train labels, test tokens, test labels)."""
    tok = TopicModel(n_topics=K).tokenizer
    docs = load_reuters_r8("train")  # sorted by label: take a fixed shuffle
    docs = [docs[i] for i in np.random.default_rng(0).permutation(len(docs))[:1500]]
    pairs = [(t, d.label) for t, d in ((tok(d.text), d) for d in docs) if t]
    tokens, labels = [p[0] for p in pairs], [p[1] for p in pairs]
    return tokens[:1280], labels[:1280], tokens[1280:], labels[1280:]


def _model(**kw):
    return TopicModel(n_topics=K, seed=3, threads=1, **kw)


def _batches(tokens, partitions=2):
    """Batches of B documents, alternating over ``partitions`` input partitions."""
    out, next_off = [], [0] * partitions
    for i in range(0, len(tokens), B):
        p = (i // B) % partitions
        chunk = tokens[i:i + B]
        out.append((Source("docs", p, next_off[p], next_off[p] + len(chunk)), chunk))
        next_off[p] += len(chunk)
    return out


def _run(replicas, batches, lag=1, labels=None):
    """Replica i computes every len(replicas)-th batch against its model as it is; the log is
    applied by every replica ``lag`` records behind its end (so computations are stale).
    ``labels``: one target list per batch (supervised models)."""
    log = []
    for j, (src, toks) in enumerate(batches):
        r = replicas[j % len(replicas)]
        rec, _ = r.compute(toks, src, None if labels is None else labels[j])
        log.append(encode(rec, max_bytes=40_000))  # small parts: splitting is exercised
        for rep in replicas:
            _apply_upto(rep, log, len(log) - lag)
    for rep in replicas:
        _apply_upto(rep, log, len(log))
    return log


def _apply_upto(rep, log, end):
    asm = Assembler()
    while rep.offset < end:
        whole = None
        for raw in log[rep.offset]:
            whole = asm.add(*decode(raw))
        rep.apply(whole, rep.offset)


@pytest.mark.parametrize("update,engine", [("stochastic", "lsparse"), ("memoized", "lsparse"),
                                           ("stochastic", "alias")])
def test_replicas_that_applied_the_same_log_hold_bit_identical_models(corpus, update, engine):
    train, _ = corpus
    replicas = [Replica(_model(update=update, engine=engine)) for _ in range(3)]
    log = _run(replicas, _batches(train), lag=2)
    digests = {digest(r.model) for r in replicas}
    assert len(digests) == 1
    # a replica that joins later and replays the whole log gets the same model
    late = Replica(_model(update=update, engine=engine))
    _apply_upto(late, log, len(log))
    assert digest(late.model) == digests.pop()
    assert late.model.state.docs_seen == len(train) and late.applied == len(log)
    assert any(len(parts) > 1 for parts in log)  # records were split and put back together


def test_topic_births_travel_in_the_log_and_replicas_stay_identical(corpus):
    """A birth resets a topic at one log offset on every replica (births.py, ``reborn``).
    corpus_size="seen" makes births frequent on this small stream (the default rule's larger D
    leaves fewer dead topics here, so whether one occurs would be up to the seeds)."""
    train, _ = corpus
    replicas = [Replica(_model(corpus_size="seen")) for _ in range(3)]
    log = _run(replicas, _batches(train), lag=2)
    assert sum(len(decode(parts[0])[0].reborn or []) for parts in log) >= 2
    late = Replica(_model(corpus_size="seen"))
    _apply_upto(late, log, len(log))
    assert len({digest(r.model) for r in replicas + [late]}) == 1


def test_the_explorer_follows_a_replica_with_its_top_words_exact(corpus):
    """A replica's computed batch reaches the topic explorer (``Computed.batch``): its known
    words' entries, and as top-word candidates those words plus every row the updates applied
    since the last batch touched, including other replicas' records and births. The explorer's
    incremental top words then equal a full scan of the model after every batch."""
    from streamtopics.explore import TopicExplorer
    from streamtopics.quality import top_word_ids

    train, _ = corpus
    replicas = [Replica(_model(corpus_size="seen")) for _ in range(2)]
    ex = TopicExplorer()
    log, checked = [], 0
    for j, (src, toks) in enumerate(_batches(train)):
        r = replicas[j % 2]
        n_known = len(r.model.vocab)
        rec, out = r.compute(toks, src)
        if r is replicas[0] and out is not None:
            assert out.batch.n_docs == len(toks) and (out.batch.word_ids < n_known).all()
            assert ex.observe(r.model, out.batch, out.theta, list(range(len(toks))), toks) is not None
            st = r.model.state
            if st.n_updates > 2:  # past the explorer's first full scans: incremental passes
                full = top_word_ids(st.mu[: st.n_words], 10)
                words = r.model.vocab.words
                assert [t["top_words"] for t in ex.view["topics"]] == [[words[i] for i in row] for row in full]
                checked += 1
        log.append(encode(rec))
        for rep in replicas:
            _apply_upto(rep, log, len(log) - 1)
    assert checked >= 5 and sum(len(decode(p[0])[0].reborn or []) for p in log) >= 1


def test_a_source_range_is_learned_once_however_often_it_is_published(corpus):
    train, _ = corpus
    a, b = Replica(_model()), Replica(_model())
    batches = _batches(train[:512])
    log = _run([a, b], batches, lag=0)
    n = a.model.state.docs_seen
    # a zombie that lost its partition re-computes and publishes a batch already in the log
    src, toks = batches[3]
    log.append(encode(b.compute(toks, src)[0]))
    # and a record of a range that overlaps a learned one
    log.append(encode(a.compute(toks[:10], Source(src.topic, src.partition, src.first + 5, src.first + 15))[0]))
    for r in (a, b):
        _apply_upto(r, log, len(log))
        assert r.model.state.docs_seen == n == 512 and r.skipped == 2 and r.unlearned == 0
    # a record reaching past the learned ranges is skipped whole, and its uncovered offsets counted
    end = a.ledger.position(src.key)
    log.append(encode(a.compute(toks, Source(src.topic, src.partition, end - len(toks) + 7, end + 7))[0]))
    for r in (a, b):
        _apply_upto(r, log, len(log))
        assert r.skipped == 3 and r.unlearned == 7 and r.model.state.docs_seen == 512
    assert digest(a.model) == digest(b.model)
    # a new log epoch of the same partition is new data
    log.append(encode(a.compute(toks, Source(src.topic, src.partition, src.first, src.next, epoch=1))[0]))
    _apply_upto(a, log, len(log))
    assert a.model.state.docs_seen == 512 + len(toks)


def test_computing_leaves_the_model_unchanged(corpus):
    train, _ = corpus
    r = Replica(_model())
    _apply_upto(r, [encode(r.compute(train[:B], Source("docs", 0, 0, B))[0])], 1)
    before = (digest(r.model), len(r.model.vocab))
    rec, out = r.compute(train[B:2 * B] + [["zzzunseenword", "another_new_one"]], Source("docs", 0, B, 2 * B + 1))
    theta = out.theta
    assert (digest(r.model), len(r.model.vocab)) == before
    assert theta.shape == (B + 1, K) and np.allclose(theta.sum(axis=1), 1.0)
    assert "zzzunseenword" in rec.new_words and (rec.known < 0).sum() == len(rec.new_words)


@pytest.mark.parametrize("engine", ["lsparse", "alias"])
def test_replicated_learning_scores_like_one_model(corpus, engine):
    """Two replicas with stale computations learn as well as one model on the same batches."""
    train, test = corpus
    one = _model(engine=engine)
    for _, toks in _batches(train):
        one.process(one.prepare(toks), learn=True)
    replicas = [Replica(_model(engine=engine)) for _ in range(2)]
    _run(replicas, _batches(train), lag=1)
    single = one.heldout_loglik(test)
    replicated = replicas[0].model.heldout_loglik(test)
    assert abs(replicated - single) <= 0.01 * abs(single), (replicated, single)


def test_unsupported_models_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="evict"):
        Replica(TopicModel(n_topics=4, vocab_cap=100, vocab_policy="evict"))
    with pytest.raises(ValueError, match="not an update record"):
        decode(b"\x81\xa1x\x01")


def _labelled_batches(tokens, labels, partitions=2, unlabelled_every=5):
    """_batches with each batch's targets; every ``unlabelled_every``-th document has none."""
    batches = _batches(tokens, partitions)
    targets = [None if i % unlabelled_every == 0 else y for i, y in enumerate(labels)]
    return batches, [targets[j * B:(j + 1) * B] for j in range(len(batches))]


@pytest.mark.parametrize("supervision,update,engine", [("hinge", "stochastic", "lsparse"),
                                                        ("logistic", "memoized", "lsparse"),
                                                        ("hinge", "memoized", "lsparse"),
                                                        ("hinge", "stochastic", "alias")])
def test_supervised_replicas_hold_bit_identical_models_and_classifiers(labelled, supervision, update, engine):
    """The classifier travels in the record: replicas computing stale batches, new labels first
    seen by different replicas, a late replica replaying the log: one digest (topics,
    vocabulary, and the head's whole state: labels in log order, eta and its draws, statistics)."""
    train, y, _, _ = labelled
    batches, targets = _labelled_batches(train, y)
    replicas = [Replica(_model(update=update, supervision=supervision, engine=engine)) for _ in range(3)]
    log = _run(replicas, batches, lag=2, labels=targets)
    digests = {digest(r.model) for r in replicas}
    assert len(digests) == 1
    late = Replica(_model(update=update, supervision=supervision, engine=engine))
    _apply_upto(late, log, len(log))
    assert digest(late.model) == digests.pop()
    head = late.model.head
    assert head.n_updates == len(log) and sorted(head.labels) == sorted(set(y))
    assert head.docs_seen == sum(t is not None for ts in targets for t in ts)


def test_supervised_replicas_predict_like_one_model(labelled):
    """Accuracy of two replicas (stale computations, log order) against one model on the same
    batches: the classifier learns the same documents once each."""
    train, y, test, y_test = labelled
    batches, targets = _labelled_batches(train, y, unlabelled_every=10 ** 9)
    one = _model(supervision="hinge")
    for (_, toks), ts in zip(batches, targets):
        one.process(one.prepare(toks), learn=True, labels=ts)
    replicas = [Replica(_model(supervision="hinge")) for _ in range(2)]
    _run(replicas, batches, lag=1, labels=targets)

    def accuracy(model):
        return float(np.mean([p == t for p, t in zip(model.predict(test), y_test)]))

    single, replicated = accuracy(one), accuracy(replicas[0].model)
    assert single > 0.6 and replicated >= single - 0.05, (replicated, single)


def test_computing_a_supervised_batch_leaves_the_classifier_unchanged(labelled):
    train, y, _, _ = labelled
    r = Replica(_model(supervision="logistic"))
    _apply_upto(r, [encode(r.compute(train[:B], Source("docs", 0, 0, B), y[:B])[0])], 1)
    before = (digest(r.model), list(r.model.label_names), r.model.head.scale_stats.n_docs)
    labels = y[B:2 * B - 1] + ["a-label-nobody-has-seen"]
    rec, out = r.compute(train[B:2 * B], Source("docs", 0, B, 2 * B), labels)
    assert (digest(r.model), list(r.model.label_names), r.model.head.scale_stats.n_docs) == before
    # predictions come from the classifier at the record's base, over its labels then
    assert out.label_names == before[1] and out.scores.shape == (B, len(before[1])) and len(out.predicted) == B
    assert rec.targets == labels and rec.doc_len.shape == (B,)
    whole, part, parts = decode(encode(rec)[0])
    assert (part, parts) == (0, 1) and whole.targets == labels and np.array_equal(whole.doc_len, rec.doc_len)
    # applied, the new label is learned, with the same id on every replica
    r.apply(whole, 1)
    assert r.model.label_names[-1] == "a-label-nobody-has-seen"


def test_a_claim_fences_the_zombie_that_lost_its_partition(corpus):
    """Replica a owns partition 0 and is still computing when b is assigned the partition and
    claims it; a's late record (cut differently from b's batches) is skipped by every replica,
    b resumes exactly where the learned ranges end, and nothing is learned twice or lost."""
    import copy

    train, _ = corpus
    a, b, c = (Replica(_model(), writer=w) for w in "abc")
    replicas = (a, b, c)
    log: list[list[bytes]] = []

    def publish(rec):
        log.append(encode(rec))
        for r in replicas:
            _apply_upto(r, log, len(log))

    key = "docs:0"
    publish(a.claim("docs", 0, 0))
    assert a.claimed(key) and not b.claimed(key)
    publish(a.compute(train[:64], Source("docs", 0, 0, 64))[0])
    zombie, _ = a.compute(train[64:128], Source("docs", 0, 64, 128))  # a's next batch, not yet published
    publish(b.claim("docs", 0, 0))  # a's session timed out: b owns the partition now
    assert b.claimed(key) and not a.claimed(key)
    start = b.ledger.position(key)
    assert start == 64  # b resumes where the learned ranges end once its claim is applied
    # snapshot of an observer here (model, offset, ledger and owners), restored later
    saved = (copy.deepcopy(c.model), c.offset, copy.deepcopy(c.ledger), dict(c.owners))
    publish(b.compute(train[64:100], Source("docs", 0, 64, 100))[0])  # b's batch is cut by time
    publish(zombie)  # the zombie's record arrives late: [64, 128) overlaps [64, 100) in part
    publish(b.compute(train[100:164], Source("docs", 0, 100, 164))[0])
    for r in replicas:
        assert r.model.state.docs_seen == 164 and r.fenced == 1 and r.unlearned == 0
        assert r.ledger.ranges(key) == [(0, 164)]
    assert len({digest(r.model) for r in replicas}) == 1
    # a replica restored from the snapshot taken after b's claim decides the same way
    model, offset, ledger, owners = saved
    d = Replica(model, offset=offset, ledger=ledger, owners=owners, writer="d")
    _apply_upto(d, log, len(log))
    assert d.fenced == 1 and digest(d.model) == digest(a.model)
    # a record computed under no claim is fenced once the partition has an owner
    publish(Replica(_model(), writer="e").compute(train[164:200], Source("docs", 0, 164, 200))[0])
    assert all(r.fenced == 2 and r.model.state.docs_seen == 164 for r in replicas)


def test_a_claim_in_a_new_epoch_moves_every_replica_to_the_new_log_and_its_owners_records_count(corpus):
    """The topic of partition 0 was created again: its new owner claims it in the next epoch with
    the topic's new id. Applying the claim moves every replica's ledger alike (the old log's
    offsets no longer cover anything); the owner's batches of the new log, at offsets the old log
    had learned, are learned once everywhere, and the replicas stay identical, ledgers included."""
    train, _ = corpus
    a, b = Replica(_model(), writer="a"), Replica(_model(), writer="b")
    log: list[list[bytes]] = []

    def publish(rec):
        log.append(encode(rec))
        for r in (a, b):
            _apply_upto(r, log, len(log))

    publish(a.claim("docs", 0, 0, "old"))
    assert a.ledger.topic_id("docs:0") == b.ledger.topic_id("docs:0") == "old"  # known from the first claim
    publish(a.compute(train[:64], Source("docs", 0, 0, 64, 0, "old"))[0])
    publish(b.claim("docs", 0, 1, "new"))
    for r in (a, b):
        assert r.ledger.epoch("docs:0") == 1 and r.ledger.topic_id("docs:0") == "new"
        assert r.ledger.position("docs:0") is None  # the new log is read from its beginning
    publish(b.compute(train[64:128], Source("docs", 0, 0, 64, 1, "new"))[0])
    for r in (a, b):
        assert r.model.state.docs_seen == 128 and r.skipped == 0 and r.ledger.ranges("docs:0") == [(0, 64)]
    assert digest(a.model) == digest(b.model)
    assert a.ledger.to_dict() == b.ledger.to_dict()


def test_a_record_the_classifier_cannot_learn_is_skipped_alike_everywhere(labelled):
    """A label cap (on_overflow="error") reached by another replica's record after this one was
    computed: applying would raise on every replica and block the log. It is skipped instead,
    before anything changes, its offsets counted as unlearned, and replicas stay identical."""
    train, y, _, _ = labelled
    kinds = sorted(set(y))
    first = [t for t in y if t in kinds[:2]]
    rows = [i for i, t in enumerate(y) if t in kinds[:2]][:2 * B]
    a, b = (Replica(_model(supervision="hinge", sup_max_labels=3)) for _ in range(2))
    log = [encode(a.compute([train[i] for i in rows[:B]], Source("docs", 0, 0, B), first[:B])[0])]
    for r in (a, b):
        _apply_upto(r, log, 1)
    other = [i for i, t in enumerate(y) if t == kinds[2]][:B]
    newer = [i for i, t in enumerate(y) if t == kinds[3]][:B]
    # both computed against the model with two labels: each adds one more
    rec_b = b.compute([train[i] for i in other], Source("docs", 1, 0, len(other)), [kinds[2]] * len(other))[0]
    rec_a = a.compute([train[i] for i in newer], Source("docs", 0, B, B + len(newer)), [kinds[3]] * len(newer))[0]
    log += [encode(rec_b), encode(rec_a)]
    for r in (a, b):
        _apply_upto(r, log, 3)
        assert r.skipped == 1 and r.unlearned == len(newer) and len(r.model.label_names) == 3
        assert r.ledger.position("docs:0") == B + len(newer)  # its owner moves on
    assert digest(a.model) == digest(b.model)


def test_a_record_that_raises_while_applied_is_skipped_and_counted(corpus):
    train, _ = corpus
    a, b = Replica(_model()), Replica(_model())
    log = [encode(a.compute(train[:B], Source("docs", 0, 0, B))[0])]
    for r in (a, b):
        _apply_upto(r, log, 1)
    bad = a.compute(train[B:2 * B], Source("docs", 0, B, 2 * B))[0]
    assert bad.kind == "summary"
    bad.values = bad.values[:3]  # an inconsistent record: fewer values than its rows say
    for r in (a, b):
        assert r.apply(bad, 1) is False and r.unlearned == B and r.ledger.position("docs:0") == 2 * B
    assert digest(a.model) == digest(b.model) and a.model.state.docs_seen == B


def test_wire_values_are_half_precision_unless_too_large():
    def roundtrip(values):
        rec = UpdateRecord(Source("d", 0, 0, 1), 0, n_docs=1, known=np.array([3]), indptr=np.array([0, len(values)]),
                           topics=np.arange(len(values)), values=np.array(values), totals=np.array([70_000.0]))
        return decode(encode(rec)[0])[0]

    small = roundtrip([0.5, 3.25, 1e-3])
    assert np.array_equal(small.values, np.array([0.5, 3.25, 1e-3], dtype=np.float16).astype(np.float64))
    assert small.totals[0] == 70_000.0  # word counts keep float32 (float16 would round them)
    large = roundtrip([0.5, 1e5])  # past float16's range: the whole array travels as float32
    assert np.array_equal(large.values, np.array([0.5, 1e5], dtype=np.float32).astype(np.float64))


def test_wire_rounds_like_numpy_float16_and_leaves_out_what_rounds_to_zero():
    """Every float16 value, every midpoint between neighbours (ties to even) and its neighbours,
    subnormals and values far below them: the decoded record holds numpy's float16 rounding of
    each value, without the entries that round to zero (rows keep their places)."""
    h = np.arange(0, 0x7C00, dtype=np.uint16).view(np.float16).astype(np.float64)
    h = h[h < 60_000]  # above, the whole array travels as float32
    mid = (h[:-1] + h[1:]) / 2
    rng = np.random.default_rng(5)
    values = np.concatenate([h, mid, np.nextafter(mid, 0), np.nextafter(mid, 1), 10.0 ** rng.uniform(-60, 4.7, 20_000)])
    values = rng.permutation(values)
    rows = 4000
    indptr = np.linspace(0, values.size, rows + 1).astype(np.int64)
    topics = rng.integers(0, 100, values.size).astype(np.int32)
    rec = UpdateRecord(Source("d", 0, 0, 1), 0, n_docs=1, known=np.arange(rows), indptr=indptr, topics=topics,
                       values=values, totals=np.ones(rows))
    parts = encode(rec, max_bytes=65_536)
    assert len(parts) > 1  # split by rows as well
    asm = Assembler()
    got = [w for w in (asm.add(*decode(raw)) for raw in parts) if w is not None][0]
    half = values.astype(np.float16)
    keep = half != 0
    assert 0 < keep.sum() < values.size
    assert np.array_equal(got.values, half[keep].astype(np.float64))
    assert np.array_equal(got.topics, topics[keep])
    per_row = np.add.reduceat(keep.astype(np.int64), indptr[:-1]) if values.size else np.zeros(rows)
    assert np.array_equal(np.diff(got.indptr), per_row) and np.array_equal(got.known, rec.known)


def test_a_non_finite_local_step_never_reaches_the_update_log(corpus, monkeypatch):
    """A replica whose local step breaks down numerically raises instead of publishing a record
    (every replica would apply its NaN), and its model is left as it was."""
    tokens, _ = corpus
    rep = Replica(_model())
    batches = _batches(tokens[:2 * B], partitions=1)
    for j, (src, toks) in enumerate(batches[:1]):
        rep.apply(decode(encode(rep.compute(toks, src)[0])[0])[0], j)
    before = digest(rep.model)
    infer = rep.model.local_step.infer

    def poisoned(state, batch, **kw):
        out = infer(state, batch, **kw)
        if out.summary is not None:
            out.summary.values[-1] = np.inf
        return out

    monkeypatch.setattr(rep.model.local_step, "infer", poisoned)
    src, toks = batches[1]
    with pytest.raises(FloatingPointError, match="non-finite expected counts"):
        rep.compute(toks, src)
    assert digest(rep.model) == before and rep.offset == 1


def test_a_record_of_a_newer_wire_format_is_refused_not_taken_for_foreign_data():
    """Foreign messages are skipped by every replica alike; a record of a newer release's format
    must not be (the replicas of that release apply it): decode says which is which."""
    import msgpack

    rec = UpdateRecord(source=Source("docs", 0, 0, 10), base=3, kind="claim", writer="w")
    m = msgpack.unpackb(encode(rec)[0])
    # update records stay at version 1: a release that reads only version 1 still reads them
    assert m["v"] == RECORD_VERSION == 1 and decode(encode(rec)[0])[0].base == 3
    with pytest.raises(NewerFormat, match=f"version {FORMAT_VERSION + 1}"):
        decode(msgpack.packb({**m, "v": FORMAT_VERSION + 1}))
    for foreign in ({"v": FORMAT_VERSION + 7, "hello": 1}, [1, 2], {"v": "9", "rid": "x", "kind": "batch"}):
        with pytest.raises(ValueError) as err:
            decode(msgpack.packb(foreign))
        assert not isinstance(err.value, NewerFormat)
    with pytest.raises(ValueError, match="not an update record"):
        decode(b"\xc1 not msgpack")


def test_a_rebase_travels_in_parts_and_a_version_1_reader_refuses_it():
    """The snapshot bytes of a rebase come back whole from parts in any interleaving with other
    messages; the parts are wire format 2, which a release reading only version 1 must refuse
    (skipping it would leave that replica on a model nobody else holds)."""
    import msgpack

    from streamtopics.service import replication
    from streamtopics.service.rebase import REBASE_VERSION, Rebase, RebaseJoiner, encode_rebase

    data = bytes(range(256)) * 1200  # 307,200 bytes
    msgs = encode_rebase(data, "a", 17, max_bytes=70000)
    assert len(msgs) == 5 and all(len(m) <= 70000 for m in msgs)
    joiner, whole = RebaseJoiner(), []
    for raw in msgs[::-1]:  # any order of arrival
        part, i, n = decode(raw)
        assert isinstance(part, Rebase) and (i, n) == (part.part, 5)
        got = joiner.add(part)
        if got is not None:
            whole.append(got)
    assert len(whole) == 1 and whole[0].data == data and (whole[0].replica, whole[0].old_offset) == ("a", 17)
    assert msgpack.unpackb(msgs[0])["v"] == REBASE_VERSION == FORMAT_VERSION == 2
    old = replication.FORMAT_VERSION
    replication.FORMAT_VERSION = 1  # a release before rebases
    try:
        with pytest.raises(NewerFormat, match="version 2"):
            decode(msgs[0])
    finally:
        replication.FORMAT_VERSION = old


def test_a_record_carries_its_input_topic_id_into_every_replicas_ledger():
    """The ledger a replica builds from the log knows the topic id of a partition it never read
    (a topic created again is then told from its old log after a rebase or a rebalance)."""
    m = TopicModel(n_topics=4, seed=0)
    m.partial_fit(["apple banana cherry", "banana cherry date"])
    rep = Replica(m, writer="w")
    rec, _ = rep.compute([["apple", "banana"], ["cherry", "date"]], Source("docs", 1, 0, 2, 0, "tid-1"))
    assert decode(encode(rec)[0])[0].source.topic_id == "tid-1"
    other = Replica(copy.deepcopy(m), writer="v")
    assert other.apply(decode(encode(rec)[0])[0], 0)
    assert other.ledger.topic_id("docs:1") == "tid-1"


def test_a_batch_record_above_the_limit_travels_in_parts_by_documents(labelled):
    """A record computed while topics wait for a seed carries its batch's tokens (seeding.py); one
    above the broker's message limit is split by documents, each part with its documents' targets,
    and put back together it applies exactly as the whole record does."""
    tokens, labels, _, _ = labelled
    rec, _ = Replica(_model(supervision="hinge")).compute(tokens[:200], Source("docs", 0, 0, 200), labels[:200])
    assert rec.kind == "batch"
    parts = encode(rec, max_bytes=20_000)
    assert len(parts) > 1 and max(map(len, parts)) <= 20_000
    asm, whole = Assembler(), None
    for raw in parts:
        whole = asm.add(*decode(raw))
    assert whole.tokens == rec.tokens and whole.targets == rec.targets and whole.n_docs == 200
    a, b = Replica(_model(supervision="hinge")), Replica(_model(supervision="hinge"))
    a.apply(whole, 0)
    b.apply(decode(encode(rec, max_bytes=10 ** 9)[0])[0], 0)
    assert a.model.state.docs_seen == 200 and digest(a.model) == digest(b.model)


def test_a_replica_of_other_settings_stops_at_join_and_the_logs_replicas_skip_its_records(corpus):
    """Records carry their writer's model settings (``model_settings``). A replica started with
    another number of topics than the log's model meets the log's first record and refuses
    (``ForeignSettings``, before anything is applied); a record it published meanwhile is
    skipped by every replica of the log's settings, alike, and its range is left to the
    partition's next owner. Before this, the odd replica's 8-topic record was applied into the
    12-topic models (IndexError on one side, a corrupted model on the other)."""
    from streamtopics.service.replication import ForeignSettings, model_settings

    train, _ = corpus
    a, b = Replica(_model(), writer="a"), Replica(_model(), writer="b")
    log: list[list[bytes]] = []
    for j, (src, toks) in enumerate(_batches(train[:256], partitions=1)):
        log.append(encode((a, b)[j % 2].compute(toks, src)[0]))
        for r in (a, b):
            _apply_upto(r, log, len(log))
    odd = Replica(TopicModel(n_topics=8, seed=3, threads=1), writer="odd")
    with pytest.raises(ForeignSettings, match=r"n_topics = 12 in the log, 8 here") as err:
        _apply_upto(odd, log, len(log))
    assert err.value.offset == 0 and odd.offset == 0 and odd.model.state.docs_seen == 0
    assert set(err.value.differences) == {"n_topics"}
    # the odd replica published a batch before it read the log: skipped alike, range left open
    end = a.ledger.position("docs:0")
    stray, _ = Replica(TopicModel(n_topics=8, seed=3, threads=1), writer="odd2").compute(
        train[256:320], Source("docs", 0, end, end + 64))
    assert stray.settings == model_settings(TopicModel(n_topics=8, seed=3))
    log.append(encode(stray))
    before = digest(a.model)
    for r in (a, b):
        _apply_upto(r, log, len(log))
        assert r.foreign == 1 and r.skipped == 1 and r.ledger.position("docs:0") == end
    assert digest(a.model) == digest(b.model) == before
    # the partition's next owner learns the same range
    log.append(encode(b.compute(train[256:320], Source("docs", 0, end, end + 64))[0]))
    for r in (a, b):
        _apply_upto(r, log, len(log))
        assert r.ledger.position("docs:0") == end + 64 and r.model.state.docs_seen == 320
    # a late replica of the log's settings replays it all and agrees; threads are the host's choice
    late = Replica(TopicModel(n_topics=K, seed=3, threads=2))
    _apply_upto(late, log, len(log))
    assert late.foreign == 1 and digest(late.model) == digest(a.model)


def test_spellings_of_one_setting_agree_and_other_values_do_not(corpus):
    """Fleet audit: ``beta = 0.05`` with K = 20 is what the default beta (None: 1/K) means, yet a
    replica configured so was refused ("beta = None in the log, 0.05 here"). Settings compare by
    value (``equivalent_settings``): beta 1/K, alpha "auto" for an unsupervised model (None is
    learned from 1/K) and table_draws max(K, 256) join a log of the defaults and learn the same model;
    another value is still refused."""
    from streamtopics.service.replication import ForeignSettings, model_settings, settings_differences

    train, _ = corpus
    a = Replica(_model(), writer="a")
    log = [encode(a.compute(toks, src)[0]) for src, toks in _batches(train[:192], partitions=1)]
    _apply_upto(a, log, len(log))
    same = Replica(_model(beta=1.0 / K, alpha="auto"), writer="same")
    _apply_upto(same, log, len(log))
    assert same.foreign == 0 and same.model.state.docs_seen == 192
    assert digest(same.model) == digest(a.model)
    with pytest.raises(ForeignSettings, match=r"beta = None in the log, 0.1 here"):
        _apply_upto(Replica(_model(beta=0.1), writer="odd"), log, len(log))
    with pytest.raises(ForeignSettings, match=r"alpha = None in the log, 0.08333"):
        _apply_upto(Replica(_model(alpha=1.0 / K), writer="fixed"), log, len(log))  # fixed, not learned
    ms = model_settings
    assert settings_differences(ms(_model(supervision="hinge")), ms(_model(supervision="hinge", alpha=1))) == {}
    assert set(settings_differences(ms(_model(supervision="hinge")), ms(_model(supervision="hinge", alpha="auto")))) \
        == {"alpha"}  # a supervised variational model's None is a fixed 1, not learned
    assert settings_differences(ms(_model(engine="alias")), ms(_model(engine="alias", table_draws=256))) == {}
    assert set(settings_differences(ms(_model(engine="alias")), ms(_model(engine="alias", table_draws=300)))) \
        == {"table_draws"}


def test_settings_travel_with_the_first_part_and_a_record_without_them_is_taken_as_agreeing(corpus):
    from streamtopics.service.replication import model_settings

    train, _ = corpus
    r = Replica(_model(supervision="hinge"))
    _apply_upto(r, [encode(r.compute(train[:B], Source("docs", 0, 0, B), ["x"] * B)[0])], 1)
    rec, _ = r.compute(train[B:3 * B], Source("docs", 0, B, 3 * B), ["x", "y"] * B)
    parts = encode(rec, max_bytes=20_000)
    assert len(parts) > 2
    decoded = [decode(p)[0] for p in parts]
    assert decoded[0].settings == model_settings(r.model) and all(d.settings is None for d in decoded[1:])
    asm = Assembler()
    whole = [asm.add(*decode(p)) for p in parts][-1]
    assert whole.settings == rec.settings and whole.settings["supervision"] == "hinge"
    # an older release's record (no settings) is applied as before
    old = decode(encode(replace_settings(rec, None))[0])[0]
    assert old.settings is None
    assert r.apply(old, 1) and r.foreign == 0


def replace_settings(rec, settings):
    import dataclasses
    return dataclasses.replace(rec, settings=settings)


def test_claims_carry_the_settings_so_an_idle_fleet_is_not_overruled_by_a_misconfigured_newcomer(corpus):
    """Fleet audit: two replicas of 12 topics, idle (their claims only in the log), and an
    8-topic newcomer whose batch reached the log first: the two were refused (the first batch
    record decided the log's settings) and the newcomer learned the stream alone. Claims now
    carry the settings and settle their writers: the newcomer is refused at the fleet's claims,
    and its own claim and records are skipped by the fleet."""
    from streamtopics.service.replication import ForeignSettings

    train, _ = corpus
    a, b = Replica(_model(), writer="a"), Replica(_model(), writer="b")
    odd = Replica(TopicModel(n_topics=8, seed=3, threads=1), writer="odd")
    log: list[list[bytes]] = [encode(a.claim("docs", 0, 0)), encode(b.claim("docs", 1, 0))]
    for r in (a, b):
        _apply_upto(r, log, len(log))
        assert r.settled and r.model.state.docs_seen == 0
    log.append(encode(odd.claim("docs", 1, 0)))  # published before it read the log
    log.append(encode(odd.compute(train[:64], Source("docs", 1, 0, 64))[0]))
    with pytest.raises(ForeignSettings, match="n_topics = 12 in the log, 8 here"):
        _apply_upto(odd, log, len(log))
    assert odd.offset == 0
    for r in (a, b):
        _apply_upto(r, log, len(log))
        assert r.foreign == 2 and r.owners["docs:1"] == 1 and r.claimed("docs:1") == (r is b)
    log.append(encode(b.compute(train[:64], Source("docs", 1, 0, 64))[0]))  # the partition's owner learns it
    for r in (a, b):
        _apply_upto(r, log, len(log))
        assert r.model.state.docs_seen == 64
    assert digest(a.model) == digest(b.model)
