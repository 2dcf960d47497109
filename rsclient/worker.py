"""The worker loop behind ``Mailbox.consume()``.

What always holds, per delivery: its lease is renewed while the handler runs; if the
lease is lost the handler is cancelled (a plain function's thread is abandoned) and the
delivery is left to its new owner; a handler that returns completes the delivery
(unless it settled it itself); one that raises goes to ``on_error`` and the delivery is
retried with backoff. Idle slots park on the server (no polling). On stop: no new work,
running handlers get ``shutdown_timeout`` seconds, whatever is still running is handed
back to the queue. A cancelled run ends consume() quietly; authentication,
configuration and not-found errors are raised; anything else is retried with backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .deliveries import IDLE_WAIT_MS, Delivery, receive
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
from .runner import is_coroutine_function, run_while_held
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
    ) -> None:
        self.session = session
        self.mailbox = mailbox
        self.handler = handler
        self.concurrency = concurrency
        self.lease_seconds = lease_seconds
        self.on_error = on_error
        self.handler_is_coroutine = is_coroutine_function(handler)
        self.stopping = False
        self.receiving: set[asyncio.Task[Any]] = set()  # slots parked in receive
        self.running: dict[asyncio.Task[Any], Delivery] = {}  # slots running a handler
        self.idle = asyncio.Event()  # set while no handler runs
        self.idle.set()
        self.failure: BaseException | None = None
        self.done = asyncio.Event()

    async def run(self, stop_event: asyncio.Event, shutdown_timeout: float) -> None:
        """Run the consumer slots until ``stop_event`` is set or the work is done,
        then give running handlers up to ``shutdown_timeout`` seconds to settle."""
        slots = [asyncio.ensure_future(self._slot()) for _ in range(self.concurrency)]
        stopper = asyncio.ensure_future(stop_event.wait())
        finished = asyncio.ensure_future(self.done.wait())
        try:
            await asyncio.wait({stopper, finished}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            finished.cancel()
            await self._shutdown(slots, shutdown_timeout)
        if self.failure is not None:
            raise self.failure

    async def _shutdown(self, slots: list[asyncio.Task[Any]], timeout: float) -> None:
        self.stopping = True
        for task in list(self.receiving):
            task.cancel()
        if self.running:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), timeout)
        unfinished = list(self.running.values())
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

    async def _slot(self) -> None:
        backoff = Backoff(0.1, 5.0)
        mailbox = self.mailbox
        while not self.stopping:
            task = asyncio.current_task()
            assert task is not None
            self.receiving.add(task)
            try:
                delivery = await receive(
                    self.session, mailbox.scope_id, mailbox.name, self.lease_seconds, True,
                    IDLE_WAIT_MS, auto_renew=True,
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
            finally:
                self.receiving.discard(task)
            backoff.reset()
            if delivery is None:
                continue
            if self.stopping:
                await _give_back(delivery)
                return
            await self._handle(delivery)

    async def _handle(self, delivery: Delivery) -> None:
        """Run the handler and settle the delivery; counts as running until settled."""
        slot = asyncio.current_task()
        assert slot is not None
        self.running[slot] = delivery
        self.idle.clear()
        try:
            try:
                await run_while_held(
                    self.handler, (delivery.data, delivery), delivery.lease,
                    self.handler_is_coroutine,
                )
            except LeaseLostError:
                log.warning("consume on %s: lost the lease on %s; left to its new owner",
                            self.mailbox, delivery, extra=_extra(delivery))
                return
            except asyncio.CancelledError as exc:
                if slot.cancelling():
                    if self.stopping:
                        return  # shutdown requeues it
                    raise
                # The handler itself raised CancelledError (it awaited something that
                # was cancelled elsewhere): a failure of this delivery, not of the slot.
                await self._failed(exc, delivery)
                return
            except Exception as exc:
                await self._failed(exc, delivery)
                return
            if not delivery.settled:
                await self._settle(delivery, delivery.complete)
        finally:
            self.running.pop(slot, None)
            if not self.running:
                self.idle.set()

    async def _settle(self, delivery: Delivery, settle: Callable[[], Any]) -> None:
        """Settle, retrying through connection trouble for as long as the lease is ours
        (the keeper keeps renewing it meanwhile, and declares it lost if it cannot)."""
        backoff: Backoff | None = None  # made on the first failure: most settle at once
        while True:
            try:
                await settle()
                return
            except LeaseLostError:
                log.warning("consume on %s: settling %s refused, the lease had been lost",
                            self.mailbox, delivery)
                return
            except ScopeCancelledError:
                log.info("consume on %s: the run was cancelled; %s ended with it",
                         self.mailbox, delivery)
                delivery.abandon()
                self._stop()  # nothing more to consume in a cancelled run
                return
            except UnavailableError as exc:
                if delivery.is_lost or self.session.closed:
                    return
                log.warning("consume on %s: could not settle %s, retrying: %s",
                            self.mailbox, delivery, exc)
                if backoff is None:
                    backoff = Backoff(0.05, 2.0)
                await backoff.sleep()
            except RunstateError as exc:  # refused for good (a bad argument): say so, stop
                log.error("consume on %s: settling %s refused: %s", self.mailbox, delivery, exc)
                delivery.abandon()
                return

    async def _failed(self, exc: BaseException, delivery: Delivery) -> None:
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
            await self._settle(delivery, lambda: delivery.retry(reason=reason))


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
