"""Limits by key, made on the fly: a task submitted with ``concurrency_key`` and
``concurrency_limit`` runs only while fewer than that many tasks with the key are
RUNNING in its queue (its mailbox in its run); one submitted with ``rate_key``,
``rate_limit`` and ``rate_period_seconds`` is delivered only while its key's current
period has had fewer than that many deliveries. Nothing is declared in advance.

How it works. Each (queue, kind, key) that an unfinished task carries has a ``Gate``:
its limit (the one the newest submit stated: ITEM_LIMITED), its running count
(concurrency) or its current period's start and deliveries (rate), the count of tasks
that carry it, and its line of held tasks. A receive that meets a ready task whose
gate is shut moves it off the ready line into its gate's line and goes on
(blocked.py's ``pop``, the same step budget as pools and quotas): the tasks behind it,
of other keys or none, are not held up, and a request's work is its own items plus the
held tasks it moves, each moved once per shutting. A gate that opens (a delivery of its
key ended: its settlement, a retry, a release, a lost lease, a suspend or its task's
ending; the rate period turned, on the one wheel timer of its line; a newer submit
raised the limit) lets as many tasks go as it has room for, from the front of its line
(blocked.py's wake): to a parked consumer, or back to the end of the ready line. A
retry or a lost lease comes back through the same gate.

Periods: a rate key's period begins with the first delivery after the last period
ended (RATE_PERIOD_BEGUN, just before that DELIVERED) and lasts ``rate_period_seconds``;
at most ``rate_limit`` deliveries fall in it (a fixed window, as BullMQ's limiter; a
task held at the end of one period goes at the start of the next).

Durable or derived. ITEM_LIMITED (a task's keys and limits, replayed and snapshotted
per task) and RATE_PERIOD_BEGUN are records; a concurrency key's running count is
derived (its RUNNING tasks, counted by DELIVERED and by the snapshot's ITEM_LIMITED of a
running task); a rate key's deliveries are counted by DELIVERED; a snapshot keeps each
key's limit and period (SNAP_KEY_GATE) after its tasks. Holding is derived, as blocking
on a pool is: after a restart every pending task is in its ready line again, and the
first receive that meets it holds it again.

What always holds:
- a gate lives while a task carries its key, and a rate gate until its period is over
  too (so finishing every task cannot restart a period early); a tenant has at most
  ``TenantLimits.limit_keys`` gates, and a submit that would make one more is refused
  with RESOURCE_EXHAUSTED before anything changes;
- keys and limits come together: a limit without its key, a key without its limit, a
  limit out of range is INVALID_ARGUMENT; a MESSAGE_SEND carries none.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Final, NamedTuple

from rsproto import ErrorCode, Limits

from ..ground.errors import CoreError
from ..ground.validate import int_arg, invalid, opt_number, opt_text
from ..records import Rec
from ..records.keyrecords import ItemLimited, RatePeriodBegun, SnapKeyGate
from ..run.items import Item
from ..run.scope import Scope
from ..state.tables import Applier, Tables

__all__ = [
    "CONCURRENCY", "RATE", "Carried", "Gate", "ItemKeys", "KeyLimits", "refuse_keys_on_send",
]

_MAX_KEY_BYTES: Final = Limits.MAX_KEY_BYTES

CONCURRENCY: Final = 0
RATE: Final = 1


class ItemKeys(NamedTuple):
    """The keys a task carries and the limits its submit stated (None: not given)."""

    concurrency_key: str | None
    concurrency_limit: int | None
    rate_key: str | None
    rate_limit: int | None
    rate_period_seconds: float | None

    def view(self) -> dict[str, Any]:
        """What TASK_STATUS shows of them: the fields given, by their submit names."""
        view: dict[str, Any] = {}
        if self.concurrency_key is not None:
            view["concurrency_key"] = self.concurrency_key
            view["concurrency_limit"] = self.concurrency_limit
        if self.rate_key is not None:
            view["rate_key"] = self.rate_key
            view["rate_limit"] = self.rate_limit
            view["rate_period_seconds"] = self.rate_period_seconds
        return view


class Carried:
    """What a task with keys holds (its ``Item.limits``): its ITEM_LIMITED record (the
    keys and limits its submit stated) and the gates of those keys (alive while it
    carries them: no lookups)."""

    __slots__ = ("concurrency", "rate", "record")

    def __init__(self, record: ItemLimited) -> None:
        self.record = record
        self.concurrency: Gate | None = None
        self.rate: Gate | None = None

    @property
    def keys(self) -> ItemKeys:
        return ItemKeys(*self.record[2:])

    def view(self) -> dict[str, Any]:
        return self.keys.view()


class Gate:
    """One key of one kind in one queue: its limit, what counts against it, its line."""

    __slots__ = (
        "carriers", "count", "key", "kind", "limit", "line", "mailbox", "out", "period",
        "running", "scope", "stale", "start", "tenant", "timer",
    )

    def __init__(self, tenant: str, scope: str, mailbox: str, kind: int, key: str) -> None:
        self.tenant = tenant
        self.scope = scope
        self.mailbox = mailbox
        self.kind = kind
        self.key = key
        self.limit = 0  # set by the first ITEM_LIMITED (or SNAP_KEY_GATE) at once
        self.period = 0.0  # rate: seconds
        self.running = 0  # concurrency: its tasks RUNNING now
        self.start = 0.0  # rate: the wall instant the current period began
        self.count = 0  # rate: deliveries in the current period
        self.carriers = 0  # unfinished tasks that carry the key
        self.line: deque[Item] = deque()  # held tasks (``blocked_on`` is this gate)
        self.stale = 0  # entries of ``line`` no longer held (ended: skipped)
        self.timer: float | None = None  # rate: the wall instant of its one timer
        # tasks let go from its line into the ready line, not yet delivered: their room
        # is theirs (others of the key wait behind them), so first held is first out
        self.out: dict[Item, None] = _NONE_OUT  # (a dict of its own once one is let go)

    def room(self, wall: float) -> int:
        """How many more tasks may start now (0 or less: shut). O(1)."""
        if self.kind == CONCURRENCY:
            return self.limit - self.running
        if self.start + self.period <= wall:
            return self.limit  # a new period begins with the next delivery
        return self.limit - self.count

    def shut_for(self, item: Item, wall: float) -> bool:
        """Whether ``item`` may not start now: no room, or none but the room kept for
        the tasks let go before it. O(1)."""
        room = self.room(wall)
        out = self.out
        if out:
            room -= len(out) - (item in out)
        return room <= 0

    def free_room(self, wall: float) -> int:
        """Room for tasks of its line beyond those let go already. O(1)."""
        return self.room(wall) - len(self.out)

    def holds(self) -> bool:
        """Whether tasks wait in its line."""
        return len(self.line) > self.stale

    def held_view(self) -> dict[str, Any]:
        """What TASK_STATUS shows of the gate holding a task back (``held_by``)."""
        if self.kind == CONCURRENCY:
            return {"kind": "concurrency", "key": self.key, "limit": self.limit,
                    "running": self.running}
        return {"kind": "rate", "key": self.key, "limit": self.limit,
                "period_seconds": self.period, "count": self.count,
                "period_ends_at": self.start + self.period}


GateKey = tuple[str, int, str]  # (mailbox, kind, key) within a run
_NONE_OUT: Final[dict[Item, None]] = {}  # every gate's ``out`` until it lets one go: never written


def refuse_keys_on_send(args: dict[str, Any]) -> None:
    """MESSAGE_SEND: limits by key are a task's (INVALID_ARGUMENT). Two lookups."""
    if "concurrency_key" in args or "rate_key" in args:
        raise invalid(
            "concurrency_key and rate_key are for TASK_SUBMIT; a message carries no key limits"
        )


class KeyLimits:
    """The gates of every run, their records, and the rules of who may start. Owned by
    Work; blocked.py holds tasks in their lines and wakes them (``key_room``)."""

    def __init__(self, tables: Tables, items: dict[str, Item]) -> None:
        self.tables = tables
        self.items = items  # Work's item table
        self.by_run: dict[tuple[str, str], dict[GateKey, Gate]] = {}
        self.per_tenant: dict[str, int] = {}  # live gates of each tenant
        self.events = tables.events  # key_room: a gate may let held tasks go (blocked.py)
        self.appliers: dict[int, Applier] = {
            Rec.ITEM_LIMITED: self.apply_limited,
            Rec.RATE_PERIOD_BEGUN: self.apply_period,
            Rec.SNAP_KEY_GATE: self.apply_snapshot_gate,
        }

    # ---- a submit ----------------------------------------------------------------------

    @staticmethod
    def args(args: dict[str, Any]) -> ItemKeys | None:
        """The keys and limits a TASK_SUBMIT states, None for none (five lookups);
        INVALID_ARGUMENT naming the field for anything wrong."""
        get = args.get
        if (get("concurrency_key") is None and get("concurrency_limit") is None
                and get("rate_key") is None and get("rate_limit") is None
                and get("rate_period_seconds") is None):
            return None
        concurrency_key = opt_text(args, "concurrency_key", _MAX_KEY_BYTES)
        concurrency_limit = None
        if (concurrency_key is None) != (get("concurrency_limit") is None):
            raise invalid(
                "concurrency_key and concurrency_limit go together: give both or neither"
            )
        if concurrency_key is not None:
            concurrency_limit = int_arg(args, "concurrency_limit", 1, Limits.MAX_CONCURRENCY_LIMIT)
        rate_key = opt_text(args, "rate_key", _MAX_KEY_BYTES)
        rate_limit, period = None, None
        if rate_key is None:
            if get("rate_limit") is not None or get("rate_period_seconds") is not None:
                raise invalid("rate_limit and rate_period_seconds need a rate_key")
        else:
            if get("rate_limit") is None:
                raise invalid("a rate_key needs its rate_limit (deliveries per period)")
            rate_limit = int_arg(args, "rate_limit", 1, Limits.MAX_RATE_LIMIT)
            period = float(opt_number(
                args, "rate_period_seconds", 1.0, Limits.MIN_RATE_PERIOD_MS / 1000,
                Limits.MAX_RATE_PERIOD_SECONDS,
            ))
        return ItemKeys(concurrency_key, concurrency_limit, rate_key, rate_limit, period)

    def room(self, tenant: str, scope_id: str, mailbox: str, keys: ItemKeys | None) -> None:
        """Refuse (RESOURCE_EXHAUSTED) a submit whose keys would make the tenant's gates
        more than its limit. O(1)."""
        if keys is None:
            return
        gates = self.by_run.get((tenant, scope_id), {})
        more = 0
        if keys.concurrency_key is not None and (mailbox, CONCURRENCY, keys.concurrency_key) \
                not in gates:
            more += 1
        if keys.rate_key is not None and (mailbox, RATE, keys.rate_key) not in gates:
            more += 1
        if not more:
            return
        have = self.per_tenant.get(tenant, 0)
        limit = self.tables.tenants.limits.limit_keys
        if have + more > limit:
            raise CoreError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"tenant {tenant!r} has {have} live concurrency and rate keys, its limit "
                f"(max_limit_keys_per_tenant is {limit}); reuse a key, or wait for the "
                "tasks of others to finish",
                {"limit": "max_limit_keys_per_tenant", "value": limit},
            )

    def carry(self, now: float, item: Item, keys: ItemKeys | None) -> None:
        """The new task ``item`` carries ``keys`` (ITEM_LIMITED), if it has any."""
        if keys is not None:
            self.tables.commit(self.record(item.id, keys), now)

    @staticmethod
    def record(item_id: str, keys: ItemKeys) -> ItemLimited:
        return ItemLimited(Rec.ITEM_LIMITED, item_id, *keys)

    # ---- who may start -----------------------------------------------------------------

    def shut(self, now: float, item: Item) -> Gate | None:
        """The first gate of ``item``'s keys with no room now; None if it may start.
        Changes nothing; O(1) (the wall clock read for a rate key alone)."""
        carried: Carried = item.limits
        gate = carried.concurrency
        if gate is not None and gate.shut_for(item, 0.0):  # (a concurrency key: no clock)
            return gate
        gate = carried.rate
        if gate is not None and gate.shut_for(item, self.tables.wall(now)):
            return gate
        return None

    def settled_out(self, item: Item) -> None:
        """``item`` was delivered, held again or ended: the room kept for it as a task
        let go (``Gate.out``) is no longer kept. O(1)."""
        carried: Carried = item.limits
        for gate in (carried.concurrency, carried.rate):
            if gate is not None and gate.out:
                gate.out.pop(item, None)

    def begin_period(self, now: float, item: Item) -> None:
        """Right before ``item``'s DELIVERED (live): if its rate key's period is over,
        a new one begins now (RATE_PERIOD_BEGUN)."""
        gate = item.limits.rate
        if gate is None:
            return
        wall = self.tables.wall(now)
        if gate.start + gate.period <= wall:
            self.tables.commit(RatePeriodBegun(
                Rec.RATE_PERIOD_BEGUN, item.tenant, item.scope, item.mailbox, gate.key, wall,
            ), now)

    def arm(self, gate: Gate) -> None:
        """A rate gate's one timer, at the end of its period (its line's turn, or its
        end if no task carries it then)."""
        if gate.timer is None:
            at = gate.timer = gate.start + gate.period
            self.tables.at_wall(at, self._period_over, gate)

    def _period_over(self, now: float, gate: Gate) -> None:
        gate.timer = None
        if gate.start + gate.period > self.tables.wall(now):  # a later period began
            self.arm(gate)
        elif gate.holds():
            self.events.key_room(gate)
        elif not gate.carriers and not gate.running:
            self._drop(gate)

    # ---- counts kept by the deliveries' appliers ---------------------------------------

    def started(self, item: Item) -> None:
        """DELIVERED of a task with keys: it counts as running, and in its period."""
        carried: Carried = item.limits
        gate = carried.concurrency
        if gate is not None:
            gate.running += 1
            if gate.out:
                gate.out.pop(item, None)
        gate = carried.rate
        if gate is not None:
            gate.count += 1
            if gate.out:
                gate.out.pop(item, None)

    def stopped(self, item: Item) -> None:
        """A delivery of a task with keys ended (settled, retried, released, lost,
        suspended, ended): its concurrency slot is free for the next held task."""
        gate = item.limits.concurrency
        if gate is None:
            return
        gate.running -= 1
        if gate.line and gate.holds():
            self.events.key_room(gate)
        if not gate.carriers and not gate.running:
            self._drop_if_idle(gate)

    def ended(self, item: Item) -> None:
        """A task with keys ended: it carries them no more (a gate no task carries is
        dropped: at once, or once its rate period is over)."""
        carried: Carried = item.limits
        gate = carried.concurrency
        if gate is not None:
            self._let_go(gate, item)
        gate = carried.rate
        if gate is not None:
            self._let_go(gate, item)

    def _let_go(self, gate: Gate, item: Item) -> None:
        if gate.out:
            gate.out.pop(item, None)
        gate.carriers -= 1
        if not gate.carriers and not gate.running:
            self._drop_if_idle(gate)

    # ---- appliers ----------------------------------------------------------------------

    def apply_limited(self, rec: ItemLimited, now: float) -> None:
        """ITEM_LIMITED: the task carries its keys, whose limits become the ones stated
        (a raised limit lets held tasks go). Applied again, it changes nothing."""
        item = self.items.get(rec[1])
        if item is None or item.terminal or item.limits is not None:
            return
        _, _, concurrency_key, concurrency_limit, rate_key, rate_limit, period = rec
        carried = item.limits = Carried(rec)
        if concurrency_key is not None:
            gate = carried.concurrency = self._carry(
                item, CONCURRENCY, concurrency_key, concurrency_limit, 0.0)
            if item.delivery is not None:  # a snapshot's running task
                gate.running += 1
        if rate_key is not None:
            carried.rate = self._carry(item, RATE, rate_key, rate_limit, period)

    def _carry(self, item: Item, kind: int, key: str, limit: Any, period: Any) -> Gate:
        """``item`` carries the gate of (``kind``, ``key``), whose limit (and period)
        becomes the stated one."""
        gate = self._gate(item.tenant, item.scope, item.mailbox, kind, key)
        raised = limit > gate.limit or period < gate.period
        gate.limit = limit
        gate.period = period
        gate.carriers += 1
        timer = gate.timer
        if timer is not None and gate.start + period < timer:  # the period ends sooner
            self.tables.cancel_at_wall(timer, self._period_over, gate)
            gate.timer = None
            self.arm(gate)
        if raised and gate.holds():
            self.events.key_room(gate)
        return gate

    def apply_period(self, rec: RatePeriodBegun, now: float) -> None:
        _, tenant, scope_id, mailbox, key, start = rec
        gate = self.by_run.get((tenant, scope_id), {}).get((mailbox, RATE, key))
        if gate is not None and gate.start != start:
            gate.start = start
            gate.count = 0
            if gate.holds():  # they wait for this period's end
                self.arm(gate)

    def apply_snapshot_gate(self, rec: SnapKeyGate, now: float) -> None:
        _, tenant, scope_id, mailbox, kind, key, limit, period, start, count = rec
        gate = self._gate(self.tables.tenants.name(tenant), scope_id, mailbox, kind, key)
        gate.limit, gate.period, gate.start, gate.count = limit, period, start, count
        self._drop_if_idle(gate)

    # ---- gates made and dropped --------------------------------------------------------

    def _gate(self, tenant: str, scope_id: str, mailbox: str, kind: int, key: str) -> Gate:
        gates = self.by_run.get((tenant, scope_id))
        if gates is None:
            gates = self.by_run[(tenant, scope_id)] = {}
        gate = gates.get((mailbox, kind, key))
        if gate is None:
            gate = gates[(mailbox, kind, key)] = Gate(tenant, scope_id, mailbox, kind, key)
            self.per_tenant[tenant] = self.per_tenant.get(tenant, 0) + 1
        return gate

    def _drop_if_idle(self, gate: Gate) -> None:
        """Drop ``gate`` once no task carries it and none runs under it; a rate gate
        waits for its period's end (its timer) first."""
        if gate.carriers or gate.running:
            return
        if gate.kind == RATE and gate.count:
            self.arm(gate)  # dropped at its period's end (``_period_over``)
            return
        self._drop(gate)

    def _drop(self, gate: Gate) -> None:
        gates = self.by_run.get((gate.tenant, gate.scope))
        if gates is None or gates.get((gate.mailbox, gate.kind, gate.key)) is not gate:
            return
        del gates[(gate.mailbox, gate.kind, gate.key)]
        if not gates:
            del self.by_run[(gate.tenant, gate.scope)]
        left = self.per_tenant[gate.tenant] - 1
        if left:
            self.per_tenant[gate.tenant] = left
        else:
            del self.per_tenant[gate.tenant]

    # ---- snapshots ---------------------------------------------------------------------

    def snapshot(self) -> Iterator[SnapKeyGate]:
        """Every gate's SNAP_KEY_GATE (after every task's ITEM_LIMITED)."""
        for (tenant, scope_id) in list(self.by_run):
            yield from self._run_gates(tenant, scope_id)

    def run_snapshot(self, scope: Scope) -> Iterator[SnapKeyGate]:
        """``scope``'s gates (a moved run's, after its tasks: transfer.py)."""
        yield from self._run_gates(scope.tenant, scope.id)

    def _run_gates(self, tenant: str, scope_id: str) -> Iterator[SnapKeyGate]:
        for gate in self.by_run.get((tenant, scope_id), {}).values():
            yield SnapKeyGate(
                Rec.SNAP_KEY_GATE, tenant, scope_id, gate.mailbox, gate.kind, gate.key,
                gate.limit, gate.period, gate.start, gate.count,
            )
