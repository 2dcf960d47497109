"""Leases: ``Lease``, a held grant on a claim or a delivery, and what may happen to one.

What always holds:
- a lease is *lost* the moment this client can no longer prove it live: the server said
  so (the keeper, in ``keeper.py``, hears it), or its own deadline passed. Loss is final:
  the SDK never re-acquires;
- the deadline is the send time of the last request whose reply confirmed the lease,
  plus ``lease_seconds``, minus a safety margin (``loss_margin``: max(1 s, 10 %); it
  and the renewal's third are ``rsproto.sdkrules``', which both SDKs follow). The
  server's expiry can come no sooner: it counts from when it handled that request;
- ``is_lost``, ``raise_if_lost()``, ``lost_event`` and the loss callbacks read the loop's
  clock when asked: past the deadline the lease is lost then and there, whether or not a
  timer has fired (a loop blocked past the lease runs no timer until it is unblocked);
- a loss is never silent: ``is_lost``, ``lost_event``, the loss callbacks and a WARNING
  on the ``rsclient`` logger, all at once, through ``declare_lost`` alone;
- a confirmed renewal moves the deadline (``confirm_renewal``), and the next renewal to
  a third of the lease after the renewal's send time;
- ``release()`` is idempotent and shielded from cancellation.
- a lease granted with ``release_on_disconnect`` is lost the moment the connection it
  was granted on ends (the keeper hears it, ``keeper.py``): the server ends it then;
- a lease whose run moved to another shard follows it: the old shard answers its
  renewal or its release MOVED, and the lease is kept by the keeper of the run's new
  shard from then on (``rebind``); it is not lost.

The SDK's other modules change a lease only through ``declare_lost``,
``confirm_renewal``, ``mark_released``, ``hold_here``, ``unhold``, ``unhold_here`` and
``rebind``, and
read only its public attributes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rsproto.sdkrules import RENEWAL_DIVISOR, loss_margin

from .connection import Moved
from .errors import LeaseLostError, RunstateError, UnavailableError
from .failover import follow_moved
from .retry import gave_up
from .wire import Op

if TYPE_CHECKING:
    from .keeper import LeaseKeeper

__all__ = [
    "Lease", "confirm_renewal", "declare_lost", "hold_here", "kept_by", "loss_margin",
    "mark_released", "raise_if_lost_here", "rebind", "unhold", "unhold_here",
]

log = logging.getLogger("rsclient")


# The running loop of this thread, or None: asyncio's own C accessor, which neither
# raises nor allocates (``is_lost`` asks it on every look at a lease).
_running_loop = asyncio._get_running_loop


class Lease:
    """A held lease on a claim. ``token()`` is its fencing token (the hex of its handle).

    ``handle`` is the server's lease handle, kept as the server gave it and sent back
    as-is: it is opaque (protocol.md, "Leases") and it is the lease's only capability.
    """

    __slots__ = (
        "__weakref__", "_event", "_keeper", "_loop", "_on_lost", "_release_fut",
        "_release_op", "_released", "_task", "_watch", "_we_cancelled", "generation", "handle",
        "key", "lease_seconds", "lost_at", "lost_reason", "release_on_disconnect", "renew_at",
        "scope",
    )
    # Set by ``confirm_renewal`` (in ``__init__`` and on every renewal the server
    # confirms): the client's own deadline for the lease, and when to renew it.
    lost_at: float
    renew_at: float

    def __init__(
        self,
        keeper: LeaseKeeper,
        handle: bytes,
        *,
        scope: str,
        key: str,
        generation: int,
        lease_seconds: float,
        confirmed_at: float,
        release_op: int = Op.CLAIM_RELEASE,
        release_on_disconnect: bool = False,
    ) -> None:
        self._keeper = keeper
        # Granted to end with its connection: lost the moment that connection ends.
        self.release_on_disconnect = release_on_disconnect
        self._loop = asyncio.get_running_loop()
        self._watch: asyncio.TimerHandle | None = None  # the deadline timer of lost_event
        self.handle = handle
        self.scope = scope
        self.key = key
        self.generation = generation
        self.lease_seconds = lease_seconds
        self.lost_reason: str | None = None
        self._event: asyncio.Event | None = None  # made on first use: most leases never need it
        self._release_op = release_op
        self._released = False
        self._release_fut: asyncio.Future[Any] | None = None
        # The loss callbacks: None, the one callback (a delivery's: its runner's), or a
        # list of them in the order given; a list only for a second one (an object the
        # collector tracks, for every delivery in flight, made for few).
        self._on_lost: Callable[[], None] | list[Callable[[], None]] | None = None
        self._task: asyncio.Task[Any] | None = None  # the task an `async with` block runs in
        self._we_cancelled = False
        # ``confirm_renewal(self, confirmed_at)``, inlined (a call less per grant)
        self.lost_at = confirmed_at + lease_seconds - loss_margin(lease_seconds)
        self.renew_at = confirmed_at + lease_seconds / RENEWAL_DIVISOR

    def __repr__(self) -> str:
        # Reading the clock here, not declaring: a repr has no side effects.
        lost = self.lost_reason is not None or (
            not self._released and time.monotonic() >= self.lost_at
        )
        state = "lost" if lost else "released" if self._released else "held"
        return (
            f"<Lease {self.scope}/{self.key} generation={self.generation} "
            f"token={self.token()} {state}>"
        )

    # ---- the guide's API -------------------------------------------------------------

    def token(self) -> str:
        """The fencing token: opaque, unique per grant; compare it for equality only.
        The hex of the lease handle, so it is also unguessable: store it with your
        writes, never in logs others read."""
        return self.handle.hex()

    @property
    def is_lost(self) -> bool:
        """Whether the lease is lost, by the server's word or by its own deadline, read
        from the clock now (see ``loss_margin``)."""
        return self.lost_reason is not None or self._past_deadline()

    @property
    def lost_event(self) -> asyncio.Event:
        """Set the moment the lease is lost (an ``asyncio.Event``): on the server's word,
        by a timer at the lease's deadline, or by any access after the deadline."""
        if self._event is None:
            self._event = asyncio.Event()
            if self.is_lost:
                self._event.set()
            elif not self._released:
                self._call_on_loop(self._arm_watch)
        else:
            self._past_deadline()  # declares (and so sets the event) if the time is up
        return self._event

    @property
    def released(self) -> bool:
        """Whether ``release()`` was called on this lease."""
        return self._released

    def raise_if_lost(self) -> None:
        """Raise LeaseLostError if the lease is lost (``is_lost``), checked on the clock."""
        if self.is_lost:
            raise LeaseLostError(
                f"lease on {self.key!r} (generation {self.generation}) was lost: "
                f"{self.lost_reason or self._deadline_reason()}",
            )

    # ---- the lease's own clock ---------------------------------------------------------

    def _lost_here(self) -> bool:
        """``is_lost`` for a caller known to run on the lease's loop (its own coroutines):
        the same answer, without asking which thread this is."""
        if self.lost_reason is not None:
            return True
        if self._released or self._loop.time() < self.lost_at:
            return False
        declare_lost(self, self._deadline_reason())
        return True

    def _past_deadline(self) -> bool:
        """Whether the deadline has passed (for a lease neither lost nor released). On the
        loop's thread the loss is declared at once; from another thread (a plain function
        that ``run()`` runs in a worker thread) the same monotonic clock is read and the
        declaration is handed to the loop, which alone may set events and cancel tasks."""
        if self._released or self.lost_reason is not None:
            return False
        loop = self._loop
        if _running_loop() is loop:
            if loop.time() < self.lost_at:
                return False
            declare_lost(self, self._deadline_reason())
            return True
        if time.monotonic() < self.lost_at:
            return False
        # (a partial, not a lambda: a lambda here would make ``self`` a cell at every
        # call, on the loop's thread too, where ``is_lost`` is read per delivery)
        self._call_on_loop(functools.partial(declare_lost, self, self._deadline_reason()))
        return True

    def _deadline_reason(self) -> str:
        return (
            f"no renewal was confirmed within its {self.lease_seconds:g} s lease "
            f"(less a {loss_margin(self.lease_seconds):g} s safety margin)"
        )

    def _call_on_loop(self, callback: Callable[[], None]) -> None:
        if _running_loop() is self._loop:
            callback()
        else:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to tell
                self._loop.call_soon_threadsafe(callback)

    def _arm_watch(self) -> None:
        """Wake at the deadline to set ``lost_event`` even if nothing else looks: one
        timer per lease whose event was asked for, moved on by each renewal it sees."""
        self._watch = None
        if self._released or self.lost_reason is not None or self._past_deadline():
            return
        self._watch = self._loop.call_at(self.lost_at, self._arm_watch)

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
            if self._lost_here():  # sent, not waited for: its answer goes to the callback
                self._release_fut = self._begin_release(self._release_answered)
            else:  # waited for here, which reads the answer: no callback needed
                fut = self._release_fut = self._begin_release(None)
                await self._await_release(fut)
            if self.lost_reason is None:  # answered (or given up): lost only by word
                return
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

    async def _await_release(self, fut: asyncio.Future[Any], follow: bool = True) -> None:
        """Wait for the release's answer, but not past the moment the lease would have
        expired anyway (an unresponsive server): then it ends by expiry. Answered MOVED
        (the lease left that shard with its run), it is sent to the run's shard
        (``_release_moved``) and that answer decides."""
        give_ups = self._keeper.give_ups
        slot = give_ups.watch(fut, max(self.lost_at, self._loop.time() + 0.5))
        try:
            # A release that had to reconnect first runs in its own task: shield it, so
            # that cancelling the caller cannot stop it on its way to the server.
            await (asyncio.shield(fut) if isinstance(fut, asyncio.Task) else fut)
        except RunstateError:
            pass
        except asyncio.CancelledError:
            if not fut.done():  # the caller left; the answer still decides, later
                fut.add_done_callback(self._release_answered)
            elif not gave_up(fut):
                self._release_answered(fut)
                raise
            else:
                log.warning("release of lease on %r unanswered; it ends by expiry", self.key)
                self._release_answered(fut)
                return
            raise
        finally:
            give_ups.unwatch(fut, slot)
        if follow and not fut.cancelled() and isinstance(fut.exception(), Moved):
            moved = fut.exception()
            assert isinstance(moved, Moved)
            fut = self._release_fut = asyncio.ensure_future(self._release_moved(moved))
            await self._await_release(fut, follow=False)
            return
        self._release_answered(fut)

    async def _release_moved(self, moved: Moved) -> Any:
        """The release was answered ``moved``: the lease lives on its run's new shard.
        Sent again there (the map asked for again first), the lease kept by that shard's
        keeper from then on, at most ``MAX_REDIRECTS`` MOVED answers in a row
        (``failover.follow_moved``, the rule of every request answered MOVED); its answer."""
        redirects = 0
        while True:
            redirects += 1
            try:
                await follow_moved(moved.answered_by, moved, redirects)
            except Moved as exc:  # a client that keeps no map: it cannot follow
                raise UnavailableError(exc.message, exc.code, exc.details) from None
            shards = self._keeper.conn.shards
            assert shards is not None  # (follow_moved raised for a client without one)
            rebind(self, shards.session_for(self.scope).keeper)
            try:
                return await self._keeper.conn.request(self._release_op, {"lease": self.handle})
            except Moved as exc:
                moved = exc

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
        """Call ``callback()`` when the lease is lost (at once if it already is)."""
        if self.is_lost:
            callback()
        else:
            _add_on_lost(self, callback)

    def remove_loss_callback(self, callback: Callable[[], None]) -> None:
        """Forget a callback given to ``add_loss_callback`` (if still there)."""
        unhold(self, callback)

    def _begin_release(
        self, on_done: Callable[[asyncio.Future[Any]], None] | None
    ) -> asyncio.Future[Any]:
        """Send the release; ``on_done`` (``_release_answered``, which also reads any
        error in the answer) is its one callback, or None if the caller awaits the
        answer and hands it to ``_release_answered`` itself."""
        self._keeper.forget(self)
        if self._watch is not None:
            _stop_watch(self)
        conn = self._keeper.conn
        args = {"lease": self.handle}
        fut = conn.send_nowait(self._release_op, args, on_done)
        if fut is None:  # not connected: connect first, in a task no cancellation stops
            fut = asyncio.ensure_future(conn.request(self._release_op, args))
            if on_done is not None:
                fut.add_done_callback(on_done)
        return fut

    def _release_answered(self, fut: asyncio.Future[Any]) -> None:
        # The server's answer decides here, not the clock: a release it accepted ended a
        # lease that was still live on the server, so no other owner can have overlapped.
        if fut.cancelled():
            # Only the awaiting caller was cancelled; the request had been sent.
            self._released = self.lost_reason is None
            return
        exc = fut.exception()
        if exc is None:
            self._released = self.lost_reason is None
        elif isinstance(exc, LeaseLostError):
            declare_lost(self, f"the server refused the release: {exc.message}")
        else:
            # The server is away; the lease ends by expiry. Nothing else can be done.
            if self.lost_reason is None:
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
    _stop_watch(lease)
    lease._keeper.forget(lease)
    log.warning(
        "lease on %r in scope %r (generation %d, token %s) lost: %s",
        lease.key, lease.scope, lease.generation, lease.token(), reason,
        extra={"scope": lease.scope, "key": lease.key, "generation": lease.generation},
    )
    on_lost, lease._on_lost = lease._on_lost, None
    if on_lost is None:
        return
    for callback in on_lost if isinstance(on_lost, list) else (on_lost,):
        try:
            callback()
        except Exception:
            log.exception("lease loss callback failed")


def raise_if_lost_here(lease: Lease) -> None:
    """``lease.raise_if_lost()`` for a caller on the lease's own loop (the runner, a few
    times per delivery): the same answer and error, without asking which thread runs."""
    if lease.lost_reason is None and (lease._released or lease._loop.time() < lease.lost_at):
        return  # held: ``_lost_here``'s first answer, without its call
    if lease._lost_here():
        lease.raise_if_lost()


def hold_here(lease: Lease, callback: Callable[[], None]) -> None:
    """On the lease's own loop: raise LeaseLostError if ``lease`` is lost already, else
    call ``callback()`` when it is (``raise_if_lost`` then ``add_loss_callback``, with
    one look at the clock)."""
    if lease.lost_reason is not None or not (
        lease._released or lease._loop.time() < lease.lost_at
    ):  # lost, or past its deadline (declared there): no call while it is held
        raise_if_lost_here(lease)
    if lease._on_lost is None:  # (``_add_on_lost``'s common case, inlined)
        lease._on_lost = callback
    else:
        _add_on_lost(lease, callback)


def _add_on_lost(lease: Lease, callback: Callable[[], None]) -> None:
    """Add a loss callback to ``lease``: the one callback, or the second (the list)."""
    on_lost = lease._on_lost
    if on_lost is None:
        lease._on_lost = callback
    elif isinstance(on_lost, list):
        on_lost.append(callback)
    else:
        lease._on_lost = [on_lost, callback]


def unhold(lease: Lease, callback: Callable[[], None]) -> None:
    """Forget a callback given to ``hold_here`` or ``add_loss_callback`` (if still there:
    the one callback, or in the list, the last one added, the common case, without a
    search; an equal one, as ``list.remove`` finds it, else)."""
    on_lost = lease._on_lost
    if on_lost is callback:
        lease._on_lost = None
    elif isinstance(on_lost, list):
        if on_lost and on_lost[-1] is callback:
            on_lost.pop()
        elif callback in on_lost:
            on_lost.remove(callback)
    elif on_lost is not None and on_lost == callback:  # (an equal bound method, say)
        lease._on_lost = None


def unhold_here(lease: Lease, callback: Callable[[], None]) -> None:
    """``unhold(lease, callback)`` then ``raise_if_lost_here(lease)``, in one call: a
    runner's end, once per delivery (its one callback, the common case, inlined)."""
    if lease._on_lost is callback:
        lease._on_lost = None
    else:
        unhold(lease, callback)
    if lease.lost_reason is None and (lease._released or lease._loop.time() < lease.lost_at):
        return  # held
    if lease._lost_here():
        lease.raise_if_lost()


def confirm_renewal(lease: Lease, sent_at: float) -> None:
    """The server confirmed a grant or renewal of ``lease`` sent at ``sent_at`` (loop
    time): the lease is ours until ``sent_at + lease_seconds - loss_margin``. A deadline
    already past (the reply was read late) makes the next look at the lease a loss."""
    seconds = lease.lease_seconds
    lease.lost_at = sent_at + seconds - loss_margin(seconds)
    lease.renew_at = sent_at + seconds / RENEWAL_DIVISOR


def rebind(lease: Lease, keeper: LeaseKeeper) -> None:
    """``lease``'s run moved to ``keeper``'s shard (its old shard answered MOVED): the
    lease is kept by ``keeper`` from now on, renewed there if it was renewed, told of
    its loss there and released there."""
    old = lease._keeper
    if old is keeper:
        return
    renewed = old.renews(lease)
    old.forget(lease)
    lease._keeper = keeper
    if renewed:
        keeper.track(lease)
    else:
        keeper.know(lease)


def kept_by(lease: Lease) -> LeaseKeeper:
    """The keeper that keeps ``lease`` now (the one of its run's shard: ``rebind``)."""
    return lease._keeper


def mark_released(lease: Lease) -> None:
    """``lease`` ended without a loss (its delivery was settled): nothing to release."""
    lease._released = True
    if lease._watch is not None:  # (``_stop_watch``, once per delivery: no call when unarmed)
        _stop_watch(lease)


def _stop_watch(lease: Lease) -> None:
    if lease._watch is not None:
        lease._watch.cancel()
        lease._watch = None
