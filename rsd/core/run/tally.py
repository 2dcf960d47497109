"""Counting tasks by state as they move: per run (SCOPE_STATUS) and per group.

Every change of a task's state that the core makes, live or in replay, goes through
``tally`` (placing it, delivering, requeueing, finishing, forgetting), so the counters
are exact and reading them is O(1): no report ever walks the tasks. A message is not a
task and is not counted. A task is counted in the Scope object it was placed in
(``item.run``), so its later moves never touch another object's counts: a run is kept
while its counts are not empty (it holds a task the server knows: runends.py), so they
cover every such task in it; a run freed and created again starts counting afresh.
"""

from __future__ import annotations

from typing import Final

from .items import Item, State

__all__ = ["move_count", "tally"]


# Each state's name (its value), by state: compiled, ``state._value_`` is a generic
# attribute lookup on the enum member, a dict lookup by the member costs less.
_NAMES: Final[dict[State, str]] = {state: state._value_ for state in State}


def tally(item: Item, old: State | None, new: State | None) -> None:
    """``item`` went from ``old`` to ``new`` (None: it was not known / it is forgotten)."""
    if item.is_message or old is new:
        return
    scope = item.run
    if scope is not None:
        move_count(scope.counts, old, new)
    group = item.group
    if group is not None:
        group.moved(item, old, new)


def move_count(counts: dict[str, int], old: State | None, new: State | None) -> None:
    """One task moves from ``old`` to ``new`` in ``counts`` (by state name); a state
    that counts nothing any more leaves the map, so a report lists only what is there."""
    if old is not None:
        name = _NAMES[old]  # (``.value`` is a property call: this is the hot path)
        left = counts[name] - 1
        if left:
            counts[name] = left
        else:
            del counts[name]
    if new is not None:
        name = _NAMES[new]
        counts[name] = counts.get(name, 0) + 1
