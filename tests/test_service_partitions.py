"""PartitionBook: where partitions resume, what is admitted, resets and quarantine - no Kafka.

These rules used to be daemon privates exercised through a half-built Daemon; they are a
pure class now, tested through its public seams (issue 16).
"""
from __future__ import annotations

from types import SimpleNamespace

from streamtopics.config import Config
from streamtopics.daemon import Daemon
from streamtopics.service.ledger import OffsetLedger, fingerprint
from streamtopics.service.partitions import PartitionBook, Span
from streamtopics.service.telemetry import Telemetry
from streamtopics.stream.consumer import RecordBatch


def _book(ledger: OffsetLedger | None = None) -> PartitionBook:
    book = PartitionBook(Telemetry())
    if ledger is not None:
        book.adopt(ledger)
    return book


def _batch(offsets, tag=b"a", ts=1):
    recs = [SimpleNamespace(offset=o, value=tag + str(o).encode(), timestamp=ts) for o in offsets]
    return RecordBatch("docs", 0, recs, [None] * len(recs), complete=True)


def test_assignment_during_a_batch_resumes_after_that_batch():
    """The prefetch poll inside a batch can run a rebalance: the partition being learned must
    resume after the batch (it will be learned), the others at the model's offsets, and a log
    reset found meanwhile must not record the old log's offset."""
    book = _book(OffsetLedger.from_offsets({"docs:0": 100, "docs:1": 40}))
    book.in_batch = Span("docs:0", 100, 150, None)
    # a lineage with a snapshot: unseen partitions follow the group's committed offset (None)
    assert book.start_offset("docs", 0, None, have_snapshot=True) == 150
    assert book.start_offset("docs", 1, None, have_snapshot=True) == 40
    assert book.start_offset("docs", 2, None, have_snapshot=True) is None
    assert not book.on_reset("docs", 0, 150, 7)
    # The batch in flight is not recorded; the log is re-read from its start, and whether it is
    # a new log (new epoch) is decided when its records arrive (the ledger's fingerprints).
    assert not book.learned(book.in_batch) and "docs:0" in book.reread
    book.in_batch = None
    assert book.start_offset("docs", 0, None, have_snapshot=True) == 0
    # without any snapshot, a partition this lineage never saw is read from its beginning
    assert book.start_offset("docs", 2, None, have_snapshot=False) == 0


def test_log_reset_with_stale_metadata_does_not_relearn_the_new_log():
    """CI once saw this race: the log was reset (broker restarted), the daemon learned the new
    log while the consumer's cached metadata still named the old topic id, and the next
    rebalance took the recorded (old) id for a recreated topic and re-read - learned twice -
    the new log from its beginning."""
    book = _book(OffsetLedger.from_offsets({"docs:0": 100}, topic_ids={"docs": "old"}))
    book.on_reset("docs", 0, 100, 0)
    book.ledger.new_epoch("docs:0", None)     # the first records showed other contents: a new log
    book.ledger.learned("docs:0", 0, 50)      # learned offsets 0..49 of the new log
    book.reread.clear()
    book.record_topic_id("docs:0", "docs", "old")   # metadata still stale: must not record "old" again
    assert book.ledger.topic_id("docs:0") is None
    # metadata refreshed; a rebalance asks where to resume
    assert book.start_offset("docs", 0, "new", have_snapshot=True) == 50
    book.record_topic_id("docs:0", "docs", "new")
    assert book.ledger.topic_id("docs:0") == "new"
    # a real re-creation later is still noticed
    assert book.start_offset("docs", 0, "newer", have_snapshot=True) == 0
    assert book.ledger.epoch("docs:0") == 2


def test_a_replica_claims_a_recreated_partition_in_a_new_epoch_and_changes_no_ledger_itself():
    """Replica mode: the ledger is the replicated one and changes only by applying the log. After
    a lost log, partition 2 of the recreated topic (id "new") was learned by another replica at
    epoch 0; this replica is then assigned partition 0, whose learned offsets are the old topic's.
    Only partition 0 is claimed in a new epoch, and nothing moves here: applying the claim does
    that on every replica. (Moving every partition of the topic here alone had this replica skip
    the other's later records of partition 2, which every other replica applied: the two-replica
    rebase test's second replica stalled 8-75 documents short.)"""
    ledger = OffsetLedger()
    ledger.learned("docs:0", 0, 400, topic_id="old")
    ledger.learned("docs:2", 0, 50, topic_id="new")
    book = _book(ledger)
    book.through_log = lambda key, epoch, topic_id: True
    assert book.claim_epoch("docs", 0, "new") == ("docs:0", 1, "new")
    assert book.claim_epoch("docs", 2, "new") == ("docs:2", 0, "new")  # judged by its own topic id
    assert book.claim_epoch("docs", 5, "new") == ("docs:5", 0, "new")  # never learned
    assert book.start_offset("docs", 0, "new", have_snapshot=False) == 0  # another log: from its beginning
    assert book.start_offset("docs", 2, "new", have_snapshot=False) == 50
    assert ledger.epochs() == {} and ledger.ranges("docs:0") == [(0, 400)] and ledger.ranges("docs:2") == [(0, 50)]


def test_a_replica_moves_an_owned_partition_to_a_new_log_through_the_update_log():
    """Replica mode, mid-ownership: a batch of offsets already learned comes from another log
    (another topic id). The book asks for the new epoch through the log (a claim) instead of
    starting it in its own ledger, which would make this replica skip its own records of the old
    log that are published but not yet applied here, while every other replica applies them."""
    ledger = OffsetLedger()
    ledger.learned("docs:0", 0, 10, topic_id="old")
    book = _book(ledger)
    asked = []

    def through_log(key, epoch, topic_id):  # the claim, applied from the log, moves the ledger
        asked.append((key, epoch, topic_id))
        ledger.new_epoch(key, topic_id)
        return True

    book.through_log = through_log
    same = book.admit(_batch(range(10, 15)), "old")  # the same log, new offsets: nothing asked
    assert same is not None and not asked
    rb = book.admit(_batch(range(0, 5), tag=b"x"), "newer")
    assert asked == [("docs:0", 1, "newer")] and rb is not None and len(rb.records) == 5
    assert ledger.epoch("docs:0") == 1
    # When the claim does not get through (stopping, or another replica owns it now), the batch
    # is not admitted and the ledger is left as it is.
    ledger2 = OffsetLedger()
    ledger2.learned("docs:0", 0, 10, topic_id="old")
    book2 = _book(ledger2)
    book2.through_log = lambda key, epoch, topic_id: False
    assert book2.admit(_batch(range(0, 5), tag=b"x"), "newer") is None
    assert ledger2.epoch("docs:0") == 0 and ledger2.ranges("docs:0") == [(0, 10)]


def test_a_reread_of_the_same_log_is_skipped_and_a_new_log_learned():
    book = _book()
    first = _batch(range(0, 5))
    book.ledger.learned("docs:0", 0, 5, fingerprint(first.records[0].value, 1))
    assert book.admit(_batch(range(0, 5)), "tid") is None                  # the same records again: nothing
    rb = book.admit(_batch(range(3, 8)), "tid")
    assert [r.offset for r in rb.records] == [5, 6, 7]                    # only the new ones
    assert book.telemetry.metrics.offsets_skipped.labels(reason="already_learned")._value.get() == 7
    rb = book.admit(_batch(range(0, 5), tag=b"other", ts=2), "tid")        # other contents at offset 0
    assert [r.offset for r in rb.records] == [0, 1, 2, 3, 4] and book.ledger.epoch("docs:0") == 1


def test_a_resumed_partition_names_the_record_before_its_offset():
    book = _book()
    rb = _batch(range(0, 5))
    span = Span.of(rb)
    assert span.tail == fingerprint(rb.records[-1].value, 1)
    assert book.learned(span)
    assert book.start_offset("docs", 0, None, have_snapshot=True) == 5
    assert book.before("docs", 0, 5) == span.tail  # the consumer reads record 4 again first
    assert book.before("docs", 0, 4) is None and book.before("docs", 0, None) is None


def test_batch_keys_are_stable_and_new_per_epoch():
    book = _book()
    assert book.batch_key("docs", 0, 256) == "docs:0:256"
    book.ledger.new_epoch("docs:0", None)
    assert book.batch_key("docs", 0, 256) == "docs:0:256~1"


def test_a_partition_that_keeps_resetting_is_quarantined_held_and_not_ready(tmp_path):
    d = Daemon(Config.from_dict({"snapshot": {"dir": str(tmp_path)}, "topics": {"input": "docs"}}, env={}),
               serve_metrics=False)
    d.model = SimpleNamespace(version=0)
    d.book.assign([("docs", 0)])
    d.telemetry.on_broker(True)
    assert d.readiness()[0]
    quarantined = [d.book.on_reset("docs", 0, 100, 0) for _ in range(d.book.ledger.max_resets + 1)]
    assert quarantined[-1] and not any(quarantined[:-1])
    ok, info = d.readiness()
    assert not ok and "docs:0" in info["quarantined"]
    assert d.metrics.partition_quarantined.labels(partition="0")._value.get() == 1
    assert d.book.admit(_batch(range(0, 5)), "tid") is None  # nothing more is learned from it
    assert d.book.assign([("docs", 0)]) == [("docs", 0)]     # held again when re-assigned


def test_readiness_says_how_long_the_group_join_has_taken_while_no_partition_is_assigned(tmp_path):
    d = Daemon(Config.from_dict({"snapshot": {"dir": str(tmp_path)}, "topics": {"input": "docs"}}, env={}),
               serve_metrics=False)
    d.model = SimpleNamespace(version=0)
    d.telemetry.on_broker(True)
    d.session.consumer = SimpleNamespace(join_progress=lambda: {"joining_s": 12.5, "patience_s": 30.0, "abandoned": 0})
    ok, info = d.readiness()
    assert not ok and info["group_join"] == {"joining_s": 12.5, "patience_s": 30.0, "abandoned": 0}
    d.book.assign([("docs", 0)])
    ok, info = d.readiness()
    assert ok and "group_join" not in info


def test_a_partition_read_from_its_start_is_in_the_next_snapshot_so_a_restart_never_follows_the_group():
    """A lineage's first snapshot comes right after its first batch, from one partition. A restart
    from it read the other partitions from the group's committed offset, which can only be another
    model's (a new snapshot.dir, same group) or a lost newer snapshot's: their records before it were
    never learned (fault audit: 1,498 of 2,000 documents). Every partition read from its start is
    now in the ledger, so the snapshot names it."""
    book = _book(OffsetLedger())
    assert [book.start_offset("docs", p, None, have_snapshot=False) for p in range(4)] == [0, 0, 0, 0]
    assert book.learned(Span("docs:3", 0, 256, None))
    saved = OffsetLedger.from_dict(book.ledger.to_dict())            # the first snapshot's ledger
    assert saved.keys() == ["docs:0", "docs:1", "docs:2", "docs:3"] and saved.positions() == {"docs:3": 256}
    restarted = _book(saved)
    assert [restarted.start_offset("docs", p, None, have_snapshot=True) for p in range(4)] == [0, 0, 0, 256]
    # a partition this lineage was never given still follows the group (another member's share)
    assert restarted.start_offset("docs", 7, None, have_snapshot=True) is None
    # replicas' ledgers change only through the update log: no local note
    replica = _book(OffsetLedger())
    replica.through_log = lambda key, epoch, topic_id: True
    assert replica.start_offset("docs", 0, None, have_snapshot=False) == 0 and replica.ledger.keys() == []
