"""streamtopics: topic models learned from a live stream.

Library API (no Kafka needed)::

    from streamtopics import TopicModel, load_snapshot
    from streamtopics import LSparse, AliasMH, Stochastic, Memoized, Hinge, Logistic, Regression

    m = TopicModel(n_topics=100, engine=LSparse(sparsity=8), update=Stochastic(),
                   supervision=Hinge())          # or engine="lsparse", supervision="hinge"
"""
from .model import TopicModel, load_snapshot
from .options import AliasMH, Hinge, Logistic, LSparse, Memoized, Regression, Stochastic, Text, Vocabulary
from .snapshot import SnapshotError
from .state import NotFittedError

__all__ = ["TopicModel", "load_snapshot", "SnapshotError", "NotFittedError", "LSparse", "AliasMH", "Stochastic",
           "Memoized", "Hinge", "Logistic", "Regression", "Text", "Vocabulary", "__version__"]
__version__ = "0.1.0"
