"""``rsctl slots``: the slot map of a sharded cluster, and the moves an operator asks for.

- ``rsctl slots [--json]``: each shard, its primary, its ranges and slot count (SLOT_MAP,
  from any node);
- ``rsctl slots move LO-HI --to SHARD [--json]``: the range's owners are read from the
  map, and each owner's primary is asked to give its part (SLOTS_MOVE, admin token);
  exits 0 once the map gives the whole range to SHARD, and prints the new owner;
- ``rsctl slots balance [--json] [--rate RANGES_PER_SECOND]``: the moves that spread the
  slots evenly over the shards (slotplan.py), one contiguous range at a time, at most
  ``--rate`` ranges a second, each printed as it is done.

What always holds: the map is read again before each move (another operator, or a
takeover, may have changed it), a move answered MOVED (the map changed under it) is
planned again from the fresh map, and a move is never asked of a shard that does not
own the range (the server refuses it anyway). Exit status as every rsctl command: 0
done, 1 refused or unreachable (the reason on stderr), 2 a usage error.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

from rsclient import AsyncRunstate, RunstateError
from rsclient.wire import ErrorCode, Op
from rsproto.fanout import shard_row
from rsproto.slots import SlotMap

from .render import print_json, print_table
from .slotplan import Move, balance_moves, move_moves, parse_range, slot_counts

__all__ = ["add_parser", "read_map", "shard_views", "slots"]

MAX_REPLANS = 8  # moves answered MOVED in a row before a move gives up
SLOTS_COLUMNS = ("shard", "primary", "count", "ranges")


class SlotsRefused(Exception):
    """A move rsctl cannot ask for (exit 1, the message on stderr)."""


class SlotsUsage(Exception):
    """An argument of ``slots`` rsctl cannot act on (exit 2, as argparse's refusals)."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """``slots`` and its actions, on rsctl's sub-command parser."""
    text = "the slot map: each shard's primary, ranges and slot count"
    slots_cmd = sub.add_parser("slots", help=text, description=text, parents=[common])
    actions = slots_cmd.add_subparsers(dest="action", required=False, metavar="ACTION")
    move = actions.add_parser(
        "move", parents=[common], help="give slots LO-HI to shard SHARD (exits once done)")
    move.add_argument("range", metavar="LO-HI")
    move.add_argument("--to", required=True, metavar="SHARD", help="the shard to own them")
    balance = actions.add_parser(
        "balance", parents=[common],
        help="spread the slots evenly over the shards, one range at a time")
    balance.add_argument("--rate", type=float, default=1.0, metavar="RANGES_PER_SECOND",
                         help="at most this many ranges moved a second (default 1)")


async def read_map(rs: AsyncRunstate) -> SlotMap:
    """The map as the node ``rs`` reaches answers it (SLOT_MAP)."""
    return SlotMap.from_wire(await rs.admin.request(Op.SLOT_MAP))


@contextlib.asynccontextmanager
async def at_address(
    rs: AsyncRunstate, args: argparse.Namespace, address: str | None
) -> AsyncIterator[AsyncRunstate]:
    """A connection to ``address`` (a shard's primary) with rsctl's token and TLS; ``rs``
    itself when ``address`` is None (a server alone: the map names no primary)."""
    if address is None:
        yield rs
        return
    given = str(args.address or "")
    if given.startswith("tls://"):
        address = "tls://" + address
    async with AsyncRunstate(holder="rsctl", address=address, **args.reach) as there:
        yield there


async def _ask(rs: AsyncRunstate, args: argparse.Namespace, slot_map: SlotMap,
               move: Move) -> dict[str, Any]:
    """SLOTS_MOVE to the primary of the shard that owns the move's range."""
    lo, hi, source, to = move
    primary = slot_map.primaries.get(source)
    if primary is None and slot_map.epoch > 0:
        raise SlotsRefused(f"shard {source}, which owns slots {lo}-{hi}, has no primary "
                           "now; try again once it has one")
    async with at_address(rs, args, primary) as there:
        return await there.admin.request(Op.SLOTS_MOVE, lo=lo, hi=hi, to=to)


async def _step(rs: AsyncRunstate, args: argparse.Namespace,
                plan: Callable[[SlotMap], list[Move]]) -> tuple[Move, dict[str, Any]] | None:
    """Read the map, plan (``plan(map)``: the moves left), and carry out the first move,
    planning again after a MOVED; the move and its answer, or None once none is left."""
    for _ in range(MAX_REPLANS):
        slot_map = await read_map(rs)
        moves: list[Move] = plan(slot_map)
        if not moves:
            return None
        try:
            return moves[0], await _ask(rs, args, slot_map, moves[0])
        except RunstateError as exc:
            if exc.code != ErrorCode.MOVED:
                raise
    raise SlotsRefused(f"the slot map changed under each of {MAX_REPLANS} moves in a row")


async def slots(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    """``rsctl slots`` and its actions (the module docstring)."""
    try:
        if args.action == "move":
            return await _move(rs, args)
        if args.action == "balance":
            return await _balance(rs, args)
    except SlotsRefused as exc:
        print(f"rsctl: {exc}", file=sys.stderr)
        return 1
    except SlotsUsage as exc:
        print(f"rsctl: {exc}", file=sys.stderr)
        return 2
    return await _show(rs, args)


async def _show(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    slot_map = await read_map(rs)
    counts = slot_counts(slot_map)
    shards: list[dict[str, Any]] = [
              {"shard": entry.shard, "primary": entry.primary, "count": counts[entry.shard],
               "ranges": [list(span) for span in entry.ranges]}
              for entry in slot_map.shards()]
    if args.json:
        print_json({"slots": slot_map.slots, "map_epoch": slot_map.epoch, "shards": shards})
        return 0
    print(f"{slot_map.slots} slots, map epoch {slot_map.epoch}")
    print_table([{**row, "ranges": _spans(row["ranges"])} for row in shards], SLOTS_COLUMNS)
    return 0


def _spans(ranges: list[list[int]]) -> str:
    return ",".join(f"{lo}-{hi}" for lo, hi in ranges) or "-"


async def _move(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    slot_map = await read_map(rs)
    try:
        lo, hi = parse_range(args.range, slot_map.slots)
    except ValueError as exc:
        raise SlotsUsage(str(exc)) from None
    if args.to not in slot_counts(slot_map):
        raise SlotsRefused(f"shard {args.to!r} is not registered in this cluster (shards: "
                           f"{', '.join(sorted(slot_counts(slot_map)))})")
    done: list[dict[str, Any]] = []
    while (step := await _step(rs, args, lambda m: move_moves(m, lo, hi, args.to))) is not None:
        (start, end, source, _), reply = step
        done.append({"lo": start, "hi": end, "from": source, "to": args.to,
                     "map_epoch": reply.get("map_epoch")})
    final = await read_map(rs)
    if args.json:
        print_json({"lo": lo, "hi": hi, "shard": args.to, "map_epoch": final.epoch,
                    "moves": done})
    else:
        print(f"slots {lo}-{hi} are owned by {args.to} (map epoch {final.epoch})")
    return 0


async def _balance(rs: AsyncRunstate, args: argparse.Namespace) -> int:
    if not args.rate > 0:
        raise SlotsUsage("--rate must be more than 0 ranges a second")
    loop = asyncio.get_running_loop()
    done: list[dict[str, Any]] = []
    budget = 2 * len(balance_moves(await read_map(rs))) + MAX_REPLANS
    next_at = loop.time()
    while budget > 0:
        await asyncio.sleep(max(0.0, next_at - loop.time()))
        step = await _step(rs, args, balance_moves)
        if step is None:
            break
        next_at = loop.time() + 1 / args.rate
        budget -= 1
        (start, end, source, to), reply = step
        done.append({"lo": start, "hi": end, "from": source, "to": to,
                     "map_epoch": reply.get("map_epoch")})
        if not args.json:
            print(f"slots {start}-{end}: {source} -> {to} (map epoch {reply.get('map_epoch')})",
                  flush=True)
    final = await read_map(rs)
    if args.json:
        print_json({"moves": done, "map_epoch": final.epoch, "slots": slot_counts(final)})
    else:
        counts = ", ".join(f"{shard} {count}" for shard, count in slot_counts(final).items())
        print(f"balanced: {counts} (map epoch {final.epoch})" if not balance_moves(final)
              else f"not balanced yet: {counts} (map epoch {final.epoch})")
    return 0 if not balance_moves(final) else 1


async def shard_views(
    rs: AsyncRunstate, args: argparse.Namespace
) -> dict[str, Any] | None:
    """``rsctl cluster --json``'s ``slots``, ``map_epoch`` and ``shards`` (each shard's
    primary node, members, ranges and runs, from its primary's SERVER_STATS); None from a
    server that knows no slot map (before shards)."""
    try:
        slot_map = await read_map(rs)
    except RunstateError as exc:
        if exc.code == ErrorCode.UNKNOWN_OP:
            return None
        raise
    shards = []
    for entry in slot_map.shards():
        stats = None
        if entry.primary is not None:
            with contextlib.suppress(RunstateError, OSError):
                async with at_address(rs, args, entry.primary) as there:
                    stats = await there.admin.request(Op.SERVER_STATS)  # its own
        shards.append(shard_row(entry.shard, entry.ranges, stats))
    return {"slots": slot_map.slots, "map_epoch": slot_map.epoch, "shards": shards}
