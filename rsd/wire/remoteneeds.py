"""Needs homed on another shard, the shell's half (issue 32): this shard's primary acts as
a client of the pools' and quotas' shard for its tasks (core/work/grants.py is the core's
half and states the contract).

How a grant is had. The pools' shard already takes a piece of work's capacity all at
once, under its FIFO rules, without polling, and holds it under a delivery's lease: so
an ask is a task on that shard (a hold task), needing the task's needs. For each hold
run (one per pool's or quota's ``{tag}``, ``hold_run``: in the slot of the needs' first
name, so on their shard; named after this shard) this primary keeps one connection
(``Link``) to that shard's primary, authenticated with the cluster token; it ensures
the run and the mailbox ``HOLD_MAILBOX`` (one attempt per item), and
- sends each ask as TASK_SUBMIT with ``key`` = ``hold_key`` (this shard, the item, the
  grant's number): a resend (a lost answer, a new primary of either shard) is the same
  task there, so one grant's quota is spent once;
- receives that queue (RECEIVE wait, a batch at a time, lease ``RemoteNeeds.lease``):
  a delivery is a grant, its lease handle the grant's; ``Core.grant_held`` journals it
  (GRANT_HELD) before the task it allows is delivered, or says it is stale (the item
  ended, or was answered already), and the delivery is completed at once (released);
- renews every grant the core holds (LEASE_RENEW, every third of the lease); a renewal
  answered STALE_CLAIM, a LEASE_LOST pushed for a grant, or a grant whose last renewal
  answered was sent almost a lease ago (``RemoteNeeds._check``: the holder gives up a
  tenth of a lease before its shard may give the capacity to another) is a lapse:
  ``Core.grant_lapsed`` ends the delivery it allows;
- completes (releases) every grant the core no longer holds (its delivery ended).
A hold task has one attempt: a grant that lapsed fails there, never delivered again,
so a lapsed grant spends nothing more. A resend answered with a hold task already
delivered elsewhere (to a connection gone with an old primary, or a link that failed
before the delivery reached it) is a grant lost: once that task has ended there, the
core abandons the ask and asks for the next number (``Core.grant_abandoned``). Its
quota was spent for nothing: the one cost of a takeover at that moment.

A link that fails (its primary killed, a takeover, a network fault) is made again to the
primary the slot map names, then renews its grants there at once (a renewal is
tenant-scoped: any connection may renew) and sends its unanswered asks again (the same
keys). A new primary of this shard starts with the grants it replayed and renews them.
Hold tasks are kept on the pools' shard for its result retention, as any task.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Any, Protocol

import rsproto as wire
from rsproto import Kind, Limits, Op, Push
from rsproto.slots import hash_tag, slot_of

from .. import __version__

if TYPE_CHECKING:
    from ..core import Core
    from ..core.work.grants import Ask
    from ..slotowner import SlotOwner

__all__ = [
    "GRANT_LEASE_SECONDS", "HOLD_MAILBOX", "NeedsHost", "RemoteNeeds", "hold_key", "hold_run",
]

log = logging.getLogger("rsd")

HOLD_MAILBOX = "rsd.needs"  # the mailbox of hold messages, on every shard that has pools
# A grant's lease on the pools' shard, renewed every third: at least three cluster
# leases, so that it outlives a takeover of either shard (``RemoteNeeds.lease``). Two of
# the protocol's shortest leases; in rsd's own tests (--test-min-lease-seconds) two of
# the lowered one, so that a grant not renewed lapses as soon as three cluster leases allow.
GRANT_LEASE_SECONDS = 2 * float(Limits.MIN_LEASE_SECONDS)
_RETRY_SECONDS = 1.0  # a link's pause before it connects again, or sends a refused ask again
_REPLY, _ERROR, _PUSH = int(Kind.REPLY), int(Kind.ERROR), int(Kind.PUSH)
_LEASE_LOST = int(Push.LEASE_LOST)


def hold_run(shard: str, name: str) -> str:
    """The run on the shard of pool or quota ``name`` that holds this shard's asks: in
    the slot of ``name``'s tag."""
    return "{" + hash_tag(name).decode() + "}rsd.needs." + shard


def hold_key(shard: str, item_id: str, seq: int) -> str:
    """The work key of ask ``seq`` of ``item_id`` of this shard (the hold key)."""
    return f"{shard}/{item_id}/{seq}"


def parse_hold_key(key: Any, shard: str) -> tuple[str, int] | None:
    """(item id, seq) of a hold key of ``shard``; None for anything else."""
    if not isinstance(key, str):
        return None
    head, _, rest = key.partition("/")
    item_id, _, seq = rest.rpartition("/")
    if head != shard or not item_id or not seq.isdigit():
        return None
    return item_id, int(seq)


class NeedsHost(Protocol):
    """What the links use of the server (server.py's ``Server`` is one)."""

    core: Core
    loop: asyncio.AbstractEventLoop
    slots: SlotOwner
    cluster_lease_seconds: int | None

    def schedule_flush(self) -> None: ...


class LinkDown(Exception):
    """The link's connection failed, or its shard answered with an error."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class Link:
    """This primary's connection to the shard holding one hold run."""

    def __init__(self, needs: RemoteNeeds, run: str) -> None:
        self.needs = needs
        self.run = run
        self.asks: dict[str, Ask] = {}  # hold key -> an ask not yet delivered as a grant
        self.unsent: list[str] = []  # hold keys to send
        self.grants: set[bytes] = set()  # handles of the grants this link holds
        self.releases: set[bytes] = set()  # handles to give back (sent again if the link fails)
        # hold keys its shard answered as submitted before and already delivered or
        # ended: their end is awaited, and then they are abandoned (``_await_end``)
        self.replayed: set[str] = set()
        self.task_ids: dict[str, str] = {}  # hold key -> its hold task's id there
        # grant handle -> until when it is surely live there: the send time of the call
        # that granted or last renewed it, plus its lease (``RemoteNeeds._check``)
        self.sure_until: dict[bytes, float] = {}
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.calls: dict[int, asyncio.Future[Any]] = {}
        self.next_id = 1
        self.wake = asyncio.Event()
        self.task = asyncio.get_running_loop().create_task(self._run(), name=f"needs {run}")

    def ask(self, ask: Ask) -> None:
        key = hold_key(self.needs.shard, ask.item_id, ask.seq)
        if key not in self.asks:
            self.asks[key] = ask
            self.unsent.append(key)
            self.wake.set()

    # ---- the connection ---------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            try:
                await self._connect()
                await self._serve()
            except (LinkDown, OSError, TimeoutError, wire.FrameError) as exc:
                log.warning("needs of another shard: the link for run %s failed (%s); "
                            "connecting again", self.run, exc)
            except Exception:  # an answer of an unexpected shape: logged, never the end
                log.exception("needs of another shard: the link for run %s failed; "
                              "connecting again", self.run)
            finally:
                self._close()
            await asyncio.sleep(_RETRY_SECONDS)

    async def _connect(self) -> None:
        needs = self.needs
        address = needs.address_of(self.run)
        if address is None:
            raise LinkDown("UNAVAILABLE", "the shard has no primary now")
        host, _, port = address.rpartition(":")
        reader, self.writer = await asyncio.wait_for(asyncio.open_connection(
            host, int(port), ssl=needs.tls,
            server_hostname=host if needs.tls is not None else None), needs.timeout)
        self.reader = reader
        asyncio.get_running_loop().create_task(self._read(reader), name="needs reader")
        hello: dict[str, Any] = {"version": wire.PROTOCOL_VERSION, "client": f"rsd/{__version__}",
                                 "holder": f"needs:{needs.shard}"}
        if needs.token is not None:
            hello["token"] = needs.token
        await self.call(Op.HELLO, hello)
        await self.call(Op.SCOPE_CREATE, {"scope": self.run})
        await self.call(Op.MAILBOX_ENSURE, {"name": HOLD_MAILBOX, "max_attempts": 1})
        self.unsent = list(self.asks)  # sent again: the same keys
        if self.grants:
            await self._renew()

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        receiver = loop.create_task(self._receive(), name="needs receive")
        try:
            while not receiver.done():
                self.wake.clear()
                while self.unsent:
                    await self._send(self.unsent.pop(0))
                held = self.needs.held_handles()
                for handle in [h for h in self.grants if h not in held]:
                    self.grants.discard(handle)
                    self.sure_until.pop(handle, None)
                    self.releases.add(handle)
                for handle in list(self.releases):
                    await self._release(handle)
                    self.releases.discard(handle)
                await self._cancel_ended()
                if self.needs.renew_due(self):
                    await self._renew()
                waker = loop.create_task(self.wake.wait())
                await asyncio.wait((waker, receiver), timeout=self.needs.lease / 3,
                                   return_when=asyncio.FIRST_COMPLETED)
                waker.cancel()
            receiver.result()  # its failure, raised here
        finally:
            receiver.cancel()

    def _close(self) -> None:
        for future in self.calls.values():
            if not future.done():
                future.set_exception(LinkDown("UNAVAILABLE", "the connection closed"))
        self.calls.clear()
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def call(self, op: int, args: dict[str, Any], timeout: float | None = None) -> Any:
        """One request and its answer (LinkDown for an error or no answer)."""
        if self.writer is None:
            raise LinkDown("UNAVAILABLE", "not connected")
        rid, self.next_id = self.next_id, self.next_id + 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.calls[rid] = future
        self.writer.write(wire.request_frame(rid, int(op), args))
        try:
            return await asyncio.wait_for(future, timeout or self.needs.timeout)
        finally:
            self.calls.pop(rid, None)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        decoder = wire.Decoder(wire.MAX_FRAME_BYTES, "frame")
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                for msg in decoder.feed(data):
                    self._dispatch(msg)
        except (OSError, wire.FrameError):
            pass
        finally:
            if self.reader is reader:
                self._close()

    def _dispatch(self, msg: Any) -> None:
        if type(msg) is not list or len(msg) < 3:
            return
        if msg[0] == _PUSH:
            body = msg[2]
            if msg[1] == _LEASE_LOST and isinstance(body, dict):
                self._lapsed(body.get("lease"))
            return
        future = self.calls.get(msg[1])
        if future is None or future.done():
            return
        if msg[0] == _ERROR:
            future.set_exception(LinkDown(str(msg[2]), str(msg[3]) if len(msg) > 3 else ""))
        else:
            future.set_result(msg[2])

    # ---- asks, grants, renewals, releases -------------------------------------------

    async def _send(self, key: str) -> None:
        ask = self.asks.get(key)
        if ask is None:
            return
        args = {"scope": self.run, "mailbox": HOLD_MAILBOX, "data": None, "key": key,
                "needs": {"pools": list(ask.pools), "quotas": dict(ask.quotas)}}
        try:
            view = await self.call(Op.TASK_SUBMIT, args)
            self.task_ids[key] = str(view.get("id"))
            # Submitted before, by an old primary or on a connection gone, and delivered
            # there: that grant is lost (nobody renews it): once it has lapsed (one
            # attempt: never delivered again), the core asks for the next.
            if not view.get("created", True) and view.get("state") != "PENDING" \
                    and key not in self.replayed:
                self.replayed.add(key)
                asyncio.get_running_loop().create_task(
                    self._await_end(key, str(view.get("id"))), name="needs lost grant")
        except LinkDown as exc:
            if exc.code == "UNAVAILABLE" or exc.code in ("NOT_PRIMARY", "MOVED"):
                raise
            # its pool or quota does not exist there (yet), an amount over a limit: the
            # task waits, and the ask is sent again later
            log.warning("needs of another shard: the ask for task %s was refused (%s); "
                        "asking again in %.3g s", ask.item_id, exc, 5 * _RETRY_SECONDS)
            asyncio.get_running_loop().call_later(5 * _RETRY_SECONDS, self._again, key)

    async def _await_end(self, key: str, task_id: str) -> None:
        """The hold task of ``key``, delivered to a connection that is gone, ended (or
        had): the core asks for the next grant. A failed link leaves it to the resend."""
        try:
            while key in self.asks:
                view = await self.call(Op.TASK_RESULT, {"scope": self.run, "task": task_id,
                                                        "timeout_ms": 60_000}, timeout=70.0)
                if view.get("state") in ("SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"):
                    ask = self.asks.pop(key, None)
                    if ask is not None:
                        self.needs.abandon(ask.item_id, ask.seq)
                    return
        except (LinkDown, TimeoutError):
            return
        finally:
            self.replayed.discard(key)

    def _again(self, key: str) -> None:
        if key in self.asks:
            self.unsent.append(key)
            self.wake.set()

    async def _receive(self) -> None:
        args = {"scope": self.run, "mailbox": HOLD_MAILBOX, "wait": True, "timeout_ms": 20_000,
                "max": 64, "lease_seconds": self.needs.lease}
        loop = asyncio.get_running_loop()
        while True:
            sent = loop.time()
            answer = await self.call(Op.RECEIVE, args, timeout=30.0)
            for delivery in answer.get("deliveries", ()):
                await self._granted(delivery, sent + self.needs.lease)

    async def _granted(self, delivery: dict[str, Any], sure_until: float) -> None:
        handle = delivery.get("lease")
        parsed = parse_hold_key(delivery.get("key"), self.needs.shard)
        if not isinstance(handle, bytes):
            return
        key = delivery.get("key")
        if isinstance(key, str):
            self.asks.pop(key, None)
            self.task_ids.pop(key, None)
        if parsed is not None and self.needs.granted(parsed[0], parsed[1], handle):
            self.grants.add(handle)
            self.sure_until[handle] = sure_until
        else:
            await self._release(handle)

    async def _cancel_ended(self) -> None:
        """The asks of tasks that ended meanwhile (cancelled, their deadline passed) are
        cancelled there, so that no capacity is taken for them."""
        for key, ask in list(self.asks.items()):
            if not self.needs.ended(ask.item_id):
                continue
            del self.asks[key]
            task_id = self.task_ids.pop(key, None)
            if task_id is None:
                continue
            try:
                await self.call(Op.TASK_CANCEL, {"scope": self.run, "task": task_id,
                                                 "reason": "the task that asked ended"})
            except LinkDown as exc:
                if exc.code == "UNAVAILABLE":
                    raise
                # ended there already: its grant, if any, is released when it comes

    async def _renew(self) -> None:
        handles = list(self.grants)
        self.needs.renewed(self)
        if not handles:
            return
        sent = self.needs.now()
        answer = await self.call(Op.LEASE_RENEW, {"leases": handles})
        for handle, result in zip(handles, answer.get("results", ()), strict=False):
            if result == "STALE_CLAIM":
                self._lapsed(handle)
            elif result is None and handle in self.grants:
                self.sure_until[handle] = sent + self.needs.lease

    async def _release(self, handle: bytes) -> None:
        try:
            await self.call(Op.DELIVERY_COMPLETE, {"lease": handle})
        except LinkDown as exc:
            if exc.code == "UNAVAILABLE":
                raise
            # STALE_CLAIM: it ended there already (lapsed): nothing is held

    def _lapsed(self, handle: Any) -> None:
        """The grant ``handle`` is lost, or may be (its renewal was not answered in
        time): the delivery it allows ends; it is released there if it still lives."""
        if isinstance(handle, bytes) and handle in self.grants:
            self.grants.discard(handle)
            self.sure_until.pop(handle, None)
            self.releases.add(handle)
            self.wake.set()
            self.needs.lapsed(handle)


class RemoteNeeds:
    """The links of one primary to the shards its tasks' needs live on. Made by the
    Server; started by the first ask or grant the core has (``kick``)."""

    def __init__(self, server: NeedsHost) -> None:
        self.server = server
        # Set by the cluster side, as SlotMoves' (clustermode.py): the cluster token and
        # the TLS context this node reaches another primary with.
        self.token: str | None = None
        self.tls: ssl.SSLContext | None = None
        self.links: dict[str, Link] = {}
        self.changes = -1  # the core's ``Grants.changes`` last looked at
        self.renew_at: dict[str, float] = {}
        self.watch: asyncio.TimerHandle | None = None  # ``_check``'s next call

    @property
    def shard(self) -> str:
        return self.server.slots.shard

    @property
    def timeout(self) -> float:
        return 2.0 * float(self.server.cluster_lease_seconds or 5)

    @property
    def lease(self) -> float:
        """A grant's lease: ``GRANT_LEASE_SECONDS`` (scaled down with a test's lowered
        minimum lease), or three cluster leases if longer."""
        shortest = self.server.core.tables.min_lease_seconds / Limits.MIN_LEASE_SECONDS
        return max(GRANT_LEASE_SECONDS * min(1.0, shortest),
                   3.0 * float(self.server.cluster_lease_seconds or 0))

    def now(self) -> float:
        return self.server.loop.time()

    def kick(self) -> None:
        """After a flush: new asks go to their links; releases and renewals of grants
        the core holds are started (the first call after a takeover adopts them)."""
        grants = self.server.core.blocked.grants
        for ask in grants.take_asks():
            self._link(ask.pools[0] if ask.pools else ask.quotas[0][0]).ask(ask)
        if grants.changes != self.changes:
            first = self.changes < 0
            self.changes = grants.changes
            if first:
                self._adopt()
            for link in self.links.values():
                link.wake.set()

    def _adopt(self) -> None:
        """The grants the core holds when this primary starts: their links renew them."""
        core = self.server.core
        for item_id, grant in core.blocked.grants.held.items():
            item = core.work.items.get(item_id)
            if item is None or item.needs is None:
                continue
            needs = item.needs
            link = self._link(needs.pools[0] if needs.pools else needs.quotas[0][0])
            link.grants.add(grant.handle)
            # (renewed at once on the link's connection; its old primary renewed it last
            # at most a third of a lease before it died, as far as this one knows)
            link.sure_until[grant.handle] = self.now() + self.lease

    def _link(self, name: str) -> Link:
        run = hold_run(self.shard, name)
        link = self.links.get(run)
        if link is None:
            link = self.links[run] = Link(self, run)
        if self.watch is None:
            self.watch = self.server.loop.call_later(self.lease / 10, self._check)
        return link

    def _check(self) -> None:
        """Every tenth of a lease: a grant not renewed in time (its shard unreachable,
        paused, cut off) ends the delivery it allows a tenth of a lease before that
        shard may give its capacity to another: the holder gives up first, as a lease's
        holder must."""
        margin = self.lease / 10
        now = self.now()
        for link in list(self.links.values()):
            for handle, until in list(link.sure_until.items()):
                if now >= until - margin:
                    log.warning("needs of another shard: a grant of run %s was not renewed "
                                "in time; the delivery it allows ends", link.run)
                    link._lapsed(handle)
        self.watch = self.server.loop.call_later(margin, self._check)

    def address_of(self, run: str) -> str | None:
        slot_map = self.server.slots.map
        return slot_map.primaries.get(slot_map.owner(slot_of(run, slot_map.slots)))

    def ended(self, item_id: str) -> bool:
        """Whether the task ``item_id`` of this shard ended (or is gone)."""
        item = self.server.core.work.items.get(item_id)
        return item is None or item.terminal

    def held_handles(self) -> set[bytes]:
        return {grant.handle for grant in self.server.core.blocked.grants.held.values()}

    def granted(self, item_id: str, seq: int, handle: bytes) -> bool:
        server = self.server
        ok = server.core.grant_held(server.loop.time(), item_id, seq, handle, self.lease)
        server.schedule_flush()
        return ok

    def abandon(self, item_id: str, seq: int) -> None:
        server = self.server
        if server.core.grant_abandoned(server.loop.time(), item_id, seq):
            log.warning("needs of another shard: ask %d of task %s brought no grant (one lost "
                        "in a takeover); asking for the next", seq, item_id)
        server.schedule_flush()

    def lapsed(self, handle: bytes) -> None:
        server = self.server
        server.core.grant_lapsed(server.loop.time(), handle)
        server.schedule_flush()

    def renew_due(self, link: Link) -> bool:
        return self.server.loop.time() >= self.renew_at.get(link.run, 0.0)

    def renewed(self, link: Link) -> None:
        self.renew_at[link.run] = self.server.loop.time() + self.lease / 3

    def stop(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
            self.watch = None
        for link in self.links.values():
            link.task.cancel()
            link._close()
        self.links.clear()
