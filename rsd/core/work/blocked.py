"""Items waiting for capacity: one line of blocked items per pool and per quota, and the
wakes that let them go when their pool or quota has room.

What always holds:
- an item with needs (needs.py) is delivered only when one slot of each of its pools and
  each quota amount can all be taken now, under the books' FIFO rules (a pool or quota
  with POOL_ACQUIRE / QUOTA_TAKE waiters gives nothing). Its slots are attached to the
  delivery's lease by the DELIVERED record's applier (``attach``) and its quota is spent
  (QUOTA_TAKEN) in the same step: nothing is ever held partly, so items needing the same
  pools in another order cannot deadlock. The slots are detached when the delivery ends
  (``detach``), and the pools then served: POOL_ACQUIRE waiters first, then blocked items;
- a receive that meets a ready item it cannot start moves it off the ready line into the
  line of the first pool or quota it lacks, and goes on: items behind it that need other
  capacity or none are not held up. One ``pop`` examines at most
  ``Policy.MAX_BLOCKED_PER_STEP`` items it cannot start; past that it answers as if nothing
  were ready and a timer at the next wheel tick (never the same ``Core.tick``) resumes the
  queue's parked consumers, so a long run of blocked items is worked through in slices,
  one per loop turn, each paid by the step that moves them;
- a blocked item leaves its line only when that pool or quota has room (a slot ended and no
  POOL_ACQUIRE waits; the refill covers the item's amount and no QUOTA_TAKE waits). It is
  then offered again: delivered at once to its queue's longest-parked consumer, blocked on
  what it lacks next, or put back at the end of its ready line when nobody receives. A wake
  touches only the line of the pool or quota that has room, ``MAX_BLOCKED_PER_STEP`` items
  per step, the rest in the next step;
- a quota's line has at most one wheel timer, at the instant the refill covers the amount
  of the item at its head; nothing polls. An item needing more than its quota's (lowered)
  limit waits, behind the others, until the limit is raised;
- an item that ends while blocked leaves a stale entry in its line, and the line is
  compacted once stale entries are half of it; an empty line is dropped.
Blocking is derived state and is not journaled: after a restart every pending item is in
its ready line again, and the first receive that meets it blocks it again.

An item whose needs are homed on another shard (``elsewhere``: its pools and quotas are
not this shard's) is not taken here: it is delivered only with a grant from that shard
(grants.py), and waits for one off its line, blocked on ``ASKING``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final

from ...policy import Policy
from ..ground.leases import Lease
from ..ground.timerwheel import Timer
from ..holds.capacity import attach, detach
from ..holds.poolbook import Pool, PoolBook
from ..holds.quotabook import QuotaBook
from ..records import Rec
from ..records.snaprecords import SnapItemNeeds
from ..run.items import Item
from ..run.queue import Queue
from ..state.tables import Applier, Handler, Tables
from ..tenant.needs import Needs
from ..tenant.quota import Quota
from .grants import Grants
from .keylimits import RATE, Gate, KeyLimits
from .workbook import Work

__all__ = ["ASKING", "Blocked"]

_STEP: Final = Policy.MAX_BLOCKED_PER_STEP
Resource = Pool | Quota
ASKING: Final[Any] = object()  # ``blocked_on`` of an item waiting for a grant (grants.py)


class Line:
    """Items blocked on one pool or quota, first blocked first; ended ones left stale."""

    __slots__ = ("items", "stale")

    def __init__(self) -> None:
        self.items: deque[Item] = deque()
        self.stale = 0


class Blocked:
    """The lines of blocked items and their wakes. Owned by the Core. An item let go is
    announced (``item_unblocked``), and so is a queue whose consumers may go on
    (``queue_ready``); it hears ``capacity_freed`` (``room_made``)."""

    def __init__(self, tables: Tables, work: Work, pools: PoolBook, quotas: QuotaBook) -> None:
        self.tables = tables
        self.work = work
        self.pools = pools
        self.quotas = quotas
        self.events = tables.events
        self.lines: dict[Resource, Line] = {}
        self.quota_timers: dict[Quota, float] = {}  # wall instant of each line's one timer
        # Live work left by appliers and waiters (ordered sets, so the core stays
        # deterministic): pools whose attached slots ended, resources that may have room.
        self.freed: dict[Pool, None] = {}
        self.room: dict[Resource | Gate, None] = {}
        self.grants = Grants(tables, work)  # needs of another shard (grants.py)
        self.keys: KeyLimits = work.keys  # limits by key: their gates' lines wake here
        self.ops: dict[int, Handler] = {}
        # (SNAP_ITEM_NEEDS: snapshots before format version 5 only; SNAP_ITEM has them since)
        self.appliers: dict[int, Applier] = {
            Rec.SNAP_ITEM_NEEDS: self.apply_snapshot_needs, **self.grants.appliers,
        }

    # ---- receiving ---------------------------------------------------------------------

    def pop(self, now: float, queue: Queue) -> Item | None:
        """The first ready item of ``queue`` that can start now, taken off its line; the
        items before it that cannot are blocked. None if none (or the step's budget ran
        out: then the queue's consumers are served again in the next step)."""
        if queue.held:  # paused: nothing is handed out (pauses.py)
            return None
        for _ in range(_STEP):
            item = queue.pop_ready()
            if item is None or (item.needs is None and item.limits is None):
                return item
            if item.limits is not None:  # held back by a key (keylimits.py)?
                gate = self.keys.shut(now, item)
                if gate is not None:
                    self._hold(now, item, queue, gate)
                    continue
                if item.needs is None:
                    return item
            if self.elsewhere(item):
                if self.grants.held_for(item):
                    return item
                self._ask(item, queue)
                continue
            lacking = self.lacking(now, item)
            if lacking is None:
                return item
            self._block(now, item, queue, lacking)
        key = (queue.tenant, queue.scope, queue.mailbox)
        self._next_step(now, self._resume, key)
        return None

    def elsewhere(self, item: Item) -> bool:
        """Whether ``item``'s needs are homed on another shard: its first pool or quota
        is not this shard's (a submit's needs name this shard's alone or another's alone:
        needs.py). Pools and quotas are never forgotten, and one named in needs here
        existed before its item, so replay decides as the live core did. O(1)."""
        needs = item.needs
        assert needs is not None
        if needs.pools:
            return (item.tenant, needs.pools[0]) not in self.pools.pools
        return (item.tenant, needs.quotas[0][0]) not in self.quotas.quotas

    def _ask(self, item: Item, queue: Queue) -> None:
        item.blocked_on = ASKING
        queue.blocked += 1
        self.grants.ask(item)

    def granted(self, now: float, item_id: str, seq: int, handle: bytes,
                length: float) -> bool:
        """The other shard granted an ask (``Core.grant_held``): the grant is journaled
        and the item offered to its queue. False: the answer is stale (the shell releases
        ``handle``)."""
        held, asking = self.grants.granted(now, item_id, seq, handle, length)
        if asking is not None:
            self._unblock(asking)
            self.events.item_unblocked(now, asking)
        return held

    def abandoned(self, now: float, item_id: str, seq: int) -> bool:
        """Ask ``seq`` of ``item_id`` will never be granted: the item asks for the next
        (``Grants.abandon``)."""
        return self.grants.abandon(now, item_id, seq)

    def lacking(self, now: float, item: Item) -> Resource | None:
        """The first pool or quota that cannot give ``item`` its share now; None if all
        can. Changes nothing; O(needs)."""
        needs = item.needs
        assert needs is not None
        tenant = item.tenant
        for name in needs.pools:
            pool = self.pools.pools[(tenant, name)]  # pools are never forgotten
            if not pool.has_free_slot():
                return pool
        for name, amount in needs.quotas:
            quota = self.quotas.quotas[(tenant, name)]
            if amount > quota.limit or not self.quotas.can_take(now, quota, amount):
                return quota
        return None

    def spend(self, now: float, item: Item) -> None:
        """At delivery, after ``lacking`` said None: spend the quota (QUOTA_TAKEN records;
        never refunded). The slots were attached by the DELIVERED record's applier."""
        assert item.needs is not None
        for name, amount in item.needs.quotas:
            quota = self.quotas.quotas.get((item.tenant, name))
            if quota is None:
                return  # needs of another shard: spent there, by its grant (grants.py)
            self.quotas.spend(now, quota, amount)

    def _resume(self, now: float, key: tuple[str, str, str]) -> None:
        queue = self.work.find_queue(*key)
        if queue is not None:
            self.events.queue_ready(now, queue)

    # ---- slots held under a delivery's lease (appliers) -------------------------------

    def attach(self, item: Item, lease: Lease) -> None:
        """The delivery ``lease`` of ``item`` holds one slot of each of its pools."""
        if item.needs is not None:
            for name in item.needs.pools:
                pool = self.pools.pools.get((item.tenant, name))
                if pool is None:
                    return  # needs of another shard: its grant holds them (grants.py)
                attach(pool, lease)

    def detach(self, item: Item, lease: Lease) -> None:
        """The delivery ended: its slots are free; the pools are served in the next wake."""
        if item.needs is not None:
            if self.grants.held:
                self.grants.delivery_ended(item)
            for name in item.needs.pools:
                pool = self.pools.pools.get((item.tenant, name))
                if pool is None:
                    return  # needs of another shard: its grant ended above
                detach(pool, lease.handle)
                self._pending()
                self.freed[pool] = None

    def apply_snapshot_needs(self, rec: SnapItemNeeds, now: float) -> None:
        _, item_id, pools, quotas = rec
        item = self.work.items.get(item_id)
        if item is None or item.needs is not None:
            return
        item.needs = Needs.from_record(pools, quotas)
        if item.delivery is not None:
            self.attach(item, item.delivery)

    # ---- blocking ------------------------------------------------------------------------

    def _block(self, now: float, item: Item, queue: Queue, resource: Resource) -> None:
        item.blocked_on = resource
        queue.blocked += 1
        line = self.lines.get(resource)
        if line is None:
            line = self.lines[resource] = Line()
        line.items.append(item)
        if type(resource) is Quota and resource not in self.quota_timers and not resource.waiters:
            self._arm(resource, _amount(item, resource))

    def forget(self, item: Item) -> None:
        """``item`` ended (an applier): if it was blocked, its entry is now stale."""
        if item.needs is not None and (self.grants.seqs or self.grants.asking):
            self.grants.forget(item)
        if item.limits is not None:
            self._forget_keyed(item)
        resource = item.blocked_on
        if resource is None:
            return
        self._unblock(item)
        line = self.lines.get(resource)
        if line is None:
            return
        line.stale += 1
        if line.stale == len(line.items):
            del self.lines[resource]
        elif line.stale > 32 and line.stale * 2 > len(line.items):
            line.items = deque(i for i in line.items if i.blocked_on is resource)
            line.stale = 0

    # ---- held back by a key (keylimits.py) -----------------------------------------------

    def _hold(self, now: float, item: Item, queue: Queue, gate: Gate) -> None:
        """``item`` (off its ready line) waits in ``gate``'s line until it has room (a
        rate gate's timer at its period's end; a period over begins again with the
        delivery of a task let go before it, which arms it: ``apply_period``)."""
        self.keys.settled_out(item)
        item.blocked_on = gate
        queue.blocked += 1
        gate.line.append(item)
        if gate.kind == RATE and gate.start + gate.period > self.tables.wall(now):
            self.keys.arm(gate)

    def _forget_keyed(self, item: Item) -> None:
        """``item`` (with keys) ended: its entry in a gate's line is stale, and it
        carries its keys no more."""
        gate = item.blocked_on
        if type(gate) is Gate:
            self._unblock(item)
            gate.stale += 1
            if gate.stale == len(gate.line):
                gate.line.clear()
                gate.stale = 0
            elif gate.stale > 32 and gate.stale * 2 > len(gate.line):
                gate.line = deque(i for i in gate.line if i.blocked_on is gate)
                gate.stale = 0
        self.keys.ended(item)

    def gate_opened(self, gate: Gate) -> None:
        """``key_room``: ``gate`` may let held tasks go (served in the next wake)."""
        self._pending()
        self.room[gate] = None

    def _wake_gate(self, now: float, gate: Gate) -> None:
        """Let go as many tasks from the front of ``gate``'s line as it has room for
        (at most a step's budget; the rest in the next step), each offered again."""
        line = gate.line
        wall = self.tables.wall(now)
        room = gate.free_room(wall)
        budget = min(room, _STEP)
        while line and budget > 0:
            item = line.popleft()
            if item.blocked_on is not gate:
                gate.stale -= 1
                continue
            budget -= 1
            self._unblock(item)
            self._offer(now, item)
            if item.queued:  # back in its ready line: its room is kept for it
                if not gate.out:
                    gate.out = {}
                gate.out[item] = None
        if gate.holds():
            if room > _STEP:
                self._next_step(now, self._line_due, gate)
            elif gate.kind == RATE and gate.start + gate.period > wall:
                self.keys.arm(gate)
        elif line:
            line.clear()
            gate.stale = 0

    def _unblock(self, item: Item) -> None:
        item.blocked_on = None
        queue = self.work.find_queue(item.tenant, item.scope, item.mailbox)
        if queue is not None:
            queue.blocked -= 1

    # ---- waking --------------------------------------------------------------------------

    def room_made(self, resource: Resource) -> None:
        """``capacity_freed``: ``resource`` may have room for blocked items."""
        if resource in self.lines:
            self._pending()
            self.room[resource] = None

    def _pending(self) -> None:
        """Make sure a wake comes even where no step follows (a dropped connection)."""
        if not self.freed and not self.room:
            self.tables.wheel.schedule(0.0, _WakeSoon(self))

    def wake(self, now: float) -> None:
        """Serve what appliers and waiters left: ended slots go to POOL_ACQUIRE waiters
        (PoolBook.fill, which reports room left), then lines with room are offered again."""
        while self.freed or self.room:
            freed, self.freed = self.freed, {}
            for pool in freed:
                self.pools.fill(now, pool)
            room, self.room = self.room, {}
            for resource in room:
                self._wake_line(now, resource)

    def _wake_line(self, now: float, resource: Resource | Gate) -> None:
        if isinstance(resource, Gate):
            self._wake_gate(now, resource)
            return
        line = self.lines.get(resource)
        is_quota = type(resource) is Quota
        rotated = 0  # items passed over in a row for needing more than the quota's limit
        for _ in range(_STEP):
            if line is None or not line.items or resource.waiters:
                break
            item = line.items[0]
            if item.blocked_on is not resource:
                line.items.popleft()
                line.stale -= 1
                continue
            if is_quota:
                amount = _amount(item, resource)
                if amount > resource.limit:  # waits for a larger limit, behind the others
                    if rotated >= len(line.items):
                        break
                    line.items.rotate(-1)
                    rotated += 1
                    continue
                if not self.quotas.can_take(now, resource, amount):
                    self._arm(resource, amount)
                    break
            elif not resource.has_free_slot():
                break
            line.items.popleft()
            rotated = 0
            self._unblock(item)
            self._offer(now, item)
        else:  # the step's budget ran out: the rest in the next step
            self._next_step(now, self._line_due, resource)
        if line is not None and len(line.items) == line.stale and self.lines.get(resource) is line:
            del self.lines[resource]

    def _next_step(self, now: float, fn: Callable[[float, Any], None], arg: Any) -> None:
        """Schedule the next step strictly after ``now``: at the next wheel tick, never
        in the same ``Core.tick``, which pops what is due again until its budget is spent
        (a continuation due at once ran up to 512 steps, 100,000 items, in one turn)."""
        wheel = self.tables.wheel
        wheel.schedule(now + wheel.tick / 2, Timer(fn, arg))

    def _line_due(self, now: float, resource: Resource | Gate) -> None:
        self._wake_line(now, resource)

    def _offer(self, now: float, item: Item) -> None:
        """``item``, let go by a line, goes to its queue if all its keys and needs let it
        start, else into the line of the next that does not."""
        if item.limits is not None:
            gate = self.keys.shut(now, item)
            if gate is not None:
                self._hold(now, item, self.work.queue_of_item(item), gate)
                return
            if item.needs is not None and self.elsewhere(item):  # asks where it is popped
                queue = self.work.queue_of_item(item)
                queue.push(item)
                self.events.queue_ready(now, queue)
                return
        if item.needs is not None:
            lacking = self.lacking(now, item)
            if lacking is not None:
                self._block(now, item, self.work.queue_of_item(item), lacking)
                return
        self.events.item_unblocked(now, item)

    def _arm(self, quota: Quota, amount: int) -> None:
        """Set the quota line's one timer for when the refill covers ``amount``."""
        old = self.quota_timers.pop(quota, None)
        if old is not None:
            self.tables.cancel_at_wall(old, self._quota_due, quota)
        if amount <= quota.limit:
            at = self.quota_timers[quota] = quota.ready_wall(amount)
            self.tables.at_wall(at, self._quota_due, quota)

    def _quota_due(self, now: float, quota: Quota) -> None:
        self.quota_timers.pop(quota, None)
        self._wake_line(now, quota)


def _amount(item: Item, quota: Quota) -> int:
    needs: Needs | None = item.needs
    assert needs is not None
    for name, amount in needs.quotas:
        if name == quota.name:
            return amount
    raise AssertionError(f"item {item.id} is blocked on a quota it does not need")


class _WakeSoon:
    """A wheel entry due at once: the next tick wakes what is pending."""

    __slots__ = ("book",)

    def __init__(self, book: Blocked) -> None:
        self.book = book

    def fire(self, now: float) -> None:
        self.book.wake(now)
