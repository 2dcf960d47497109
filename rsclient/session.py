"""The session: the one narrow interface every handle of a client works through.

A scope, claim, mailbox, ticket or delivery holds its client's ``Session`` and nothing
else of the client: requests (plain, cancellable, fire-and-forget), sending one again
after it failed unanswered (``again``), the lease keeper, and whether the client was
closed. No handle reads another object's private attributes.

What always holds: the request methods are the connection's own bound methods, so the
session adds no call, task or allocation to any request; ``again`` runs only after a
failure (``failover.py`` decides), and ``call`` (a request, then ``again``) is for
requests off the hot path.

Of a sharded cluster whose map gives slots to more than one shard, the client's session
*routes* (``route``, once, by ``shards.py``): its request methods become the router's,
which send each request to the connection of the shard that owns it, so every handle
follows without code of its own. What a lease holds stays with the connection that
granted it: ``for_run(run)`` is the session of the run's shard (its connection, lease
keeper and ``link``), where a grant's lease is kept and a delivery is settled; unrouted,
the session itself. A lease whose run moved since is followed to its new shard's
session (``moved_to``) when its connection answers MOVED.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .errors import UnavailableError
from .failover import follow_moved, send_again
from .progress import TaskEventRouter

if TYPE_CHECKING:
    import asyncio

    from .connection import Connection, SentWait
    from .keeper import LeaseKeeper
    from .shards import Shards
    from .tracing import Spans

__all__ = ["Session"]

T = TypeVar("T")


class _RequestCancellable(Protocol):
    def __call__(
        self,
        op: int,
        args: dict[str, Any],
        *,
        withdraw: bool,
        give_back: Callable[[Any], None] | None = None,
        timeout: float | None = None,
    ) -> Awaitable[Any]: ...


class _RequestThenWait(Protocol):
    def __call__(
        self, op: int, args: dict[str, Any], wait_op: int, wait_args: dict[str, Any],
        *, timeout: float,
    ) -> Awaitable[tuple[Any, Any]]: ...


class Session:
    """What a handle may use of its client (see the module docstring)."""

    __slots__ = (
        "_conn", "_events", "connect", "keeper", "request", "request_cancellable",
        "request_then_wait", "router", "send_nowait", "send_wait", "spans", "stop_waiting",
    )

    def __init__(self, conn: Connection, keeper: LeaseKeeper) -> None:
        self._conn = conn
        self.keeper = keeper
        self.request: Callable[[int, dict[str, Any]], Awaitable[Any]] = conn.request
        self.request_cancellable: _RequestCancellable = conn.request_cancellable
        self.request_then_wait: _RequestThenWait = conn.request_then_wait
        # A wait sent at once for a caller that awaits its future itself, or None (then
        # ``request_cancellable``); ``stop_waiting`` when that caller is cancelled.
        self.send_wait: Callable[[int, dict[str, Any], float], SentWait | None] = (
            conn.send_wait
        )
        self.stop_waiting: Callable[[int, asyncio.Future[Any], float], None] = (
            conn.stop_waiting
        )
        # Connect (or wait for the connect under way) without sending anything.
        self.connect: Callable[[], Awaitable[None]] = conn.connect
        self.send_nowait: Callable[[int, dict[str, Any]], asyncio.Future[Any] | None] = (
            conn.send_nowait
        )
        self.router: Shards | None = None  # set by ``route``: a sharded cluster's client
        self._events: TaskEventRouter | None = None  # made by the first ``task_events``
        # OpenTelemetry's spans (tracing.py), or None: no call on the task path
        self.spans: Spans | None = None

    def task_events(self) -> TaskEventRouter:
        """The TASK_EVENTS pushes of this session's connection, by task (progress.py)."""
        events = self._events
        if events is None:
            events = self._events = TaskEventRouter(self._conn)
        return events

    def route(self, router: Shards) -> None:
        """From now on send every request through ``router`` (a sharded cluster whose
        slots more than one shard owns): its methods replace the connection's."""
        self.router = router
        self.request = router.request
        self.request_cancellable = router.request_cancellable
        self.request_then_wait = router.request_then_wait
        self.send_nowait = router.send_nowait
        self.send_wait = _never_at_once  # (each wait goes to its shard: request_cancellable)

    def for_run(self, scope: str) -> Session:
        """The session of the shard that owns run ``scope``: the connection its grants
        come on, the keeper that renews their leases, its ``link``. This one unless
        the client routes."""
        router = self.router
        return self if router is None else router.session_for(scope)

    def moved_to(self, scope: str) -> Session:
        """After a request naming a lease of run ``scope`` was answered MOVED on this
        session's connection and followed (``follow_moved``: the map asked for again):
        the session of the shard that owns the run now, where the lease is kept from
        then on (this one for a client that keeps no map)."""
        shards = self._conn.shards
        if shards is None or shards.map is None:
            return self
        return shards.session_for(scope)

    def again(
        self,
        failure: UnavailableError,
        op: int,
        args: dict[str, Any],
        send: Callable[[], Awaitable[T]] | None = None,
    ) -> Awaitable[T]:
        """``op`` with ``args`` failed with ``failure`` before its answer: its answer when
        sent again, if ``failover.py``'s rule allows (by default with ``request``), else
        ``failure`` raised. For ``except UnavailableError as exc:`` blocks."""
        if send is None:  # (looked up when sent: the router's, if the client routes by then)
            return send_again(self._conn, failure, op, args, lambda: self.request(op, args))
        return send_again(self._conn, failure, op, args, send)

    def follow_moved(self, failure: UnavailableError, redirects: int) -> Awaitable[None]:
        """A request answered MOVED (``failure``, the ``redirects``-th in a row) goes
        again: the slot map refreshed first; past MAX_REDIRECTS, UnavailableError (code
        MOVED) raised (``failover.py``). For waits, which are made again their own way."""
        return follow_moved(self._conn, failure, redirects)

    async def call(self, op: int, args: dict[str, Any]) -> Any:
        """``request``, then ``again`` if it failed before its answer: for requests off
        the hot path (a coroutine more per request)."""
        try:
            return await self.request(op, args)
        except UnavailableError as exc:
            return await self.again(exc, op, args)

    @property
    def link(self) -> int:
        """The number of ready connections ended so far (``Connection.link``): read when
        a request is sent, it names the connection its reply comes on."""
        return self._conn.link

    @property
    def shard(self) -> str | None:
        """The shard this session's connection serves (None: a server alone, or not
        known before its first HELLO)."""
        return self._conn.shard

    @property
    def closed(self) -> bool:
        """Whether the client was closed (nothing more will be sent)."""
        return self._conn.closed


def _never_at_once(op: int, args: dict[str, Any], timeout: float) -> SentWait | None:
    """``send_wait`` of a session that routes: no wait is sent at once from here (the
    router sends each to its shard's connection, through ``request_cancellable``)."""
    return None

