"""Shared fixtures: one real tansu broker per test session, unique topics per test.

The broker is a real Kafka-protocol server on loopback (never a mock). Its
storage is memory only, so a test that restarts it loses every topic: use
``fresh_topic`` (which re-starts a stopped session broker) rather than topic
names that outlive a test.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Run from a plain checkout too (no `pip install -e .`): make the repo importable.
_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from streamtopics.testing.broker import EmbeddedBroker, create_topics  # noqa: E402


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A tansu broker shared by the whole session (starts in ~30 ms)."""
    b = EmbeddedBroker()
    b.start()
    try:
        yield b
    finally:
        b.cleanup()


@pytest.fixture
def fresh_topic(broker: EmbeddedBroker) -> Callable[..., str]:
    """Factory: ``fresh_topic(partitions=1, prefix="t") -> name`` of a new, empty topic.

    Names are unique (uuid), so tests never see each other's records even on
    the shared broker. Topics are created explicitly: tansu would auto-create
    them with 4 partitions.
    """
    if not broker.is_running():  # a previous test stopped it to simulate loss
        broker.start()

    def make(partitions: int = 1, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        got = create_topics(broker.bootstrap, {name: partitions})
        assert got.get(name) == partitions, got
        return name

    return make
