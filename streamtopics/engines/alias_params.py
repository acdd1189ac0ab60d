"""What the alias kernels and their drivers share: the statistics slots and the multiple-try settings.

A module of its own so that the unsupervised (``alias``) and supervised (``alias_supervised``)
samplers both import it and neither imports the other at module level.
"""
from __future__ import annotations

import numpy as np

# Slots of the statistics vector the kernels fill.
S_WORD_PROP, S_WORD_ACC, S_DOC_PROP, S_DOC_ACC, S_REBUILDS, S_CHANGED = range(6)


def default_tries(K: int) -> tuple[int, int]:
    """(word, doc) candidates per MH step when ``tries`` is None (see ``engines.alias``)."""
    return (2, 1) if K >= 256 else (1, 1)


def check_tries(tries) -> tuple[int, int] | None:
    """Validate ``tries`` (None, an int >= 1 for both kinds, or a (word, doc) pair); return it normalised."""
    if tries is None:
        return None
    pair = tuple(tries) if isinstance(tries, (tuple, list)) else (tries, tries)
    if len(pair) != 2 or not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) and 1 <= t <= 64
                                 for t in pair):
        raise ValueError(f"tries must be None, an integer in [1, 64] or a (word, doc) pair of them (got {tries!r})")
    return int(pair[0]), int(pair[1])


def resolve_tries(tries, K: int) -> tuple[int, int]:
    """The (word, doc) candidates a run uses: ``tries`` validated, else the default for K."""
    pair = check_tries(tries)
    return default_tries(K) if pair is None else pair
