"""Which slots this node serves: the slot map it holds, its shard, and the slots it holds
back while they move (rsproto/slots.py says what slots and the map are).

The Server owns one, ``server.slots``. The shell asks it, before the core, about every
request that names a run, a pool or a quota (``refusal``); the cluster side
(clustermode.py) gives it each new map (``adopt``) and the compare-and-swap that moves
slots in etcd (``switch``).

What always holds:
- ``owns_all`` is true exactly when the map gives this shard every slot and no slot is
  moving: then nothing is asked per request (the shell reads that one attribute, once a
  batch), so a server alone, or a cluster of one shard, pays nothing for slots;
- otherwise a request is served only if its key's slot (``route_key``, rsproto/sdkrules.py)
  is this shard's and not moving: a slot of another shard is answered MOVED (not executed:
  the shell answers before the core); a moving one is held (``HELD``) until the move ends,
  and so is a request naming a lease of a run in a moving slot (``holds_run``: the shell
  asks the core whose leases a request names only while slots move);
- a pool or quota is served by the shard of its name's slot, to runs of every shard: a
  POOL_ACQUIRE or QUOTA_TAKE goes by the pool's or quota's slot alone (held while the
  run's slot is moving off this shard: the run's state is being copied);
- a task's ``needs`` name pools and quotas of its run's own shard (taken there when it
  is delivered) or of exactly one other shard (its shard then asks that shard for a
  grant of them: core/work/grants.py, wire/remoteneeds.py); a submit whose ``needs``
  mix its run's shard with another, or name two other shards, is INVALID_ARGUMENT
  naming them (a ``{tag}`` puts them together);
- a map of a lower epoch than the one held is ignored (watches may deliver late), and a
  map of another number of slots is refused (the number is fixed when a cluster is made).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from rsproto import ErrorCode, Op
from rsproto.sdkrules import ROUTE
from rsproto.slots import DEFAULT_SHARD, DEFAULT_SLOTS, SlotMap, slot_of

__all__ = ["HELD", "Refusal", "SlotOwner", "Switch", "SwitchRefused"]

# ``switch(lo, hi, to, expected_epoch)``: the compare-and-swap of the map in etcd, giving
# slots lo..hi to shard ``to`` if the map's epoch is still ``expected_epoch``; the new
# map, or an exception (the map moved meanwhile, etcd unreachable).
Switch = Callable[[int, int, str, int], Awaitable[SlotMap]]


class SwitchRefused(Exception):
    """A switch that changed nothing in etcd, for sure: the map moved on, the target is
    not a shard, or the switch failed before its compare-and-swap was sent. A move then
    rolls back at once; any other failure of a switch leaves its outcome unknown, and
    the move asks the watched map (slotmoves.py)."""

# A request refused before the core: its code, message and details.
Refusal = tuple[ErrorCode, str, dict[str, Any] | None]
HELD: Final = "held"  # the request's slot is moving: it waits for the move's end

# The fields whose slot decides each op routed by a run or a name (ROUTE's; route_key's
# rule, read here without a call: this is the per-request path of a sharded node).
_DECIDING: dict[int, tuple[str, ...]] = {int(op): rule.fields for op, rule in ROUTE.items()
                                         if rule.fields}
_SCOPE_CREATE = int(Op.SCOPE_CREATE)
_POOL_ACQUIRE, _QUOTA_TAKE = int(Op.POOL_ACQUIRE), int(Op.QUOTA_TAKE)
_WITH_NEEDS = frozenset({int(Op.TASK_SUBMIT), int(Op.MESSAGE_SEND)})
_SUBMIT_MANY = int(Op.TASK_SUBMIT_MANY)


class SlotOwner:
    """The slots of one node: ``map`` (the slot map held), ``shard`` (this node's),
    ``owns_all``, ``moving`` (the range held back during a move, or None) and ``switch``
    (set by the cluster side; None alone)."""

    __slots__ = ("_serves", "map", "moves", "moving", "owns_all", "shard", "switch")

    def __init__(self, slot_map: SlotMap, shard: str = DEFAULT_SHARD) -> None:
        self.map = slot_map
        self.shard = shard
        self.moving: tuple[int, int] | None = None
        self.switch: Switch | None = None
        # Moves of this shard's slots to another that ended, by how (/metrics'
        # rsd_slot_moves_total): "done" once the map gave the slots away, else "failed".
        self.moves = {"done": 0, "failed": 0}
        self._serves = b""  # per slot, 1 if served now (owned and not moving): _refresh
        self.owns_all = self._refresh()

    @classmethod
    def alone(cls, slots: int = DEFAULT_SLOTS) -> SlotOwner:
        """A server alone: one shard, every slot, epoch 0, its primary itself (None)."""
        return cls(SlotMap.whole(DEFAULT_SHARD, slots, 0, None), DEFAULT_SHARD)

    def adopt(self, new_map: SlotMap) -> None:
        """Serve by ``new_map`` from now on (the cluster side calls it at each change it
        watches); one of a lower epoch than the map held is ignored."""
        if new_map.slots != self.map.slots:
            raise ValueError(f"a map of {new_map.slots} slots cannot replace one of "
                             f"{self.map.slots}: a cluster's slots are fixed when it is made")
        if new_map.epoch < self.map.epoch:
            return
        self.map = new_map
        self.owns_all = self._refresh()

    def hold(self, lo: int, hi: int) -> None:
        """Hold back requests for slots ``lo``..``hi`` (a move begins)."""
        self.moving = (lo, hi)
        self.owns_all = self._refresh()

    def release(self) -> None:
        """Serve the held slots again by the map (a move ended, done or failed)."""
        if self.moving is not None:
            self.moves["failed" if self.owns(self.moving[0]) else "done"] += 1
        self.moving = None
        self.owns_all = self._refresh()

    def _refresh(self) -> bool:
        """The slots served now, one byte each (at most MAX_SLOTS: made at each change of
        the map or of a move, never per request); whether that is every slot."""
        served = bytearray(self.map.slots)
        for lo, hi, owner in self.map.ranges:
            if owner == self.shard:
                served[lo:hi + 1] = b"\x01" * (hi + 1 - lo)
        if self.moving is not None:
            lo, hi = self.moving
            served[lo:hi + 1] = bytes(hi + 1 - lo)
        self._serves = bytes(served)
        return 0 not in served

    # ---- per request, when not owns_all ------------------------------------------------

    def owns(self, slot: int) -> bool:
        """Whether ``slot`` is this shard's by the map (held or not)."""
        return self.map.owner(slot) == self.shard

    def owns_key(self, key: str) -> bool:
        """Whether the slot of ``key`` is this shard's and served now: the core's
        ``placeable`` for fresh run ids (scopebook.py)."""
        return self.owns_all or self._serves[slot_of(key, self.map.slots)] == 1

    def owns_none(self) -> bool:
        """Whether the map gives this shard no slot at all."""
        return all(owner != self.shard for _, _, owner in self.map.ranges)

    def holds_run(self, run: str) -> bool:
        """Whether ``run``'s slot is moving (its requests wait for the move's end)."""
        return self.moving is not None and self._held(slot_of(run, self.map.slots))

    def _held(self, slot: int) -> bool:
        moving = self.moving
        return moving is not None and moving[0] <= slot <= moving[1]

    def moved(self, slot: int) -> Refusal:
        """MOVED for ``slot``: its owner by the map, the owner's primary, the map's epoch."""
        owner = self.map.owner(slot)
        return (ErrorCode.MOVED,
                f"slot {slot} belongs to shard {owner!r}, not to this shard ({self.shard!r}): "
                "the request was not executed; send it to that shard's primary",
                {"slot": slot, "shard": owner, "primary": self.map.primaries.get(owner),
                 "map_epoch": self.map.epoch})

    def refusal(self, op: int, args: Mapping[str, Any]) -> Refusal | str | None:
        """Why this shard does not serve ``op`` with ``args`` now (None: it does; ``HELD``:
        its slot is moving). Only asked when not ``owns_all``. O(1), or O(needs)."""
        fields = _DECIDING.get(op)
        if fields is None:
            return None  # no route by slot (ANY, CONNECTION, EVERY): never refused
        key = None
        for name in fields:
            value = args.get(name)
            if type(value) is str:
                key = value
                break
        if key is None:
            return self._unplaceable() if op == _SCOPE_CREATE else None
        slot = slot_of(key, self.map.slots)
        if self._serves[slot] != 1:
            return HELD if self._held(slot) else self.moved(slot)
        if op in (_POOL_ACQUIRE, _QUOTA_TAKE):
            run = args.get("scope")
            return HELD if isinstance(run, str) and self._held(
                slot_of(run, self.map.slots)) else None
        if op in _WITH_NEEDS:
            return self._run_apart(key, _needed(args.get("needs")))
        if op == _SUBMIT_MANY:
            items = args.get("items")
            named: set[str] = set()
            for item in items if isinstance(items, list) else ():
                if isinstance(item, dict):
                    named |= _needed(item.get("needs"))
            return self._run_apart(key, named)
        return None

    def _unplaceable(self) -> Refusal | None:
        """A fresh run id without placement is minted in a slot of this shard: MOVED
        (for the slot of an id drawn, to its owner) when this shard owns none."""
        if not self.owns_none():
            return None
        slot = slot_of(_any_id(), self.map.slots)
        return self.moved(slot)

    def _run_apart(self, run: Any, names: set[str]) -> Refusal | str | None:
        """The rule that a task's needs name pools and quotas of one shard, its run's or
        another: for ``run`` and the pools or quotas ``names`` (this shard serves the
        request's own key)."""
        if not isinstance(run, str):
            return None  # no run named: the core refuses the request
        slots = self.map.slots
        run_slot = slot_of(run, slots)
        if self._held(run_slot):
            return HELD
        first: tuple[str, int, str] | None = None  # a name, its slot, its shard
        for name in sorted(names):
            slot = slot_of(name, slots)
            if self._held(slot):
                return HELD
            shard = self.map.owner(slot)
            if first is None:
                first = (name, slot, shard)
            elif shard != first[2]:
                return (ErrorCode.INVALID_ARGUMENT,
                        f"pools or quotas {first[0]!r} (slot {first[1]}, shard {first[2]!r}) "
                        f"and {name!r} (slot {slot}, shard {shard!r}) are on different "
                        f"shards (the run {run!r} is on shard {self.map.owner(run_slot)!r}): "
                        "a task's needs name pools and quotas of one shard; give them one "
                        "{tag} (a run created with placement=TAG and a pool or quota named "
                        "{TAG}NAME share a slot)", None)
        return None


def _needed(needs: Any) -> set[str]:
    """The pool and quota names a ``needs`` value names (whatever else it holds: the
    core checks it)."""
    if not isinstance(needs, dict):
        return set()
    pools, quotas = needs.get("pools"), needs.get("quotas")
    names = {name for name in pools if isinstance(name, str)} if isinstance(pools, list) else set()
    if isinstance(quotas, dict):
        names |= {name for name in quotas if isinstance(name, str)}
    return names


def _any_id() -> str:
    """A fresh id's hexadecimal digits, as the server draws them (cli.py)."""
    return secrets.token_hex(12)
