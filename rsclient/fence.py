"""``rs.fence``: ask the server whether a fencing token is still its key's current grant.

Keep the token (``lease.token()``) or the generation (``lease.generation``) with every
write to an external store, and let the store refuse a write whose generation is older
than the one it holds (examples/fencing_sqlite.py, examples/fencing_files.py). Where the
store cannot compare, ask here: ``await rs.fence.check(run, key, token)`` is True while
that token's lease is the key's live grant. It turns False for good the moment the
server ends that lease: released, expired without renewal (the server's timer at its
deadline), or its run cancelled; a later generation is only granted after that.
"""

from __future__ import annotations

from typing import Protocol, TypedDict

from .errors import InvalidArgumentError
from .session import Session
from .wire import LEASE_HANDLE_BYTES, Op

__all__ = ["Fence", "FenceStatus", "Run"]


class Run(Protocol):
    """A run handle, async or sync (``rs.scopes.create()``): all a fence asks is its id."""

    @property
    def id(self) -> str:
        """The run's id."""
        ...


class FenceStatus(TypedDict):
    """The FENCE_CHECK reply: whether the token is current, and the key's generation."""

    current: bool
    generation: int


def token_bytes(token: str | bytes) -> bytes:
    """The lease handle a token names: ``lease.token()`` (hex) or the handle itself."""
    if isinstance(token, str):
        try:
            token = bytes.fromhex(token)
        except ValueError:
            raise InvalidArgumentError(
                "token must be lease.token(), the hex of a lease handle"
            ) from None
    if not isinstance(token, bytes) or len(token) != LEASE_HANDLE_BYTES:
        raise InvalidArgumentError(
            f"token must be lease.token() (the hex of a {LEASE_HANDLE_BYTES}-byte lease handle)"
        )
    return token


class Fence:
    """``rs.fence``: fencing checks (one round trip each; nothing changes)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    async def status(self, scope: Run | str, key: str, token: str | bytes) -> FenceStatus:
        """``{"current": bool, "generation": int}`` for ``token`` on ``key`` in run
        ``scope`` (a Scope or its id). A run never created is NotFoundError."""
        scope_id = scope if isinstance(scope, str) else scope.id
        reply: FenceStatus = await self._session.call(
            Op.FENCE_CHECK, {"scope": scope_id, "key": key, "token": token_bytes(token)}
        )
        return reply

    async def check(self, scope: Run | str, key: str, token: str | bytes) -> bool:
        """True while ``token`` is the current grant of ``key`` in run ``scope``; False
        once it is stale (see the module docstring for exactly when)."""
        return (await self.status(scope, key, token))["current"]
