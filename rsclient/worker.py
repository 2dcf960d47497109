"""The worker loop behind ``Mailbox.consume()``.

What always holds, per delivery: its lease is renewed while the handler runs; if the
lease is lost the handler is cancelled (a plain function's thread is abandoned) and the
delivery is left to its new owner; a handler that returns completes the delivery
(unless it settled it itself); one that raises goes to ``on_error`` and the delivery is
retried with backoff. Idle slots park on the server (no polling). On stop: no new work,
running handlers get ``shutdown_timeout`` seconds, whatever is still running is handed
back to the queue. A cancelled run ends consume() quietly; authentication,
configuration and not-found errors are raised; anything else is retried with backoff.

Round trips: never more than ``concurrency`` deliveries are held at once. One receiver
fills every free slot with one batched RECEIVE (``max`` = the free slots, parked while
none is ready); a slot whose handler is done settles with ``take_next=1``, so a busy
queue costs one request per task, and goes back to the receiver only when that found
nothing. Deliveries that arrive after stop was asked are handed back at once.

Tasks: a slot is a task that lives across deliveries. One that found no next delivery
parks (a future in ``parked``) and the receiver hands it the next one it gets, so a
delivery costs no task of its own; never more than ``concurrency`` slots exist. (So
the handlers one slot runs share its task, and its context variables.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .deliveries import IDLE_WAIT_MS, Delivery, receive_many
from .errors import (
    AuthenticationError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    RunstateError,
    ScopeCancelledError,
    UnavailableError,
)
from .retry import Backoff
from .runner import in_task, is_coroutine_function, run_while_held
from .wire import Limits

if TYPE_CHECKING:
    from .mailboxes import Mailbox
    from .session import Session

__all__ = ["Worker"]

log = logging.getLogger("rsclient")

_FATAL = (AuthenticationError, InvalidArgumentError, NotFoundError)


class Worker:
    """The state of one consume() call: its slots and their running handlers."""

    def __init__(
        self,
        session: Session,
        mailbox: Mailbox,
        handler: Callable[[Any, Delivery], Any],
        concurrency: int,
        lease_seconds: float,
        on_error: Callable[[BaseException, Delivery], Any] | None,
        release_on_disconnect: bool = False,
    ) -> None:
        self.session = session
        self.spans = session.spans  # OpenTelemetry's, or None (tracing.py)
        self.release_on_disconnect = release_on_disconnect
        self.mailbox = mailbox
        self.handler = handler
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.on_error = on_error
        self.handler_is_coroutine = is_coroutine_function(handler)
        self.stopping = False
        self.slots: set[asyncio.Task[Any]] = set()  # one task per held delivery or parked
        self.parked: list[asyncio.Future[Delivery | None]] = []  # slots waiting for work
        self.running: dict[asyncio.Task[Any], Delivery] = {}  # slots running a handler
        self.idle = asyncio.Event()  # set while no handler runs
        self.idle.set()
        self.slot_freed = asyncio.Event()  # a slot ended: the receiver may take more
        self.receiver_waits = False  # the receiver waits on ``slot_freed`` (all slots busy)
        self.failure: BaseException | None = None
        self.done = asyncio.Event()

    async def run(self, stop_event: asyncio.Event, shutdown_timeout: float) -> None:
        """Fill the consumer's slots until ``stop_event`` is set or the work is done,
        then give running handlers up to ``shutdown_timeout`` seconds to settle."""
        receiver = asyncio.ensure_future(self._receiver())
        stopper = asyncio.ensure_future(stop_event.wait())
        finished = asyncio.ensure_future(self.done.wait())
        try:
            await asyncio.wait({stopper, finished}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            finished.cancel()
            await self._shutdown(receiver, shutdown_timeout)
        if self.failure is not None:
            raise self.failure

    async def _shutdown(self, receiver: asyncio.Task[Any], timeout: float) -> None:
        self.stopping = True
        receiver.cancel()
        await asyncio.gather(receiver, return_exceptions=True)
        parked, self.parked = self.parked, []
        for waiter in parked:  # nothing more comes: parked slots end
            if not waiter.done():
                waiter.set_result(None)
        if self.running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), timeout)
        unfinished = list(self.running.values())
        slots = list(self.slots)
        for slot in slots:
            slot.cancel()
        await asyncio.gather(*slots, return_exceptions=True)
        for delivery in unfinished:
            await _give_back(delivery)

    def _stop(self, failure: BaseException | None = None) -> None:
        if failure is not None and self.failure is None:
            self.failure = failure
        self.stopping = True
        self.done.set()

    async def _receiver(self) -> None:
        """Fill the free slots, all of them in one RECEIVE, parked while none is ready."""
        backoff = Backoff(0.1, 5.0)
        mailbox = self.mailbox
        while not self.stopping:
            free = self.concurrency - len(self.slots) + len(self.parked)
            if free <= 0:
                self.slot_freed.clear()
                self.receiver_waits = True
                try:
                    await self.slot_freed.wait()
                finally:
                    self.receiver_waits = False
                continue
            try:
                deliveries = await receive_many(
                    self.session, mailbox.scope_id, mailbox.name, self.lease_seconds, True,
                    IDLE_WAIT_MS, min(free, Limits.MAX_RECEIVE_BATCH), auto_renew=True,
                    release_on_disconnect=self.release_on_disconnect,
                )
            except ScopeCancelledError:
                self._stop()
                return
            except _FATAL as exc:
                self._stop(exc)
                return
            except RunstateError as exc:
                if self.session.closed:
                    self._stop()  # the client was closed: nothing more to consume
                    return
                log.warning("consume on %s: receive failed, retrying: %s", mailbox, exc)
                await backoff.sleep()
                continue
            backoff.reset()
            for delivery in deliveries:
                self._start_slot(delivery)

    def _start_slot(self, delivery: Delivery) -> None:
        parked = self.parked
        while parked:  # a parked slot takes it: no new task
            waiter = parked.pop()
            if not waiter.done():
                waiter.set_result(delivery)
                return
        slot = asyncio.ensure_future(self._slot(delivery))
        self.slots.add(slot)
        slot.add_done_callback(self._slot_ended)

    def _free_slot(self) -> None:
        """A slot ended or parked: wake the receiver if it waits for one (an
        ``Event.set`` per delivery otherwise, for nobody)."""
        if self.receiver_waits:
            self.receiver_waits = False  # woken once: the other slots need not
            self.slot_freed.set()

    def _slot_ended(self, slot: asyncio.Task[Any]) -> None:
        self.slots.discard(slot)
        self._free_slot()
        if not slot.cancelled() and slot.exception() is not None:
            log.error("consume on %s: a slot failed", self.mailbox, exc_info=slot.exception())

    async def _slot(self, delivery: Delivery | None) -> None:
        """Handle ``delivery``, then each next one its settlement brought; with none,
        park until the receiver hands one over (None: the consumer stops)."""
        slot = asyncio.current_task()
        assert slot is not None
        loop = slot.get_loop()
        while delivery is not None:
            while delivery is not None:
                if self.stopping:
                    await _give_back(delivery)
                    return
                if self.spans is None:
                    delivery = await self._handle(delivery, slot)
                else:  # in a ``handle`` span, the submitter's its parent (tracing.py)
                    delivery = await self.spans.handled(
                        delivery, functools.partial(self._handle, delivery, slot))
            if self.stopping:
                return
            waiter: asyncio.Future[Delivery | None] = loop.create_future()
            self.parked.append(waiter)
            if self.receiver_waits:  # (``_free_slot`` inlined: once per delivery)
                self.receiver_waits = False  # woken once: the other slots need not
                self.slot_freed.set()
            try:
                delivery = await waiter
            except asyncio.CancelledError:
                if waiter in self.parked:
                    self.parked.remove(waiter)
                elif waiter.done() and not waiter.cancelled():
                    handed = waiter.result()  # handed over just before the cancellation
                    if handed is not None:
                        await _give_back(handed)
                raise

    async def _handle(self, delivery: Delivery, slot: asyncio.Task[Any]) -> Delivery | None:
        """Run the handler and settle the delivery in ``slot`` (the current task);
        counts as running until settled. The next delivery of the queue, if the
        settlement brought one."""
        running = self.running
        if not running:  # (already clear while any handler runs: no call per delivery)
            self.idle.clear()
        running[slot] = delivery
        try:
            try:
                if self.handler_is_coroutine:  # ``run_in_task``, awaited here: a coroutine less
                    held = in_task(slot, delivery.lease)
                    try:
                        result = await self.handler(delivery.data, delivery)
                        while result is not None and inspect.isawaitable(result):
                            result = await result
                    except BaseException as exc:
                        held.failed(exc)
                        raise
                    held.done()
                else:
                    await run_while_held(
                        self.handler, (delivery.data, delivery), delivery.lease, False, slot
                    )
            except LeaseLostError:
                log.warning("consume on %s: lost the lease on %s; left to its new owner",
                            self.mailbox, delivery, extra=_extra(delivery))
                return None
            except asyncio.CancelledError as exc:
                if slot.cancelling():
                    if self.stopping:
                        return None  # shutdown requeues it
                    raise
                # The handler itself raised CancelledError (it awaited something that
                # was cancelled elsewhere): a failure of this delivery, not of the slot.
                return await self._failed(exc, delivery)
            except Exception as exc:
                return await self._failed(exc, delivery)
            if not delivery.settled:
                return await self._settle(
                    delivery, functools.partial(self._complete_taking_next, delivery)
                )
            return None
        finally:
            self.running.pop(slot, None)
            if not self.running:
                self.idle.set()

    def _complete_taking_next(self, delivery: Delivery) -> Awaitable[list[Delivery]]:
        """``delivery.complete()`` taking the slot's next delivery (``_take_next``, read
        at each try): a method, not a closure made in ``_handle`` (its names would be
        cells made at every delivery)."""
        return delivery.complete(take_next=self._take_next())

    def _take_next(self) -> int:
        """How many next deliveries a settlement asks for: this slot's one, unless
        stopping."""
        return 0 if self.stopping else 1

    async def _settle(
        self, delivery: Delivery, settle: Callable[[], Any]
    ) -> Delivery | None:
        """Settle, retrying through connection trouble for as long as the lease is ours
        (the keeper keeps renewing it meanwhile, and declares it lost if it cannot).
        The next delivery the settlement brought, if any (more are handed to slots)."""
        backoff: Backoff | None = None  # made on the first failure: most settle at once
        while True:
            try:
                got = await settle()
                if not got:
                    return None
                for extra in got[1:]:  # only if asked for more: each gets its own slot
                    self._start_slot(extra)
                first: Delivery = got[0]
                return first
            except LeaseLostError:
                log.warning("consume on %s: settling %s refused, the lease had been lost",
                            self.mailbox, delivery)
                return None
            except ScopeCancelledError:
                log.info("consume on %s: the run was cancelled; %s ended with it",
                         self.mailbox, delivery)
                delivery.abandon()
                self._stop()  # nothing more to consume in a cancelled run
                return None
            except UnavailableError as exc:
                if delivery.is_lost or self.session.closed:
                    return None
                log.warning("consume on %s: could not settle %s, retrying: %s",
                            self.mailbox, delivery, exc)
                if backoff is None:
                    backoff = Backoff(0.05, 2.0)
                await backoff.sleep()
            except RunstateError as exc:  # refused for good (a bad argument): say so, stop
                log.error("consume on %s: settling %s refused: %s", self.mailbox, delivery, exc)
                delivery.abandon()
                return None

    async def _failed(self, exc: BaseException, delivery: Delivery) -> Delivery | None:
        if self.on_error is not None:
            try:
                outcome = self.on_error(exc, delivery)
                if inspect.isawaitable(outcome):
                    await outcome
            except Exception:
                log.exception("consume on %s: on_error raised", self.mailbox)
        else:
            log.warning("consume on %s: handler failed on %s: %r", self.mailbox, delivery, exc)
        if not delivery.settled:
            reason = _clip(f"{type(exc).__name__}: {exc}", Limits.MAX_REASON_BYTES)
            return await self._settle(
                delivery, lambda: delivery.retry(reason=reason, take_next=self._take_next())
            )
        return None


async def _give_back(delivery: Delivery) -> None:
    """Hand a delivery back for another worker; if even that fails (the server is
    away), stop renewing it so that its lease expires and the task is redelivered."""
    try:
        await delivery.requeue()
    except RunstateError:
        delivery.abandon()


def _extra(delivery: Delivery) -> dict[str, Any]:
    """The structured fields of a log record about ``delivery`` (logging's ``extra``)."""
    return {
        "scope": delivery.scope_id, "mailbox": delivery.mailbox, "task_id": delivery.task_id,
        "key": delivery.key, "generation": delivery.attempt,
    }


def _clip(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, never inside a character."""
    return text.encode(errors="replace")[:max_bytes].decode(errors="ignore")
