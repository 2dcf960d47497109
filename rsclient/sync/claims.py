"""Sync claims and leases: ``with run.claim(k).acquire() as lease:``, ``claim.run(fn)``.

A thin layer over ``rsclient.claims`` and ``rsclient.leases``: every rule (acquire,
renewal, loss, release) is the async client's, run on the client's loop thread, and every
method that only mirrors an async one is derived from it (``_derive.py``).

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
from ..views import Busy
from ..wire import Limits
from ._derive import Attribute, Handle, attribute, blocking, direct
from ._portal import Portal

__all__ = ["Claim", "Lease"]

T = TypeVar("T")


class Lease(Handle[aleases.Lease]):
    """A held lease, for sync code. ``token()`` is its fencing token."""

    def __init__(self, portal: Portal, lease: aleases.Lease) -> None:
        super().__init__(portal, lease)
        self._lost_event: threading.Event | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return repr(self._async).replace("<Lease", "<sync Lease", 1)

    @property
    def key(self) -> str:
        """The claim's key (for a delivery's lease: the delivery id)."""
        return self._async.key

    @property
    def scope(self) -> str:
        """The run the lease belongs to."""
        return self._async.scope

    @property
    def generation(self) -> int:
        """Grows with each new owner of the key: compare with ``<`` (the manual: "Concepts")."""
        return self._async.generation

    @property
    def lease_seconds(self) -> float:
        """The lease's length in seconds."""
        return self._async.lease_seconds

    @property
    def lost_reason(self) -> str | None:
        """Why the lease was lost, or None."""
        return self._async.lost_reason

    @property
    def release_on_disconnect(self) -> bool:
        """Whether the lease ends with the connection it was granted on."""
        return self._async.release_on_disconnect

    token = direct(aleases.Lease.token)
    is_lost: Attribute[bool] = attribute(aleases.Lease.is_lost)
    raise_if_lost = direct(aleases.Lease.raise_if_lost)
    renew = blocking(aleases.Lease.renew)
    release = blocking(aleases.Lease.release)

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
        _ = self._async.lost_event  # arms the deadline timer on the loop
        self._async.add_loss_callback(event.set)

    def _release_quietly(self) -> None:
        self._portal.call(self._async.release_quietly())

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


class Claim(Handle[aclaims.Claim]):
    """Exclusive ownership of a key inside a run, for sync code."""

    def __init__(self, portal: Portal, claim: aclaims.Claim) -> None:
        super().__init__(portal, claim)
        self._held = threading.local()

    def __repr__(self) -> str:
        return f"<sync Claim {self._async.scope}/{self._async.key}>"

    @property
    def key(self) -> str:
        """The claimed key."""
        return self._async.key

    acquire = blocking(aclaims.Claim.acquire, Lease, note="""
        ``with claim.acquire(wait=True) as lease:`` releases at the end of the block.""")
    inspect = blocking(aclaims.Claim.inspect)

    def try_acquire(self) -> Busy | Acquired:
        """``{"kind": "busy", "holder": ...}`` or ``{"kind": "acquired", "lease": lease}``."""
        attempt = self._portal.call(self._async.try_acquire())
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
