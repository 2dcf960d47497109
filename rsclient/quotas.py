"""Quotas: ``rs.quotas`` defines token buckets, ``run.quota(name).take()`` spends one.

``await rs.quotas.ensure(name, limit=N, per_seconds=S)``: a budget of N that refills
continuously at N per S seconds (burst N); its level survives server restarts.
``await run.quota(name).take(amount=1, wait=True, timeout_ms=30_000)`` takes from it.
Waiting is done by the server, strictly first in first out (a large amount is not
starved by small ones behind it) and answered by a push, never by polling; the wait
outlasts a reconnect for the time left. Running out of time raises WaitTimeoutError;
without waiting, a budget that cannot cover the amount raises ConflictError with code
QUOTA_EXHAUSTED; an amount above the limit raises InvalidArgumentError. Quota is spent
once taken: a take whose caller was cancelled after the grant is not refunded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from .errors import UnavailableError, WaitTimeoutError
from .retry import wait_across_reconnects
from .wire import Limits, Op

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Quota", "Quotas"]


class Quotas:
    """``rs.quotas``: defining and inspecting token-bucket quotas."""
    def __init__(self, session: Session) -> None:
        self._session = session

    async def ensure(self, name: str, *, limit: int, per_seconds: float) -> dict[str, Any]:
        """Create the quota, or bring it to these settings (the level is kept, capped at
        the new limit). Idempotent."""
        return cast("dict[str, Any]", await self._session.call(
            Op.QUOTA_ENSURE, {"name": name, "limit": limit, "per_seconds": per_seconds}
        ))

    async def inspect(self, name: str) -> dict[str, Any]:
        """``{"name", "limit", "per_seconds", "level", "waiters", "head_amount"}``."""
        return cast("dict[str, Any]", await self._session.call(Op.QUOTA_INSPECT, {"name": name}))


class Quota:
    """A quota as used by one run. Making one does no I/O."""

    def __init__(self, session: Session, scope: str, name: str) -> None:
        self._session = session
        self.scope = scope
        self.name = name

    def __repr__(self) -> str:
        return f"<Quota {self.name} in {self.scope}>"

    async def take(
        self,
        amount: int = 1,
        *,
        wait: bool = True,
        timeout_ms: int = Limits.DEFAULT_WAIT_TIMEOUT_MS,
    ) -> dict[str, Any]:
        """Take ``amount``: ``{"taken", "level", "waited_ms"}`` (the level left after)."""
        args: dict[str, Any] = {
            "scope": self.scope, "quota": self.name, "amount": amount, "wait": wait,
            "timeout_ms": timeout_ms,
        }
        if not wait:
            try:
                return cast("dict[str, Any]", await self._session.request(Op.QUOTA_TAKE, args))
            except UnavailableError as exc:  # sent again only if not executed (NOT_PRIMARY)
                return cast("dict[str, Any]", await self._session.again(exc, Op.QUOTA_TAKE, args))
        reply, _ = await wait_across_reconnects(
            self._session, Op.QUOTA_TAKE, args, timeout_ms,
            time_up=lambda: WaitTimeoutError(
                f"quota {self.name!r} did not give {amount} within {timeout_ms} ms"
            ),
        )
        return cast("dict[str, Any]", reply)

    async def inspect(self) -> dict[str, Any]:
        """The quota as the server sees it (see ``Quotas.inspect``)."""
        reply = await self._session.call(
            Op.QUOTA_INSPECT, {"name": self.name}
        )
        return cast("dict[str, Any]", reply)
