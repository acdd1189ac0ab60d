"""Growing label vocabulary: label strings <-> dense row indices of the classifier.

New label values may appear anywhere in a stream; each new value gets the next index
(which becomes a new row of eta, starting at the prior).  Indices are never reused or
reordered, so a snapshot restores the exact mapping.

Two policies, both explicit:

* ``max_labels`` caps the vocabulary.  When a *training* batch brings a new label past
  the cap, ``on_overflow="error"`` raises :class:`LabelCapacityError` (nothing is
  added), ``on_overflow="ignore"`` drops the label: the document then still counts as a
  negative for every known label (which it truly is) but no row is created.
* At *prediction / evaluation* time (``grow=False``) a label that is not in the
  vocabulary raises :class:`UnknownLabelError` with ``unknown="error"`` or maps to
  ``-1`` with ``unknown="ignore"``.

Labels are strings (they travel in msgpack snapshot headers and Kafka messages); any
other type is a ``TypeError`` rather than a silent ``str()`` that would not round-trip.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

OVERFLOW_POLICIES = ("error", "ignore")
UNKNOWN_POLICIES = ("error", "ignore")


class LabelCapacityError(ValueError):
    """A new label arrived while the vocabulary is at ``max_labels`` (policy "error")."""


class UnknownLabelError(KeyError):
    """A label that was never seen in training was looked up with ``unknown="error"``."""


class LabelVocabulary:
    """str <-> int map that only grows (optionally up to ``max_labels``)."""

    def __init__(self, max_labels: int | None = None, on_overflow: str = "error"):
        if max_labels is not None and (not isinstance(max_labels, int) or max_labels < 1):
            raise ValueError(f"max_labels must be a positive int or None (got {max_labels!r})")
        if on_overflow not in OVERFLOW_POLICIES:
            raise ValueError(f"on_overflow must be one of {OVERFLOW_POLICIES} (got {on_overflow!r})")
        self.max_labels = max_labels
        self.on_overflow = on_overflow
        self._labels: list[str] = []
        self._index: dict[str, int] = {}
        self.n_dropped = 0  # labels dropped by the "ignore" overflow policy (occurrences)

    # -- lookup ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._labels)

    def __iter__(self) -> Iterator[str]:
        return iter(self._labels)

    def __contains__(self, label) -> bool:
        return label in self._index

    def __getitem__(self, i: int) -> str:
        return self._labels[i]

    def __repr__(self) -> str:
        return f"LabelVocabulary({self._labels!r}, max_labels={self.max_labels})"

    @property
    def labels(self) -> list[str]:
        return list(self._labels)

    @staticmethod
    def _check(label) -> str:
        if not isinstance(label, str):
            raise TypeError(f"labels must be str (got {type(label).__name__} {label!r}); "
                            "convert explicitly, e.g. str(label)")
        return str(label)  # numpy's str_ (labels from an array) as the plain str it is

    def index(self, label: str, unknown: str = "error") -> int:
        """Index of a known label; unknown -> ``UnknownLabelError`` or -1 (``unknown="ignore"``)."""
        if unknown not in UNKNOWN_POLICIES:
            raise ValueError(f"unknown must be one of {UNKNOWN_POLICIES} (got {unknown!r})")
        i = self._index.get(self._check(label))
        if i is None:
            if unknown == "error":
                raise UnknownLabelError(label)
            return -1
        return i

    # -- growth ---------------------------------------------------------------------------
    def add(self, label: str) -> int:
        """Index of ``label``, adding it if new; -1 if dropped by the overflow policy."""
        i = self._index.get(self._check(label))
        if i is not None:
            return i
        if self.max_labels is not None and len(self._labels) >= self.max_labels:
            if self.on_overflow == "error":
                raise LabelCapacityError(
                    f"label {label!r} would be label number {len(self._labels) + 1}, "
                    f"over max_labels={self.max_labels}")
            self.n_dropped += 1
            return -1
        i = len(self._labels)
        self._labels.append(label)
        self._index[label] = i
        return i

    def encode(self, labels: Iterable[str], grow: bool = True, unknown: str = "error") -> list[int]:
        """Indices of ``labels``: growing (training) or lookup-only with the unknown policy.

        With ``grow=True`` and ``on_overflow="error"`` the call is atomic: if any label
        would overflow, nothing is added.
        """
        labels = [self._check(lab) for lab in labels]
        if not grow:
            return [self.index(lab, unknown) for lab in labels]
        if self.max_labels is not None and self.on_overflow == "error":
            new = {lab for lab in labels if lab not in self._index}
            if len(self._labels) + len(new) > self.max_labels:
                raise LabelCapacityError(
                    f"{len(new)} new label(s) {sorted(new)[:5]!r} would exceed "
                    f"max_labels={self.max_labels} (have {len(self._labels)})")
        return [self.add(lab) for lab in labels]

    def decode(self, indices: Iterable[int]) -> list[str]:
        return [self._labels[int(i)] for i in indices]

    # -- snapshots (msgpack-able) -----------------------------------------------------------
    def state(self) -> dict:
        return {"labels": list(self._labels), "max_labels": self.max_labels,
                "on_overflow": self.on_overflow, "n_dropped": self.n_dropped}

    @classmethod
    def restore(cls, state: dict) -> "LabelVocabulary":
        voc = cls(state.get("max_labels"), state.get("on_overflow", "error"))
        for lab in state["labels"]:
            if lab in voc._index:
                raise ValueError(f"duplicate label {lab!r} in a vocabulary snapshot")
            voc._index[voc._check(lab)] = len(voc._labels)
            voc._labels.append(lab)
        if voc.max_labels is not None and len(voc._labels) > voc.max_labels:
            raise ValueError("vocabulary snapshot holds more labels than its max_labels")
        voc.n_dropped = int(state.get("n_dropped", 0))
        return voc
