"""Shards: a client of a sharded cluster sends each request to the shard that owns it.

A sharded cluster spreads its runs over shards, each an HA group with its own primary,
by slot (``rsproto.slots``: a run's slot is ``slot_of(run id)``, a pool's or quota's
``slot_of(name)``); its slot map says which shard owns which slots, and a node answers
MOVED for a request whose slot its shard does not own (protocol.md, "Slots and
shards"). One ``Shards`` per client keeps the map and one connection per shard primary.

What always holds:
- a server alone tells no ``shard`` in its HELLO, and a cluster of one shard owns every
  slot: the client's session keeps the connection's own request methods, so a request
  costs what it did before shards: no hash, no map, no check (a grant or a receive asks
  ``Session.for_run`` where its lease is kept: one check);
- the first HELLO that names a shard gives the client's first connection (*home*) its
  shard. The slot map is asked for (SLOT_MAP) when a HELLO tells a map epoch above the
  one known (the first map, epoch 1, gives every slot to one shard: nobody asks for it),
  before a request answered MOVED goes again (on the connection that answered), and
  when a connection is lost or cannot find its primary (on another connection);
- once the map gives a slot to a shard other than home's, the session routes, for good
  (``Session.route``): each request goes by ``sdkrules.route_key`` to the connection of
  the shard owning ``slot_of(key)`` (RUN, NAME), to every shard that owns slots (EVERY:
  one answer back, the first shard's; any refusal raised), or to home (ANY, and a RUN
  request that names no run yet: a fresh run is made where it lands). CONNECTION
  requests (renewals, settlements, releases, the CANCEL of a wait) name a lease or a
  wait, not a run: each is sent on the connection that holds it by what holds it (the
  lease's keeper, the delivery's session: ``Session.for_run``; a connection's own
  CANCEL), and those that reach the router are home's own. A lease whose run moved to
  another shard follows it: a renewal item answered MOVED (``lease_moved``) or a handle
  op answered MOVED (``failover.follow_moved``, then ``session_for``) takes the lease to
  the owner's connection and keeper (``leases.rebind``), where it is renewed at once;
- one connection per shard primary, made when first needed with home's options and
  nodes (``Connection.sibling``), with its own lease keeper and session: leases, waits
  and consumers live per connection as they always did. Every connection of a shard
  expects that shard: a HELLO naming another is refused like a NOT_PRIMARY naming the
  primary that node's slot map gives our shard (``greeted``), so a lost shard finds its
  new primary through any node it was given; a MOVED is followed by ``failover.py``;
- a slot's owner is looked up in a list of every slot's shard and the slots of the last
  ``SLOT_CACHE`` keys are remembered: a routed request hashes its run id once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from rsproto.sdkrules import NODE_ANSWER_SECONDS, Route, moved_pause, route_key
from rsproto.slots import SlotMap, slot_of

from .errors import RunstateError, UnavailableError
from .keeper import LeaseKeeper
from .session import Session
from .wire import Op

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from .connection import Connection, Moved

__all__ = ["SLOT_CACHE", "Shards"]

log = logging.getLogger("rsclient")

SLOT_CACHE = 4096  # keys whose slot is remembered (cleared whole when full)
FIRST_MAP_EPOCH = 1  # the map a cluster is made with: every slot in its first shard


class Shards:
    """The slot map of one client and its connections, one per shard (the module
    docstring). ``session``: the client's own, whose connection is home."""

    def __init__(self, session: Session, home: Connection) -> None:
        self.home = home
        self.session = session
        self.map: SlotMap | None = None
        self.routing = False  # the session routes (for good, once it does)
        self._owners: list[str] = []  # every slot's shard, under ``map``
        self._slots: dict[str, int] = {}  # the slot of recent keys
        self._conns: dict[str, Connection] = {}  # each shard's connection, home's too
        self._sessions: dict[str, Session] = {}  # and its session
        self._refreshing: asyncio.Task[bool] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()  # refreshes started by a loss
        home.shards = self
        home.on_link_lost(lambda: self._lost(home))

    # ---- the map ---------------------------------------------------------------------

    async def greeted(self, conn: Connection, told: object) -> tuple[str, dict[str, Any]] | None:
        """``conn``'s HELLO named the shard ``told`` (``{"name", "slots", "map_epoch"}``):
        None if it is ``conn``'s (the map asked for first if ``told`` is newer), else
        why it is refused and the primary of ``conn``'s shard by that node's map."""
        name = told.get("name") if isinstance(told, dict) else None
        if not isinstance(name, str):
            return None  # not a shard we can read: served as a node alone would be
        assert isinstance(told, dict)
        if conn.shard is None:  # home's first HELLO: home serves this shard from now on
            conn.shard = name
            self._conns[name] = conn
            self._sessions[name] = self.session
        elif name != conn.shard:
            found = await self._ask(conn)
            primary = found.primaries.get(conn.shard) if found is not None else None
            return (f"rsd at {conn.host}:{conn.port} serves shard {name!r}, not "
                    f"{conn.shard!r}", {"primary": primary, "shard": name})
        epoch = told.get("map_epoch")
        if isinstance(epoch, int) and epoch > self._epoch():
            await self._ask(conn)
        return None

    def _epoch(self) -> int:
        return self.map.epoch if self.map is not None else FIRST_MAP_EPOCH

    def adopt(self, found: SlotMap) -> None:
        """Take ``found`` as the slot map, unless an older one; route from the moment a
        shard other than home's owns a slot."""
        known = self.map
        if known is not None and found.epoch < known.epoch:
            return
        if known is None or known.slots != found.slots:
            self._slots.clear()
        self.map = found
        owners: list[str] = []
        for lo, hi, shard in found.ranges:
            owners += [shard] * (hi - lo + 1)
        self._owners = owners
        whole = len(found.ranges) == 1 and found.ranges[0][2] == self.home.shard
        if not whole and not self.routing:
            self.routing = True
            self.session.route(self)

    def primary_of(self, shard: str) -> str | None:
        """The primary the map names for ``shard`` (None: none known)."""
        return self.map.primaries.get(shard) if self.map is not None else None

    async def follow(self, moved: Moved, redirects: int = 1) -> None:
        """Before a request answered MOVED (``moved``, the ``redirects``-th in a row) goes
        again, what ``sdkrules.moved_pause`` says: the map asked for again (on the
        connection that answered first) if the answer's is newer; nothing if it is the
        one held; a pause if the one held is newer (the node that answered lags behind
        the map: a slot move's target adopts it when its etcd watch says so, while the
        source already sends its held requests there), for it to catch up instead of
        being sent the request straight back to answer MOVED again."""
        known = self.map.epoch if self.map is not None else None
        pause = moved_pause(known, moved.details.get("map_epoch"), redirects)
        if pause is None:
            await self.refresh(prefer=moved.answered_by)
        elif pause > 0:
            await asyncio.sleep(pause)

    async def refresh(
        self, *, prefer: Connection | None = None, exclude: Connection | None = None
    ) -> bool:
        """Ask for the map on ``prefer``, else on any other ready connection but
        ``exclude``; whether one answered. One refresh at a time: a caller that comes
        while one runs shares it."""
        running = self._refreshing
        if running is None:
            running = self._refreshing = asyncio.ensure_future(self._refresh(prefer, exclude))
            running.add_done_callback(self._refreshed)
        return await asyncio.shield(running)

    def _refreshed(self, task: asyncio.Task[bool]) -> None:
        if self._refreshing is task:
            self._refreshing = None

    async def _refresh(self, prefer: Connection | None, exclude: Connection | None) -> bool:
        candidates = [prefer] if prefer is not None else []
        candidates += [conn for conn in self._conns.values() if conn is not prefer]
        for conn in candidates:
            if conn is not exclude and conn.connected and await self._ask(conn) is not None:
                return True
        return False

    async def _ask(self, conn: Connection) -> SlotMap | None:
        """SLOT_MAP on ``conn`` (also one being opened), adopted; None if it failed."""
        try:
            reply = await asyncio.wait_for(conn.ask(Op.SLOT_MAP, {}), NODE_ANSWER_SECONDS)
            found = SlotMap.from_wire(reply)
        except (RunstateError, TimeoutError, ValueError, TypeError, AttributeError) as exc:
            log.info("could not read the slot map from rsd at %s:%s: %s",
                     conn.host, conn.port, exc)
            return None
        self.adopt(found)
        return found

    def _lost(self, conn: Connection) -> None:
        """``conn``'s connection ended: the map asked for again on another, for where its
        shard's primary is now (a takeover's new primary)."""
        if self.map is None or conn.closed or self.home.closed:
            return
        task = asyncio.get_running_loop().create_task(self.refresh(exclude=conn))
        self._tasks.add(task)  # (the loop keeps only a weak reference)
        task.add_done_callback(self._tasks.discard)

    # ---- routing ---------------------------------------------------------------------

    def conn_for(self, key: str) -> Connection:
        """The connection of the shard that owns ``key``'s slot (made if need be)."""
        name = self._shard_of(key)
        conn = self._conns.get(name)
        return conn if conn is not None else self._open(name)[0]

    def _shard_of(self, key: str) -> str:
        """The shard that owns ``key``'s slot by the map held (one was adopted)."""
        slot = self._slots.get(key)
        if slot is None:
            assert self.map is not None  # (routing: a map was adopted)
            slot = slot_of(key, self.map.slots)
            if len(self._slots) >= SLOT_CACHE:
                self._slots.clear()
            self._slots[key] = slot
        return self._owners[slot]

    async def lease_moved(self, run: str, answered_by: Connection) -> Session | None:
        """A renewal of a lease of run ``run`` was answered MOVED by ``answered_by``
        (the lease left that shard with its run; the item names no owner): the session
        of the shard that owns the run's slot now, where the lease is kept from then on.
        The map is asked for again first (on ``answered_by``, as ``follow`` does) if it
        still gives the slot to ``answered_by``'s shard; None if it still does then (the
        map has not caught up: the keeper tries again soon). No pause as ``follow``'s for
        a node behind the map: a renewal names a lease, not a run, so a move's target
        (which holds the lease from its import on) renews it whatever map it holds."""
        if self.map is None or self._shard_of(run) == answered_by.shard:
            await self.refresh(prefer=answered_by)
            if self.map is None or self._shard_of(run) == answered_by.shard:
                return None
        return self.session_for(run)

    def session_for(self, key: str) -> Session:
        """The session of the shard that owns ``key``'s slot (made if need be)."""
        name = self.conn_for(key).shard
        assert name is not None
        return self._sessions[name]

    def _open(self, name: str) -> tuple[Connection, Session]:
        """Shard ``name``'s connection (no I/O: it connects on its first request), with
        its own lease keeper and session."""
        if self.home.closed:
            raise UnavailableError("client is closed")
        conn = self.home.sibling(name, self.primary_of(name))
        session = Session(conn, LeaseKeeper(conn))
        session.spans = self.session.spans
        conn.on_link_lost(lambda: self._lost(conn))
        self._conns[name] = conn
        self._sessions[name] = session
        return conn, session

    def _conn_of(self, op: int, args: dict[str, Any]) -> Connection | None:
        """Where ``op`` goes: the connection of its key's shard, home, or None for every
        shard (EVERY)."""
        route, key = route_key(op, args)
        if key is not None:
            return self.conn_for(key)
        return None if route is Route.EVERY else self.home

    def request(self, op: int, args: dict[str, Any]) -> Awaitable[Any]:
        """``Connection.request`` on the connection of the shard that owns it."""
        conn = self._conn_of(op, args)
        return self._every(op, args) if conn is None else conn.request(op, args)

    def request_cancellable(
        self, op: int, args: dict[str, Any], *, withdraw: bool,
        give_back: Callable[[Any], None] | None = None, timeout: float | None = None,
    ) -> Awaitable[Any]:
        """``Connection.request_cancellable`` on the connection of the shard that owns it."""
        conn = self._conn_of(op, args) or self.home
        return conn.request_cancellable(op, args, withdraw=withdraw, give_back=give_back,
                                        timeout=timeout)

    def request_then_wait(
        self, op: int, args: dict[str, Any], wait_op: int, wait_args: dict[str, Any],
        *, timeout: float,
    ) -> Awaitable[tuple[Any, Any]]:
        """``Connection.request_then_wait`` on the connection of the shard that owns
        ``op`` (the wait names the same run)."""
        conn = self._conn_of(op, args) or self.home
        return conn.request_then_wait(op, args, wait_op, wait_args, timeout=timeout)

    def send_nowait(self, op: int, args: dict[str, Any]) -> asyncio.Future[Any] | None:
        """``Connection.send_nowait`` on the connection of the shard that owns it."""
        conn = self._conn_of(op, args) or self.home
        return conn.send_nowait(op, args)

    async def _every(self, op: int, args: dict[str, Any]) -> Any:
        """``op`` on every shard that owns slots (a declaration each must know): the
        first shard's answer, or the first refusal raised."""
        assert self.map is not None
        names = [entry.shard for entry in self.map.shards() if entry.ranges]
        answers = await asyncio.gather(
            *(self._named(name).request(op, args) for name in names), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
        return answers[0]

    def _named(self, name: str) -> Connection:
        conn = self._conns.get(name)
        return conn if conn is not None else self._open(name)[0]

    def owning(self) -> list[tuple[str, Session]]:
        """Every shard that owns slots, in the map's order, with its session (made if need
        be): the shards a view of the whole cluster asks (``admin.py``, rsproto/fanout.py)."""
        assert self.map is not None  # (routing: a map was adopted)
        owners = []
        for entry in self.map.shards():
            if entry.ranges:
                session = self._sessions.get(entry.shard)
                owners.append((entry.shard, session or self._open(entry.shard)[1]))
        return owners

    # ---- the client's end ------------------------------------------------------------

    def sessions(self) -> list[Session]:
        """Every shard's session, the client's own first."""
        return [self.session] + [s for s in self._sessions.values() if s is not self.session]

    async def close(self) -> None:
        """Close every connection but home's (the client closes that one) and stop
        their keepers; the client has released their leases first."""
        for task in list(self._tasks):
            task.cancel()
        for name, conn in list(self._conns.items()):
            if conn is not self.home:
                self._sessions[name].keeper.close()
                await conn.close()
