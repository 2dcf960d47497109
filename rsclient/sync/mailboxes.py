"""Sync mailboxes, tickets and deliveries: ``submit``, ``send``, ``receive`` and
``consume(handler, stop=threading.Event())`` for scripts and thread-based workers.

A thin layer over ``rsclient.mailboxes``, ``tasks``, ``deliveries`` and ``worker``: the
worker loop is the async one, running on the client's loop thread; each handler runs in
a thread of the client's pool (``HANDLER_THREADS``) and gets a sync ``Delivery``.

What always holds: ``consume`` returns when ``stop`` is set (noticed within
``STOP_POLL`` seconds; running handlers get ``shutdown_timeout``, the rest is requeued),
when the run is cancelled, or when the caller is interrupted (then gracefully, as for a
stop, before re-raising); it raises authentication, configuration and not-found errors
as the async one does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime as dt
import threading
from collections.abc import Callable, Iterable
from typing import Any

from .. import deliveries as adeliveries
from .. import mailboxes as amailboxes
from .. import tasks as atasks
from ..deliveries import IDLE_WAIT_MS
from ..errors import RunstateError
from ..views import DeadLetter, Needs, QueueCounts, SentMessage, TaskView
from ._portal import Portal
from .claims import Lease

__all__ = ["STOP_POLL", "Delivery", "Mailbox", "Ticket"]

STOP_POLL = 0.1  # seconds: how often consume() looks at its threading.Event


class Ticket:
    """A handle on a shared task (a task id inside a run), for sync code."""

    def __init__(self, portal: Portal, ticket: atasks.Ticket) -> None:
        self._portal = portal
        self._ticket = ticket

    def __repr__(self) -> str:
        return f"<sync Ticket {self._ticket.scope_id}/{self._ticket.id}>"

    @property
    def id(self) -> str:
        """The task id: ``run.task(id)`` re-attaches from any process."""
        return self._ticket.id

    @property
    def view(self) -> dict[str, Any]:
        """The task as last seen (submit's reply)."""
        return self._ticket.view

    @property
    def created(self) -> bool:
        """Whether the submit that made this ticket created the task (False: joined)."""
        return self._ticket.created

    def status(self) -> TaskView:
        """state, attempt, outcome, reason, tombstoned, key, subscribers, timestamps."""
        return self._portal.call(self._ticket.status())

    def result(self, timeout_ms: int | None = None) -> TaskView:
        """Wait for the task to end (pushed, not polled); WaitTimeoutError leaves it going."""
        return self._portal.call(self._ticket.result(timeout_ms))

    def join(self, subscriber_id: str, scope_id: str | None = None) -> TaskView:
        """Record ``subscriber_id`` (of run ``scope_id``) as interested in this task."""
        return self._portal.call(self._ticket.join(subscriber_id, scope_id))

    def detach(self, subscriber_id: str) -> TaskView:
        """Unsubscribe. A task with no subscribers is not cancelled."""
        return self._portal.call(self._ticket.detach(subscriber_id))

    def cancel(self, reason: str | None = None) -> TaskView:
        """End the task CANCELLED (no-op if it already ended); returns its view."""
        return self._portal.call(self._ticket.cancel(reason))


class Delivery:
    """One leased hand-out of a task or message, for sync code; settles once."""

    def __init__(self, portal: Portal, delivery: adeliveries.Delivery) -> None:
        self._portal = portal
        self._delivery = delivery
        self.lease = Lease(portal, delivery.lease)
        self.id: str = delivery.id
        self.kind: str = delivery.kind
        self.task_id: str | None = delivery.task_id
        self.key: str | None = delivery.key
        self.data: Any = delivery.data
        self.attempt: int = delivery.attempt

    def __repr__(self) -> str:
        return f"<sync Delivery {self.kind} {self.id} attempt={self.attempt}>"

    @property
    def settled(self) -> bool:
        """Whether complete, retry, reject or requeue has decided it."""
        return self._delivery.settled

    @property
    def state(self) -> str | None:
        """The task's state after settlement."""
        return self._delivery.state

    @property
    def is_lost(self) -> bool:
        """Whether the delivery's lease is lost (read from the clock now)."""
        return self._delivery.is_lost

    def token(self) -> str:
        """The delivery's fencing token (its lease's)."""
        return self._delivery.token()

    def renew(self, seconds: float | None = None) -> None:
        """Extend the lease to ``seconds`` from now (default: its current length)."""
        self._portal.call(self._delivery.renew(seconds))

    def complete(
        self, result: dict[str, Any] | None = None, *, take_next: int = 0
    ) -> list[Delivery]:
        """SUCCEEDED; ``result={"payload": ...}``'s payload becomes the recorded outcome.
        ``take_next``: also take up to that many next deliveries in the same request."""
        return self._wrap(self._portal.call(self._delivery.complete(result, take_next=take_next)))

    def retry(
        self, *, delay_ms: int | None = None, reason: str | None = None, take_next: int = 0
    ) -> list[Delivery]:
        """Back on the queue with backoff (or after ``delay_ms``); FAILED at the limit."""
        return self._wrap(self._portal.call(
            self._delivery.retry(delay_ms=delay_ms, reason=reason, take_next=take_next)
        ))

    def reject(self, reason: str | None = None, *, take_next: int = 0) -> list[Delivery]:
        """Dead-letter it without retry; the task becomes FAILED."""
        return self._wrap(self._portal.call(self._delivery.reject(reason, take_next=take_next)))

    def _wrap(self, got: list[adeliveries.Delivery]) -> list[Delivery]:
        return [Delivery(self._portal, delivery) for delivery in got]

    def requeue(self) -> None:
        """Give it back untouched, for another worker, without using an attempt."""
        self._portal.call(self._delivery.requeue())


class Mailbox:
    """One mailbox inside one run, for sync code."""

    def __init__(self, portal: Portal, mailbox: amailboxes.Mailbox) -> None:
        self._portal = portal
        self._mailbox = mailbox

    def __repr__(self) -> str:
        return f"<sync Mailbox {self._mailbox.scope_id}/{self._mailbox.name}>"

    @property
    def name(self) -> str:
        """The mailbox's name."""
        return self._mailbox.name

    def submit(
        self,
        data: Any,
        *,
        key: str | None = None,
        subscriber_id: str | None = None,
        deadline: str | dt.datetime | float | None = None,
        needs: Needs | None = None,
        group: str | None = None,
        slim: bool = False,
    ) -> Ticket:
        """Submit a shared task; the same key and input joins the existing task.
        ``needs``: the capacity it takes at delivery (see the async ``submit``);
        ``group`` puts the new task in that task group of the run."""
        return Ticket(self._portal, self._portal.call(self._mailbox.submit(
            data, key=key, subscriber_id=subscriber_id, deadline=deadline, needs=needs,
            group=group, slim=slim,
        )))

    def submit_many(self, items: Iterable[dict[str, Any]]) -> list[Ticket | RunstateError]:
        """Submit many tasks in as few requests as possible; a Ticket or the item's own
        error per item, in order (as the async ``submit_many``)."""
        answers = self._portal.call(self._mailbox.submit_many(list(items)))
        return [
            answer if isinstance(answer, RunstateError) else Ticket(self._portal, answer)
            for answer in answers
        ]

    def send(
        self, data: Any, *, work_key: str | None = None, needs: Needs | None = None
    ) -> SentMessage:
        """Put a plain message on the queue; ``{"id", "replay"}``."""
        return self._portal.call(self._mailbox.send(data, work_key=work_key, needs=needs))

    def receive(
        self, *, lease_seconds: float = 30, wait: bool = False, timeout_ms: int = IDLE_WAIT_MS
    ) -> Delivery | None:
        """One delivery, or None if the queue is empty. Not renewed for you."""
        delivery = self._portal.call(self._mailbox.receive(
            lease_seconds=lease_seconds, wait=wait, timeout_ms=timeout_ms
        ))
        return None if delivery is None else Delivery(self._portal, delivery)

    def receive_many(
        self, max: int, *, lease_seconds: float = 30, wait: bool = False,
        timeout_ms: int = IDLE_WAIT_MS,
    ) -> list[Delivery]:
        """Up to ``max`` deliveries in one request; each not renewed for you."""
        got = self._portal.call(self._mailbox.receive_many(
            max, lease_seconds=lease_seconds, wait=wait, timeout_ms=timeout_ms
        ))
        return [Delivery(self._portal, delivery) for delivery in got]

    def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The newest dead letters: {id, kind, key, data, attempt, reason, at}."""
        return self._portal.call(self._mailbox.dead_letters(limit))

    def inspect(self) -> QueueCounts:
        """Counts as the server sees them: ready, running, consumers, dead_letters."""
        return self._portal.call(self._mailbox.inspect())

    def consume(
        self,
        handler: Callable[[Any, Delivery], Any],
        *,
        concurrency: int = 1,
        lease_seconds: float = 60,
        stop: threading.Event | None = None,
        on_error: Callable[[BaseException, Delivery], Any] | None = None,
        shutdown_timeout: float = 30.0,
    ) -> None:
        """Run ``handler(data, delivery)`` in worker threads, ``concurrency`` at a time,
        until ``stop`` is set or the run is cancelled (see the module docstring)."""
        portal = self._portal

        def run_handler(data: Any, delivery: adeliveries.Delivery) -> Any:
            return handler(data, Delivery(portal, delivery))  # in a thread of the pool

        async def report(exc: BaseException, delivery: adeliveries.Delivery) -> None:
            assert on_error is not None  # off the loop: it may settle the delivery
            await asyncio.get_running_loop().run_in_executor(
                None, on_error, exc, Delivery(portal, delivery)
            )

        stop_async = asyncio.Event()  # bound to the client's loop at its first wait
        running = portal.submit(self._mailbox.consume(
            run_handler, concurrency=concurrency, lease_seconds=lease_seconds,
            stop_event=stop_async, on_error=report if on_error is not None else None,
            shutdown_timeout=shutdown_timeout,
        ))
        try:
            while True:
                try:
                    running.result(STOP_POLL)
                    return
                except concurrent.futures.TimeoutError:
                    if stop is not None and stop.is_set():
                        break
        except BaseException:  # interrupted: stop as for a stop, then re-raise
            portal.call_soon(stop_async.set)
            running.result()
            raise
        portal.call_soon(stop_async.set)
        running.result()
