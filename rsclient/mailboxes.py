"""Mailboxes (work queues) and the worker loop, ``consume()``.

``rs.mailboxes.ensure(name, ...)`` defines a queue once for every run;
``run.mailbox(name)`` addresses it inside one run: ``submit`` shared tasks, ``send``
plain messages, ``receive`` one delivery, or ``consume`` with a handler.

consume() guarantees, per delivery: its lease is renewed while the handler runs; if the
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
import datetime as dt
import inspect
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .deliveries import Delivery
from .errors import (
    AuthenticationError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    RunstateError,
    ScopeCancelledError,
    UnavailableError,
    WaitTimeoutError,
)
from .leases import is_coroutine_function, run_while_held
from .tasks import Ticket
from .wire import Limits, Op

if TYPE_CHECKING:
    from .client import AsyncRunstate

__all__ = ["Mailbox", "Mailboxes"]

log = logging.getLogger("rsclient")

_FATAL = (AuthenticationError, InvalidArgumentError, NotFoundError)
_IDLE_WAIT_MS = 30_000  # how long one parked receive lasts before it is renewed


class Mailboxes:
    def __init__(self, client: AsyncRunstate) -> None:
        self._client = client

    async def ensure(
        self,
        name: str,
        mode: str = "WORK",
        *,
        max_attempts: int = Limits.DEFAULT_MAX_ATTEMPTS,
        retry_backoff_ms: int = Limits.DEFAULT_RETRY_BACKOFF_MS,
    ) -> dict[str, Any]:
        """Create the mailbox, or bring its settings to these values. Idempotent."""
        return await self._client._conn.request(
            Op.MAILBOX_ENSURE,
            {
                "name": name,
                "mode": mode,
                "max_attempts": max_attempts,
                "retry_backoff_ms": retry_backoff_ms,
            },
        )


def _deadline(value: str | dt.datetime | float | None) -> float | None:
    """ISO 8601 text, a datetime or epoch seconds -> epoch seconds. Naive means UTC."""
    if value is None or (isinstance(value, int | float) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise InvalidArgumentError(
                f"deadline must be an ISO 8601 timestamp, got {value!r}"
            ) from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value.timestamp()
    raise InvalidArgumentError(f"deadline must be an ISO 8601 timestamp, got {value!r}")


class Mailbox:
    """One mailbox inside one run."""

    def __init__(self, client: AsyncRunstate, scope: str, name: str) -> None:
        self._client = client
        self.scope_id = scope
        self.name = name

    def __repr__(self) -> str:
        return f"<Mailbox {self.scope_id}/{self.name}>"

    def _args(self, **extra: Any) -> dict[str, Any]:
        return {"scope": self.scope_id, "mailbox": self.name, **extra}

    async def submit(
        self,
        data: Any,
        *,
        key: str | None = None,
        subscriber_id: str | None = None,
        deadline: str | dt.datetime | float | None = None,
    ) -> Ticket:
        """Submit a shared task; the same key and input joins the existing task."""
        view = await self._client._conn.request(
            Op.TASK_SUBMIT,
            self._args(
                data=data, key=key, subscriber_id=subscriber_id, deadline=_deadline(deadline)
            ),
        )
        return Ticket(self._client, self.scope_id, view["id"], view)

    async def send(self, data: Any, *, work_key: str | None = None) -> dict[str, Any]:
        """Put a plain message on the queue; ``{"id", "replay"}``."""
        return await self._client._conn.request(
            Op.MESSAGE_SEND, self._args(data=data, work_key=work_key)
        )

    async def receive(
        self, *, lease_seconds: float = 30, wait: bool = False, timeout_ms: int = _IDLE_WAIT_MS
    ) -> Delivery | None:
        """One delivery, or None if the queue is empty. Not renewed for you."""
        return await self._receive(lease_seconds, wait, timeout_ms, auto_renew=False)

    async def _receive(
        self, lease_seconds: float, wait: bool, timeout_ms: int, *, auto_renew: bool
    ) -> Delivery | None:
        """One RECEIVE. A parked one that loses its connection waits again on the next
        connection for the time that is left, like acquire and result."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000.0
        args = self._args(lease_seconds=lease_seconds, wait=wait, timeout_ms=timeout_ms)
        while True:
            sent_at = loop.time()
            try:
                reply = await self._client._conn.request_cancellable(
                    Op.RECEIVE, args, withdraw=wait, give_back=self._requeue_orphan,
                    timeout=args["timeout_ms"] / 1000.0 if wait else None,
                )
                break
            except UnavailableError:
                left = deadline - loop.time()
                if not wait or left <= 0 or self._client._conn.closed:
                    raise
                args["timeout_ms"] = int(left * 1000)
            except WaitTimeoutError:
                return None  # a parked receive that ran out simply found nothing
        body = reply.get("delivery")
        if body is None:
            return None
        granted_at = sent_at + body.get("waited_ms", 0) / 1000.0  # no sooner than this
        return Delivery(
            self._client, self.scope_id, self.name, body, granted_at, auto_renew=auto_renew
        )

    def _requeue_orphan(self, reply: dict[str, Any]) -> None:
        """A delivery arrived after its receive was cancelled: hand it straight back."""
        body = reply.get("delivery")
        if body is not None:
            self._client._conn.send_nowait(Op.DELIVERY_RELEASE, {"lease": body["lease"]})

    async def dead_letters(self, limit: int = 100) -> list[dict[str, Any]]:
        """The newest dead letters: {id, kind, key, data, attempt, reason, at}."""
        reply = await self._client._conn.request(Op.DEAD_LETTERS, self._args(limit=limit))
        return reply["items"]

    async def inspect(self) -> dict[str, Any]:
        """Counts as the server sees them: ready, running, consumers, dead_letters."""
        return await self._client._conn.request(Op.QUEUE_INSPECT, self._args())

    async def consume(
        self,
        handler: Callable[[Any, Delivery], Any],
        *,
        concurrency: int = 1,
        lease_seconds: float = 60,
        stop_event: asyncio.Event | None = None,
        on_error: Callable[[BaseException, Delivery], Any] | None = None,
        shutdown_timeout: float = 30.0,
    ) -> None:
        if not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidArgumentError("concurrency must be a positive integer")
        if not Limits.MIN_LEASE_SECONDS <= lease_seconds <= Limits.MAX_LEASE_SECONDS:
            raise InvalidArgumentError(
                f"lease_seconds must be between {Limits.MIN_LEASE_SECONDS} and "
                f"{Limits.MAX_LEASE_SECONDS}"
            )
        consumer = _Consumer(self, handler, concurrency, lease_seconds, on_error)
        await consumer.run(stop_event or asyncio.Event(), shutdown_timeout)


class _Consumer:
    """The state of one consume() call: its slots and their running handlers."""

    def __init__(
        self,
        mailbox: Mailbox,
        handler: Callable[[Any, Delivery], Any],
        concurrency: int,
        lease_seconds: float,
        on_error: Callable[[BaseException, Delivery], Any] | None,
    ) -> None:
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
        backoff = 0.1
        while not self.stopping:
            task = asyncio.current_task()
            assert task is not None
            self.receiving.add(task)
            try:
                delivery = await self.mailbox._receive(
                    self.lease_seconds, True, _IDLE_WAIT_MS, auto_renew=True
                )
            except ScopeCancelledError:
                self._stop()
                return
            except _FATAL as exc:
                self._stop(exc)
                return
            except RunstateError as exc:
                if self.mailbox._client._conn.closed:
                    self._stop()  # the client was closed: nothing more to consume
                    return
                log.warning("consume on %s: receive failed, retrying: %s", self.mailbox, exc)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, 5.0)
                continue
            finally:
                self.receiving.discard(task)
            backoff = 0.1
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
                            self.mailbox, delivery)
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
        backoff = 0.05
        while True:
            try:
                await settle()
                return
            except LeaseLostError:
                log.warning("consume on %s: settling %s refused, the lease had been lost",
                            self.mailbox, delivery)
                return
            except UnavailableError as exc:
                if delivery.is_lost or self.mailbox._client._conn.closed:
                    return
                log.warning("consume on %s: could not settle %s, retrying: %s",
                            self.mailbox, delivery, exc)
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
                backoff = min(backoff * 2, 2.0)
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


def _clip(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` of UTF-8, never inside a character."""
    return text.encode(errors="replace")[:max_bytes].decode(errors="ignore")
