"""What rsd keeps in etcd, and nothing else: ``EtcdStore``.

Under a shard's prefix: ``/rsd/<cluster>/`` for the default shard (nodes started
without ``--shard``: today's clusters keep their keys), ``/rsd/<cluster>/shards/NAME/``
for shard NAME. Each shard is an HA group of its own (its own leader, epoch, sync
standby, members); the default shard's view skips the keys under its prefix that are
not its own (``shards/...``, and ``slotmap``, which slotmap.py keeps):
- ``leader``: the primary's node name, bound to that node's lease: it lasts while the
  node keeps its lease alive and goes with the lease;
- ``epoch``: an integer in ASCII, one more at each takeover: written only in the
  transaction that creates a ``leader`` key;
- ``sync``: the name of the synchronous standby (no lease: it outlives the leader that
  named it, so the next one knows who held every acknowledged change);
- ``last_leader``: the node that won the current epoch (no lease: written with the epoch),
  so a primary that restarts knows that nobody has led since it did;
- ``members/<node>``: a small JSON object (``name``, ``address`` "HOST:PORT", ``role``,
  and what the node adds), bound to the node's lease, so a dead node disappears.

What always holds:
- one lease per node at a time (``open_lease``); the member record and, while this node
  leads, the leader key are bound to it;
- a campaign is one transaction: if the leader key is absent and the epoch has not moved
  since it was read, put epoch + 1 and the leader key. Two nodes never both win, and each
  win has an epoch greater than every earlier one;
- a leader's writes (``name_sync``, ``step_down``) are guarded in the same transaction:
  the leader key holds this node's name and was created by this store's campaign (its
  create revision). A later run of a node of the same name, whose old key has not yet
  expired, is not the leader that key names;
- time is leaseclock.py's (the loop's clock plus any time the machine was suspended). A keep-alive
  counts from the moment it was sent: ``lease_deadline`` is the send time of the last
  answered grant or keep-alive + the TTL etcd granted - ``margin``; etcd's own lease ends
  later than that (it starts counting when it receives the request). It never moves back;
- every call has a deadline (``call_timeout``: by default derived from the lease,
  options.call_timeout_for says how and why); a call that gets no answer raises
  ``EtcdError`` and changes nothing here;
- ``watch`` yields a fresh ``ClusterView`` at each change under the prefix, for as long
  as it is iterated: a broken stream (a member killed, hung, or restarted) is followed by
  a new read and a new watch from the revision after it, so a change is never missed,
  though changes that came and went while the stream was down are seen as their result.
  A store's watches are asked for one at a time, as aetcd sends them: the call timeout
  of each counts from its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import aetcd
import grpc

from rsproto.slots import DEFAULT_SHARD

from . import leaseclock
from .client import EtcdClient, EtcdError, Link
from .options import (
    LEASE_MARGIN,
    LEASE_SECONDS,
    NAME_RULE,
    EtcdTls,
    call_timeout_for,
    grpc_target,
    valid_name,
)

__all__ = ["ClusterView", "EtcdStore", "cluster_prefix", "member_record", "shard_prefix"]

log = logging.getLogger("rsd")

T = TypeVar("T")


class _View(Protocol):
    """What ``EtcdStore.watching`` reads: the etcd revision it was read at, and whether
    another read holds the same state."""

    @property
    def revision(self) -> int: ...

    def same_state(self, other: Any) -> bool: ...


V = TypeVar("V", bound=_View)

WATCH_RETRY_SECONDS = 0.2  # between attempts to watch again while etcd cannot be reached
# Round trips a new connection takes before its first call can go (TCP's, HTTP/2's
# settings, TLS's handshake): ``connect`` gives it as many call timeouts.
CONNECT_ROUND_TRIPS = 3
SHARDS = b"shards/"  # under the cluster's prefix: one folder of keys per named shard
SLOTMAP = b"slotmap"  # under the cluster's prefix: the slot map (slotmap.py)


def cluster_prefix(cluster: str) -> bytes:
    """Every key of cluster ``cluster`` is under this prefix."""
    return f"/rsd/{cluster}/".encode()


def shard_prefix(cluster: str, shard: str | None) -> bytes:
    """The keys of shard ``shard`` (None: the default shard, whose keys are today's)."""
    base = cluster_prefix(cluster)
    if shard is None or shard == DEFAULT_SHARD:
        return base
    return base + SHARDS + shard.encode() + b"/"


def _not_its_own(name: bytes) -> bool:
    """Whether ``name`` (a key under the default shard's prefix, the prefix cut off)
    belongs to another shard or to the slot map, not to the default shard."""
    return name.startswith(SHARDS) or name == SLOTMAP


@dataclass(frozen=True)
class ClusterView:
    """Everything under the prefix, as read at one etcd revision."""

    revision: int
    leader: str | None = None
    leader_lease: int = 0  # the leader key's lease id, 0 without a leader
    leader_revision: int = 0  # the leader key's create revision: one per term
    epoch: int = 0
    sync: str | None = None
    last_leader: str | None = None  # the node that won ``epoch``
    members: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def address_of(self, node: str | None) -> str | None:
        """The address ``node`` registered, or None."""
        record = self.members.get(node) if node is not None else None
        address = record.get("address") if record is not None else None
        return address if isinstance(address, str) else None

    def same_state(self, other: ClusterView | None) -> bool:
        """Whether ``other`` holds the same keys and values (whatever its revision)."""
        return other is not None and (
            self.leader, self.leader_lease, self.leader_revision, self.epoch, self.sync,
            self.last_leader, self.members,
        ) == (
            other.leader, other.leader_lease, other.leader_revision, other.epoch, other.sync,
            other.last_leader, other.members,
        )


class EtcdStore:
    """rsd's keys of shard ``shard`` (None or ``DEFAULT_SHARD``: the default shard, under
    ``/rsd/<cluster>/``) for node ``node`` (see the module docstring).

    ``endpoints``: every etcd member's ``HOST:PORT`` (ValueError if no gRPC target can
    hold them: see ``options.grpc_target``). ``lease_seconds``: the TTL asked for
    (etcd may grant more: it has a floor of about 1.5 election timeouts). ``margin``: how
    much earlier than send time + TTL the leadership deadline falls. ``call_timeout``:
    how long each call waits for its answer (None: ``options.call_timeout_for`` the lease
    and the margin, which is also how far etcd may be).
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        cluster: str,
        node: str,
        *,
        lease_seconds: int = LEASE_SECONDS,
        call_timeout: float | None = None,
        margin: float = LEASE_MARGIN,
        tls: EtcdTls | None = None,
        shard: str | None = None,
    ) -> None:
        shard = DEFAULT_SHARD if shard is None else shard
        for what, name in (("cluster", cluster), ("node", node), ("shard", shard)):
            if not valid_name(name):
                raise ValueError(f"{what} name {name!r}: {NAME_RULE}")
        if not 0 <= margin < lease_seconds:
            raise ValueError("the margin must be at least 0 and less than the lease")
        grpc_target(endpoints)  # ValueError now rather than at the first call
        self.endpoints = list(endpoints)
        self.cluster = cluster
        self.node = node
        self.lease_seconds = lease_seconds
        self.call_timeout = (call_timeout if call_timeout is not None
                             else call_timeout_for(lease_seconds, margin))
        self.margin = margin
        self.tls = tls
        self.shard = shard
        self.cluster_prefix = cluster_prefix(cluster)
        self.prefix = shard_prefix(cluster, shard)
        self._default = self.prefix == self.cluster_prefix  # its prefix holds others' keys
        self._leader_key = self.prefix + b"leader"
        self._epoch_key = self.prefix + b"epoch"
        self._sync_key = self.prefix + b"sync"
        self._members = self.prefix + b"members/"
        self._link = Link(endpoints, self.call_timeout, tls, f"cluster {cluster}: {node}")
        self._closed = False
        self._lease: int | None = None
        self._leader_revision: int | None = None
        # The sync key's mod revision as last seen by this store (0: absent; None: not
        # known, read before the next write).
        self._sync_revision: int | None = None
        self._member: dict[str, Any] | None = None
        self.lease_deadline = -math.inf
        self.watch_breaks = 0  # watches lost and made again (a member died, hung...)
        # aetcd makes one watch at a time on a channel (the next request waits for the
        # last one's answer): each of this store's watches (the cluster's keys, the slot
        # map) is asked for in its turn, so its call timeout covers its own round trip.
        self._watch_turn = asyncio.Lock()

    def __repr__(self) -> str:
        of = self.cluster if self._default else f"{self.cluster}/{self.shard}"
        return f"<EtcdStore {self.node} of {of} on {','.join(self.endpoints)}>"

    @property
    def lease_id(self) -> int | None:
        """This node's etcd lease, None before ``open_lease`` and once it is gone."""
        return self._lease

    @property
    def channel_moves(self) -> int:
        """How often the channel moved on to the next member (client.py: ``Link``)."""
        return self._link.moves

    @property
    def leader_revision(self) -> int | None:
        """The create revision of the leader key this store's campaign made, while it
        may still exist; None otherwise."""
        return self._leader_revision

    # ---- the connection and the lease ----------------------------------------------------

    async def connect(self) -> None:
        """Open the channel, wait for its connection to a member (``CONNECT_ROUND_TRIPS``
        call timeouts at most: with etcd far away, a first call on a new connection would
        outlast its timeout), and grant this node's lease (``open_lease``)."""
        await self.call(self.channel().ready(), "a connection",
                         CONNECT_ROUND_TRIPS * self.call_timeout)
        await self.open_lease()

    async def close(self) -> None:
        """Close the channel, for good. The lease is left to expire, as if this node had
        died (``resign`` ends it at once)."""
        self._closed = True
        await self._link.close()

    def channel(self) -> EtcdClient:
        """The client on the channel now (slotmap.py reads through it too)."""
        if self._closed:
            raise EtcdError(f"{self!r} is closed")
        return self._link.client()

    async def call(self, call: Awaitable[T], what: str, timeout: float | None = None) -> T:
        """``call``'s answer within ``timeout`` (the call timeout); ``EtcdError`` naming
        ``what`` otherwise (and the channel told, so it may move to the next member)."""
        # asyncio.timeout, not wait_for: Python 3.11's wait_for loses a cancellation that
        # comes as the call completes, and the task that was told to stop runs on.
        timeout = self.call_timeout if timeout is None else timeout
        try:
            async with asyncio.timeout(timeout):
                answer = await call
        except TimeoutError:
            why = f"etcd did not answer {what} within {timeout:.3g} s"
            self._link.failed(why)
            raise EtcdError(why) from None
        except (aetcd.ClientError, grpc.RpcError, grpc.aio.BaseError) as exc:
            why = f"etcd refused {what}: {exc}"
            self._link.failed(why)
            raise EtcdError(why) from exc
        self._link.succeeded()
        return answer

    async def open_lease(self) -> float:
        """Grant a new lease for this node (the one before, if any, is revoked) and put
        the member record again if one was registered; the new ``lease_deadline``."""
        client = self.channel()
        if self._lease is not None:
            old, self._lease, self._leader_revision = self._lease, None, None
            with contextlib.suppress(EtcdError):  # if not, it expires by itself
                await self.call(client.revoke_lease(old), "a lease revocation")
        self.lease_deadline = -math.inf
        sent = leaseclock.now()
        lease = await self.call(client.lease(self.lease_seconds), "a lease grant")
        self._lease = int(lease.id)
        self.lease_deadline = sent + int(lease.ttl) - self.margin
        if self._member is not None:
            await self._put_member()
        return self.lease_deadline

    async def keep_alive(self) -> float | None:
        """Refresh the lease; the deadline until which this node may act as leader (the
        time this request was sent + TTL - margin), or None if the lease is gone (expired,
        revoked, or never granted: the leader key, if it was ours, went with it)."""
        if self._lease is None:
            return None
        lease, sent = self._lease, leaseclock.now()
        reply = await self.call(self.channel().refresh_lease(lease), "a keep-alive")
        if reply is None:
            raise EtcdError("etcd closed the keep-alive stream without an answer")
        if self._lease != lease:  # a new lease was granted meanwhile: this one is over
            return None
        if reply.TTL <= 0:
            self._lease = self._leader_revision = None
            self.lease_deadline = -math.inf
            return None
        self.lease_deadline = max(self.lease_deadline, sent + int(reply.TTL) - self.margin)
        return self.lease_deadline

    # ---- leadership --------------------------------------------------------------------

    async def campaign(self) -> int | None:
        """Become the leader if there is none: the new epoch, or None (there is a leader,
        another node won, or this node has no lease). The lease is kept alive together
        with the read of the epoch, so ``lease_deadline`` is fresh when this returns an
        epoch, and a campaign takes two round trips to etcd, not three (the second ends
        less than two call timeouts after the keep-alive was sent: within the lease,
        options.call_timeout_for)."""
        client = self.channel()
        tx = client.transactions
        refresh = asyncio.ensure_future(self.keep_alive())
        try:
            current = await self.call(client.get(self._epoch_key), "a read of the epoch")
        except BaseException:
            refresh.cancel()
            await asyncio.wait([refresh])
            raise
        if await refresh is None:
            return None
        epoch = _epoch(current.value) if current is not None else 0
        unchanged = (tx.mod(self._epoch_key) == current.mod_revision if current is not None
                     else tx.create(self._epoch_key) == 0)
        won, replies = await self.call(client.transaction(
            compare=[tx.create(self._leader_key) == 0, unchanged],
            success=[
                tx.put(self._epoch_key, str(epoch + 1).encode()),
                tx.put(self.prefix + b"last_leader", self.node.encode()),
                tx.put(self._leader_key, self.node.encode(), lease=self._lease),
                tx.get(self._leader_key),
            ],
            failure=[],
        ), "a campaign")
        if not won:
            return None
        self._leader_revision = int(replies[3][0][1].create_revision)
        self._sync_revision = None  # a new term: read the sync key before writing it
        return epoch + 1

    def _guard(self) -> list[Any]:
        """The compares of a leader's write: the key is this node's, made by our campaign."""
        tx = self.channel().transactions
        return [tx.value(self._leader_key) == self.node.encode(),
                tx.create(self._leader_key) == self._leader_revision]

    async def step_down(self) -> bool:
        """Delete the leader key if it is still the one our campaign made; whether it was.
        The lease (and the member record) stay."""
        if self._leader_revision is None:
            return False
        client = self.channel()
        deleted, _ = await self.call(client.transaction(
            compare=self._guard(), success=[client.transactions.delete(self._leader_key)],
            failure=[],
        ), "a step down")
        self._leader_revision = None
        return bool(deleted)

    async def resign(self) -> None:
        """Step down if leading, then revoke the lease (the member record goes with it,
        and the leader key too if the step down got no answer)."""
        with contextlib.suppress(EtcdError):  # the revocation deletes the key as well
            await self.step_down()
        if self._lease is not None:
            lease, self._lease = self._lease, None
            self.lease_deadline = -math.inf
            await self.call(self.channel().revoke_lease(lease), "a lease revocation")

    async def leader(self) -> tuple[str | None, int]:
        """The leader's name (None: no leader) and the epoch, read together."""
        view = await self.view()
        return view.leader, view.epoch

    async def name_sync(self, node: str | None) -> bool:
        """Name the synchronous standby (None: no synchronous standby), only if this store
        made the current leader key and the sync key is as this store last saw it (a
        compare-and-swap on its mod revision); whether it was written.

        A write whose answer never came (EtcdError) may still be applied later; the next
        write reads the key first, and the late one, compared with a revision that has
        moved on, then changes nothing: the key never goes back to a name the leader no
        longer relies on."""
        if self._leader_revision is None:
            return False
        client = self.channel()
        tx = client.transactions
        if self._sync_revision is None:
            got = await self.call(client.get(self._sync_key), "a read of the sync key")
            self._sync_revision = int(got.mod_revision) if got is not None else 0
        write = (tx.put(self._sync_key, node.encode()) if node is not None
                 else tx.delete(self._sync_key))
        read = tx.get(self._sync_key)
        self._sync_revision, seen = None, self._sync_revision
        written, replies = await self.call(client.transaction(
            compare=[*self._guard(), tx.mod(self._sync_key) == seen],
            success=[write, read], failure=[read]), "a write of the sync standby")
        found = replies[-1]  # the key as the transaction left it: [(value, meta)] or []
        self._sync_revision = int(found[0][1].mod_revision) if found else 0
        return bool(written)

    async def sync(self) -> str | None:
        """The synchronous standby's name, or None."""
        got = await self.call(self.channel().get(self._sync_key), "a read of the sync key")
        return got.value.decode() if got is not None else None

    # ---- members -----------------------------------------------------------------------

    async def register(
        self, address: str, role: str, extra: Mapping[str, Any] | None = None
    ) -> None:
        """Put this node's member record, bound to its lease: ``address`` ("HOST:PORT"
        where the others reach it), ``role``, and ``extra`` (small, JSON-encodable). It is
        remembered and put again with every new lease; without a lease, only remembered."""
        self._member = {**(extra or {}), "name": self.node, "address": address, "role": role}
        if self._lease is not None:
            await self._put_member()

    async def _put_member(self) -> None:
        key = self._members + self.node.encode()
        value = json.dumps(self._member, separators=(",", ":")).encode()
        await self.call(self.channel().put(key, value, lease=self._lease),
                         "a member record")

    async def members(self) -> list[dict[str, Any]]:
        """Every live member's record, by name."""
        got = await self.call(self.channel().get_prefix(self._members), "a read of members")
        found = (member_record(kv.value) for kv in got.kvs)
        return sorted((m for m in found if m is not None), key=lambda m: str(m["name"]))

    # ---- reading and watching ----------------------------------------------------------

    async def view(self) -> ClusterView:
        """Every key under the prefix, read at one revision."""
        got = await self.call(self.channel().get_prefix(self.prefix), "a read")
        values: dict[str, Any] = {"revision": int(got.header.revision)}
        members: dict[str, Mapping[str, Any]] = {}
        for kv in got.kvs:
            name = bytes(kv.key)[len(self.prefix):]
            if self._default and _not_its_own(name):
                continue
            if name == b"leader":
                values.update(leader=kv.value.decode(errors="replace"),
                              leader_lease=int(kv.lease),
                              leader_revision=int(kv.create_revision))
            elif name == b"epoch":
                values["epoch"] = _epoch(kv.value)
            elif name == b"sync":
                values["sync"] = kv.value.decode(errors="replace")
            elif name == b"last_leader":
                values["last_leader"] = kv.value.decode(errors="replace")
            elif name.startswith(b"members/"):
                record = member_record(kv.value)
                if record is not None:
                    members[str(record["name"])] = record
        return ClusterView(**values, members=members)

    async def watch(self) -> AsyncIterator[ClusterView]:
        """A view now, then one at each change of this shard's keys, until the store is
        closed (see the module docstring); nothing is raised while etcd cannot be
        reached: it tries again every ``WATCH_RETRY_SECONDS``."""
        def its_own(name: bytes) -> bool:
            return not (self._default and _not_its_own(name))

        async for view in self.watching(self.prefix, self.view, its_own):
            yield view

    async def watching(
        self, prefix: bytes, read: Callable[[], Awaitable[V]], relevant: Callable[[bytes], bool],
    ) -> AsyncIterator[V]:
        """``read()`` now, then again at each change of a key under ``prefix`` for which
        ``relevant(key without the prefix)`` holds, yielding each result whose state
        differs from the last one yielded, until the store is closed. A broken stream is
        followed by a new read and a new watch from the revision after it (the module
        docstring); nothing is raised while etcd cannot be reached."""
        last: V | None = None
        failing = False
        while not self._closed:
            try:
                view = await read()
                seen = view.revision
                if not view.same_state(last):
                    last = view
                    yield view
                async with self._watch_turn:
                    watch = await self.call(self.channel().watch_prefix(
                        prefix, start_revision=seen + 1), "a watch")
                try:
                    if failing:
                        failing = False
                        log.info("cluster %s: etcd watch of %s made again", self.cluster,
                                 self.node)
                    async for event in watch:
                        if event.kv.mod_revision <= seen:
                            continue  # the last view holds it already
                        if not relevant(bytes(event.kv.key)[len(prefix):]):
                            continue  # another shard's key, or one nothing here reads
                        view = await read()
                        seen = view.revision
                        if not view.same_state(last):
                            last = view
                            yield view
                finally:
                    await _cancel(watch)
            except (EtcdError, aetcd.ClientError, grpc.RpcError, grpc.aio.BaseError) as exc:
                if not failing and not self._closed:
                    failing = True
                    log.warning("cluster %s: etcd watch of %s broken, watching again: %s",
                                self.cluster, self.node, exc)
            if not self._closed:
                self.watch_breaks += 1
                await asyncio.sleep(WATCH_RETRY_SECONDS)


async def _cancel(watch: Any) -> None:
    """End an aetcd watch, whatever state its stream and client are in (a closed client
    has no watcher left to ask: AttributeError). Nothing of it is used any more."""
    with contextlib.suppress(Exception):
        async with asyncio.timeout(1.0):
            await watch.cancel()


def _epoch(value: bytes) -> int:
    try:
        return int(value)
    except ValueError:
        raise EtcdError(f"the epoch key holds {value[:40]!r}, not a number: rsd did not "
                        "write it") from None


def member_record(value: bytes) -> dict[str, Any] | None:
    """A member record, or None for a value rsd did not write."""
    try:
        record = json.loads(value)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("name"), str):
        return None
    return record
