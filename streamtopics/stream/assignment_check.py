"""A group leader's assignment, checked against what the group coordinator hands back.

The member that leads a consumer group computes every member's partitions and sends them in its
SyncGroup; the coordinator must hand each member what the leader computed for it. tansu 0.6.0
does not always. After a broker restart the daemon rejoins the new broker's group at generation 0
with the metadata it had (the input topic with one partition); a producer had meanwhile created the
topic with four. When the client's metadata catches up, kafka-python rejoins and, as the group's
only member and leader, computes partitions 0-3 for itself, but the rejoin keeps generation 0 and
SyncGroup returns the assignment stored for it before: partition 0 alone. kafka-python's check for
a changed partition count compares the metadata with what the leader *computed*, which now agree,
so it never rejoins again: three partitions stayed unread until the daemon was stopped (measured,
2026-11-29: `test_broker_outages_five_cycles_full`, 827 of 3,000 documents never predicted; the
coordinator's debug log shows the leader's SyncGroup with [0, 1, 2, 3] answered with [0]).

The same fault starves followers: two daemons in one group (on one topic, or on two topics that
share a group id) whose leader recomputes the group's assignment at the same generation leave the
follower with the old one, an empty one in the audit that found it (0 of 1,000 documents read in
130 s, `/readyz` "partitions: []" with the group stable).

``RecordingAssignor`` wraps one of kafka-python's assignors and keeps what it computed in the
member's current join as leader. ``LeaderCheck.verdict`` compares it with what the member was
handed and with its previous join: the member's own share must be what it computed, and a new
assignment of the group needs a new generation (Kafka's group protocol: SyncGroup distributes the
leader's assignment of *that* generation). The consumer rebuilds itself on a verdict
(``BatchingConsumer``); a rejoin is not enough, tansu keeps the member at its generation.
Followers compute nothing: their leader's check covers them. A broker that follows the protocol
never gives a verdict.
"""
from __future__ import annotations

from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

__all__ = ["JoinCheck", "LeaderCheck", "RecordingAssignor", "computed_group", "leading", "member_generation",
           "recording_assignors"]


class RecordingAssignor(AbstractPartitionAssignor):
    """kafka-python assignor ``inner`` (an instance or a class with classmethods), recording the
    assignment it computed in the current join; forgotten when the member joins again (kafka-python
    asks every assignor for its subscription metadata at each JoinGroup)."""

    def __init__(self, inner) -> None:
        self._inner = inner() if isinstance(inner, type) else inner  # supported_protocols is an instance method
        self.computed: dict[str, frozenset] | None = None
        self.topics: frozenset = frozenset()  # every topic the group's members subscribe to

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def version(self) -> int:
        return int(getattr(self._inner, "version", 0))

    def supported_protocols(self):
        return self._inner.supported_protocols()

    def metadata(self, topics):
        self.computed = None  # a new join: what the last one computed no longer applies
        return self._inner.metadata(topics)

    def assign(self, cluster, members):
        out = self._inner.assign(cluster, members)
        self.topics = frozenset(t for m in members for t in m.metadata.topics)
        self.computed = {member: frozenset((topic, int(p)) for topic, parts in a.assigned_partitions for p in parts)
                         for member, a in out.items()}
        return out

    def on_assignment(self, assignment, generation):
        return self._inner.on_assignment(assignment, generation)


def recording_assignors() -> tuple[RecordingAssignor, ...]:
    """kafka-python's default strategies (range, then round robin), each recording."""
    return RecordingAssignor(RangePartitionAssignor), RecordingAssignor(RoundRobinPartitionAssignor)


def leading(assignors) -> RecordingAssignor | None:
    """The assignor that computed the group's assignment in this member's current join; None
    when the member did not lead it."""
    return next((a for a in assignors if getattr(a, "computed", None) is not None), None)


def computed_group(assignors) -> dict[str, frozenset] | None:
    """The group's assignment this member computed as the leader of its current join ({member id:
    (topic, partition) pairs}); None when it did not lead it."""
    a = leading(assignors)
    return None if a is None else a.computed


def member_generation(consumer) -> tuple[str, int] | None:
    """(member id, generation) of a KafkaConsumer's group membership; None where kafka-python's
    internals differ."""
    try:
        gen = consumer._coordinator._generation
        return gen.member_id, int(gen.generation_id)
    except (AttributeError, TypeError, ValueError):
        return None


def _parts(pairs) -> list[int]:
    return sorted(p for _, p in pairs)


class LeaderCheck:
    """What one member computed as leader in its previous completed join, to judge the next."""

    def __init__(self) -> None:
        self._last: tuple | None = None  # (member id, generation, computed group assignment)

    def verdict(self, assignors, member: str | None, generation: int, received: frozenset) -> str | None:
        """Why the coordinator's answer to this join cannot be trusted, or None (also when the
        member did not lead the join). ``received``: the (topic, partition) pairs handed to it."""
        group = computed_group(assignors)
        last, self._last = self._last, (member, generation, group)
        if group is None or not member or member not in group:
            return None
        if group[member] != received:
            return (f"the group coordinator handed this member partitions {_parts(received)} where it computed "
                    f"{_parts(group[member])} as the group's leader")
        if last is not None and last[:2] == (member, generation) and last[2] is not None and last[2] != group:
            return (f"the group coordinator kept generation {generation} for a new assignment of the group: "
                    f"its other members keep the old one")
        return None


class JoinCheck:
    """One consumer's check of its group joins: ``new_member()`` gives the assignors for a new
    KafkaConsumer (``partition_assignment_strategy``), ``judge`` a verdict on each assignment, and
    ``warm`` the new client's metadata of the group's other topics.

    Why ``warm``: a rebuilt member is new, so it joins a new generation and, as leader, computes the
    assignment at once, with the metadata its new client has: its own topic only. A follower on
    another topic then gets nothing again, the client fetches that topic's metadata, rejoins at the
    same generation, and the check rebuilds it again. Fetching the group's topics first does not
    always hold (the client's next refresh covers its subscription only): two members on two topics
    in one group settled after 1-5 rebuilds in 6 of 7 runs and not within 12 in one. The lone
    member of the broker-restart case settles after one. One group per input topic avoids it."""

    def __init__(self) -> None:
        self.assignors = recording_assignors()
        self.leader = LeaderCheck()
        self.group_topics: frozenset = frozenset()  # known from this consumer's joins as leader

    def new_member(self) -> tuple[RecordingAssignor, ...]:
        self.assignors, self.leader = recording_assignors(), LeaderCheck()
        return self.assignors

    def warm(self, consumer, own_topic: str) -> None:
        """Have the new KafkaConsumer ``consumer`` fetch the metadata of the group's topics other
        than ``own_topic`` before its first join (``partitions_for_topic``, public API)."""
        for topic in sorted(self.group_topics - {own_topic}):
            try:
                consumer.partitions_for_topic(topic)
            except Exception:  # noqa: BLE001 - broker away: the join computes with what it has
                return

    def judge(self, consumer, tps) -> str | None:
        """``LeaderCheck.verdict`` for the partitions ``tps`` just assigned to the KafkaConsumer
        ``consumer``; None when its member id or generation cannot be read (kafka-python internals)."""
        mg = member_generation(consumer)
        if mg is None:
            return None
        if (led := leading(self.assignors)) is not None:
            self.group_topics = led.topics
        return self.leader.verdict(self.assignors, *mg, frozenset((tp.topic, tp.partition) for tp in tps))
