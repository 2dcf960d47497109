"""The slot ops the shell answers itself: SLOT_MAP (the map this node holds) and
SLOTS_MOVE (hand a range of this shard's slots to another shard), and the connections
whose requests wait while slots move.

A move (issue 32): the source holds back the requests for those slots
(``SlotOwner.hold``); if they hold runs, it answers the waits on them MOVED, exports
their state and sends it to the target's primary, part by part, each part durable there
before its answer (SLOTS_IMPORT: slotimport.py); it switches the map in etcd through
``SlotOwner.switch`` (a compare-and-swap the cluster side gives), adopts the new map at
once, drops the runs (one journaled record, ``Core.drop_slots``) and lets the held
requests go on: answered MOVED, to the new owner. A move that fails before the switch
(the core refuses to export a run holding a pool slot, the target refuses a part or
cannot be reached, the map moved meanwhile) lets them go on here, tells the target to
drop what it took, and answers with the reason, at once when the switch surely changed
nothing (``SwitchRefused``: the map moved, its read failed). A switch whose outcome is
unknown (etcd did not answer its compare-and-swap) is settled by the map the node
watches, for up to a cluster lease; runs
left on the wrong side by a move cut short are dropped later as strays (slotimport.py).

What always holds:
- a request for a moving slot is not answered and not executed until the move ends; its
  connection waits with it (``Connection.wait_for_slots``): that request and those sent
  after it stay in the connection's backlog and its socket is not read, so its requests
  keep their order and it holds at most what an output pause holds (the rest of one
  read: batches.py), however much it sends into a moving slot; other connections go on;
- one move at a time per node; the move is the one request that runs a task (its
  transfer to the target and its compare-and-swap in etcd), and the task ends with the
  move or the server;
- the source drops the runs only after the map gives their slots to the target, and
  the target was sent every part, each answered once durable there: never two owners
  that serve a slot (a shard serves only the slots its map gives it), nothing
  acknowledged left behind;
- every connection held is resumed at the move's end, whatever the end.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Any, Protocol

import rsproto as wire
from rsproto import ErrorCode, Op
from rsproto.slots import SlotMap, slot_of

from ..core import CoreError
from ..disk import failpoints
from ..slotowner import SwitchRefused
from .slotimport import PART_BYTES, ImportChannel, ImportRefused, Imports

if TYPE_CHECKING:
    from ..core import Core
    from ..metrics import Metrics
    from ..slotowner import SlotOwner
    from .connection import Connection

__all__ = ["SlotMoves", "SlotMovesHost", "count_runs"]

log = logging.getLogger("rsd")



class SlotMovesHost(Protocol):
    """What the slot ops use of the server (server.py's ``Server`` is one)."""

    core: Core
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    slots: SlotOwner
    cluster: str | None  # None: a server alone
    cluster_lease_seconds: int | None
    conns: dict[int, Connection]

    def schedule_flush(self) -> None: ...
    def maybe_resume(self, conn: Connection) -> None: ...


def count_runs(core: Core, lo: int, hi: int, slots: int) -> int:
    """The runs (of every tenant) whose slot is in ``lo``..``hi``: from the core's index
    of runs by slot on a node of a cluster (clustermode.py has it kept), else one walk
    over the runs (a server given a map by a test)."""
    if core.tables.slot_count:
        return core.runs_in_slots(lo, hi)
    return sum(1 for _, scope_id in core.scopes if lo <= slot_of(scope_id, slots) <= hi)


class SlotMoves:
    """SLOT_MAP, SLOTS_MOVE, and the connections held while slots move."""

    def __init__(self, server: SlotMovesHost) -> None:
        self.server = server
        self.held: set[Connection] = set()  # waiting for the move's end (their backlog)
        self.task: asyncio.Task[None] | None = None  # the move under way, if any
        self.imports = Imports(server)  # SLOTS_IMPORT (the target's half) and strays
        # The cluster token and TLS context this node reaches another primary with (the
        # cluster side sets them, as a standby follows its primary: clustermode.py).
        self.token: str | None = None
        self.tls: ssl.SSLContext | None = None
        self.began = 0.0  # when the last move began to hold its slots' requests
        self.paused = 0.0  # seconds the last move held them

    def slots_import(self, conn: Connection, rid: int, args: dict[str, Any]) -> None:
        """SLOTS_IMPORT: a part of a move's runs taken in (its answer leaves once the
        part is durable: output.py holds it for the fsync the import asks), or refused."""
        server = self.server
        try:
            result = self.imports.take(conn.id, args)
        except CoreError as exc:
            server.metrics.error(Op.SLOTS_IMPORT, exc.code)
            conn.put(wire.error_frame(rid, exc.code, exc.message, exc.details))
        else:
            server.metrics.ok[Op.SLOTS_IMPORT] += 1
            conn.put(wire.reply_frame(rid, result))

    def slot_map(self, conn: Connection, rid: int) -> None:
        """SLOT_MAP: the map this node holds, any role."""
        self.server.metrics.ok[Op.SLOT_MAP] += 1
        conn.put(wire.reply_frame(rid, self.server.slots.map.to_wire()))

    def hold(self, conn: Connection, rest: list[Any]) -> None:
        """``conn``'s request ``rest[0]`` names a moving slot: it and ``rest`` wait."""
        conn.wait_for_slots(rest)
        self.held.add(conn)

    def move(self, conn: Connection, rid: int, args: dict[str, Any]) -> None:
        """SLOTS_MOVE: refused, answered at once, or begun (answered at its end)."""
        server = self.server
        try:
            begun = self._begin(conn.id, rid, args)
        except CoreError as exc:
            server.metrics.error(Op.SLOTS_MOVE, exc.code)
            conn.put(wire.error_frame(rid, exc.code, exc.message, exc.details))
            return
        if begun is None:
            server.metrics.deferred[Op.SLOTS_MOVE] += 1
        else:
            server.metrics.ok[Op.SLOTS_MOVE] += 1
            conn.put(wire.reply_frame(rid, begun))

    def _begin(self, conn_id: int, rid: int, args: dict[str, Any]) -> dict[str, Any] | None:
        """The checks of SLOTS_MOVE in the order protocol.md lists them, then the hold
        and the move's task; or the answer when there is nothing to move."""
        server = self.server
        if not server.core.is_admin(conn_id):
            raise CoreError(ErrorCode.PERMISSION_DENIED, "SLOTS_MOVE is an admin operation; "
                            "this connection's token has the client role")
        owner = server.slots
        if server.cluster is None:
            raise CoreError(ErrorCode.INVALID_ARGUMENT, "a server alone is one shard: it "
                            "owns every slot and there is no other shard to move them to")
        slot_map = owner.map
        lo, hi, to = _move_args(args, slot_map.slots)
        if to not in {entry.shard for entry in slot_map.shards()}:
            raise CoreError(ErrorCode.NOT_FOUND, f"no shard {to!r} in the slot map "
                            f"(epoch {slot_map.epoch}): a shard is known once its first "
                            "node has started")
        for start, end, shard in slot_map.ranges:
            if shard != owner.shard and start <= hi and end >= lo:
                code, message, details = owner.moved(max(start, lo))
                raise CoreError(code, message, details)
        if to == owner.shard:
            return {"lo": lo, "hi": hi, "shard": to, "map_epoch": slot_map.epoch}
        if self.task is not None or owner.moving is not None:
            raise CoreError(ErrorCode.UNAVAILABLE, "another move of slots is under way on "
                            "this shard: try again once it is done")
        if owner.switch is None:
            raise CoreError(ErrorCode.UNAVAILABLE, "this node cannot switch the slot map "
                            "now (it has no hold on etcd's map yet)")
        owner.hold(lo, hi)
        self.task = server.loop.create_task(
            self._move(conn_id, rid, lo, hi, to, slot_map.epoch))
        return None

    async def _move(self, conn_id: int, rid: int, lo: int, hi: int, to: str,
                    epoch: int) -> None:
        """The runs sent, the compare-and-swap, the new map adopted, the runs dropped,
        the answers, the held resumed (the module docstring's order)."""
        server = self.server
        owner = server.slots
        effects = server.core.effects
        began = self.began = server.loop.time()
        try:
            answer = await self._moved(lo, hi, to, epoch)
        except CoreError as exc:
            effects.error(conn_id, rid, exc.code, exc.message, exc.details)
        except Exception as exc:  # a fault of ours: said, and the slots still released
            log.exception("the move of slots %d-%d to shard %r failed", lo, hi, to)
            effects.error(conn_id, rid, ErrorCode.INTERNAL,
                          f"the move of slots {lo}-{hi} to shard {to!r} failed: {exc!r}; "
                          f"see the map (rsctl slots) for where they are", None)
        else:
            effects.reply(conn_id, rid, answer)
        finally:
            owner.release()
            self.task = None
            self.paused = server.loop.time() - began
            self._resume_held()
            server.schedule_flush()

    async def _moved(self, lo: int, hi: int, to: str, epoch: int) -> dict[str, Any]:
        """The move of slots ``lo``..``hi`` (held) to ``to`` from map ``epoch``: its
        answer, or CoreError (nothing moved: the held requests run here)."""
        server = self.server
        owner = server.slots
        core = server.core
        assert owner.switch is not None
        runs = count_runs(core, lo, hi, owner.map.slots)
        channel = None
        if runs:
            channel = await self._send_runs(lo, hi, to, epoch)
        failpoints.hit("slots.before_switch.hold")  # a test seam: every part sent
        try:
            new_map: SlotMap | None = await owner.switch(lo, hi, to, epoch)
        except Exception as exc:  # the map moved, etcd unreachable: perhaps nothing moved
            unknown = runs and not isinstance(exc, SwitchRefused)  # else surely not
            new_map = await self._switched_meanwhile(lo, hi, to, epoch) if unknown else None
            if new_map is None:
                log.warning("slots %d-%d stay on this shard: the map could not be "
                            "switched: %s", lo, hi, exc)
                if channel is not None:
                    await self._abort(channel, lo, hi)
                raise CoreError(ErrorCode.UNAVAILABLE, "the slot map could not be switched "
                                f"({exc or type(exc).__name__}): slots {lo}-{hi} stay on "
                                f"shard {owner.shard!r}") from None
        finally:
            if channel is not None:
                channel.close()
        assert new_map is not None
        failpoints.hit("slots.after_switch.kill")  # switched, not yet adopted nor dropped
        owner.adopt(new_map)
        dropped = 0
        if runs:
            dropped = core.drop_slots(server.loop.time(), lo, hi, owner.moved(lo)[2])
        log.info("slots %d-%d moved to shard %r (map epoch %d) with %d runs; their requests "
                 "were held %.1f ms", lo, hi, to, owner.map.epoch, dropped,
                 1000 * (server.loop.time() - self.began))
        return {"lo": lo, "hi": hi, "shard": to, "map_epoch": owner.map.epoch}

    async def _send_runs(self, lo: int, hi: int, to: str, epoch: int) -> ImportChannel:
        """The runs of ``lo``..``hi`` imported by ``to``'s primary, every part answered
        (so durable there); the open channel. CoreError (and the target told to drop
        what it took) if the core refuses to export them or the target any part."""
        server = self.server
        owner, core = server.slots, server.core
        details = owner.moved(lo)[2]
        core.answer_moved_waits(server.loop.time(), lo, hi, details)
        server.schedule_flush()
        parts = core.export_slots(lo, hi, PART_BYTES)  # CoreError: runs that stay home
        address = owner.map.primaries.get(to)
        if address is None:
            raise CoreError(ErrorCode.UNAVAILABLE, f"shard {to!r} has no primary now: "
                            f"slots {lo}-{hi} stay on shard {owner.shard!r}")
        channel = ImportChannel(address, self.token, self.tls, self._timeout())
        try:
            await channel.open(owner.shard)
        except ImportRefused as exc:
            channel.close()
            raise CoreError(ErrorCode.UNAVAILABLE, f"the primary of shard {to!r} ({address}) "
                            f"could not be reached: {exc}") from None
        for index, part in enumerate(parts):
            failpoints.hit("slots.send_part.hold")  # a test seam: mid-transfer
            try:
                await channel.call(Op.SLOTS_IMPORT, {"lo": lo, "hi": hi, "map_epoch": epoch,
                                                     "index": index, "part": list(part)})
            except ImportRefused as exc:
                await self._abort(channel, lo, hi)
                channel.close()
                code = ErrorCode.INVALID_ARGUMENT if exc.code == "INVALID_ARGUMENT" else (
                    ErrorCode.UNAVAILABLE)
                raise CoreError(code, f"shard {to!r} did not take the runs of slots "
                                f"{lo}-{hi} ({exc.code}: {exc.message}): they stay on shard "
                                f"{owner.shard!r}") from None
        return channel

    async def _abort(self, channel: ImportChannel, lo: int, hi: int) -> None:
        """The target drops what it took (best effort: else at its next import of these
        slots, or as strays: slotimport.py)."""
        try:
            await channel.call(Op.SLOTS_IMPORT, {"lo": lo, "hi": hi, "abort": True})
        except ImportRefused as exc:
            log.warning("the target of slots %d-%d was not told to drop the runs it took: "
                        "%s", lo, hi, exc)

    async def _switched_meanwhile(self, lo: int, hi: int, to: str,
                                  epoch: int) -> SlotMap | None:
        """After a switch that failed, perhaps only to answer (etcd may have applied
        it): the map as the watch shows it once it is past ``epoch``, if it gives the
        slots to ``to``; None if it does not, or shows nothing past ``epoch`` within
        the cluster lease."""
        server = self.server
        owner = server.slots
        deadline = server.loop.time() + float(server.cluster_lease_seconds or 1)
        while owner.map.epoch <= epoch and server.loop.time() < deadline:
            await asyncio.sleep(0.05)
        seen = owner.map
        if seen.epoch > epoch and seen.owner(lo) == to and seen.owner(hi) == to:
            return seen
        return None

    def _timeout(self) -> float:
        return 2.0 * float(self.server.cluster_lease_seconds or 5)

    def _resume_held(self) -> None:
        """Every connection held goes on (its backlog runs again: MOVED, or served)."""
        held, self.held = self.held, set()
        for conn in held:
            if conn.transport is not None and not conn.closing:
                conn.waiting_output = True
                self.server.maybe_resume(conn)

    def forget(self, conn: Connection) -> None:
        """``conn`` is gone."""
        self.held.discard(conn)

    def stop(self) -> None:
        """The server stops: a move under way ends (its ``finally`` releases the slots)."""
        self.imports.stop()
        if self.task is not None:
            self.task.cancel()


def _move_args(args: dict[str, Any], slots: int) -> tuple[int, int, str]:
    """SLOTS_MOVE's ``lo``, ``hi`` and ``to``, checked (INVALID_ARGUMENT)."""
    lo, hi, to = args.get("lo"), args.get("hi"), args.get("to")
    for name, value in (("lo", lo), ("hi", hi)):
        if type(value) is not int:
            raise CoreError(ErrorCode.INVALID_ARGUMENT,
                            f"{name} must be a slot number (an integer), got {value!r}")
    assert isinstance(lo, int) and isinstance(hi, int)
    if not 0 <= lo <= hi < slots:
        raise CoreError(ErrorCode.INVALID_ARGUMENT,
                        f"lo and hi must be slots with 0 <= lo <= hi < {slots}, got {lo}-{hi}")
    if not isinstance(to, str) or not to:
        raise CoreError(ErrorCode.INVALID_ARGUMENT, f"to must be a shard's name, got {to!r}")
    return lo, hi, to
