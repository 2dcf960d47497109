"""Leases: ``Lease``, a held grant on a claim or a delivery, and what may happen to one.

What always holds:
- a lease is *lost* the moment this client can no longer prove it live (the keeper, in
  ``keeper.py``, decides when). Loss is final: the SDK never re-acquires;
- a loss is never silent: ``is_lost``, ``lost_event``, the loss callbacks and a WARNING
  on the ``rsclient`` logger, all at once, through ``declare_lost`` alone;
- a confirmed renewal moves the loss deadline to ``lease_seconds`` after the send time
  of the renewal, and the next renewal to a third of that (``confirm_renewal``);
- ``release()`` is idempotent and shielded from cancellation.

The SDK's other modules change a lease only through ``declare_lost``,
``confirm_renewal`` and ``mark_released``, and read only its public attributes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import LeaseLostError, RunstateError
from .retry import gave_up, give_up_after
from .wire import Op

if TYPE_CHECKING:
    from .keeper import LeaseKeeper

__all__ = ["Lease", "confirm_renewal", "declare_lost", "mark_released"]

log = logging.getLogger("rsclient")


class Lease:
    """A held lease on a claim. ``token()`` is its fencing token."""

    __slots__ = (
        "__weakref__", "_event", "_keeper", "_on_lost", "_release_fut", "_release_op",
        "_released", "_task", "_we_cancelled", "generation", "id", "key", "lease_seconds",
        "lost_at", "lost_reason", "renew_at", "scope",
    )

    def __init__(
        self,
        keeper: LeaseKeeper,
        lease_id: int,
        *,
        scope: str,
        key: str,
        generation: int,
        lease_seconds: float,
        confirmed_at: float,
        release_op: int = Op.CLAIM_RELEASE,
    ) -> None:
        self._keeper = keeper
        self.id = lease_id
        self.scope = scope
        self.key = key
        self.generation = generation
        self.lease_seconds = lease_seconds
        self.lost_reason: str | None = None
        self._event: asyncio.Event | None = None  # made on first use: most leases never need it
        self._release_op = release_op
        self._released = False
        self._release_fut: asyncio.Future[Any] | None = None
        self._on_lost: list[Callable[[], None]] = []
        self._task: asyncio.Task[Any] | None = None  # the task an `async with` block runs in
        self._we_cancelled = False
        confirm_renewal(self, confirmed_at)  # sets lost_at and renew_at

    def __repr__(self) -> str:
        state = "lost" if self.is_lost else "released" if self._released else "held"
        return (
            f"<Lease {self.scope}/{self.key} generation={self.generation} "
            f"token={self.token()} {state}>"
        )

    # ---- the guide's API -------------------------------------------------------------

    def token(self) -> str:
        """The fencing token: opaque, unique per grant; compare it for equality only."""
        return str(self.id)

    @property
    def is_lost(self) -> bool:
        return self.lost_reason is not None

    @property
    def lost_event(self) -> asyncio.Event:
        """Set the moment the lease is lost (an ``asyncio.Event``)."""
        if self._event is None:
            self._event = asyncio.Event()
            if self.is_lost:
                self._event.set()
        return self._event

    @property
    def released(self) -> bool:
        return self._released

    def raise_if_lost(self) -> None:
        if self.lost_reason is not None:
            raise LeaseLostError(
                f"lease on {self.key!r} (generation {self.generation}) was lost: "
                f"{self.lost_reason}",
            )

    async def release(self) -> None:
        """End the lease. Idempotent, and done even if the caller is cancelled.

        The release request is queued before the first ``await``, so a cancellation
        cannot stop it from reaching the server. Raises LeaseLostError if the lease had
        been lost: the caller's work may have overlapped another owner's, and that must
        not pass unnoticed. A lost lease's release is sent but not waited for (the
        server may be unreachable: that may be why it was lost). An unanswered release
        is waited for only until the lease would have expired anyway.
        """
        fut = self._release_fut
        if fut is None:
            fut = self._release_fut = self._begin_release()
            if not fut.done() and not self.is_lost:
                await self._await_release(fut)
        elif not fut.done() and not self.is_lost:
            try:
                await asyncio.shield(fut)  # a second caller: the first one owns ``fut``
            except RunstateError:
                pass
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise  # this caller was cancelled; not just the first one's wait
        self.raise_if_lost()

    async def _await_release(self, fut: asyncio.Future[Any]) -> None:
        """Wait for the release's answer, but not past the moment the lease would have
        expired anyway (an unresponsive server): then it ends by expiry."""
        timer = give_up_after(fut, max(self.lost_at - fut.get_loop().time(), 0.5))
        try:
            # A release that had to reconnect first runs in its own task: shield it, so
            # that cancelling the caller cannot stop it on its way to the server.
            await (asyncio.shield(fut) if isinstance(fut, asyncio.Task) else fut)
        except RunstateError:
            pass
        except asyncio.CancelledError:
            if not gave_up(fut):
                raise
            log.warning("release of lease on %r unanswered; it ends by expiry", self.key)
        finally:
            timer.cancel()

    async def renew(self, lease_seconds: float | None = None) -> None:
        """Renew now (optionally with a new length) instead of waiting for the keeper."""
        self.raise_if_lost()
        if self._released:
            raise LeaseLostError(
                f"lease on {self.key!r} (generation {self.generation}) was released"
            )
        await self._keeper.renew_now([self], lease_seconds)
        self.raise_if_lost()

    # ---- async with ------------------------------------------------------------------

    async def __aenter__(self) -> Lease:
        self._task = asyncio.current_task()
        self.add_loss_callback(self._cancel_block)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        self.remove_loss_callback(self._cancel_block)
        task, self._task = self._task, None
        if self._we_cancelled and task is not None:
            self._we_cancelled = False
            if task.uncancel() == 0 and (exc_type is None or exc_type is asyncio.CancelledError):
                await self.release_quietly()
                self.raise_if_lost()
        if self.is_lost:
            await self.release_quietly()
            if exc_type is None:
                self.raise_if_lost()
            return False
        await self.release()
        return False

    def _cancel_block(self) -> None:
        if self._task is not None and not self._task.done():
            self._we_cancelled = True
            self._task.cancel(f"lease on {self.key!r} was lost")

    # ---- loss ------------------------------------------------------------------------

    def add_loss_callback(self, callback: Callable[[], None]) -> None:
        if self.is_lost:
            callback()
        else:
            self._on_lost.append(callback)

    def remove_loss_callback(self, callback: Callable[[], None]) -> None:
        if callback in self._on_lost:
            self._on_lost.remove(callback)

    def _begin_release(self) -> asyncio.Future[Any]:
        self._keeper.forget(self)
        conn = self._keeper.conn
        args = {"lease": self.id}
        fut = conn.send_nowait(self._release_op, args)
        if fut is None:  # not connected: connect first, in a task no cancellation stops
            fut = asyncio.ensure_future(conn.request(self._release_op, args))
        fut.add_done_callback(self._release_answered)
        return fut

    def _release_answered(self, fut: asyncio.Future[Any]) -> None:
        if fut.cancelled():
            # Only the awaiting caller was cancelled; the request had been sent.
            self._released = not self.is_lost
            return
        exc = fut.exception()
        if exc is None:
            self._released = not self.is_lost
        elif isinstance(exc, LeaseLostError):
            declare_lost(self, f"the server refused the release: {exc.message}")
        else:
            # The server is away; the lease ends by expiry. Nothing else can be done.
            if not self.is_lost:
                log.warning("could not release lease on %r: %s", self.key, exc)
                self._released = True

    async def release_quietly(self) -> None:
        """Release and ignore a loss: for cleanup after a loss was already reported."""
        with contextlib.suppress(LeaseLostError):
            await self.release()


def declare_lost(lease: Lease, reason: str) -> None:
    """Declare ``lease`` lost, once: flag, event, callbacks, WARNING. A released lease
    cannot be lost any more."""
    if lease.lost_reason is not None or lease._released:
        return
    lease.lost_reason = reason
    if lease._event is not None:
        lease._event.set()
    lease._keeper.forget(lease)
    log.warning(
        "lease on %r in scope %r (generation %d, token %s) lost: %s",
        lease.key, lease.scope, lease.generation, lease.token(), reason,
    )
    callbacks, lease._on_lost = lease._on_lost, []
    for callback in callbacks:
        try:
            callback()
        except Exception:
            log.exception("lease loss callback failed")


def confirm_renewal(lease: Lease, sent_at: float) -> None:
    """The server confirmed a grant or renewal of ``lease`` sent at ``sent_at``."""
    lease.lost_at = sent_at + lease.lease_seconds
    lease.renew_at = sent_at + lease.lease_seconds / 3


def mark_released(lease: Lease) -> None:
    """``lease`` ended without a loss (its delivery was settled): nothing to release."""
    lease._released = True
