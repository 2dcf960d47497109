"""Tickets: handles on shared tasks. A ticket is just a task id inside a run.

``rs.scope(run_id).task(task_id)`` re-attaches from any process; nothing is re-run.
``result()`` parks on the server and the result is pushed the moment the task ends:
it does not poll. A timeout raises WaitTimeoutError here only; the task keeps going.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .errors import UnavailableError, WaitTimeoutError
from .wire import Limits, Op

if TYPE_CHECKING:
    from .client import AsyncRunstate

__all__ = ["Ticket"]


class Ticket:
    def __init__(
        self, client: AsyncRunstate, scope: str, task_id: str, view: dict[str, Any] | None = None
    ) -> None:
        self._client = client
        self.scope_id = scope
        self.id = task_id
        self.view = view or {}  # the task as last seen (submit's reply)

    def __repr__(self) -> str:
        return f"<Ticket {self.scope_id}/{self.id}>"

    @property
    def created(self) -> bool:
        """Whether the submit that made this ticket created the task (False: joined)."""
        return bool(self.view.get("created"))

    def _args(self, **extra: Any) -> dict[str, Any]:
        return {"scope": self.scope_id, "task": self.id, **extra}

    async def status(self) -> dict[str, Any]:
        """state, attempt, outcome, reason, tombstoned, key, subscribers, timestamps."""
        return await self._client._conn.request(Op.TASK_STATUS, self._args())

    async def result(self, timeout_ms: int | None = None) -> dict[str, Any]:
        """Wait for the task to end; returns its view ({"state", "outcome", "reason", ...}).

        ``timeout_ms=None`` waits as long as it takes.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout_ms is None else loop.time() + timeout_ms / 1000.0
        while True:
            if deadline is None:
                wait_ms = Limits.MAX_WAIT_TIMEOUT_MS
            else:
                wait_ms = max(0, int((deadline - loop.time()) * 1000))
            try:
                return await self._wait_once(wait_ms)
            except WaitTimeoutError:
                if deadline is not None:
                    raise
            except UnavailableError:
                # The wait died with the connection: wait again on the next one.
                if deadline is not None and loop.time() >= deadline:
                    raise WaitTimeoutError(
                        f"task {self.id} had not finished within {timeout_ms} ms"
                    ) from None

    async def _wait_once(self, timeout_ms: int) -> dict[str, Any]:
        return await self._client._conn.request_cancellable(
            Op.TASK_RESULT, self._args(timeout_ms=timeout_ms), withdraw=True,
            timeout=timeout_ms / 1000.0,
        )

    async def join(self, subscriber_id: str, scope_id: str | None = None) -> dict[str, Any]:
        """Record ``subscriber_id`` (of run ``scope_id``) as interested in this task."""
        return await self._client._conn.request(
            Op.TASK_JOIN, self._args(subscriber_id=subscriber_id, subscriber_scope=scope_id)
        )

    async def detach(self, subscriber_id: str) -> dict[str, Any]:
        """Unsubscribe. A task with no subscribers is not cancelled."""
        return await self._client._conn.request(
            Op.TASK_DETACH, self._args(subscriber_id=subscriber_id)
        )

    async def cancel(self, reason: str | None = None) -> dict[str, Any]:
        """End the task CANCELLED (no-op if it already ended); returns its view."""
        return await self._client._conn.request(Op.TASK_CANCEL, self._args(reason=reason))
