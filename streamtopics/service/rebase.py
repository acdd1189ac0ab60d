"""Rebase messages: one replica's whole state (a snapshot file's bytes) through the update log.

When the update log is lost (a broker that lost its data, the topic created again), the replicas'
models stood at different offsets of a log that is gone, and nothing left in Kafka says which of
them the others should continue from. A replica that finds its log lost at start publishes a
*rebase*: the bytes of the snapshot it started from, in parts of at most ``max_bytes``. Every
replica adopts the **first** complete rebase of a log, in log order, and skips the later ones
(docs/scale-out.md, "When the update log is lost"): the log decides, as it decides every claim.

Rebase messages are wire format version 2 (``REBASE_VERSION``): a release that reads only
version 1 stops at one (``replication.NewerFormat``) instead of skipping it, which would leave it
on a model nobody else holds.
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass

import msgpack

__all__ = ["REBASE_VERSION", "Rebase", "RebaseJoiner", "encode_rebase", "rebase_from_map"]

REBASE_VERSION = 2


@dataclass(frozen=True)
class Rebase:
    """A rebase message (``parts`` > 1: one part of it) or, joined, the whole snapshot."""

    rid: str
    replica: str
    old_offset: int  # the update offset of the lost log its snapshot was at
    data: bytes
    part: int = 0
    parts: int = 1


def encode_rebase(data: bytes, replica: str, old_offset: int, max_bytes: int) -> list[bytes]:
    """The snapshot bytes as msgpack messages of at most about ``max_bytes`` each."""
    step = max(65536, int(max_bytes) - 4096)
    pieces = [data[i:i + step] for i in range(0, len(data), step)] or [b""]
    rid = uuid.uuid4().hex
    return [msgpack.packb({"v": REBASE_VERSION, "rid": rid, "kind": "rebase", "replica": replica,
                           "old_offset": int(old_offset), "part": i, "parts": len(pieces), "data": p},
                          use_bin_type=True) for i, p in enumerate(pieces)]


def rebase_from_map(m: dict) -> Rebase:
    """A decoded rebase message (raises KeyError/TypeError/ValueError when malformed)."""
    data = m["data"]
    if not isinstance(data, bytes):
        raise TypeError("rebase data must be bytes")
    return Rebase(str(m["rid"]), str(m.get("replica") or ""), int(m["old_offset"]), data, int(m["part"]),
                  int(m["parts"]))


class RebaseJoiner:
    """Parts of rebase messages back into whole ones (in the order their last part arrives)."""

    def __init__(self) -> None:
        self._parts: dict[str, dict[int, Rebase]] = {}

    def add(self, part: Rebase) -> Rebase | None:
        if part.parts <= 1:
            return part
        have = self._parts.setdefault(part.rid, {})
        have[part.part] = part
        if len(have) < part.parts:
            return None
        del self._parts[part.rid]
        return Rebase(part.rid, part.replica, part.old_offset, b"".join(have[i].data for i in range(part.parts)))
