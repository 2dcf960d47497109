"""The dashboard's API over every shard of a sharded cluster (issue 32, "one view of many
shards"): its listings merged from each shard's primary, a run's routes read from the
run's shard, and an overview that shows the shards, their slots and their figures.

Where the fan-out happens, and why here: in the API of the node the browser asks, which
asks the other shards' primaries over the binary protocol. A browser then needs one
address, as it always did; the page stays a thin shell that shows what ``/api/`` gives
(it learns no map, opens no connection to another node, holds no token of another);
and a script that reads ``/api/`` gets the same merged answers. The other choices were
worse: the page asking every node's HTTP listener needs every listener reachable from
the browser, and the slot map and the cursor rules written again in JavaScript; a
standing proxy between nodes would hold connections and state for a page nobody opens.

Who asks: the other primary is sent the requester's own credentials, in a HELLO as any
client's (the bearer token the request carried; none without a tokens file, where
every node serves loopback only), over the cluster's TLS context (``--cluster-ca``: as
a standby reaches its primary and a move reaches its target, slotimport.py's channel).
So each primary decides who asks as this one did (the cluster's nodes share one tokens
file): a tenant's token reads its own tenant there too, a client-role token is refused
the admin ops there as here, and no op is sent on another's behalf (the cluster token
is an admin of one tenant: a view through it would need every rule written again here).

What always holds:
- this node's own shard is read from its core (``api.Here``), at once; only the other
  shards are asked over the network, each on one connection of its own for the whole
  request (opened when first needed, closed with the answer), each connection's every
  step (connect, HELLO, each request) within the request's one time-out
  (``PEER_SECONDS``, and before the listener's deadline: ``DEADLINE_MARGIN``), so a
  slow or dead shard costs a page at most that, and nothing blocks the event loop or
  another client (everything is awaited; merging is O(rows of one page));
- the page answers with what it has: a shard without a primary, or one that did not
  answer in time, is shown as such (the overview's ``shards`` row has no primary and
  an ``error``; a listing names it under ``unavailable`` and its cursor keeps that
  shard's position, so the next page asks it again); a route of a run on such a shard
  is 503 ``UNAVAILABLE``;
- a refusal that is the requester's (PERMISSION_DENIED, NOT_FOUND, ...) is the answer,
  as from one node; only a shard that cannot be reached is left out;
- listings that name no run follow rsproto/fanout.py, the rules the Python SDK's
  ``rs.admin`` follows (each shard's share of ``limit``, the merged cursor, each row
  naming its ``shard``); the overview's newest runs are each shard's ten newest, the
  ten newest of them shown; its ``stats`` are every answering shard's SERVER_STATS
  summed (``merge_stats``: each shard's own under ``shards``, beside the sums), and
  ``shards`` is ``rsctl cluster --json``'s (``shard_row``) plus each one's ``error``;
- a node whose map names one shard (a server alone, a cluster of one shard) never gets
  here (``api.many_shards``): it answers from its core, as before.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import rsproto as wire
from rsproto import ErrorCode, Op
from rsproto.fanout import merge_page, merge_stats, plan_page, read_cursor, shard_row

from .. import __version__
from ..core import CoreError
from ..wire.slotimport import ImportChannel, ImportRefused
from .api import MAX_ANSWER_BYTES, OVERVIEW_MAILBOXES, RECENT_RUNS, Here, encode, own_mailboxes

if TYPE_CHECKING:
    import ssl

    from ..security.tokens import Identity
    from .api import Api, ApiHost, Reader
    from .httpserver import Request

__all__ = ["DEADLINE_MARGIN", "PEER_SECONDS", "Sharded", "There"]

PEER_SECONDS = 2.0  # the most a request waits for the other shards' primaries
DEADLINE_MARGIN = 0.5  # and it answers this long before the listener's deadline at least
# A shard unreachable for these answers: it is left out (the page shows it), not raised.
_UNREACHED = frozenset({ErrorCode.UNAVAILABLE, ErrorCode.NOT_PRIMARY, ErrorCode.MOVED})


class _Channel(ImportChannel):
    """A connection to another shard's primary (slotimport.py's: one request at a time),
    greeted as the dashboard of this node's shard."""

    async def open(self, node: str) -> None:
        host, _, port = self.address.rpartition(":")
        self.reader, self.writer = await asyncio.open_connection(
            host, int(port), ssl=self.tls,
            server_hostname=host if self.tls is not None else None)
        args: dict[str, Any] = {"version": wire.PROTOCOL_VERSION, "holder": node,
                                "client": f"rsd/{__version__}"}
        if self.token is not None:
            args["token"] = self.token
        await self.call(Op.HELLO, args)


class There:
    """Shard ``shard``'s primary at ``address`` (None: it has none now), asked with the
    requester's ``token``, every step before ``until`` (loop time)."""

    def __init__(self, shard: str, address: str | None, token: str | None,
                 tls: ssl.SSLContext | None, until: float, holder: str) -> None:
        self.shard, self.address, self.until, self.holder = shard, address, until, holder
        self.channel = None if address is None else _Channel(address, token, tls, PEER_SECONDS)
        self.opened = False
        self.broken = None if address is not None else f"shard {shard!r} has no primary now"
        self.lock = asyncio.Lock()  # one request at a time on the channel

    async def read(self, op: int, args: dict[str, Any]) -> Any:
        """``op`` answered by that primary; CoreError with its code if refused there, or
        UNAVAILABLE if it could not be asked in time."""
        async with self.lock:
            if self.broken is not None or self.channel is None:
                raise CoreError(ErrorCode.UNAVAILABLE, self.broken or "no channel")
            try:
                async with asyncio.timeout_at(self.until):
                    if not self.opened:
                        self.opened = True
                        await self.channel.open(self.holder)
                    return await self.channel.call(op, args)
            except ImportRefused as exc:
                code = ErrorCode.__members__.get(exc.code, ErrorCode.UNAVAILABLE)
                if code in _UNREACHED:
                    self._break(f"the primary of shard {self.shard!r} ({self.address}) "
                                f"did not answer: {exc.message}")
                    raise CoreError(code, self.broken or exc.message) from None
                raise CoreError(code, exc.message) from None
            except (OSError, TimeoutError) as exc:
                self._break(f"the primary of shard {self.shard!r} ({self.address}) did not "
                            f"answer in time: {exc or type(exc).__name__}")
                raise CoreError(ErrorCode.UNAVAILABLE, self.broken or "") from None

    def _break(self, why: str) -> None:
        self.broken = why
        self.close()

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()


class Sharded:
    """One request to a sharded cluster (``api.Asking``): this node's shard read here,
    the others asked of their primaries (the module docstring)."""

    sharded = True

    def __init__(self, api: Api, who: Identity, token: str | None, server: ApiHost,
                 request: Request) -> None:
        self.api, self.who, self.token = api, who, token
        self.map = server.slots.map
        self.shard = server.slots.shard
        self.tls = server.moves.tls
        self.here = Here(api, who)
        now = api.loop.time()
        self.until = min(now + PEER_SECONDS, request.deadline - DEADLINE_MARGIN)
        self.peers: dict[str, There] = {}

    def reader(self, shard: str) -> Reader:
        """Where shard ``shard``'s ops go: this node's core, or its primary."""
        if shard == self.shard:
            return self.here
        peer = self.peers.get(shard)
        if peer is None:
            peer = self.peers[shard] = There(
                shard, self.map.primaries.get(shard), self.token, self.tls, self.until,
                f"dashboard of shard {self.shard}")
        return peer

    def at(self, key: str) -> Reader:
        return self.reader(self.map.owner_of(key))

    def shard_of(self, key: str) -> str | None:
        return self.map.owner_of(key)

    def close(self) -> None:
        for peer in self.peers.values():
            peer.close()

    async def _each(self, names: list[str], op: int, args: list[dict[str, Any]]
                    ) -> tuple[dict[str, Any], dict[str, str]]:
        """``op`` asked of each shard of ``names`` at once (with its own ``args``): the
        answers, and why each shard that could not be reached was left out. A refusal
        that is the requester's is raised (the first, in ``names``' order)."""
        found = await asyncio.gather(
            *(self.reader(name).read(op, sent) for name, sent in zip(names, args, strict=True)),
            return_exceptions=True)
        answers: dict[str, Any] = {}
        missing: dict[str, str] = {}
        for name, answer in zip(names, found, strict=True):
            if isinstance(answer, CoreError) and answer.code in _UNREACHED:
                missing[name] = answer.message
            elif isinstance(answer, BaseException):
                raise answer
            else:
                answers[name] = answer
        return answers, missing

    def _owning(self) -> list[str]:
        """The shards that own slots, in the map's order (those a listing asks)."""
        return [entry.shard for entry in self.map.shards() if entry.ranges]

    async def listing(self, op: int, field: str, args: dict[str, Any]) -> Any:
        """One merged page of a listing that names no run (rsproto/fanout.py), within
        ``MAX_ANSWER_BYTES``: asked again with half the limit while over half of it."""
        cursor = args["cursor"]
        positions = read_cursor(cursor)  # (checked by api._paging)
        names = self._owning()
        limit = args["limit"]
        while True:
            asks = plan_page(positions, names, limit)
            answers, missing = await self._each(
                [name for name, _, _ in asks], op,
                [{**args, "cursor": at, "limit": share} for _, at, share in asks])
            found, after = merge_page(positions, names, asks, answers, field)
            page: dict[str, Any] = {field: found, "next": after}
            if missing:
                page["unavailable"] = missing
            if limit <= 1 or len(encode(page)) <= MAX_ANSWER_BYTES // 2:
                return page
            limit //= 2

    async def overview(self) -> dict[str, Any]:
        """/overview of a sharded cluster: the figures of every shard summed, each
        shard's beside them, its row (primary, members, slots, runs), the ten newest runs
        of all and the first mailboxes of every shard."""
        api, who = self.api, self.who
        own = api.stats(who)  # this shard's, and the rule: the server's figures, admin only
        entries = self.map.shards()
        others = [entry.shard for entry in entries if entry.shard != self.shard]
        owning = self._owning()
        # at once: a shard that does not answer costs the overview one time-out, not three
        (stats, missing), (newest, unreached), mailboxes = await asyncio.gather(
            self._each(others, Op.SERVER_STATS, [{} for _ in others]),
            self._each(owning, Op.ADMIN_SCOPES, [
                {"limit": RECENT_RUNS, "newest_first": True} for _ in owning]),
            self.listing(Op.ADMIN_MAILBOXES, "mailboxes",
                         {"cursor": 0, "limit": OVERVIEW_MAILBOXES}))
        stats[self.shard] = own
        each = {entry.shard: own_mailboxes(stats[entry.shard], who.tenant)
                for entry in entries if entry.shard in stats}
        rows = []
        for entry in entries:
            row = shard_row(entry.shard, entry.ranges, each.get(entry.shard))
            if entry.shard in missing:
                row["error"] = missing[entry.shard]
            rows.append(row)
        recent = [{**run, "shard": name} for name in owning if name in newest
                  for run in newest[name]["scopes"]]
        recent.sort(key=lambda run: run.get("created_at") or 0, reverse=True)
        return {
            "tenant": who.tenant, "role": who.role, "stats": merge_stats(each),
            "cluster": api.cluster(), "slots": self.map.slots, "map_epoch": self.map.epoch,
            "shard": self.shard, "shards": rows, "recent_runs": recent[:RECENT_RUNS],
            "mailboxes": mailboxes, "unavailable": {**unreached, **missing},
        }
