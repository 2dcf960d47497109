"""The manual loop's receives, batched as ``consume()`` batches them, behind the same API.

``mailbox.receive()`` called from many coroutines of one client costs what
``consume()``'s one batched RECEIVE costs, without a change to the call: the non-waiting
``receive()`` calls made on one queue (scope, mailbox, lease length) in one loop turn go
to rsd as one RECEIVE with ``max`` = their number (at most ``max_receive_batch``), and
its deliveries are handed to them in call order; a call that gets none returns None, as
it would have alone. (Settling with ``next`` for the following receive() was measured
too and dropped: with receives batched it saved one RECEIVE per batch and cost a look
at the queue per settlement, and it kept deliveries nobody had asked for yet.)

What always holds:
- each delivery of a batched RECEIVE goes to exactly one caller; one whose caller gave
  up before it came is given back to the queue at once, untouched (DELIVERY_RELEASE:
  its attempt is not used);
- a batched RECEIVE that fails (a lost connection, a refusal) is made again by each of
  its callers on its own, as before, with its own error and failover rules; so is a
  receive() made while the client is not connected;
- waiting receives (``wait=True``) are sent one request each, as they were: a parked
  batch would be served only with what is ready at that moment.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from .deliveries import Delivery, _bodies, _deliveries, receive
from .wire import Limits, Op

if TYPE_CHECKING:
    from .session import Session

__all__ = ["Receives"]

_Key = tuple[str, str, float]  # scope, mailbox, lease seconds
_AGAIN: Any = object()  # a batched RECEIVE failed: the caller receives on its own


class Receives:
    """One client's batched receives, per queue."""

    __slots__ = ("_batches", "_session")

    def __init__(self, session: Session) -> None:
        self._session = session
        self._batches: dict[_Key, list[asyncio.Future[Any]]] = {}

    async def receive(
        self, scope: str, mailbox: str, lease_seconds: float, wait: bool, timeout_ms: int
    ) -> Delivery | None:
        """``Mailbox.receive``: a delivery from a batched RECEIVE (or, waiting, from a
        RECEIVE of its own)."""
        if not wait and self._session.connected:
            key = (scope, mailbox, lease_seconds)
            loop = asyncio.get_running_loop()
            batch = self._batches.get(key)
            if batch is None:
                batch = self._batches[key] = []
                loop.call_soon(self._send, key, batch)
            waiter: asyncio.Future[Any] = loop.create_future()
            batch.append(waiter)
            try:
                got = await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():  # came just before: give back
                    self._give_back(waiter.result())
                raise
            if got is not _AGAIN:
                return got  # type: ignore[no-any-return]
        return await receive(
            self._session, scope, mailbox, lease_seconds, wait, timeout_ms, auto_renew=False
        )

    def _send(self, key: _Key, batch: list[asyncio.Future[Any]]) -> None:
        """The loop turn is over: one RECEIVE for every receive() of it on ``key``."""
        if self._batches.get(key) is batch:
            del self._batches[key]
        scope, mailbox, lease_seconds = key
        wanted = min(len(batch), Limits.MAX_RECEIVE_BATCH)
        args: dict[str, Any] = {
            "scope": scope, "mailbox": mailbox, "lease_seconds": lease_seconds, "wait": False,
        }
        if len(batch) > 1:
            args["max"] = wanted
        session = self._session
        sent_at = asyncio.get_running_loop().time()
        fut = session.send_nowait(Op.RECEIVE, args)
        if fut is None:  # not connected: each receives on its own (and connects)
            _finish(batch)
            return
        fut.add_done_callback(lambda done: self._answered(key, batch, done, sent_at))

    def _answered(
        self, key: _Key, batch: list[asyncio.Future[Any]], done: asyncio.Future[Any],
        sent_at: float,
    ) -> None:
        if done.cancelled() or done.exception() is not None:
            _finish(batch)
            return
        scope, mailbox, _ = key
        got = _deliveries(self._session, scope, mailbox, _bodies(done.result()), sent_at,
                          False)
        given = 0
        for waiter in batch[:Limits.MAX_RECEIVE_BATCH]:
            if waiter.done():  # its caller gave up: nothing for it
                continue
            if given < len(got):
                waiter.set_result(got[given])
                given += 1
            else:
                waiter.set_result(None)
        for extra in got[given:]:  # nobody left to take it
            self._give_back(extra)
        if len(batch) > Limits.MAX_RECEIVE_BATCH:  # (over one RECEIVE's bound: again)
            _finish(batch[Limits.MAX_RECEIVE_BATCH:])

    def _give_back(self, got: Any) -> None:
        """A delivery whose caller gave up: back to the queue at once, untouched."""
        if isinstance(got, Delivery):
            got.abandon()  # (not renewed, nothing more sent for it here)
            self._session.send_nowait(Op.DELIVERY_RELEASE, {"lease": got.lease.handle})


def _finish(batch: list[asyncio.Future[Any]]) -> None:
    """Each caller of a batch that got no answer receives on its own."""
    for waiter in batch:
        if not waiter.done():
            waiter.set_result(_AGAIN)
