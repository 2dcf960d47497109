"""Sync mailboxes, tickets and deliveries: ``submit``, ``send``, ``receive`` and
``consume(handler, stop=threading.Event())`` for scripts and thread-based workers.

A thin layer over ``rsclient.mailboxes``, ``tasks``, ``deliveries`` and ``worker``: the
worker loop is the async one, running on the client's loop thread; each handler runs in
a thread of the client's pool (``HANDLER_THREADS``) and gets a sync ``Delivery``.
Every method that only mirrors an async one is derived from it (``_derive.py``).

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
from typing import TYPE_CHECKING, Any, Literal, overload

from .. import deliveries as adeliveries
from .. import mailboxes as amailboxes
from .. import tasks as atasks
from ..errors import RunstateError
from ..mailboxes import Instant
from ..views import Needs, TaskOutcome, TaskView
from ._derive import Attribute, Handle, attribute, blocking, direct
from ._portal import Portal
from .claims import Lease

__all__ = ["STOP_POLL", "Delivery", "Mailbox", "Ticket"]

STOP_POLL = 0.1  # seconds: how often consume() looks at its threading.Event


def _deliveries(portal: Portal, got: list[adeliveries.Delivery]) -> list[Delivery]:
    """Sync handles over deliveries the async client handed out."""
    return [Delivery(portal, delivery) for delivery in got]


def _delivery_or_none(portal: Portal, got: adeliveries.Delivery | None) -> Delivery | None:
    """A sync handle over one delivery, or None when there was none."""
    return None if got is None else Delivery(portal, got)


class Ticket(Handle[atasks.Ticket]):
    """A handle on a shared task (a task id inside a run), for sync code."""

    def __repr__(self) -> str:
        return f"<sync Ticket {self._async.scope_id}/{self._async.id}>"

    @property
    def id(self) -> str:
        """The task id: ``run.task(id)`` re-attaches from any process."""
        return self._async.id

    @property
    def view(self) -> dict[str, Any]:
        """The task as last seen (submit's reply)."""
        return self._async.view

    created: Attribute[bool] = attribute(atasks.Ticket.created)
    status = blocking(atasks.Ticket.status)
    if TYPE_CHECKING:  # the async method's overloads (a ParamSpec carries only the first)
        @overload
        def result(
            self, timeout_ms: int | None = None, *, outcome_only: Literal[False] = False
        ) -> TaskView: ...
        @overload
        def result(
            self, timeout_ms: int | None = None, *, outcome_only: Literal[True]
        ) -> TaskOutcome: ...
        @overload
        def result(
            self, timeout_ms: int | None = None, *, outcome_only: bool = False
        ) -> TaskView | TaskOutcome: ...
        def result(self, *args: Any, **kwargs: Any) -> Any: ...
    else:
        result = blocking(atasks.Ticket.result, note="WaitTimeoutError leaves the task going.")
    join = blocking(atasks.Ticket.join)
    detach = blocking(atasks.Ticket.detach)
    signal = blocking(atasks.Ticket.signal)
    children = blocking(atasks.Ticket.children)
    cancel = blocking(atasks.Ticket.cancel)


class Delivery(Handle[adeliveries.Delivery]):
    """One leased hand-out of a task or message, for sync code; settles once."""

    def __init__(self, portal: Portal, delivery: adeliveries.Delivery) -> None:
        super().__init__(portal, delivery)
        self.lease = Lease(portal, delivery.lease)
        self.id: str = delivery.id
        self.data: Any = delivery.data
        self.attempt: int = delivery.attempt

    # Read from the async delivery when asked for, as it reads them from its body.
    kind: Attribute[str] = attribute(adeliveries.Delivery.kind)
    task_id: Attribute[str | None] = attribute(adeliveries.Delivery.task_id)
    key: Attribute[str | None] = attribute(adeliveries.Delivery.key)
    signal: Attribute[dict[str, Any] | None] = attribute(adeliveries.Delivery.signal)
    trace: Attribute[dict[str, str] | None] = attribute(adeliveries.Delivery.trace)
    parents: Attribute[dict[str, Any]] = attribute(adeliveries.Delivery.parents)

    def __repr__(self) -> str:
        return f"<sync Delivery {self.kind} {self.id} attempt={self.attempt}>"

    @property
    def settled(self) -> bool:
        """Whether complete, retry, reject, requeue or suspend has decided it."""
        return self._async.settled

    @property
    def state(self) -> str | None:
        """The task's state after settlement."""
        return self._async.state

    is_lost: Attribute[bool] = attribute(adeliveries.Delivery.is_lost)
    token = direct(adeliveries.Delivery.token)
    renew = blocking(adeliveries.Delivery.renew)
    progress = blocking(adeliveries.Delivery.progress)
    complete = blocking(adeliveries.Delivery.complete, _deliveries)
    retry = blocking(adeliveries.Delivery.retry, _deliveries)
    reject = blocking(adeliveries.Delivery.reject, _deliveries)
    requeue = blocking(adeliveries.Delivery.requeue)
    suspend = blocking(adeliveries.Delivery.suspend)
    submit_child = blocking(adeliveries.Delivery.submit_child, Ticket)


class Mailbox(Handle[amailboxes.Mailbox]):
    """One mailbox inside one run, for sync code."""

    def __repr__(self) -> str:
        return f"<sync Mailbox {self._async.scope_id}/{self._async.name}>"

    @property
    def name(self) -> str:
        """The mailbox's name."""
        return self._async.name

    submit = blocking(amailboxes.Mailbox.submit, Ticket)
    if TYPE_CHECKING:  # the async method's overloads (a ParamSpec carries only the first)
        @overload
        def submit_and_wait(
            self,
            data: Any,
            *,
            key: str | None = None,
            subscriber_id: str | None = None,
            deadline: str | dt.datetime | float | None = None,
            needs: Needs | None = None,
            group: str | None = None,
            timeout_ms: int | None = None,
            delay_seconds: float | None = None,
            not_before: Instant | None = None,
            priority: int | None = None,
            fairness_key: str | None = None,
            after: Iterable[Any] | None = None,
            on_parent_failure: str | None = None,
            parent: Any = None,
            concurrency_key: str | None = None,
            concurrency_limit: int | None = None,
            rate_key: str | None = None,
            rate_limit: int | None = None,
            rate_period_seconds: float | None = None,
            outcome_only: Literal[False] = False,
        ) -> TaskView: ...
        @overload
        def submit_and_wait(
            self,
            data: Any,
            *,
            key: str | None = None,
            subscriber_id: str | None = None,
            deadline: str | dt.datetime | float | None = None,
            needs: Needs | None = None,
            group: str | None = None,
            timeout_ms: int | None = None,
            delay_seconds: float | None = None,
            not_before: Instant | None = None,
            priority: int | None = None,
            fairness_key: str | None = None,
            after: Iterable[Any] | None = None,
            on_parent_failure: str | None = None,
            parent: Any = None,
            concurrency_key: str | None = None,
            concurrency_limit: int | None = None,
            rate_key: str | None = None,
            rate_limit: int | None = None,
            rate_period_seconds: float | None = None,
            outcome_only: Literal[True],
        ) -> TaskOutcome: ...
        @overload
        def submit_and_wait(
            self,
            data: Any,
            *,
            key: str | None = None,
            subscriber_id: str | None = None,
            deadline: str | dt.datetime | float | None = None,
            needs: Needs | None = None,
            group: str | None = None,
            timeout_ms: int | None = None,
            delay_seconds: float | None = None,
            not_before: Instant | None = None,
            priority: int | None = None,
            fairness_key: str | None = None,
            after: Iterable[Any] | None = None,
            on_parent_failure: str | None = None,
            parent: Any = None,
            concurrency_key: str | None = None,
            concurrency_limit: int | None = None,
            rate_key: str | None = None,
            rate_limit: int | None = None,
            rate_period_seconds: float | None = None,
            outcome_only: bool = False,
        ) -> TaskView | TaskOutcome: ...
        def submit_and_wait(self, *args: Any, **kwargs: Any) -> Any: ...
    else:
        submit_and_wait = blocking(amailboxes.Mailbox.submit_and_wait)
    send = blocking(amailboxes.Mailbox.send)
    receive = blocking(amailboxes.Mailbox.receive, _delivery_or_none)
    receive_many = blocking(amailboxes.Mailbox.receive_many, _deliveries)
    dead_letters = blocking(amailboxes.Mailbox.dead_letters)
    inspect = blocking(amailboxes.Mailbox.inspect)
    pause = blocking(amailboxes.Mailbox.pause)
    resume = blocking(amailboxes.Mailbox.resume)

    def submit_many(self, items: Iterable[dict[str, Any]]) -> list[Ticket | RunstateError]:
        """Submit many tasks in as few requests as possible; a Ticket or the item's own
        error per item, in order (as the async ``submit_many``). ``items`` is read in
        this thread, before anything is sent."""
        answers = self._portal.call(self._async.submit_many(list(items)))
        return [
            answer if isinstance(answer, RunstateError) else Ticket(self._portal, answer)
            for answer in answers
        ]

    def consume(
        self,
        handler: Callable[[Any, Delivery], Any],
        *,
        concurrency: int = 1,
        lease_seconds: float = 60,
        stop: threading.Event | None = None,
        on_error: Callable[[BaseException, Delivery], Any] | None = None,
        shutdown_timeout: float = 30.0,
        release_on_disconnect: bool = False,
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
        running = portal.submit(self._async.consume(
            run_handler, concurrency=concurrency, lease_seconds=lease_seconds,
            stop_event=stop_async, on_error=report if on_error is not None else None,
            shutdown_timeout=shutdown_timeout, release_on_disconnect=release_on_disconnect,
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
