"""PublishPipeline's acknowledgement hook (``PublishJob.on_ok``) on a real broker.

A replica publishes a batch's update record the moment the broker has acknowledged the batch's
predictions (never before: kill -9 safety), on the publisher thread, so that the record is in
the log while the loop computes the next batch. The hook must run once per acknowledged job,
in submission order, on the publisher thread, and before the job counts as finished.
"""
from __future__ import annotations

import threading

from streamtopics.stream.producer import OutMessage, Publisher, PublishJob, PublishPipeline


def test_on_ok_runs_on_the_publisher_thread_in_order_before_the_job_is_finished(broker, fresh_topic):
    topic = fresh_topic(prefix="pub")
    pipeline = PublishPipeline(Publisher({"bootstrap_servers": broker.bootstrap, "acks": "all"}),
                               abort=lambda: False)
    calls = []

    def hook(i: int) -> None:
        finished = [j.meta for j in pipeline.completed()]  # what the loop would have collected by now
        calls.append((i, threading.current_thread().name, finished))

    try:
        for i in range(3):
            assert pipeline.submit(PublishJob([OutMessage(topic, f"m{i}".encode())], meta=i,
                                              on_ok=lambda i=i: hook(i)))
        assert pipeline.wait_idle(30)
        assert [c[0] for c in calls] == [0, 1, 2]
        assert {c[1] for c in calls} == {"streamtopics-publisher"}
        assert all(i not in finished for i, _, finished in calls)  # ran before its job finished
    finally:
        pipeline.close()


def test_a_message_the_broker_can_never_take_is_dropped_counted_and_the_rest_delivered(broker, fresh_topic):
    topic = fresh_topic(prefix="pub")
    dropped = []
    pub = Publisher({"bootstrap_servers": broker.bootstrap, "acks": "all"}, on_drop=dropped.append)
    try:
        n = pub.publish([OutMessage(topic, b"a"), OutMessage(topic, b"x" * 2_000_000, key=b"big"),
                         OutMessage(topic, b"b")])
    finally:
        pub.close(timeout_s=5)
    assert n == 1 and pub.dropped == 1 and dropped == [topic]


def test_undelivered_topic_events_do_not_cost_the_final_snapshot_but_undelivered_predictions_do():
    """Outbox.collect set ``failed`` (no final snapshot: learned batches are replayed) for any
    failed job, topic events and snapshot announcements included, which no offsets wait on
    (SIGTERM audit, read from the code): with [topics] events on, a stop while an event message
    was pending cost the final snapshot though every prediction was acknowledged."""
    from types import SimpleNamespace

    from streamtopics.config import Config
    from streamtopics.service.outbox import Outbox

    class _Pipeline:
        def __init__(self, jobs):
            self.jobs, self.pending_messages = jobs, 0

        def completed(self):
            out, self.jobs = self.jobs, []
            return out

    telemetry = SimpleNamespace(on_pending=lambda n: None)
    events = PublishJob([OutMessage("events", b"x")])  # meta None: not acknowledged (ok False)
    session = SimpleNamespace(pipeline=_Pipeline([events]))
    box = Outbox(Config(), session, telemetry, point=lambda name: None)
    assert box.collect(stopping=True) and not box.failed
    session.pipeline = _Pipeline([PublishJob([], meta=object())])  # a batch's predictions, not acknowledged
    box.collect(stopping=True)
    assert box.failed
