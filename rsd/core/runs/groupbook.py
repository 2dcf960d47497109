"""Task groups: named sets of tasks of one run, and waiting until enough have succeeded.

A task joins a group when it is submitted with ``group`` (a GROUP_JOINED record right
after its ITEM_ENQUEUED). GROUP_WAIT parks until ``need`` members have SUCCEEDED and
answers with the first ``need`` of them (ids, keys, outcomes), or answers at once with
``reached: false`` when ``need`` can no longer be reached (an outcome, not an error:
the counts say why). ``cancel_rest`` then cancels the members still unfinished.

What always holds:
- a group's counters are exact and kept as tasks move (tally.py): ``succeeded`` (the
  succeeded members, in the order they succeeded) and ``live`` (the unfinished ones) are
  dicts, so a success costs O(1) and ``reach`` (how many can still succeed, ``succeeded
  + live``) is O(1);
- every parked waiter has ``succeeded < need <= reach``. A success raises ``succeeded``
  by one and serves exactly the waiters whose need it now meets; another ending (or the
  forgetting of a success) lowers ``reach`` by one and answers ``reached: false`` to
  exactly those whose need was the old ``reach``. Waiters are kept in lines by need, so
  each check is O(1) plus the waiters it answers: never a walk over the group;
- a group holds at most ``MAX_GROUP_TASKS`` known tasks and ``MAX_WAITERS_PER_GROUP``
  waiters; ``cancel_rest`` ends the unfinished ones in slices (cascade.py); waiters met
  in one step share one reply per ``outcomes`` flag (never one ``done`` list each);
  a group is forgotten with its last known task.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rsproto import ErrorCode, Limits, Op

from ..ground.effects import DEFERRED
from ..ground.errors import CoreError
from ..ground.pages import PagedIndex
from ..ground.validate import int_arg, opt_bool, opt_text, req_text
from ..ground.waits import Wait, WaitLine
from ..records import Rec
from ..records.itemrecords import GroupJoined
from ..run.group import Group
from ..run.groupdone import done_entries
from ..run.items import Item, State
from ..run.scope import Scope
from ..state.tables import Applier, Handler, Tables
from ..work.workbook import Work
from .cascade import Cascade

__all__ = ["GroupBook"]


def _empty_view(name: str) -> dict[str, Any]:
    return {"group": name, "tasks": 0, "counts": {}, "succeeded": 0, "unfinished": 0,
            "waiters": 0}


class GroupWaiter(Wait):
    """A GROUP_WAIT parked until its group has ``need`` successes."""

    __slots__ = ("cancel_rest", "group", "need", "outcomes")

    def __init__(
        self, group: Group, need: int, cancel_rest: bool, outcomes: bool, conn: int,
        request_id: int, deadline: float, since: float,
    ) -> None:
        super().__init__(conn, request_id, deadline, since)
        self.group = group
        self.need = need
        self.cancel_rest = cancel_rest
        self.outcomes = outcomes

    def withdraw(self) -> None:
        group = self.group
        group.waiting -= 1
        line = group.waiters.get(self.need)
        if line is not None:
            line.withdraw(self)
            if not line:
                del group.waiters[self.need]

    def timeout_message(self) -> str:
        group = self.group
        return (
            f"group {group.name!r} had {len(group.succeeded)} of the {self.need} successes "
            "needed when the wait timed out"
        )


class GroupBook:
    """GROUP_WAIT, GROUP_STATUS and GROUP_JOINED; hears ``item_ended`` and
    ``item_forgotten`` for the groups' waiters. Owned by the Core."""

    def __init__(self, tables: Tables, work: Work, cascade: Cascade) -> None:
        self.tables = tables
        self.work = work
        self.cascade = cascade  # ``cancel_rest``, in slices
        self.ops: dict[int, Handler] = {
            Op.GROUP_WAIT: self.wait,
            Op.GROUP_STATUS: self.status,
        }
        self.appliers: dict[int, Applier] = {Rec.GROUP_JOINED: self.apply_joined}

    # ---- joining (TASK_SUBMIT's ``group``) -------------------------------------------

    def group_arg(self, args: dict[str, Any], scope: Scope | None) -> str | None:
        """The ``group`` of a submit, checked before anything is written: a bounded
        name, and room in the group (RESOURCE_EXHAUSTED names the limit)."""
        name = opt_text(args, "group", Limits.MAX_GROUP_NAME_BYTES)
        if name is None or scope is None:
            return name
        group = scope.groups.get(name)
        if group is not None and group.size() >= Limits.MAX_GROUP_TASKS:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"group {name!r} already has {Limits.MAX_GROUP_TASKS} tasks, the limit",
            )
        return name

    def check_same(self, item: Item, name: str | None) -> None:
        """Submitting an existing task's key again names the same group, or none."""
        if name is None:
            return
        current = item.group.name if item.group is not None else None
        if current != name:
            raise CoreError(
                ErrorCode.IDEMPOTENCY_CONFLICT,
                f"task key {item.key!r} already names a task in "
                + (f"group {current!r}" if current is not None else "no group")
                + f", not in group {name!r}",
                {"task": item.id},
            )

    def join(self, now: float, item: Item, name: str) -> None:
        self.tables.commit(GroupJoined(Rec.GROUP_JOINED, item.id, name), now)

    def apply_joined(self, rec: GroupJoined, now: float) -> None:
        _, item_id, name = rec
        item = self.work.items.get(item_id)
        if item is None or item.group is not None or item.is_message:
            return
        scope = self.tables.scope_for(item.tenant, item.scope)
        group = scope.groups.get(name)
        if group is None:
            groups = scope.groups
            group = groups[name] = Group(scope, name)
            pages = scope.group_pages  # the run's groups, for ADMIN_GROUPS (admin.py)
            if pages is None:
                pages = scope.group_pages = PagedIndex(lambda g: groups.get(g.name) is g)
            pages.add(group)
        item.group = group
        group.moved(item, None, item.state)

    def snapshot(self) -> Iterator[tuple[Any, ...]]:
        """One GROUP_JOINED per member, after the items (O(items), like the snapshot)."""
        for item in self.work.items.values():
            if item.group is not None:
                yield GroupJoined(Rec.GROUP_JOINED, item.id, item.group.name)

    # ---- live consequences of a member's move ----------------------------------------

    def ended(self, now: float, item: Item) -> None:
        """``item_ended``: if ``item`` is a member, its group's waiters may be answered
        (live path, after its FINISHED record)."""
        group = item.group
        if group is None or not group.waiting:
            return
        if item.state is State.SUCCEEDED:
            self._serve(now, group, len(group.succeeded))
        else:
            self._unreachable(group, group.reach() + 1)

    def forgotten(self, item: Item, state: State) -> None:
        """``item_forgotten``: a member forgotten (live path, after its FORGOTTEN
        record): a success forgotten lowers the reach."""
        group = item.group
        if group is not None and group.waiting and state is State.SUCCEEDED:
            self._unreachable(group, group.reach() + 1)

    def _serve(self, now: float, group: Group, need: int) -> None:
        line = group.waiters.pop(need, None)
        if line is None:
            return
        waits = self.tables.waits
        effects = self.tables.effects
        # One reply per ``outcomes`` flag, shared by every waiter it answers (up to
        # MAX_WAITERS_PER_GROUP of them, each owed up to MAX_GROUP_TASKS entries): built
        # once, encoded per connection by the output path as each one reads.
        # The first waiter with cancel_rest cancels the rest; later ones share its reply.
        shared: dict[bool, dict[str, Any] | CoreError] = {}
        rest_cancelled = False
        while (waiter := line.popleft()) is not None:
            assert isinstance(waiter, GroupWaiter)
            group.waiting -= 1
            waits.served(waiter)
            reply = shared.get(waiter.outcomes)
            if reply is None or (waiter.cancel_rest and not rest_cancelled):
                try:
                    reply = self._reached(now, group, need, waiter.cancel_rest, waiter.outcomes)
                    rest_cancelled = rest_cancelled or waiter.cancel_rest
                except CoreError as exc:
                    reply = exc
                shared[waiter.outcomes] = reply
            if isinstance(reply, CoreError):
                effects.error(waiter.conn, waiter.request_id, reply.code, reply.message)
            else:
                effects.reply(waiter.conn, waiter.request_id, reply)

    def _unreachable(self, group: Group, need: int) -> None:
        line = group.waiters.pop(need, None)
        if line is None:
            return
        waits = self.tables.waits
        while (waiter := line.popleft()) is not None:
            group.waiting -= 1
            waits.served(waiter)
            self.tables.effects.reply(
                waiter.conn, waiter.request_id, self._unreached_view(group, need)
            )

    # ---- ops -------------------------------------------------------------------------

    def _scope(self, conn: int, args: dict[str, Any]) -> Scope:
        scope_id = req_text(args, "scope", Limits.MAX_SCOPE_ID_BYTES)
        scope = self.tables.find_scope(self.tables.tenant_of(conn), scope_id)
        if scope is None:
            raise CoreError(ErrorCode.NOT_FOUND, f"no run {scope_id!r}")
        return scope

    def status(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> dict[str, Any]:
        scope = self._scope(conn, args)
        name = req_text(args, "group", Limits.MAX_GROUP_NAME_BYTES)
        group = scope.groups.get(name)
        return group.view() if group is not None else _empty_view(name)

    def wait(self, now: float, conn: int, rid: int, args: dict[str, Any]) -> Any:
        scope = self._scope(conn, args)
        name = req_text(args, "group", Limits.MAX_GROUP_NAME_BYTES)
        need_arg = args.get("need")
        need = None if need_arg is None else int_arg(args, "need", 1, Limits.MAX_GROUP_TASKS)
        cancel_rest = opt_bool(args, "cancel_rest", False)
        outcomes = opt_bool(args, "outcomes", True)
        timeout_ms = int_arg(  # typed integer by protocol.md: 1.5 is INVALID_ARGUMENT
            args, "timeout_ms", 0, Limits.MAX_WAIT_TIMEOUT_MS, Limits.DEFAULT_WAIT_TIMEOUT_MS
        )
        group = scope.groups.get(name)
        if group is None:
            if need is None:
                return {**_empty_view(name), "reached": True, "need": 0, "done": [],
                        "cancelled": 0}
            return {**_empty_view(name), "reached": False, "need": need, "done": [],
                    "cancelled": 0, "why": f"group {name!r} has no tasks"}
        if need is None:
            need = group.size()
        if len(group.succeeded) >= need:
            return self._reached(now, group, need, cancel_rest, outcomes)
        if need > group.reach():
            return self._unreached_view(group, need)
        if timeout_ms == 0:
            raise CoreError(
                ErrorCode.WAIT_TIMEOUT,
                f"group {name!r} has {len(group.succeeded)} of the {need} successes needed",
            )
        if group.waiting >= Limits.MAX_WAITERS_PER_GROUP:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"group {name!r} already has {Limits.MAX_WAITERS_PER_GROUP} waiters, the limit",
            )
        waiter = GroupWaiter(
            group, need, cancel_rest, outcomes, conn, rid, now + timeout_ms / 1000.0, now
        )
        line = group.waiters.get(need)
        if line is None:
            line = group.waiters[need] = WaitLine()
        line.append(waiter)
        group.waiting += 1
        self.tables.waits.add(waiter)  # refused: withdraw() undid the two lines above
        return DEFERRED

    def _reached(
        self, now: float, group: Group, need: int, cancel_rest: bool, outcomes: bool
    ) -> dict[str, Any]:
        """The answer to a wait whose need is met; first cancels the unfinished members
        if asked: up to Policy.MAX_CANCELLED_PER_STEP of them now, the rest in later
        steps, one per timer tick (cascade.py), so the reply's counts may still show some
        unfinished while ``cancelled`` counts them all."""
        done = done_entries(group.name, group.succeeded.values(), need, outcomes)
        cancelled = 0
        if cancel_rest and group.live:
            reason = f"group {group.name!r} reached {need} successes; the rest was cancelled"
            rest = list(group.live.values())  # unfinished, all of them
            cancelled = len(rest)
            self.cascade.cancel_members(now, group.scope, rest, reason)  # in slices
        return {**group.view(), "reached": True, "need": need, "done": done,
                "cancelled": cancelled}

    def _unreached_view(self, group: Group, need: int) -> dict[str, Any]:
        ended = group.size() - group.reach()
        return {
            **group.view(), "reached": False, "need": need, "done": [], "cancelled": 0,
            "why": (
                f"group {group.name!r} can reach at most {group.reach()} successes "
                f"({len(group.succeeded)} succeeded, {len(group.live)} unfinished, "
                f"{ended} ended otherwise); {need} needed"
            ),
        }

