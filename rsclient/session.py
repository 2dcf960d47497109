"""The session: the one narrow interface every handle of a client works through.

A scope, claim, mailbox, ticket or delivery holds its client's ``Session`` and nothing
else of the client: requests (plain, cancellable, fire-and-forget), the lease keeper, and
whether the client was closed. No handle reads another object's private attributes.

What always holds: the request methods are the connection's own bound methods, so the
session adds no call, task or allocation to any request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from .connection import Connection
    from .keeper import LeaseKeeper

__all__ = ["Session"]


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

    __slots__ = ("_conn", "keeper", "request", "request_cancellable", "send_nowait")

    def __init__(self, conn: Connection, keeper: LeaseKeeper) -> None:
        self._conn = conn
        self.keeper = keeper
        self.request: Callable[[int, dict[str, Any]], Awaitable[Any]] = conn.request
        self.request_cancellable: _RequestCancellable = conn.request_cancellable
        self.send_nowait: Callable[[int, dict[str, Any]], asyncio.Future[Any] | None] = (
            conn.send_nowait
        )

    @property
    def closed(self) -> bool:
        """Whether the client was closed (nothing more will be sent)."""
        return self._conn.closed
