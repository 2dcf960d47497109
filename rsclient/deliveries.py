"""Deliveries: one leased hand-out of a task or message to a worker, and ``receive``,
the one RECEIVE that ``Mailbox.receive`` and the worker loop both use.

A delivery settles once: the first ``complete``, ``retry``, ``reject``, ``requeue`` or
``suspend`` decides, and later calls do nothing. A settlement the server refuses
because the lease is no longer current (it expired and the task went to another
worker) raises LeaseLostError; the
task keeps the result of whoever completed it with a valid lease. A delivery that
arrives for a receive its caller gave up on is handed straight back, never kept.

A completion, retry, rejection or suspend whose connection drops before its answer (rsd may
have recorded it, or not) is sent again, with the same lease handle, once the client has
reconnected, for as long as the lease would live (``_send_settlement``): rsd answers a
repeat of a settlement it recorded as it answered the first (protocol.md, "Repeated
settlements"), so ``complete()`` returns normally and the result is recorded once. The
lease is not renewed meanwhile (a renewal of a lease the first settlement ended would be
refused, and that refusal is no loss). ``requeue()`` is sent once, as before: unanswered,
it raises UnavailableError at once (a worker giving its deliveries back at shutdown does
not wait out their leases; one left so expires and is delivered again).

A delivery whose run moved to another shard meanwhile (a slot move) is settled there:
its old shard answers MOVED, and the settlement follows it as any request answered
MOVED (at most ``MAX_REDIRECTS`` in a row), the delivery's lease kept by the new
shard's keeper from then on.

``release_on_disconnect``: the deliveries' leases end the moment the connection they
came on closes (their items go back to the queue at once, as on expiry), and each is
lost here the moment that connection drops (``LeaseKeeper.bind``); the deliveries a
settlement's ``take_next`` takes are bound the same way as the one settled.

Fewer round trips: ``receive`` with ``many`` asks for up to that many deliveries in one
RECEIVE, and a settlement with ``take_next`` asks for the next deliveries of the same
queue in the same request; deliveries in a reply whose caller gave up are handed back
too, all of them.
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

from .connection import Moved
from .errors import (
    InvalidArgumentError,
    LeaseLostError,
    RunstateError,
    ScopeCancelledError,
    UnavailableError,
    WaitTimeoutError,
    checked_bool,
)
from .leases import Lease, declare_lost, kept_by, mark_released, rebind
from .retry import Backoff, wait_across_reconnects
from .wire import Op

if TYPE_CHECKING:
    from .session import Session
    from .tasks import Ticket

__all__ = ["IDLE_WAIT_MS", "Delivery", "receive", "receive_many"]

IDLE_WAIT_MS = 30_000  # how long one parked receive lasts before it is made again


async def receive(
    session: Session,
    scope: str,
    mailbox: str,
    lease_seconds: float,
    wait: bool,
    timeout_ms: int,
    *,
    auto_renew: bool,
    release_on_disconnect: bool = False,
) -> Delivery | None:
    """One RECEIVE: a delivery, or None if there was none (a parked wait that ran out
    found nothing). A parked one that loses its connection waits again on the next
    connection for the time that is left, as acquire and result do."""
    got = await receive_many(
        session, scope, mailbox, lease_seconds, wait, timeout_ms, None, auto_renew=auto_renew,
        release_on_disconnect=release_on_disconnect,
    )
    return got[0] if got else None


async def receive_many(
    session: Session,
    scope: str,
    mailbox: str,
    lease_seconds: float,
    wait: bool,
    timeout_ms: int,
    many: int | None,
    *,
    auto_renew: bool,
    release_on_disconnect: bool = False,
) -> list[Delivery]:
    """One RECEIVE of up to ``many`` deliveries (None: the single form, at most one)."""
    args: dict[str, Any] = {
        "scope": scope, "mailbox": mailbox, "lease_seconds": lease_seconds, "wait": wait,
        "timeout_ms": timeout_ms,
    }
    if many is not None:
        args["max"] = many
    # The connection they came on, for leases that end with it (None: they do not).
    on_send: _LinkAtSend | None = None
    if checked_bool(release_on_disconnect):
        args["release_on_disconnect"] = True
        on_send = _LinkAtSend(session, scope)

    give_back = functools.partial(_requeue_orphan, session, scope)
    try:
        if wait:
            reply, sent_at = await wait_across_reconnects(
                session, Op.RECEIVE, args, timeout_ms, give_back=give_back,
                stop_when_closed=True, on_send=on_send,
            )
        else:
            sent_at = asyncio.get_running_loop().time()
            try:
                reply = await session.request_cancellable(
                    Op.RECEIVE, args, withdraw=False, give_back=give_back
                )
            except UnavailableError as exc:  # sent again only if not executed (NOT_PRIMARY, MOVED)
                reply = await session.again(
                    exc, Op.RECEIVE, args, functools.partial(_receive_again, session, args, on_send)
                )
    except WaitTimeoutError:
        return []  # a parked receive that ran out simply found nothing
    # Settled, renewed and released where they were received: the run's shard's session.
    return _deliveries(
        session.for_run(scope), scope, mailbox, _bodies(reply), sent_at, auto_renew,
        None if on_send is None else on_send.link,
    )


class _LinkAtSend:
    """The ``link`` of the run's shard's session when a RECEIVE was last sent (read
    again at each send: ``on_send``), which its deliveries end with. An object, not a
    closure over ``receive_many``'s names: those would be cells made at every receive."""

    __slots__ = ("link", "scope", "session")

    def __init__(self, session: Session, scope: str) -> None:
        self.session = session
        self.scope = scope
        self.link = session.for_run(scope).link

    def __call__(self) -> None:
        self.link = self.session.for_run(self.scope).link


def _receive_again(
    session: Session, args: dict[str, Any], on_send: Callable[[], None] | None
) -> Awaitable[Any]:
    """A RECEIVE that may not wait, sent again (``Session.again``)."""
    if on_send is not None:
        on_send()
    return session.request_cancellable(
        Op.RECEIVE, args, withdraw=False,
        give_back=functools.partial(_requeue_orphan, session, args["scope"]),
    )


def _bodies(reply: dict[str, Any]) -> list[dict[str, Any]]:
    """The delivery bodies of a RECEIVE reply, single or list form (or of ``next``)."""
    many = reply.get("deliveries")
    if many is not None:
        return cast("list[dict[str, Any]]", many)
    body = reply.get("delivery")
    return [] if body is None else [body]


def _deliveries(
    session: Session, scope: str, mailbox: str, bodies: list[dict[str, Any]],
    sent_at: float, auto_renew: bool, link: int | None,
) -> list[Delivery]:
    """``link``: the connection they came on, for deliveries that end with it; None for
    the others."""
    # A loop, not a comprehension: a comprehension is a function made and called, and
    # the six names it reads would be cells made at each call of this one.
    deliveries = []
    for body in bodies:
        # Granted no sooner than the send time plus the wait the server reports.
        deliveries.append(Delivery(
            session, scope, mailbox, body, sent_at + body.get("waited_ms", 0) / 1000.0,
            auto_renew=auto_renew, link=link))
    return deliveries


def _requeue_orphan(session: Session, scope: str, reply: dict[str, Any]) -> None:
    """Deliveries arrived after their request's caller gave up: hand them straight back
    (on the connection they came on: their run's shard's)."""
    here = session.for_run(scope)
    for body in _bodies(reply) + (reply.get("next") or []):
        here.send_nowait(Op.DELIVERY_RELEASE, {"lease": body["lease"]})



def delay_ms_of(delay_seconds: float | None) -> int | None:
    """``delay_seconds`` as the wire's whole milliseconds (InvalidArgumentError for a
    negative, NaN or infinite delay, or one that is not a number)."""
    if delay_seconds is None:
        return None
    if (
        not isinstance(delay_seconds, int | float) or isinstance(delay_seconds, bool)
        or not math.isfinite(delay_seconds) or delay_seconds < 0
    ):
        raise InvalidArgumentError(
            f"delay_seconds must be a finite number of seconds, 0 or more, got {delay_seconds!r}"
        )
    return round(delay_seconds * 1000)


class Delivery:
    """One task or message handed to this worker under a lease, to settle once."""
    def __init__(
        self,
        session: Session,
        scope: str,
        mailbox: str,
        body: dict[str, Any],
        confirmed_at: float,
        *,
        auto_renew: bool = False,
        link: int | None = None,
    ) -> None:
        """``link``: for a delivery taken with ``release_on_disconnect``, the
        connection it came on (``Session.link`` when its request was sent)."""
        self._session = session
        self._auto_renew = auto_renew
        # The body as rsd sent it: the fields most handlers never read (``kind``,
        # ``task_id``, ``key``, ``signal``, ``trace``, ``parents``) are read from it
        # when asked for, not copied for every delivery.
        self._body = body
        self.scope_id = scope
        self.mailbox = mailbox
        self.id: str = body["id"]
        self.data: Any = body["data"]
        self.attempt: int = body["attempt"]
        keeper = session.keeper
        self.lease = Lease(
            keeper,
            body["lease"],
            scope=scope,
            key=self.id,
            generation=self.attempt,
            lease_seconds=body["lease_seconds"],
            confirmed_at=confirmed_at,
            release_op=Op.DELIVERY_RELEASE,
            release_on_disconnect=link is not None,
        )
        self.settled = False
        self.state: str | None = None  # the task's state after settlement
        if auto_renew:
            keeper.track(self.lease)
        else:
            keeper.know(self.lease)  # not renewed here, but told of its loss
        if link is not None:
            keeper.bind(self.lease, link)

    def __repr__(self) -> str:
        return f"<Delivery {self.kind} {self.id} attempt={self.attempt}>"

    @property
    def kind(self) -> str:
        """"task" or "message"."""
        kind: str = self._body["kind"]
        return kind

    @property
    def task_id(self) -> str | None:
        """The task's id (None for a message)."""
        task_id: str | None = self._body["task_id"]
        return task_id

    @property
    def key(self) -> str | None:
        """The task's key, if it was submitted with one."""
        key: str | None = self._body.get("key")
        return key

    @property
    def signal(self) -> dict[str, Any] | None:
        """The signal that woke this task's last wait (``suspend``): {"name", "data"};
        None before any wait, and after one that timed out."""
        signal: dict[str, Any] | None = self._body.get("signal")
        return signal

    @property
    def trace(self) -> dict[str, str] | None:
        """Its submitter's W3C trace context (``traceparent``, ``tracestate``), or None:
        the parent of the ``handle`` span (tracing.py)."""
        trace: dict[str, str] | None = self._body.get("trace")
        return trace

    @property
    def parents(self) -> dict[str, Any]:
        """A task submitted ``after`` others: each parent's id -> its outcome ({"id",
        "state", "outcome", "reason"}; None for one forgotten); else {}."""
        parents = self._body.get("parents")
        if parents is None:  # (the same {} at each read: made once, on the first)
            parents = self._body["parents"] = {}
        return cast("dict[str, Any]", parents)

    def token(self) -> str:
        """The delivery's fencing token (its lease's)."""
        return self.lease.token()

    @property
    def is_lost(self) -> bool:
        """Whether the delivery's lease is lost (read on the clock, as ``Lease.is_lost``)."""
        return self.lease.is_lost

    async def renew(self, seconds: float | None = None) -> None:
        """Extend the lease to ``seconds`` from now (default: its current length)."""
        await self.lease.renew(seconds)

    async def complete(
        self, result: dict[str, Any] | None = None, *, take_next: int = 0
    ) -> list[Delivery]:
        """SUCCEEDED; ``result={"payload": ...}``'s payload becomes the recorded outcome.
        ``take_next``: also take up to that many next deliveries of the same queue in
        the same request (never waiting; see "Settle and receive next" in protocol.md);
        they are returned, leased like this one. Without it: an empty list."""
        if result is None:
            outcome = None
        elif isinstance(result, dict) and len(result) <= 1 and (not result or "payload" in result):
            outcome = result.get("payload")  # no field but "payload" (no set made per call)
        else:
            got = sorted(result) if isinstance(result, dict) else type(result).__name__
            raise InvalidArgumentError(
                f'complete() takes result={{"payload": ...}} (or nothing); got {got}'
            )
        spans = self._session.spans
        if spans is not None:  # in a ``complete`` span (tracing.py)
            return await spans.settled("complete", functools.partial(
                self._settle, Op.DELIVERY_COMPLETE, {"outcome": outcome}, take_next))
        if take_next:
            return await self._settle(Op.DELIVERY_COMPLETE, {"outcome": outcome}, take_next)
        # ``_settle`` without take_next, awaited here (a coroutine less per task: a
        # handler's own complete() is most tasks' settlement); the same steps.
        args = {"outcome": outcome}
        session = self._begin_settling(args, 0)
        if session is None:
            return []
        try:
            try:
                reply = await session.request(Op.DELIVERY_COMPLETE, args)
            except UnavailableError as exc:
                reply = (await self._send_settlement(Op.DELIVERY_COMPLETE, args, 0, exc))[0]
        except RunstateError as exc:
            self._not_settled(exc)
            raise
        self.state = reply.get("state")
        mark_released(self.lease)
        return []

    async def progress(self, data: Any = None) -> int:
        """Publish ``data`` (at most 64 KiB encoded) as a progress event of this task:
        every follower of ``ticket.events()`` gets it, and late ones too while it is
        retained. Fenced like ``complete``: a delivery whose lease is lost raises
        LeaseLostError and nothing is published. Returns the event's seq. Sent again
        after a lost connection while the lease lasts (at least once: a repeat whose
        first was recorded shows as a second event)."""
        lease = self.lease
        if self.settled:
            raise LeaseLostError(f"delivery {self.id} is settled: no more progress")
        session = self._session
        if kept_by(lease) is not session.keeper:  # it followed its run (keeper.py)
            session = self._session = session.moved_to(self.scope_id)
        args = {"lease": lease.handle, "data": data}
        try:
            try:
                reply = await session.request(Op.DELIVERY_PROGRESS, args)
            except UnavailableError as exc:
                reply = (await self._send_settlement(Op.DELIVERY_PROGRESS, args, 0, exc))[0]
        except LeaseLostError as exc:
            declare_lost(lease, f"the server refused a progress event: {exc.message}")
            raise
        return int(reply["seq"])

    async def retry(
        self, *, delay_ms: int | None = None, reason: str | None = None, take_next: int = 0,
        delay_seconds: float | None = None,
    ) -> list[Delivery]:
        """Back on the queue with backoff (or after ``delay_seconds``, or ``delay_ms``,
        instead: for this retry only); FAILED at the limit. ``take_next`` as for
        ``complete``."""
        if delay_seconds is not None:
            if delay_ms is not None:
                raise InvalidArgumentError("give delay_seconds or delay_ms, not both")
            delay_ms = delay_ms_of(delay_seconds)
        args = {"delay_ms": delay_ms, "reason": reason}
        spans = self._session.spans
        if spans is not None:  # in a ``retry`` span (tracing.py)
            return await spans.settled(
                "retry", functools.partial(self._settle, Op.DELIVERY_RETRY, args, take_next))
        return await self._settle(Op.DELIVERY_RETRY, args, take_next)

    async def reject(self, reason: str | None = None, *, take_next: int = 0) -> list[Delivery]:
        """Dead-letter it without retry; the task becomes FAILED. ``take_next`` as for
        ``complete``."""
        spans = self._session.spans
        if spans is not None:  # in a ``reject`` span (tracing.py)
            return await spans.settled("reject", functools.partial(
                self._settle, Op.DELIVERY_REJECT, {"reason": reason}, take_next))
        return await self._settle(Op.DELIVERY_REJECT, {"reason": reason}, take_next)

    async def requeue(self) -> None:
        """Give it back untouched, for another worker, without using an attempt."""
        await self._settle(Op.DELIVERY_RELEASE, {}, 0)

    async def submit_child(
        self, mailbox: str, data: Any, *, key: str | None = None,
        after: list[Any] | None = None, on_parent_failure: str | None = None,
        group: str | None = None, priority: int | None = None,
        fairness_key: str | None = None, delay_seconds: float | None = None,
    ) -> Ticket:
        """Submit a task in this delivery's run as a child of its task (``parent``): a
        cancellation or deadline of this task cancels it (and its own children);
        ``ticket.children()`` lists it. The other arguments are ``Mailbox.submit``'s."""
        if self.task_id is None:
            raise InvalidArgumentError("a message has no children: only a task's delivery does")
        from .mailboxes import Mailbox  # (mailboxes.py imports this module)

        return await Mailbox(self._session, self.scope_id, mailbox).submit(
            data, key=key, parent=self.task_id, after=after,
            on_parent_failure=on_parent_failure, group=group, priority=priority,
            fairness_key=fairness_key, delay_seconds=delay_seconds,
        )

    async def suspend(self, name: str, timeout_seconds: float | None = None) -> None:
        """Wait for the signal ``name`` without holding a worker: the delivery settles
        without using an attempt, the task is WAITING (its lease ends, this worker is
        free), and it is delivered again when ``ticket.signal(name, data)`` comes (the
        next delivery's ``signal`` is ``{"name", "data"}``) or after ``timeout_seconds``
        (its ``signal`` None; default and longest: 366 days). A signal sent before this
        call was kept and wakes it at once (``state`` then says PENDING, not WAITING).
        Sent again after a lost connection as complete is (a repeat is answered as the
        first)."""
        await self._settle(
            Op.DELIVERY_SUSPEND, {"name": name, "timeout_seconds": timeout_seconds}, 0
        )

    def abandon(self) -> None:
        """Stop renewing the lease and settle nothing: it expires and the task is
        redelivered (attempt + 1). For a worker that cannot reach the server to settle."""
        self.settled = True
        self._auto_renew = False
        self._session.keeper.forget(self.lease)

    def _begin_settling(self, args: dict[str, Any], take_next: int) -> Session | None:
        """A settlement starts: None if the delivery was settled already (it does
        nothing), else it counts as settled from now on, its lease is no longer renewed,
        ``args`` name it, and the session it is sent on (its run's shard's)."""
        if self.settled:
            return None
        if type(take_next) is not int or take_next < 0:
            raise InvalidArgumentError("take_next must be a non-negative integer")
        self.settled = True
        lease = self.lease
        session = self._session
        if kept_by(lease) is not session.keeper:  # it followed its run (keeper.py)
            session = self._session = session.moved_to(self.scope_id)
        session.keeper.forget(lease)
        args["lease"] = lease.handle  # (a dict of our own, made by the caller)
        return session

    def _not_settled(self, exc: RunstateError) -> None:
        """The settlement failed with ``exc`` (the caller raises it on): a refusal of
        the lease, or the run's cancellation, is final, a loss; anything else (a bad
        argument, no answer) decided nothing, and the delivery is still ours to settle
        again (renewed again if it was)."""
        lease = self.lease
        if isinstance(exc, LeaseLostError):
            declare_lost(lease, f"the server refused the settlement: {exc.message}")
        elif isinstance(exc, ScopeCancelledError):
            # The run was cancelled and took the delivery with it: final, like a loss.
            declare_lost(lease, exc.message)
        else:
            self.settled = False
            if self._auto_renew and not lease.is_lost:
                self._session.keeper.track(lease)

    async def _settle(self, op: int, args: dict[str, Any], take_next: int) -> list[Delivery]:
        session = self._begin_settling(args, take_next)
        if session is None:
            return []
        lease = self.lease
        bound = lease.release_on_disconnect
        try:
            if take_next:
                args["next"] = {"lease_seconds": lease.lease_seconds, "max": take_next}
                if bound:
                    args["next"]["release_on_disconnect"] = True
                reply, sent_at, link = await self._send_settlement(op, args, take_next)
            else:  # (its first send here: a coroutine less when it is answered)
                try:
                    reply = await session.request(op, args)
                except UnavailableError as exc:
                    reply = (await self._send_settlement(op, args, 0, exc))[0]
        except RunstateError as exc:
            self._not_settled(exc)
            raise
        self.state = reply.get("state")
        mark_released(lease)
        if not take_next:
            return []
        return _deliveries(  # (the session of the shard that settled it: its run's)
            self._session, self.scope_id, self.mailbox, reply.get("next") or [], sent_at,
            self._auto_renew, link if bound else None,
        )

    async def _send_settlement(
        self, op: int, args: dict[str, Any], take_next: int,
        first: UnavailableError | None = None,
    ) -> tuple[dict[str, Any], float, int]:
        """Send the settlement; if the connection fails before its answer, send it again
        (the same handle: a repeat of a recorded one is answered as the first) after the
        client reconnects, until the lease's own deadline or the client's close, which
        raise the last UnavailableError (a release is sent once: see the module
        docstring). Its reply, the send time that got it and the connection it came on
        (``Session.link``). ``first``: how the caller's own first send failed (its
        reply, if that one is what answers, is dated from here)."""
        loop = asyncio.get_running_loop()
        backoff: Backoff | None = None  # made on the first failure: most settle at once
        failure: UnavailableError | None = None
        redirects = 0  # MOVED answers in a row
        while True:
            if failure is not None:
                await self._reach_before_deadline(failure)
            session = self._session
            sent_at = loop.time()
            link = session.link
            try:
                if first is not None:  # the caller's first send: handled as if made here
                    failed, first = first, None
                    raise failed
                if take_next:
                    # Cancelled while the reply is on its way: its next deliveries go back.
                    reply = await session.request_cancellable(
                        op, args, withdraw=False,
                        give_back=functools.partial(_requeue_orphan, session, self.scope_id),
                    )
                else:
                    reply = await session.request(op, args)
                return reply, sent_at, link
            except Moved as exc:  # the lease moved with its run: sent at once where it is
                redirects += 1
                await session.follow_moved(exc, redirects)  # raised past MAX_REDIRECTS
                self._follow_to(session.moved_to(self.scope_id))
                failure = None
            except UnavailableError as exc:
                left = self.lease.lost_at - loop.time()
                if op == Op.DELIVERY_RELEASE or session.closed or left <= 0:
                    raise
                failure = exc
                redirects = 0
                if backoff is None:
                    backoff = Backoff(0.05, 1.0)
                await asyncio.sleep(min(backoff.next_pause(), left))

    def _follow_to(self, session: Session) -> None:
        """The delivery's run is on ``session``'s shard now (its old one answered MOVED):
        its lease is kept, and it is settled, there from now on."""
        if session is not self._session:
            rebind(self.lease, session.keeper)
            self._session = session

    async def _reach_before_deadline(self, failure: UnavailableError) -> None:
        """Before a settlement is sent again: be connected while the lease's deadline is
        still ahead, else raise ``failure`` (its outcome unknown). rsd answers a resent
        settlement as the first only while it remembers it (one lease from when it was
        made): one that reached it later could be refused (STALE_CLAIM) though it was
        applied, and the worker told its result was refused when it is the task's."""
        loop = asyncio.get_running_loop()
        session = self._session
        pause = Backoff(0.05, 1.0)
        while (left := self.lease.lost_at - loop.time()) > 0:
            try:
                async with asyncio.timeout(left):
                    await session.connect()
            except TimeoutError:
                break
            except UnavailableError as exc:  # (an attempt under way failed): again
                if session.closed:
                    raise
                failure = exc
                await asyncio.sleep(min(pause.next_pause(), left))
                continue
            if loop.time() < self.lease.lost_at:
                return  # connected in time: the resend goes out now
        raise failure
