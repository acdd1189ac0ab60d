"""Named points of the daemon's cycle, and who listens to them.

Business logic announces where it is (``hooks.point("learned")``) and knows nothing about who
listens. The composition root (``Daemon``) subscribes the fault injector of
``streamtopics.testing.faults`` (a no-op unless ``STREAMTOPICS_FAULT`` arms it: one dict test
per point) so drills and kill -9 tests can crash or fail the daemon at an exact place; tests
may add their own subscribers. The point names and what each one means are listed in
``testing.faults.POINTS``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from .. import snapshot

__all__ = ["Hooks"]


class Hooks:
    """Subscribers called, in order, at every named point (exceptions propagate: a fault hook
    that raises stands for the work at that point failing)."""

    def __init__(self, subscribers: Iterable[Callable[[str], None]] = ()) -> None:
        self._subscribers = list(subscribers)

    def add(self, fn: Callable[[str], None]) -> None:
        self._subscribers.append(fn)

    def point(self, name: str) -> None:
        for fn in self._subscribers:
            fn(name)

    @classmethod
    def default(cls) -> Hooks:
        """The daemon's hooks: the process's fault injector at every point, including the
        points inside an atomic snapshot write (``snapshot.add_write_hook``)."""
        from ..testing import faults

        snapshot.add_write_hook(faults.hit)
        return cls([faults.hit])
