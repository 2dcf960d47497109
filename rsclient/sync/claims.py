"""Sync claims and leases: ``with run.claim(k).acquire() as lease:``, ``claim.run(fn)``.

A thin layer over ``rsclient.claims`` and ``rsclient.leases``: every rule (acquire,
renewal, loss, release) is the async client's, run on the client's loop thread.

What always holds: a lease is renewed in the background while the caller's thread works;
a plain thread cannot be interrupted, so a lost lease is never silent but never stops the
thread either: ``is_lost`` and ``raise_if_lost()`` read the clock when asked,
``lost_event`` (a ``threading.Event``) is set the moment it is lost, and ``run()`` and the
``with`` block raise LeaseLostError when the function or block ends with the lease lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import TracebackType
from typing import Literal, TypedDict, TypeVar

from .. import claims as aclaims
from .. import leases as aleases
from ..views import Busy, ClaimView
from ..wire import Limits
from ._portal import Portal

__all__ = ["Claim", "Lease"]

T = TypeVar("T")


class Lease:
    """A held lease, for sync code. ``token()`` is its fencing token."""

    def __init__(self, portal: Portal, lease: aleases.Lease) -> None:
        self._portal = portal
        self._lease = lease
        self._lost_event: threading.Event | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return repr(self._lease).replace("<Lease", "<sync Lease", 1)

    @property
    def key(self) -> str:
        """The claim's key (for a delivery's lease: the delivery id)."""
        return self._lease.key

    @property
    def scope(self) -> str:
        """The run the lease belongs to."""
        return self._lease.scope

    @property
    def generation(self) -> int:
        """Grows with each new owner of the key: compare with ``<`` (see the README)."""
        return self._lease.generation

    @property
    def lease_seconds(self) -> float:
        """The lease's length in seconds."""
        return self._lease.lease_seconds

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, or None."""
        return self._lease.lost_reason

    def token(self) -> str:
        """The fencing token: opaque, unique per grant; store it with your writes."""
        return self._lease.token()

    @property
    def is_lost(self) -> bool:
        """Whether the lease is lost, read from the clock now."""
        return self._lease.is_lost

    @property
    def lost_event(self) -> threading.Event:
        """A ``threading.Event`` set the moment the lease is lost (by the server's word
        or its own deadline, even if nobody looks)."""
        with self._lock:
            if self._lost_event is None:
                event = threading.Event()
                self._portal.run_sync(lambda: self._watch(event))
                self._lost_event = event
            return self._lost_event

    def _watch(self, event: threading.Event) -> None:
        _ = self._lease.lost_event  # arms the deadline timer on the loop
        self._lease.add_loss_callback(event.set)

    def raise_if_lost(self) -> None:
        """Raise LeaseLostError if the lease is lost."""
        self._lease.raise_if_lost()

    def renew(self, lease_seconds: float | None = None) -> None:
        """Renew now (optionally with a new length) instead of waiting for the keeper."""
        self._portal.call(self._lease.renew(lease_seconds))

    def release(self) -> None:
        """End the lease; idempotent. LeaseLostError if it had been lost."""
        self._portal.call(self._lease.release())

    def _release_quietly(self) -> None:
        self._portal.call(self._lease.release_quietly())

    def __enter__(self) -> Lease:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.is_lost:
            self._release_quietly()
            if exc_type is None:
                self.raise_if_lost()  # the block ended, but the lease did not last
            return
        self.release()


class Acquired(TypedDict):
    """``try_acquire()`` when the key was free: the sync lease is yours to release."""

    kind: Literal["acquired"]
    lease: Lease


class Claim:
    """Exclusive ownership of a key inside a run, for sync code."""

    def __init__(self, portal: Portal, claim: aclaims.Claim) -> None:
        self._portal = portal
        self._claim = claim
        self._held = threading.local()

    def __repr__(self) -> str:
        return f"<sync Claim {self._claim.scope}/{self._claim.key}>"

    @property
    def key(self) -> str:
        """The claimed key."""
        return self._claim.key

    def acquire(
        self, *, wait: bool = False, timeout_ms: int = Limits.DEFAULT_WAIT_TIMEOUT_MS
    ) -> Lease:
        """The lease: ConflictError (CLAIM_HELD) if held and not waiting,
        WaitTimeoutError if the wait runs out. ``with claim.acquire(wait=True) as lease:``."""
        return Lease(self._portal, self._portal.call(
            self._claim.acquire(wait=wait, timeout_ms=timeout_ms)
        ))

    def try_acquire(self) -> Busy | Acquired:
        """``{"kind": "busy", "holder": ...}`` or ``{"kind": "acquired", "lease": lease}``."""
        attempt = self._portal.call(self._claim.try_acquire())
        if attempt["kind"] == "acquired":
            return {"kind": "acquired", "lease": Lease(self._portal, attempt["lease"])}
        return attempt

    def run(
        self,
        fn: Callable[[Lease], T],
        *,
        wait: bool = False,
        timeout_ms: int = Limits.DEFAULT_WAIT_TIMEOUT_MS,
    ) -> T:
        """Acquire, run ``fn(lease)`` in this thread while the lease is renewed, release.
        A thread cannot be interrupted: if the lease was lost meanwhile, ``run()``
        raises LeaseLostError when ``fn`` returns (check ``lease.is_lost`` to stop early)."""
        lease = self.acquire(wait=wait, timeout_ms=timeout_ms)
        try:
            result = fn(lease)
        except BaseException:
            if lease.is_lost:
                lease._release_quietly()
            else:
                lease.release()
            raise
        lease.release()  # raises LeaseLostError if the lease turned out lost
        return result

    def inspect(self) -> ClaimView:
        """The claim as the server sees it: held, generation, holder, waiters."""
        return self._portal.call(self._claim.inspect())

    def __enter__(self) -> Lease:
        lease = self.acquire(wait=False)
        self._held.lease = lease
        return lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease: Lease = self._held.lease
        del self._held.lease
        lease.__exit__(exc_type, exc, tb)

