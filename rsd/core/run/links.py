"""A task's links to other tasks of its run: the parents it was submitted ``after``, the
parent it was submitted as a child of, and, on the other side, the tasks that wait for
it and the children it has (work/parents.py owns the rules; this is their data).

What always holds:
- ``parents`` (at most ``Limits.MAX_TASK_PARENTS``) and ``parent`` name tasks of the
  same run that existed when the task was submitted: a task only ever points back in
  time, so no cycle can form;
- ``dependents`` holds, for a task that has not ended, the BLOCKED tasks submitted after
  it (its end decides them: one step per dependent, never a walk over other tasks);
  ``children`` holds the ids of the tasks submitted as its children, in submit order
  (at most ``Limits.MAX_TASK_CHILDREN`` each: a client cannot grow either without bound,
  and each entry is a task already counted against its tenant's item limit);
- a parent that has been forgotten (its retention passed) counts as ended, and reads
  as None in the ``parents`` a delivery carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

from ..records import Rec
from ..records.itemrecords import SnapLinks
from .items import Item

__all__ = [
    "CANCEL_ON_FAILURE", "RUN_ON_FAILURE", "Links", "forget_child", "links_admin_view",
    "links_of", "links_records", "parents_view",
]

ADMIN_CHILDREN: Final = 100  # the children an admin view of a task lists (TASK_CHILDREN: all)

# (Final: compiled, a C static each, not a lookup by name at each Links made)
RUN_ON_FAILURE: Final = "run"  # on_parent_failure: run even if a parent did not succeed
CANCEL_ON_FAILURE: Final = "cancel"  # the default: end CANCELLED, naming the parent


class Links:
    """One task's parents and children. Made for a task that has either."""

    __slots__ = (
        "alone", "children", "dependents", "met", "on_parent_failure", "parent", "parents")

    def __init__(self) -> None:
        # submitted ``after`` these task ids: the list of the record that made the task
        # (ITEM_ENQUEUED or SNAP_LINKS), never changed (a copy would be one more object
        # for the collector to trace, for each task with parents); for a task after one
        # task alone, that task's ``alone``, shared by all of them
        self.parents: Sequence[str] = ()
        # (this task's id,), made with the first task after it alone: the ``parents`` of
        # every such task (1,000 children after their root: one tuple, not 1,000 lists
        # left for the collector to trace)
        self.alone: tuple[str, ...] | None = None
        self.on_parent_failure = CANCEL_ON_FAILURE
        self.parent: str | None = None  # submitted as this task's child
        self.dependents: dict[str, Any] | None = None  # id -> BLOCKED Item after this one
        self.children: dict[str, None] | None = None  # child ids, in submit order
        # How many of ``parents``, from the first, are known to have ended: an end is
        # for good, so this only grows, and a task checks each parent once in its life
        # however many times its parents' ends make it look (derived: 0 after a restart).
        self.met = 0

    def only_parent(self, task_id: str) -> tuple[str, ...]:
        """``parents`` for a task after this one (``task_id``) alone: ``alone``."""
        alone = self.alone
        if alone is None:
            alone = self.alone = (task_id,)
        return alone

    @property
    def runs_on_failure(self) -> bool:
        return self.on_parent_failure == RUN_ON_FAILURE

    def add_view(self, view: dict[str, Any]) -> None:
        """What a task's view adds (written into ``view``): only the links it has."""
        if self.parents:
            view["after"] = list(self.parents)
            view["on_parent_failure"] = self.on_parent_failure
        if self.parent is not None:
            view["parent"] = self.parent
        if self.children:
            view["children"] = len(self.children)


def links_of(item: Item) -> Links:
    """``item``'s links, made on first use. (An ``Item``, not Any: compiled, its
    ``links`` is then read and set in place, not looked up by name.)"""
    links: Links | None = item.links
    if links is None:
        links = Links()
        item.links = links
    return links


def parents_view(links: Links, items: Mapping[str, Any]) -> dict[str, Any]:
    """A delivery's ``parents``: each parent's id -> its outcome as a result wait with
    ``outcome_only`` reads it (``{"id", "state", "outcome", "reason"}``), None for a
    parent already forgotten. At most ``MAX_TASK_PARENTS`` lookups."""
    out: dict[str, Any] = {}
    for parent_id in links.parents:
        parent = items.get(parent_id)
        out[parent_id] = None if parent is None else parent.outcome_view()
    return out


def forget_child(item: Any, items: Mapping[str, Any]) -> None:
    """``item``, forgotten (its FORGOTTEN applied, live and in a replay alike), leaves
    its parent's children, so the parent's count and TASK_CHILDREN say the same after
    a restart. O(1)."""
    links: Links | None = item.links
    if links is not None and links.parent is not None:
        parent = items.get(links.parent)
        if parent is not None and parent.links is not None and parent.links.children:
            parent.links.children.pop(item.id, None)


def links_admin_view(links: Links | None, items: Mapping[str, Any]) -> dict[str, Any] | None:
    """What ADMIN_TASK shows of a task's links (the dashboard's task page, ``rsctl
    task``): its parents and its parent, each ``{"id", "state"}`` (state None once
    forgotten), its first ``ADMIN_CHILDREN`` children likewise and how many it has;
    None for a task with no links. At most 64 + 1 + 100 lookups."""
    if links is None:
        return None

    def brief(task_id: str) -> dict[str, Any]:
        task = items.get(task_id)
        return {"id": task_id, "state": None if task is None else task.state._value_}

    children = list(links.children or ())
    return {
        "after": [brief(parent_id) for parent_id in links.parents],
        "on_parent_failure": links.on_parent_failure if links.parents else None,
        "parent": None if links.parent is None else brief(links.parent),
        "children": [brief(child_id) for child_id in children[:ADMIN_CHILDREN]],
        "children_count": len(children),
    }


def links_records(items: Iterable[Any]) -> Iterator[SnapLinks]:
    """The SNAP_LINKS of each of ``items`` submitted with links: a snapshot writes them
    after every item, so that each task's parents are known when it is linked again."""
    for item in items:
        links: Links | None = item.links
        if links is not None and (links.parents or links.parent is not None):
            yield SnapLinks(
                Rec.SNAP_LINKS, item.id, list(links.parents), links.on_parent_failure,
                links.parent,
            )
