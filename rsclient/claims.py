"""Claims: ``run.claim(key)`` and the ways to hold it.

- ``await claim.run(fn, wait=False, timeout_ms=30_000)``: acquire, keep the lease
  renewed while ``fn(lease)`` runs, release when it returns or raises. If the lease is
  lost, a coroutine function is cancelled and ``run()`` raises LeaseLostError; a plain
  function runs in a worker thread, which cannot be interrupted: ``run()`` stops
  waiting for it and raises.
- ``await claim.try_acquire()`` -> ``{"kind": "busy", ...}`` or
  ``{"kind": "acquired", "lease": lease}``; the caller releases.
- ``await claim.acquire(wait=..., timeout_ms=...)`` -> Lease, and
  ``async with claim as lease:`` (no waiting) / ``async with await claim.acquire(...)``.

``run.claim(key, release_on_disconnect=True)``: each grant ends the moment the
connection it came on closes (a killed holder's key goes to its waiter at once), and the
lease is lost here the moment that connection drops (``LeaseKeeper.bind``); by default
a lease outlives its connection and is renewed from the next one.

Waiting is done by the server: the acquire request stays pending in a FIFO per key and
its reply arrives the moment the key is ours. Cancelling a pending acquire cancels it
on the server too; a grant that raced the cancellation is released, never leaked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from .errors import ConflictError, UnavailableError, WaitTimeoutError, checked_bool
from .leases import Lease
from .retry import wait_across_reconnects
from .runner import run_while_held
from .views import Busy, ClaimView, TryAcquire
from .wire import Limits, Op

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Claim"]


class Claim:
    """A key in a run, to be held exclusively under a lease (no I/O until used)."""
    # What a subclass over another kind of lease (a pool slot) changes: its two ops,
    # the field that names what is acquired, and what "busy" says.
    _ACQUIRE_OP = Op.CLAIM_ACQUIRE
    _RELEASE_OP = Op.CLAIM_RELEASE

    def __init__(
        self, session: Session, scope: str, key: str,
        lease_seconds: float = Limits.DEFAULT_LEASE_SECONDS,
        *, release_on_disconnect: bool = False,
    ) -> None:
        self._session = session
        self.scope = scope
        self.key = key
        self.lease_seconds = lease_seconds
        self.release_on_disconnect = checked_bool(release_on_disconnect)
        self._held: Lease | None = None  # for `async with claim`

    def __repr__(self) -> str:
        return f"<Claim {self.scope}/{self.key}>"

    async def acquire(
        self, *, wait: bool = False, timeout_ms: int = Limits.DEFAULT_WAIT_TIMEOUT_MS
    ) -> Lease:
        """Acquire the claim; ConflictError(CLAIM_HELD) or WaitTimeoutError if we cannot.

        If the caller is cancelled meanwhile, nothing is left held: a pending wait is
        withdrawn, and a grant that arrives anyway is released."""
        args = self._target()
        args["lease_seconds"] = self.lease_seconds
        args["wait"] = wait
        args["timeout_ms"] = timeout_ms
        if self.release_on_disconnect:
            args["release_on_disconnect"] = True
        session = self._session
        # The connection the grant comes on (read again at each send).
        link = self._granting().link

        def on_send() -> None:
            nonlocal link
            link = self._granting().link
        if not wait:
            sent_at = asyncio.get_running_loop().time()
            try:
                reply = await session.request_cancellable(
                    self._ACQUIRE_OP, args, withdraw=False, give_back=self._release_orphan
                )
            except UnavailableError as exc:
                # Sent again only if not executed (NOT_PRIMARY, MOVED); dated from the
                # first send, which is earlier: safe (``failover.py``).
                def again() -> Any:
                    on_send()
                    return session.request_cancellable(
                        self._ACQUIRE_OP, args, withdraw=False, give_back=self._release_orphan
                    )
                reply = await session.again(exc, self._ACQUIRE_OP, args, again)
            return self._lease(reply, sent_at, link)
        reply, sent_at = await wait_across_reconnects(
            self._session, self._ACQUIRE_OP, args, timeout_ms,
            give_back=self._release_orphan,
            time_up=lambda: WaitTimeoutError(
                f"{self._what()} was not granted within {timeout_ms} ms"
            ),
            on_send=on_send,
        )
        return self._lease(reply, sent_at, link)

    def _granting(self) -> Session:
        """The session of the shard that grants (and keeps) this lease: the run's, for a
        claim (a pool's is its name's: pools.py)."""
        return self._session.for_run(self.scope)

    def _release_orphan(self, reply: dict[str, Any]) -> None:
        """A grant arrived after its acquire was cancelled: give the key back (on the
        connection it came on: ``_granting``)."""
        self._granting().send_nowait(
            self._RELEASE_OP, {"lease": reply["lease"]}
        )

    def _lease(self, reply: dict[str, Any], sent_at: float, link: int) -> Lease:
        keeper = self._granting().keeper  # renewed where it was granted
        # The grant happened no sooner than send time + time spent in line: a safe date.
        sent_at += reply.get("waited_ms", 0) / 1000.0
        lease = Lease(
            keeper,
            reply["lease"],
            scope=self.scope,
            key=self.key,
            generation=reply["generation"],
            lease_seconds=reply["lease_seconds"],
            confirmed_at=sent_at,
            release_op=self._RELEASE_OP,
            release_on_disconnect=self.release_on_disconnect,
        )
        keeper.track(lease)
        if self.release_on_disconnect:
            keeper.bind(lease, link)
        return lease

    async def inspect(self) -> ClaimView:
        """The claim as the server sees it: held, generation, holder, waiters."""
        return cast("ClaimView", await self._session.call(
            Op.CLAIM_INSPECT, {"scope": self.scope, "key": self.key}
        ))

    async def try_acquire(self) -> TryAcquire:
        """``{"kind": "busy", "holder": ...}`` or ``{"kind": "acquired", "lease": lease}``."""
        try:
            lease = await self.acquire(wait=False)
        except ConflictError as exc:
            return self._busy(exc)
        return {"kind": "acquired", "lease": lease}

    def _target(self) -> dict[str, Any]:
        """The request's first fields: the run and what is acquired (a new dict)."""
        return {"scope": self.scope, "key": self.key}

    def _what(self) -> str:
        return f"claim {self.key!r}"

    def _busy(self, exc: ConflictError) -> Busy:
        return {"kind": "busy", "holder": exc.details.get("holder")}

    async def run(
        self,
        fn: Callable[[Lease], Any],
        *,
        wait: bool = False,
        timeout_ms: int = Limits.DEFAULT_WAIT_TIMEOUT_MS,
    ) -> Any:
        """Acquire, run ``fn(lease)`` while the lease is renewed, release; its result.

        If the lease is lost meanwhile, ``fn`` is cancelled and LeaseLostError raised."""
        lease = await self.acquire(wait=wait, timeout_ms=timeout_ms)
        try:
            result = await run_while_held(fn, (lease,), lease)
        except BaseException:
            if lease.is_lost:
                await lease.release_quietly()
            else:
                await lease.release()
            raise
        await lease.release()  # raises LeaseLostError if the lease turned out lost
        return result

    async def __aenter__(self) -> Lease:
        lease = await self.acquire(wait=False)
        self._held = lease
        return await lease.__aenter__()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        lease, self._held = self._held, None
        assert lease is not None
        return await lease.__aexit__(exc_type, exc, tb)
