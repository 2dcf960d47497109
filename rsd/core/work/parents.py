"""Tasks that depend on tasks: parents (``after``) and children (``parent``).

How it works. A TASK_SUBMIT may name ``after`` (up to ``Limits.MAX_TASK_PARENTS`` task
ids of its run), ``on_parent_failure`` ("cancel", the default, or "run") and ``parent``
(a task id of its run). Its ITEM_ENQUEUED carries them (its ``parents``,
``on_parent_failure`` and ``parent`` fields), and its applier takes them (``adopt``)
before placing the task: so a replay, a standby and a live submit build the same state
from the same one record, and a task with links costs one record, as one without.
- A task with a parent that has not ended is BLOCKED (not on its ready line); so is one
  with a parent already ended other than SUCCEEDED under "cancel", which the submit then
  ends CANCELLED at once, naming that parent (``decide``). A task whose parents have all
  ended is never BLOCKED: it is decided at submit, as if it had none.
- A parent's end (``item_ended``) walks its own dependents, the BLOCKED tasks after it,
  and nothing else: a parent that did not succeed cancels each one under "cancel"
  (reason naming it); otherwise a dependent whose parents have now all ended (at most
  64 lookups) is let go (TASK_UNBLOCKED): PENDING on its ready line, or DELAYED until its
  ``not_before``, with its priority and fairness key as submitted, through the same
  placing every item takes (``Deliveries.ready_when_visible``, ``due_at``).
- A parent CANCELLED or EXPIRED cancels its unfinished children (``parent`` links), and
  theirs, each naming its parent. A run's cancellation ends them all anyway, in its own
  slices (cascade.py): then nothing is done here.
- The ends that follow from an end are worked off a queue, not by recursion: a chain of
  any length is followed in one step without growing the stack.

What always holds:
- parents and the parent exist when the child is submitted (NOT_FOUND otherwise), are
  tasks of the same tenant and run (INVALID_ARGUMENT for another run), so every link
  points back in time and no cycle can form; 65 parents is INVALID_ARGUMENT;
- a task has at most ``Limits.MAX_TASK_CHILDREN`` children and as many BLOCKED
  dependents (RESOURCE_EXHAUSTED past either); every entry is a task counted against its
  tenant's item limit, so no client can grow these without bound;
- the links are part of a task's input: the same key with other links is
  IDEMPOTENCY_CONFLICT;
- the work an end costs is its own dependents' and children's, never a walk over tasks;
- a snapshot writes each task's links after every item (SNAP_LINKS), which rebuilds the
  same dependents and children; a moved run carries them (transfer.py).
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final

from rsproto import ErrorCode, Limits, Op

from ..ground.errors import CoreError
from ..ground.validate import invalid, req_list, req_text
from ..records import Rec
from ..records.itemrecords import SnapLinks, TaskUnblocked
from ..run.items import TERMINAL, Event, Item, State, transition
from ..run.links import CANCEL_ON_FAILURE, RUN_ON_FAILURE, Links, links_of
from ..run.tally import tally
from ..state.tables import Applier, Handler, Tables
from .deliveries import Deliveries
from .endings import Endings
from .tasks import Tasks
from .workbook import Work

__all__ = ["LinkArgs", "Parents", "link_args", "refuse_links"]

# Final: compiled by mypyc, a Final module constant is a C static; any other is looked
# up in the module's dict at each use (a submit with links uses a dozen of these).
_BLOCKED: Final = State.BLOCKED
_SUCCEEDED: Final = State.SUCCEEDED
_TERMINAL: Final = TERMINAL
_TAKES_CHILDREN: Final = (State.CANCELLED, State.EXPIRED)
_MAX_PARENTS: Final = Limits.MAX_TASK_PARENTS
_MAX_CHILDREN = Limits.MAX_TASK_CHILDREN  # (not Final: the tests lower it to try the bound)
_CANCEL: Final = CANCEL_ON_FAILURE
_RUN: Final = RUN_ON_FAILURE
# A task id of at most this many characters is at most ``max_key_bytes`` UTF-8 bytes
# (4 a character at most): a longer one is measured by ``req_text``.
_ID_CHARS: Final = Limits.MAX_KEY_BYTES // 4


def refuse_links(args: dict[str, Any]) -> None:
    """MESSAGE_SEND: a message has no parents or children (INVALID_ARGUMENT)."""
    if (
        args.get("after") is not None or args.get("parent") is not None
        or args.get("on_parent_failure") is not None
    ):
        raise invalid(
            "after, on_parent_failure and parent are for TASK_SUBMIT: a message has no "
            "parents or children"
        )


def _check_id(value: Any, index: int) -> None:
    """``after[index]`` is a task id (a string of 1 to ``max_key_bytes`` UTF-8 bytes),
    else INVALID_ARGUMENT naming it."""
    if type(value) is not str or not value or len(value.encode()) > Limits.MAX_KEY_BYTES:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:80] + "..."
        raise invalid(
            f"after[{index}] must be a task id (a string of 1 to {Limits.MAX_KEY_BYTES} "
            f"bytes), got {shown}"
        )


class LinkArgs:
    """What a TASK_SUBMIT asks for: parents (in order, each once), the policy, a parent:
    ITEM_ENQUEUED's fields as they are (``parents`` is the record's list, never changed).
    ``ended``: ``Parents.check`` saw one of the tasks it names already ended, so the
    submit may decide the task at once (``Parents.decide``); else nothing can."""

    __slots__ = ("ended", "on_parent_failure", "parent", "parents")

    def __init__(self, parents: list[str], on_parent_failure: str, parent: str | None):
        self.parents = parents
        self.on_parent_failure = on_parent_failure
        self.parent = parent
        self.ended = False

    def salt(self) -> str:
        """Part of the submit's digest: the same key with other links is a conflict."""
        return f"\x00after={','.join(self.parents)};{self.on_parent_failure};{self.parent}"


def link_args(args: dict[str, Any]) -> LinkArgs | None:
    """The links a TASK_SUBMIT asks for, None for none (three lookups); INVALID_ARGUMENT
    for anything malformed: ``after`` not an array of at most 64 task ids (non-empty
    strings of at most ``max_key_bytes``), ``on_parent_failure`` other than "cancel" or
    "run" or without ``after``, ``parent`` not a task id."""
    # (``args.get`` called, not kept in a name: compiled, a bound method is an object
    # made for each submit)
    after, policy, parent = (
        args.get("after"), args.get("on_parent_failure"), args.get("parent"))
    if after is None and parent is None and policy is None:
        return None
    parents: list[str]
    if after is None:
        parents = []
    else:
        if type(after) is not list or len(after) > _MAX_PARENTS:
            req_list(args, "after", _MAX_PARENTS)  # (not an array of at most 64: refused)
        ids: list[Any] = after  # (a list: compiled, its loop walks it in place)
        for index, parent_id in enumerate(ids):
            if type(parent_id) is not str or not 0 < len(parent_id) <= _ID_CHARS:
                _check_id(parent_id, index)
        # (the request's own list when it cannot hold an id twice: no copy to make, and
        # none left for the collector; nothing changes a request's list or a record's)
        parents = ids if len(ids) <= 1 else list(dict.fromkeys(ids))
    if policy is None:
        policy = _CANCEL
    elif policy != _CANCEL and policy != _RUN:
        raise invalid(f"on_parent_failure must be 'cancel' or 'run', got {policy!r}")
    elif not parents:
        raise invalid("on_parent_failure goes with after (the parents it is about)")
    if parent is not None and (type(parent) is not str or not 0 < len(parent) <= _ID_CHARS):
        parent = req_text(args, "parent", Limits.MAX_KEY_BYTES)
    return LinkArgs(parents, policy, parent)


class Parents:
    """Links between tasks, their records, and what a task's end does to the tasks
    linked to it. Owned by the Core; Intake calls ``check`` and ``decide`` on a submit,
    and ``adopt`` from ITEM_ENQUEUED's applier."""

    def __init__(
        self, tables: Tables, work: Work, deliveries: Deliveries, endings: Endings,
        tasks: Tasks,
    ) -> None:
        self.tables = tables
        self.work = work
        self.deliveries = deliveries
        self.endings = endings
        self.tasks = tasks
        self._ended: deque[Item] = deque()  # ends whose links are still to follow
        self._following = False
        self.ops: dict[int, Handler] = {Op.TASK_CHILDREN: self.children}
        self.appliers: dict[int, Applier] = {
            Rec.SNAP_LINKS: self.apply_snapshot_links,
            Rec.TASK_UNBLOCKED: self.apply_unblocked,
        }

    # ---- a submit ----------------------------------------------------------------------

    def check(self, tenant: str, scope_id: str, links: LinkArgs) -> None:
        """Refuse links to tasks that do not exist (NOT_FOUND), of another run
        (INVALID_ARGUMENT), or that have no room for one more child or dependent
        (RESOURCE_EXHAUSTED). At most 65 lookups. Notes in ``links.ended`` whether one of
        them has ended (only then is there anything for ``decide``)."""
        parent: Item | None = None
        theirs: Links | None
        for parent_id in links.parents:
            parent = self._task(tenant, scope_id, parent_id, "after")
            if parent.state in _TERMINAL:
                links.ended = True
            theirs = parent.links
            if theirs is not None and theirs.dependents is not None and (
                    len(theirs.dependents) >= _MAX_CHILDREN):
                raise _full(parent_id, "tasks waiting for it")
        if links.parent is not None:
            # (a child after its parent alone, the usual shape: the task just looked up)
            if parent is None or parent.id != links.parent:
                parent = self._task(tenant, scope_id, links.parent, "parent")
                if parent.state in _TERMINAL:
                    links.ended = True
            theirs = parent.links
            if theirs is not None and theirs.children is not None and (
                    len(theirs.children) >= _MAX_CHILDREN):
                raise _full(links.parent, "children")

    def _task(self, tenant: str, scope_id: str, task_id: str, field: str) -> Item:
        item = self.work.items.get(task_id)
        if item is None or item.is_message or item.tenant != tenant:
            raise CoreError(
                ErrorCode.NOT_FOUND,
                f"{field} names task {task_id!r}, which does not exist (or was forgotten)",
                {"task": task_id},
            )
        if item.scope != scope_id:
            raise invalid(
                f"{field} names task {task_id!r} of run {item.scope!r}: a task's parents "
                f"are tasks of its own run ({scope_id!r})"
            )
        return item

    def adopt(
        self, item: Item, parents: list[str], policy: str | None, parent_id: str | None
    ) -> None:
        """From ITEM_ENQUEUED's applier, before the task is placed: it takes the links
        its record carries, BLOCKED if a parent has not ended (or ended badly under
        "cancel": ``decide`` then cancels it)."""
        if self._link(item, parents, policy or _CANCEL, parent_id):
            item.state = _BLOCKED

    def decide(self, now: float, item: Item) -> None:
        """After a submit whose links name a task already ended (``LinkArgs.ended``): a
        task already doomed by its parent ends now."""
        links: Links = item.links
        if links.parent is not None:
            parent = self.work.items.get(links.parent)
            if parent is not None and parent.state in _TAKES_CHILDREN and not item.terminal:
                self._cancel(now, item, f"parent {parent.id} ended {parent.state._value_}")
        if item.state is _BLOCKED and not links.runs_on_failure:
            for parent_id in links.parents:
                parent = self.work.items.get(parent_id)
                if parent is not None and parent.terminal and parent.state is not _SUCCEEDED:
                    self._cancel(now, item, _failed_reason(parent))
                    return

    # ---- links, live and rebuilt -------------------------------------------------------

    def _link(
        self, item: Item, parents: list[str], policy: str, parent_id: str | None
    ) -> bool:
        """Give ``item`` its links and enter it in its parents' dependents and its
        parent's children (each entry once: applied twice, nothing changes). Returns
        whether it waits: a parent has not ended, or ended other than SUCCEEDED under
        "cancel". O(its parents)."""
        links = links_of(item)
        links.parents = parents  # the record's list, never changed: shared, not copied
        # (or, after one unfinished task alone, that task's own tuple: below)
        links.on_parent_failure = policy
        links.parent = parent_id
        items = self.work.items
        named = None if parent_id is None else items.get(parent_id)
        if named is not None:
            mine = links_of(named)
            if mine.children is None:
                mine.children = {}
            mine.children[item.id] = None
        waits = False
        for each in parents:
            # (a child after its parent, the usual shape: that task is not looked up again)
            parent = named if each == parent_id else items.get(each)
            if parent is None:
                continue
            if parent.state not in _TERMINAL:
                waits = True
                mine = links_of(parent)
                if mine.dependents is None:
                    mine.dependents = {}
                mine.dependents[item.id] = item
                if len(parents) == 1:  # after it alone: its shared tuple, not a list each
                    links.parents = mine.only_parent(parent.id)
            elif parent.state is not _SUCCEEDED and policy != _RUN:
                waits = True
        return waits

    def apply_snapshot_links(self, rec: SnapLinks, now: float) -> None:
        """SNAP_LINKS: a task placed from a snapshot takes its links again."""
        _, item_id, parents, policy, parent_id = rec
        item = self.work.items.get(item_id)
        if item is None:
            return
        if item.state is not _BLOCKED:  # it waits for nobody: only its parent's child
            self._link(item, [], policy, parent_id)
            links_of(item).parents = parents
            return
        self._link(item, parents, policy, parent_id)

    # ---- ends ---------------------------------------------------------------------------

    def ended(self, now: float, item: Item) -> None:
        """``item_ended``: follow what ``item``'s end does to the tasks linked to it, and
        what their ends do in turn, one end at a time off a queue."""
        if item.links is None:
            return
        self._ended.append(item)
        if self._following:
            return
        self._following = True
        try:
            while self._ended:
                self._follow(now, self._ended.popleft())
        finally:
            self._following = False

    def resume(self, now: float, clean: bool) -> None:
        """After recovery from a crash (or a takeover): what an end did to the tasks
        linked to it is a run of records written with that end, and a torn tail may
        have kept the end and lost some of them. Each ended task with links is
        followed again (a task already let go or ended is passed over), so none is left
        BLOCKED behind a parent that has ended. O(the tasks known), once, only after an
        unclean stop."""
        if clean:
            return
        for item in list(self.work.items.values()):
            links = item.links
            if links is not None and item.terminal and (links.dependents or links.children):
                self.ended(now, item)

    def _follow(self, now: float, item: Item) -> None:
        links: Links = item.links
        items = self.work.items
        self._leave_parents(item)  # it waits for nobody any more
        run = item.run
        if run is not None and run.cancelled is not None:
            return  # its run's cancellation ends the rest, in its own slices
        dependents = links.dependents
        if dependents:
            links.dependents = None
            failed = item.state is not _SUCCEEDED
            ready: list[Item] = []
            for child in list(dependents.values()):
                if child.state is not _BLOCKED:
                    continue
                if failed and not child.links.runs_on_failure:
                    self._cancel(now, child, _failed_reason(item))
                elif self._all_ended(child.links):
                    ready.append(child)
            if ready:
                self._unblock(now, ready)
        if links.children and item.state in _TAKES_CHILDREN:
            reason = f"parent {item.id} ended {item.state._value_}"
            for child_id in list(links.children):
                child = items.get(child_id)
                if child is not None and not child.terminal:
                    self._cancel(now, child, reason)

    def _leave_parents(self, item: Item) -> None:
        """``item`` no longer waits: out of its parents' dependents. O(its parents)."""
        items = self.work.items
        for parent_id in item.links.parents:
            parent = items.get(parent_id)
            if parent is not None and parent.links is not None and parent.links.dependents:
                parent.links.dependents.pop(item.id, None)

    def _all_ended(self, links: Links) -> bool:
        """Whether every parent has ended (or been forgotten). From ``links.met`` on:
        each parent is looked at until it is seen ended, so a task after 64 parents
        costs 64 lookups over all their ends, not 64 at each."""
        items, parents, at = self.work.items, links.parents, links.met
        while at < len(parents):
            parent = items.get(parents[at])
            if parent is not None and parent.state not in _TERMINAL:
                links.met = at
                return False
            at += 1
        links.met = at
        return True

    def _cancel(self, now: float, item: Item, reason: str) -> None:
        self.endings.finish(now, item, Event.CANCEL, None, reason, lost_reason=reason)

    def _unblock(self, now: float, ready: list[Item]) -> None:
        """``ready`` (BLOCKED, every parent ended) join their ready lines: one
        TASK_UNBLOCKED for all that one end lets go; each of their queues then hands
        them to its parked consumers."""
        self.tables.commit(TaskUnblocked(
            Rec.TASK_UNBLOCKED, [item.id for item in ready], self.tables.wall(now)), now)
        queues = {}
        for item in ready:
            queue = item.run.queues.get(item.mailbox) if item.run is not None else None
            if queue is not None:
                queues[id(queue)] = queue
        for queue in queues.values():
            self.deliveries.dispatch(now, queue)

    def apply_unblocked(self, rec: TaskUnblocked, now: float) -> None:
        """TASK_UNBLOCKED: each BLOCKED task it names joins its ready line (or waits out
        its delay); one let go or ended since is passed over."""
        _, item_ids, at_wall = rec
        items = self.work.items
        for item_id in item_ids:
            item = items.get(item_id)
            if item is not None and item.state is _BLOCKED:
                self._let_go(item, at_wall, now)

    def _let_go(self, item: Item, at_wall: float, now: float) -> None:
        early = item.not_before is not None and item.not_before > at_wall
        self._leave_parents(item)
        old = item.state
        self.work.set_state(
            item, transition(old, Event.PARENTS_MET_EARLY if early else Event.PARENTS_MET)
        )
        tally(item, old, item.state)
        if early:
            self.work.delay(item)
            self.deliveries.due_at(item)
        else:
            self.deliveries.ready_when_visible(item, now)

    # ---- TASK_CHILDREN -----------------------------------------------------------------

    def children(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        """The children of a task, in submit order: ``{"id", "key", "state"}`` each (at
        most ``MAX_TASK_CHILDREN``); those forgotten are left out."""
        item = self.tasks.task_of(conn, args)
        links = item.links
        out: list[dict[str, Any]] = []
        if links is not None and links.children:
            items = self.work.items
            for child_id in links.children:
                child = items.get(child_id)
                if child is not None:
                    out.append({"id": child.id, "key": child.key, "state": child.state._value_})
        return {"children": out}


def _failed_reason(parent: Item) -> str:
    return f"parent {parent.id} ended {parent.state._value_}"


def _full(task_id: str, what: str) -> CoreError:
    return CoreError(
        ErrorCode.RESOURCE_EXHAUSTED,
        f"task {task_id!r} has {_MAX_CHILDREN} {what} already, the most a task may have",
        {"task": task_id, "limit": _MAX_CHILDREN},
    )
