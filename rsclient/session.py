"""The session: the one narrow interface every handle of a client works through.

A scope, claim, mailbox, ticket or delivery holds its client's ``Session`` and nothing
else of the client: requests (plain, cancellable, fire-and-forget), sending one again
after it failed unanswered (``again``), the lease keeper, and whether the client was
closed. No handle reads another object's private attributes.

What always holds: the request methods are the connection's own bound methods, so the
session adds no call, task or allocation to any request; ``again`` runs only after a
failure (``failover.py`` decides), and ``call`` (a request, then ``again``) is for
requests off the hot path.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .errors import UnavailableError
from .failover import send_again

if TYPE_CHECKING:
    import asyncio

    from .connection import Connection
    from .keeper import LeaseKeeper

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


class Session:
    """What a handle may use of its client (see the module docstring)."""

    __slots__ = (
        "_conn", "connect", "keeper", "request", "request_cancellable", "request_then_wait",
        "send_nowait",
    )

    def __init__(self, conn: Connection, keeper: LeaseKeeper) -> None:
        self._conn = conn
        self.keeper = keeper
        self.request: Callable[[int, dict[str, Any]], Awaitable[Any]] = conn.request
        self.request_cancellable: _RequestCancellable = conn.request_cancellable
        self.request_then_wait = conn.request_then_wait
        # Connect (or wait for the connect under way) without sending anything.
        self.connect: Callable[[], Awaitable[None]] = conn.connect
        self.send_nowait: Callable[[int, dict[str, Any]], asyncio.Future[Any] | None] = (
            conn.send_nowait
        )

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
        return send_again(self._conn, failure, op, args, send)

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
    def closed(self) -> bool:
        """Whether the client was closed (nothing more will be sent)."""
        return self._conn.closed
