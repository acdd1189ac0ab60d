"""streamtopics: topic models learned from a live stream.

Library API (no Kafka needed)::

    from streamtopics import TopicModel, load_snapshot
"""
from .model import TopicModel, load_snapshot
from .snapshot import SnapshotError

__all__ = ["TopicModel", "load_snapshot", "SnapshotError", "__version__"]
__version__ = "0.1.0"
