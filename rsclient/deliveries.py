"""Deliveries: one leased hand-out of a task or message to a worker.

A delivery settles once: the first ``complete``, ``retry`` or ``reject`` decides, and
later calls do nothing. A settlement the server refuses because the lease is no longer
current (it expired and the task went to another worker) raises LeaseLostError; the
task keeps the result of whoever completed it with a valid lease.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import InvalidArgumentError, LeaseLostError, RunstateError
from .leases import Lease
from .wire import Op

if TYPE_CHECKING:
    from .client import AsyncRunstate

__all__ = ["Delivery"]


class Delivery:
    def __init__(
        self,
        client: AsyncRunstate,
        scope: str,
        mailbox: str,
        body: dict[str, Any],
        confirmed_at: float,
        *,
        auto_renew: bool = False,
    ) -> None:
        self._client = client
        self._auto_renew = auto_renew
        self.scope_id = scope
        self.mailbox = mailbox
        self.id: str = body["id"]
        self.kind: str = body["kind"]  # "task" or "message"
        self.task_id: str | None = body["task_id"]
        self.key: str | None = body.get("key")
        self.data: Any = body["data"]
        self.attempt: int = body["attempt"]
        self.lease = Lease(
            client._keeper,
            body["lease"],
            scope=scope,
            key=self.id,
            generation=self.attempt,
            lease_seconds=body["lease_seconds"],
            confirmed_at=confirmed_at,
            release_op=Op.DELIVERY_RELEASE,
        )
        self.settled = False
        self.state: str | None = None  # the task's state after settlement
        if auto_renew:
            client._keeper.track(self.lease)
        else:
            client._keeper.know(self.lease)  # not renewed here, but told of its loss

    def __repr__(self) -> str:
        return f"<Delivery {self.kind} {self.id} attempt={self.attempt}>"

    def token(self) -> str:
        """The delivery's fencing token (its lease's)."""
        return self.lease.token()

    @property
    def is_lost(self) -> bool:
        return self.lease.is_lost

    async def renew(self, seconds: float | None = None) -> None:
        """Extend the lease to ``seconds`` from now (default: its current length)."""
        await self.lease.renew(seconds)

    async def complete(self, result: dict[str, Any] | None = None) -> None:
        """SUCCEEDED; ``result={"payload": ...}``'s payload becomes the recorded outcome."""
        if result is None:
            outcome = None
        elif isinstance(result, dict) and set(result) <= {"payload"}:
            outcome = result.get("payload")
        else:
            got = sorted(result) if isinstance(result, dict) else type(result).__name__
            raise InvalidArgumentError(
                f'complete() takes result={{"payload": ...}} (or nothing); got {got}'
            )
        await self._settle(Op.DELIVERY_COMPLETE, {"outcome": outcome})

    async def retry(self, *, delay_ms: int | None = None, reason: str | None = None) -> None:
        """Back on the queue with backoff (or after ``delay_ms``); FAILED at the limit."""
        await self._settle(Op.DELIVERY_RETRY, {"delay_ms": delay_ms, "reason": reason})

    async def reject(self, reason: str | None = None) -> None:
        """Dead-letter it without retry; the task becomes FAILED."""
        await self._settle(Op.DELIVERY_REJECT, {"reason": reason})

    async def requeue(self) -> None:
        """Give it back untouched, for another worker, without using an attempt."""
        await self._settle(Op.DELIVERY_RELEASE, {})

    def abandon(self) -> None:
        """Stop renewing the lease and settle nothing: it expires and the task is
        redelivered (attempt + 1). For a worker that cannot reach the server to settle."""
        self.settled = True
        self._auto_renew = False
        self.lease._keeper.forget(self.lease)

    async def _settle(self, op: int, args: dict[str, Any]) -> None:
        if self.settled:
            return
        self.settled = True
        lease = self.lease
        lease._keeper.forget(lease)
        try:
            reply = await self._client._conn.request(op, {"lease": lease.id, **args})
        except LeaseLostError as exc:
            lease._mark_lost(f"the server refused the settlement: {exc.message}")
            raise
        except RunstateError:
            # Refused (bad argument) or unanswered: nothing was decided, the delivery is
            # still ours and the caller may settle it again.
            self.settled = False
            if self._auto_renew and not lease.is_lost:
                lease._keeper.track(lease)
            raise
        self.state = reply.get("state")
        lease._released = True
