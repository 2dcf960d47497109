"""The session ops the server answers itself: HELLO, PING and SERVER_STATS (and the slot
ops, SLOT_MAP, SLOTS_MOVE and SLOTS_IMPORT, whose rules are slotmoves.py's and
slotimport.py's; the backup ops, BACKUP_BEGIN, BACKUP_READ and BACKUP_END, whose rules
are disk/backups.py's).

What always holds: HELLO comes first on every connection and only once; until it has
succeeded no core op runs for the connection. A HELLO that cannot be accepted (wrong
version, bad holder, args not a map) gets its answer and then fails the connection.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Protocol

import rsproto as wire
from rsproto import ErrorCode, Limits, Op

from .. import __version__
from ..core import CoreError
from ..policy import Policy, announced_limits
from ..security.auth import Refusal

if TYPE_CHECKING:
    from ..core import Core
    from ..disk.backups import Backups
    from ..metrics import Metrics
    from ..security.auth import Authenticator
    from ..slotowner import SlotOwner
    from .connection import Connection
    from .feeds import Feeds
    from .refusals import Refusals
    from .slotmoves import SlotMoves

__all__ = ["BACKUP_OPS", "SESSION_OPS", "SessionHost", "hello", "server_stats", "session_op"]


class SessionHost(Protocol):
    """What the session ops use of the server (server.py's ``Server`` is one): no more."""

    core: Core
    loop: asyncio.AbstractEventLoop
    metrics: Metrics
    auth: Authenticator
    refusals: Refusals
    handshake_timeout: float
    feeds: Feeds | None  # a cluster's primary: the standbys' feeds (feeds.py)
    cluster: str | None  # the cluster's name, in a cluster
    cluster_lease_seconds: int | None  # its lease (--cluster-lease-seconds), in a cluster
    slots: SlotOwner  # which slots this node serves (slotowner.py)
    moves: SlotMoves  # SLOT_MAP and SLOTS_MOVE (slotmoves.py)
    backups: Backups  # BACKUP_BEGIN, BACKUP_READ, BACKUP_END (disk/backups.py)

    def stats(self) -> dict[str, Any]: ...


BACKUP_OPS = frozenset({int(Op.BACKUP_BEGIN), int(Op.BACKUP_READ), int(Op.BACKUP_END)})
SESSION_OPS = frozenset({int(Op.HELLO), int(Op.PING), int(Op.SERVER_STATS), int(Op.REPL_ACK),
                         int(Op.SLOT_MAP), int(Op.SLOTS_MOVE), int(Op.SLOTS_IMPORT),
                         *BACKUP_OPS})


class StatsSource(Protocol):
    def stats(self) -> dict[str, Any]: ...


def server_stats(server: StatsSource, admin: bool) -> dict[str, Any]:
    """SERVER_STATS under its rule: the server's figures are an admin operation
    (PERMISSION_DENIED, a CoreError, for a client-role caller). The one rule for a
    session and for the HTTP API (api.py) alike."""
    if not admin:
        raise CoreError(ErrorCode.PERMISSION_DENIED, "SERVER_STATS is an admin operation; "
                        "this connection's token has the client role")
    return server.stats()


def session_op(server: SessionHost, conn: Connection, rid: int, op: int, args: Any) -> bool:
    """The ops the server answers itself (HELLO, PING, SERVER_STATS), and the rule that
    HELLO comes first. False: the connection failed, stop reading its batch."""
    if conn.holder is None:
        if op != Op.HELLO:
            conn.fail(ErrorCode.PROTOCOL_ERROR, "the first request must be HELLO")
            return False
        return hello(server, conn, rid, args)
    metrics = server.metrics
    if op == Op.HELLO:
        metrics.error(op, ErrorCode.PROTOCOL_ERROR)
        conn.put(wire.error_frame(rid, ErrorCode.PROTOCOL_ERROR, "HELLO was already done"))
    elif type(args) is not dict:
        metrics.error(op, ErrorCode.INVALID_ARGUMENT)
        conn.put(wire.error_frame(rid, ErrorCode.INVALID_ARGUMENT, "args must be a map"))
    elif op == Op.PING:
        metrics.ok[op] += 1
        conn.put(wire.reply_frame(rid, {"time": time.time()}))
    elif op == Op.SLOT_MAP:
        server.moves.slot_map(conn, rid)
    elif op == Op.SLOTS_MOVE:
        server.moves.move(conn, rid, args)
    elif op == Op.SLOTS_IMPORT:
        server.moves.slots_import(conn, rid, args)
    elif op == Op.REPL_ACK:  # a standby's: not answered (feeds.py)
        if server.feeds is None:
            conn.fail(ErrorCode.PROTOCOL_ERROR, "REPL_ACK on a connection that is not a feed")
            return False
        server.feeds.ack(conn, args)
    elif op == Op.SERVER_STATS or op in BACKUP_OPS:
        try:
            reply = _answer(server, conn.id, op, args)
        except CoreError as exc:
            metrics.error(op, exc.code)
            conn.put(wire.error_frame(rid, exc.code, exc.message))
        else:
            metrics.ok[op] += 1
            conn.put(wire.reply_frame(rid, reply))
    else:  # a core op before HELLO is refused above; nothing else reaches here
        raise AssertionError(f"op {op} is not a session op")
    return True


def _answer(server: SessionHost, conn: int, op: int, args: dict[str, Any]) -> Any:
    """The reply to SERVER_STATS or a backup op, under the caller's role (CoreError)."""
    admin = server.core.is_admin(conn)
    if op == Op.SERVER_STATS:
        return server_stats(server, admin)
    if op == Op.BACKUP_BEGIN:
        return server.backups.begin(conn, admin)
    if op == Op.BACKUP_READ:
        return server.backups.read(conn, admin, args)
    return server.backups.end(conn, admin)


def hello(server: SessionHost, conn: Connection, rid: int, args: Any) -> bool:
    """The handshake: check the version, the token (auth.py) and the holder, register
    the connection with the core (its tenant and role), answer with the server's limits.
    False: the connection failed."""
    if type(args) is not dict:
        conn.fail(ErrorCode.PROTOCOL_ERROR, "HELLO args must be a map")
        return False
    version = args.get("version")
    if type(version) is not int or version != wire.PROTOCOL_VERSION:
        return _handshake_failed(
            conn, rid, ErrorCode.UNSUPPORTED_VERSION,
            f"protocol version {version!r} is not supported; this server speaks "
            f"{wire.PROTOCOL_VERSION}",
            {"supported": [wire.PROTOCOL_VERSION]},
        )
    admission = server.auth.authenticate(
        args.get("token"), conn.cert_name, conn.peer, conn.peer_host, server.loop.time()
    )
    if isinstance(admission, Refusal):
        server.refusals.refuse(conn, rid, admission)  # now, or once its wait is over
        return False
    identity = admission.identity
    holder = args.get("holder")
    if (
        not isinstance(holder, str)
        or not holder
        or len(holder.encode()) > Limits.MAX_HOLDER_BYTES
    ):
        return _handshake_failed(
            conn, rid, ErrorCode.INVALID_ARGUMENT,
            f"holder must be a non-empty string of at most {Limits.MAX_HOLDER_BYTES} bytes",
        )
    replicate = args.get("replicate")
    if replicate is not None:
        return _follow(server, conn, rid, holder, identity.admin, replicate)
    conn.holder = holder
    if admission.entry is not None:
        conn.auth_entry = admission.entry
        server.auth.admitted(admission.entry, conn)  # closed if a reload revokes it
    server.metrics.ok[Op.HELLO] += 1
    if conn.handshake_timer is not None:
        conn.handshake_timer.cancel()
        conn.handshake_timer = None
    server.core.connected(conn.id, holder, tenant=identity.tenant, admin=identity.admin)
    conn.put(wire.reply_frame(rid, _welcome(server, conn, identity.tenant, identity.role)))
    return True


def _welcome(server: SessionHost, conn: Connection, tenant: str, role: str) -> dict[str, Any]:
    """HELLO's reply: the server, the limits, who the connection acts for and, from a
    node of a cluster, its cluster and its shard."""
    reply: dict[str, Any] = {
        "version": wire.PROTOCOL_VERSION,
        "server": f"rsd/{__version__}",
        "connection": conn.id,
        "time": time.time(),
        "limits": announced_limits(
            server.handshake_timeout, server.core.tables.min_lease_seconds
        ),
        "tenant": tenant,
        "role": role,
    }
    if server.cluster is not None:  # a client's failover budget comes from the lease
        reply["cluster"] = {"name": server.cluster, "lease_seconds": server.cluster_lease_seconds}
        slots = server.slots  # its shard, and the map it holds: a client routes by it
        reply["shard"] = {"name": slots.shard, "slots": slots.map.slots,
                          "map_epoch": slots.map.epoch}
    return reply


def _handshake_failed(
    conn: Connection, rid: int, code: ErrorCode, message: str,
    details: dict[str, Any] | None = None,
) -> bool:
    """A HELLO refused: its error answered, then the connection failed. False, as
    ``hello`` returns then."""
    conn.put(wire.error_frame(rid, code, message, details))
    conn.fail(code, "handshake failed")
    return False


def _follow(
    server: SessionHost, conn: Connection, rid: int, holder: str, admin: bool, replicate: Any
) -> bool:
    """A standby's HELLO (``replicate``: ``{cluster, node, epoch}``): admitted only with
    an admin's rights, by the primary of the cluster it names, in an epoch not older
    than the standby knows; the connection then becomes its feed (feeds.py). False: the
    connection failed."""
    feeds = server.feeds
    problem = None
    if type(replicate) is not dict or not isinstance(replicate.get("node"), str) or (
        type(replicate.get("epoch")) is not int
    ):
        problem = (ErrorCode.INVALID_ARGUMENT,
                   "replicate must be a map {cluster, node, epoch}")
    elif not admin:
        problem = (ErrorCode.PERMISSION_DENIED,
                   "following the journal takes an admin token; this token has the client role")
    elif feeds is None or replicate.get("cluster") != server.cluster:
        problem = (ErrorCode.NOT_PRIMARY,
                   f"this node is not the primary of cluster {replicate.get('cluster')!r}")
    elif len(feeds.feeds) >= Policy.MAX_FEEDS and not any(
        feed.node == replicate["node"] for feed in feeds.feeds.values()
    ):
        problem = (ErrorCode.RESOURCE_EXHAUSTED,
                   f"this primary already feeds {Policy.MAX_FEEDS} standbys, the limit")
    elif replicate["epoch"] > feeds.epoch():
        problem = (ErrorCode.NOT_PRIMARY,
                   f"this primary leads epoch {feeds.epoch()}, older than the standby's "
                   f"{replicate['epoch']}: it has been replaced")
    if problem is not None:
        code, message = problem
        details = {"primary": None, "epoch": feeds.epoch() if feeds is not None else 0}
        conn.put(wire.error_frame(rid, code, message, details))
        conn.fail(code, "handshake failed")
        return False
    assert feeds is not None
    conn.holder = holder
    if conn.handshake_timer is not None:
        conn.handshake_timer.cancel()
        conn.handshake_timer = None
    server.metrics.ok[Op.HELLO] += 1
    conn.feed = True
    resumed = feeds.follow(conn, replicate["node"], replicate.get("have"))
    reply = wire.reply_frame(rid, {
        "version": wire.PROTOCOL_VERSION, "server": f"rsd/{__version__}",
        "connection": conn.id, "role": "feed", "epoch": feeds.epoch(), "resumed": resumed,
        "written": feeds.written,  # the standby is caught up once it holds this batch
    })
    conn.put(reply)
    conn.quiet_bytes += len(reply)  # it reveals nothing: never held for a standby's ack
    return True
