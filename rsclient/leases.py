"""Leases held by this client, and the keeper that renews them all in batches.

What always holds:
- a lease is renewed at about a third of its length; every lease due within a sixth of
  its length of the earliest one rides in the same LEASE_RENEW request, so a thousand
  leases cost one frame per renewal round, not a thousand;
- a lease is *lost* the moment the keeper can no longer prove it live: the server says
  STALE_CLAIM or pushes LEASE_LOST, or ``lease_seconds`` have passed since the send time
  of the last renewal the server confirmed. Loss is final: the SDK never re-acquires;
- a loss is never silent: ``is_lost``, ``lost_event``, the loss callbacks and a WARNING
  on the ``rsclient`` logger, all at once;
- ``release()`` is idempotent and shielded from cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import inspect
import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import LeaseLostError, RunstateError
from .wire import ErrorCode, Limits, Op, Push

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["Lease", "LeaseKeeper", "is_coroutine_function", "run_while_held"]

log = logging.getLogger("rsclient")

_RETRY_AFTER_FAILURE = 0.25  # seconds between renewal attempts while the server is away


class Lease:
    """A held lease on a claim. ``token()`` is its fencing token."""

    __slots__ = (
        "__weakref__", "_event", "_keeper", "_on_lost", "_release_fut", "_release_op",
        "_released",
        "_task", "_version", "_we_cancelled", "generation", "id", "key", "lease_seconds",
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
        self._version = 0
        self.lost_at = confirmed_at + lease_seconds
        self.renew_at = confirmed_at + lease_seconds / 3

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
        loop = asyncio.get_running_loop()
        gave_up = False

        def give_up() -> None:
            nonlocal gave_up
            if not fut.done():
                gave_up = True
                fut.cancel()

        timer = loop.call_at(max(self.lost_at, loop.time() + 0.5), give_up)
        try:
            # A release that had to reconnect first runs in its own task: shield it, so
            # that cancelling the caller cannot stop it on its way to the server.
            await (asyncio.shield(fut) if isinstance(fut, asyncio.Task) else fut)
        except RunstateError:
            pass
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if not gave_up or (task is not None and task.cancelling()):
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

    def _mark_lost(self, reason: str) -> None:
        if self.is_lost or self._released:
            return
        self.lost_reason = reason
        if self._event is not None:
            self._event.set()
        self._keeper.forget(self)
        log.warning(
            "lease on %r in scope %r (generation %d, token %s) lost: %s",
            self.key, self.scope, self.generation, self.token(), reason,
        )
        callbacks, self._on_lost = self._on_lost, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("lease loss callback failed")

    def _confirmed(self, sent_at: float) -> None:
        self.lost_at = sent_at + self.lease_seconds
        self.renew_at = sent_at + self.lease_seconds / 3

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
            self._mark_lost(f"the server refused the release: {exc.message}")
        else:
            # The server is away; the lease ends by expiry. Nothing else can be done.
            if not self.is_lost:
                log.warning("could not release lease on %r: %s", self.key, exc)
                self._released = True

    async def release_quietly(self) -> None:
        """Release and ignore a loss: for cleanup after a loss was already reported."""
        with contextlib.suppress(LeaseLostError):
            await self.release()


class LeaseKeeper:
    """Renews every live lease of one client in batches; declares losses.

    Deadlines sit in a heap of ``(when, seq, lease, version)``; an entry whose version
    is not the lease's current one is stale and skipped, so rescheduling is a push and
    tracking a lease is O(log n).
    """

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._leases: dict[int, Lease] = {}
        self._heap: list[tuple[float, int, Lease, int]] = []
        self._seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._in_flight: set[int] = set()
        self._renewals: set[asyncio.Task[None]] = set()
        conn.on_push(Push.LEASE_LOST, self._on_lost_push)
        self._known: weakref.WeakValueDictionary[int, Lease] = weakref.WeakValueDictionary()

    def __len__(self) -> int:
        return len(self._leases)

    def track(self, lease: Lease) -> None:
        self._leases[lease.id] = lease
        self._schedule(lease)

    def forget(self, lease: Lease) -> None:
        self._leases.pop(lease.id, None)

    def leases(self) -> list[Lease]:
        return list(self._leases.values())

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = None

    async def renew_now(self, leases: list[Lease], lease_seconds: float | None) -> None:
        limit = self._batch_limit()
        for start in range(0, len(leases), limit):
            part = leases[start : start + limit]
            sent_at = asyncio.get_running_loop().time()
            items: list[Any] = [
                lease.id if lease_seconds is None else [lease.id, lease_seconds]
                for lease in part
            ]
            reply = await self.conn.request(Op.LEASE_RENEW, {"leases": items})
            self._settle(part, reply, sent_at, lease_seconds)

    # ---- internals -------------------------------------------------------------------

    def _schedule(self, lease: Lease) -> None:
        """(Re)arm the lease's next deadline: renewal, or loss while a renewal is out."""
        if lease.id not in self._leases:
            return
        when = lease.lost_at if lease.id in self._in_flight else min(
            lease.renew_at, lease.lost_at
        )
        lease._version += 1
        self._seq += 1
        heapq.heappush(self._heap, (when, self._seq, lease, lease._version))
        if self._timer_at is None or when < self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
            self._timer_at = when
            self._timer = asyncio.get_running_loop().call_at(when, self._due)

    def know(self, lease: Lease) -> None:
        """Hear about ``lease``'s loss even if it is not renewed here (a received delivery)."""
        self._known[lease.id] = lease

    def _on_lost_push(self, body: dict[str, Any]) -> None:
        lease_id = body.get("lease", -1)
        lease = self._leases.get(lease_id) or self._known.get(lease_id)
        if lease is not None:
            lease._mark_lost(f"the server ended it ({body.get('reason', 'expired')})")

    def _settle(
        self,
        leases: list[Lease],
        reply: dict[str, Any],
        sent_at: float,
        lease_seconds: float | None,
    ) -> None:
        for lease, outcome in zip(leases, reply["results"], strict=True):
            if outcome is None:
                if lease_seconds is not None:
                    lease.lease_seconds = lease_seconds
                lease._confirmed(sent_at)
                self._schedule(lease)
            elif outcome == ErrorCode.STALE_CLAIM:
                lease._mark_lost("the server no longer knows it (STALE_CLAIM)")
            else:  # an outcome this client does not know: try again soon, until its deadline
                lease.renew_at = min(sent_at + _RETRY_AFTER_FAILURE, lease.lost_at)
                self._schedule(lease)

    def _due(self) -> None:
        self._timer = None
        self._timer_at = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        heap = self._heap
        leases = self._leases
        batch: list[Lease] = []
        watch: list[Lease] = []
        while heap:
            when, _, lease, version = heap[0]
            if version != lease._version or lease.id not in leases:
                heapq.heappop(heap)
                continue
            if when > now + lease.lease_seconds / 6:
                break
            heapq.heappop(heap)
            if lease.lost_at <= now:
                lease._mark_lost(
                    f"no renewal was confirmed within its {lease.lease_seconds:g} s lease"
                )
            elif lease.id in self._in_flight:
                watch.append(lease)  # not yet answered: watch for its loss deadline
            else:
                batch.append(lease)
        if batch:
            self._in_flight.update(lease.id for lease in batch)
            renewal = loop.create_task(self._renew_batch(batch, now))
            self._renewals.add(renewal)  # the loop keeps only a weak reference
            renewal.add_done_callback(self._renewals.discard)
        for lease in batch + watch:
            self._schedule(lease)  # in flight now: armed at its loss deadline
        self._rearm()

    def _rearm(self) -> None:
        """Make the one timer fire at the earliest live deadline in the heap."""
        heap = self._heap
        while heap and (heap[0][3] != heap[0][2]._version or heap[0][2].id not in self._leases):
            heapq.heappop(heap)
        if not heap:
            return
        when = heap[0][0]
        if self._timer_at is not None and self._timer_at <= when:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = asyncio.get_running_loop().call_at(when, self._due)

    def _batch_limit(self) -> int:
        limits = self.conn.server_info.get("limits") or {}
        return int(limits.get("max_renew_batch", Limits.MAX_RENEW_BATCH))

    async def _renew_batch(self, batch: list[Lease], sent_at: float) -> None:
        limit = self._batch_limit()
        if len(batch) > limit:  # the server takes so many per request: split the round
            await asyncio.gather(*(
                self._renew_batch(batch[i : i + limit], sent_at)
                for i in range(0, len(batch), limit)
            ))
            return
        try:
            reply = await self.conn.request(
                Op.LEASE_RENEW, {"leases": [lease.id for lease in batch]}
            )
        except RunstateError as exc:
            # Not reachable right now: try again soon, until each lease's deadline.
            retry_at = asyncio.get_running_loop().time() + _RETRY_AFTER_FAILURE
            self._in_flight.difference_update(lease.id for lease in batch)
            log.info("lease renewal failed, retrying: %s", exc)
            for lease in batch:
                lease.renew_at = min(retry_at, lease.lost_at)
                self._schedule(lease)
            return
        self._in_flight.difference_update(lease.id for lease in batch)
        self._settle(batch, reply, sent_at, None)


def is_coroutine_function(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )


async def run_while_held(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    lease: Lease,
    is_coroutine: bool | None = None,
) -> Any:
    """Run ``fn(*args)`` while ``lease`` is held; if it is lost, stop it and raise.

    A coroutine function is cancelled on loss. A plain function runs in a worker thread,
    which cannot be interrupted: we stop waiting for it. Either way LeaseLostError is
    raised, also when the function finished but the lease was lost meanwhile. A
    cancellation of the caller itself propagates as CancelledError.
    """
    if is_coroutine is None:
        is_coroutine = is_coroutine_function(fn)
    if is_coroutine:
        running: asyncio.Future[Any] = asyncio.ensure_future(fn(*args))
    else:
        running = asyncio.ensure_future(asyncio.to_thread(fn, *args))

    def stop() -> None:
        running.cancel()  # whatever runs now: the function, or the awaitable it returned

    lease.add_loss_callback(stop)
    current = asyncio.current_task()
    try:
        result = await running
        if inspect.isawaitable(result):  # `lambda lease: work(lease)`: the work is this
            running = asyncio.ensure_future(result)
            if lease.is_lost:
                running.cancel()
            result = await running
    except asyncio.CancelledError:
        if lease.is_lost and (current is None or not current.cancelling()):
            lease.raise_if_lost()
        raise
    finally:
        lease.remove_loss_callback(stop)
    lease.raise_if_lost()
    return result
