"""The asyncio shell around the core: connections, their limits, and the parts that serve them.

The server owns the connections and their admission; the work is done by its parts, one
concept each: ``batches.py`` (bytes -> frames -> core calls), ``session.py`` (HELLO,
PING, SERVER_STATS, the backup ops of disk/backups.py), ``output.py`` (one write per
connection per loop turn, output held for an fsync, resuming connections whose output
has drained), ``turns.py`` (each busy connection's share of a loop turn, round robin),
``coretimer.py`` (the core's deadlines) and ``watchdog.py`` (loop stalls, unfinished
frames). Each part gets what it uses, wired here in ``__init__``: its collaborators
passed in, or, where it reads the server itself, a narrow ``Protocol`` declared beside
it (``ConnectionHost``, ``OutputHost``, ``SessionHost``, ``metrics.Observed``) that
``Server`` meets; no part imports this module.

What always holds:
- every frame of one read is decoded and applied before anything is written;
- all output produced in one loop turn leaves in one ``transport.write`` per connection;
- journal records of a batch are written before its replies, and replies that depend on
  records not yet fsynced wait for the fsync (group commit, groupcommit.py: one fsync
  per batch, not per request, and the loop keeps serving while it runs);
- no request creates a task (but a SLOTS_MOVE, one at a time: its compare-and-swap in
  etcd, slotmoves.py); the timers are one ``call_at`` for the core's next deadline and
  the watchdog's (watchdog.py), none per request;
- a request naming a run, a pool or a quota is served only by the shard that owns its
  slot (``slots``, slotowner.py: MOVED, not executed, otherwise); a server alone owns
  every slot and asks nothing per request;
- a connection's output is bounded before the work is done: a request is executed only
  while its connection's output is under the high-water mark (connection.py), so one
  read, or a thousand deferred replies, cannot grow the server by more than the mark
  plus one reply;
- a client can only hurt its own connection: a broken frame stream gets the answers to
  the requests before it, then an error frame, and that connection is closed; a bad
  request gets an error reply; an unexpected exception inside the core becomes INTERNAL
  for that request and is logged;
- connections are admitted under a total and a per-peer limit (descriptors.py), so the
  descriptors persistence needs are never taken by clients;
- the bytes held for all clients together (unfinished frames, unsent output) stay under
  ``--max-client-buffer-bytes``: past it the largest holders are closed (clientbudget.py).
- TLS handshakes happen after admission (connection.py), so they count against the
  limits; no request but HELLO runs before the HELLO authenticated (auth.py); without a
  tokens file (and without TLS client certificates or ``--insecure``) only loopback
  peers are admitted at all.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from typing import Any

from rsproto import ErrorCode

from . import __version__
from .collector import Collector
from .core import Core
from .disk.backups import Backups
from .disk.groupcommit import GroupCommit
from .disk.journal import Journal
from .disk.snapshots import Snapshots
from .metrics import Metrics, summary
from .policy import Policy
from .security.auth import Authenticator, is_loopback
from .slotowner import SlotOwner
from .watchdog import Watchdog
from .wire.batches import Batches
from .wire.clientbudget import ClientBudget
from .wire.connection import Connection
from .wire.coretimer import CoreTimer
from .wire.feeds import Feeds
from .wire.output import Output, encode_message
from .wire.refusals import Refusals
from .wire.remoteneeds import RemoteNeeds
from .wire.slotmoves import SlotMoves
from .wire.turns import Turns

__all__ = ["Connection", "Server"]

log = logging.getLogger("rsd")

_REFUSAL_LOG_SECONDS = 1.0  # at most one log line per this long about refused connections


class Server:
    """A server: its listener, connections and output around ``core``.

    Its constructor's arguments: without a journal nothing is persisted; with one,
    ``snapshots`` is required. The connection limits come from the file limit
    (descriptors.py, cli.py).
    ``auth``: who HELLOs authenticate as (none: everyone is tenant "default", admin);
    ``tls``: serve TLS with this context; ``loopback_only``: refuse other peers;
    ``collector``: run the process's garbage collector by collector.py's policy (no
    full collections of the whole heap; the rsd process, not a test embedding one).
    In a cluster (the primary): ``feeds``, the standbys' feeds of the journal (under
    ``--fsync always`` a reply waits for the synchronous standby too); ``cluster``
    its name; ``on_lapsed``: called once if ``leadership()`` (the leadership deadline,
    the cluster's elector's) passes before this node steps down: it answers nothing
    more (``lapsed``). ``slots``: which slots it serves (slotowner.py; default: every
    slot, a server alone)."""

    def __init__(
        self,
        core: Core,
        loop: asyncio.AbstractEventLoop,
        *,
        journal: Journal | None = None,
        snapshots: Snapshots | None = None,
        handshake_timeout: float = Policy.HANDSHAKE_TIMEOUT_SECONDS,
        frame_timeout: float = Policy.FRAME_TIMEOUT_SECONDS,
        max_connections: int = 1000,
        max_connections_per_peer: int = Policy.MAX_CONNECTIONS_PER_PEER,
        max_refused_lingering: int = Policy.MAX_REFUSED_LINGERING,
        backlog: int = Policy.LISTEN_BACKLOG,
        max_client_buffer_bytes: int = Policy.MAX_CLIENT_BUFFER_BYTES,
        auth: Authenticator | None = None,
        tls: ssl.SSLContext | None = None,
        loopback_only: bool = False,
        collector: bool = False,
        feeds: Feeds | None = None,
        cluster: str | None = None,
        on_lapsed: Callable[[], None] | None = None,
        sync_wait_seconds: float = Policy.SYNC_WAIT_SECONDS,
        unready_wait_seconds: float = Policy.UNREADY_WAIT_SECONDS,
        slots: SlotOwner | None = None,
    ) -> None:
        self.core = core
        self.slots = slots if slots is not None else SlotOwner.alone()
        # A fresh run id is minted in a slot this shard serves (scopebook.py); a pool or
        # quota serves runs of other shards too, without their state (poolbook.py).
        core.scope_book.placeable = core.tables.homes_run = self.slots.owns_key
        self.loop = loop
        self.journal = journal
        self.snapshots = snapshots
        self.budget = ClientBudget(max_client_buffer_bytes)
        self.turns: Turns[Connection] = Turns()  # each busy connection's share of a turn
        self.output = Output(self)
        self.moves = SlotMoves(self)  # SLOT_MAP, SLOTS_MOVE, the requests held by a move
        self.needs = RemoteNeeds(self)  # needs of another shard: grants asked of it
        self.backups = Backups(journal)  # the files pinned for backups (disk/backups.py)
        self.metrics = metrics = Metrics()
        self.commit: GroupCommit[Connection] | None = None
        self._cluster_parts(feeds, cluster, on_lapsed)
        if journal is not None:
            self.commit = self._group_commit(journal, snapshots, sync_wait_seconds)
        self.unready_wait_seconds = unready_wait_seconds  # (unready)
        self.handshake_timeout = handshake_timeout
        self.max_connections = max_connections
        self.max_connections_per_peer = max_connections_per_peer
        self.max_refused_lingering = max_refused_lingering
        self.backlog = backlog
        self.auth = auth if auth is not None else Authenticator(None)
        self.refusals = Refusals(loop)  # refused HELLOs: answered now or held (auth.py)
        self.tls = tls
        self.loopback_only = loopback_only
        self.watchdog: Watchdog[Connection] = Watchdog(loop, frame_timeout, self._frame_overdue)
        self.watchdog.on_lag = metrics.loop_lag.observe
        self.collector = Collector(loop) if collector else None
        self._connection_parts()
        self._run_turns()

    def _connection_parts(self) -> None:
        """The connections served (by id, and how many per peer address), the refused
        ones lingering, and the listening socket (none until ``start``)."""
        self.conns: dict[int, Connection] = {}
        self._peers: dict[str, int] = {}  # served connections per peer address
        self._refused: set[Connection] = set()  # refused, lingering until their peer closes
        self.refused_total, self._refusal_logged = 0, 0.0
        self._next_conn = 1
        self._server: asyncio.base_events.Server | None = None

    def _cluster_parts(self, feeds: Feeds | None, cluster: str | None,
                       on_lapsed: Callable[[], None] | None) -> None:
        """What a node of a cluster has (all None alone): its standbys' feeds, the
        cluster's name, its lease (told in HELLO's reply), how long it may still lead,
        the cluster as it sees it (SERVER_STATS' ``cluster``, metrics), and whom to tell
        when its leadership lapsed."""
        self.feeds = feeds
        self.cluster = cluster
        self.cluster_lease_seconds: int | None = None
        self.leadership: Callable[[], float] | None = None
        self.cluster_status: Callable[[], dict[str, Any]] | None = None
        self._on_lapsed = on_lapsed

    def _run_turns(self) -> None:
        """The request loop's parts: the batches connections run, the core's timer, and
        what connections call bound once (no extra call on the hot path)."""
        output = self.output
        self.batches = Batches(
            self.core, self.loop.time, self.turns, self.metrics, self, output.dirty,
            output.next_turn, self.slots, self.moves.hold,
        )
        self.timer = CoreTimer(self.core, self.loop, output.flush)
        self.run = self.batches.run
        self.dirty = output.dirty
        self.maybe_resume = output.maybe_resume
        self.schedule_flush = output.schedule_flush

    def _group_commit(
        self, journal: Journal, snapshots: Snapshots | None, sync_wait: float
    ) -> GroupCommit[Connection]:
        """The group commit of a server with a journal (and its snapshots, required),
        the journal's and snapshots' events wired to the metrics and the output. Under
        ``--fsync always`` a cluster's replies wait for the synchronous standby too."""
        if snapshots is None:
            raise ValueError("a server with a journal needs its snapshots")
        feeds, metrics, output = self.feeds, self.metrics, self.output
        commit = GroupCommit(
            journal, snapshots, self.loop, output.send_held, metrics.commit_wait.observe,
            replicas=feeds if feeds is not None and journal.policy == "always" else None,
            refuse=output.refuse_held, sync_wait=sync_wait,
        )
        journal.on_fsync = metrics.fsynced
        snapshots.on_written = metrics.snapshot_written
        snapshots.wake = output.schedule_flush
        return commit

    _encode = staticmethod(encode_message)  # a deferred reply or push as a frame

    # ---- lifecycle -------------------------------------------------------------------

    def protocol_factory(self) -> Connection:
        conn = Connection(self, self._next_conn)
        self._next_conn += 1
        return conn

    def internal_conn_id(self) -> int:
        """A connection id no socket has (the HTTP API's calls, api.py): ids are never
        reused, so a core call on it meets no one else's state."""
        conn_id = self._next_conn
        self._next_conn += 1
        return conn_id

    async def start(
        self, host: str, port: int, listener: asyncio.base_events.Server | None = None
    ) -> tuple[str, int]:
        """Listen on ``host:port`` and accept; or accept on ``listener``, a server made
        beforehand with ``start_serving=False`` (cli.py binds before it recovers, so a
        start that cannot listen has written nothing)."""
        if listener is None:
            listener = await self.loop.create_server(
                self.protocol_factory, host, port, reuse_address=True, backlog=self.backlog
            )
        else:
            await listener.start_serving()
        self._server = listener
        self.watchdog.start()
        if self.collector is not None:
            self.collector.start()
        # The state was loaded before (recovered at start, or a standby's copy promoted:
        # both serve through here): the first flush arms the core's timer for what it
        # holds (schedules, delays, leases, retention) and logs what loading it noted.
        # Left to a client's first request, an idle rsd would sleep through them all.
        self.output.flush()
        sockname = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    async def stop(self) -> None:
        """Stop accepting, persist and send what is pending, close, end the journal."""
        if self._server is not None:
            self._server.close()
        self.timer.cancel()
        self.watchdog.stop()
        self.refusals.stop()
        self.moves.stop()
        self.backups.close()
        self.needs.stop()
        if self.collector is not None:
            self.collector.stop()
        self.output.flush()
        self.output.notes.stop()  # the summed-up notes' open intervals: their lines now
        if self.commit is not None:
            await self.commit.stop()  # everything held is on disk and sent
        for conn in [*self.conns.values(), *self._refused]:
            if conn.transport is not None:
                conn.transport.close()
        # The last durable flush is done: what the loop still runs while connections
        # finish closing (their connection_lost, a core deadline falling due meanwhile)
        # answers no one and must not reach the closed journal. Nothing acknowledged is
        # lost; a lease that expires now expires again one lease after the restart.
        self.commit = None
        self.timer.cancel()
        if self.journal is not None:
            self.journal.close()
        if self._server is not None:
            await self._server.wait_closed()

    def stats(self) -> dict[str, Any]:
        """Counters for operators and benchmarks (SERVER_STATS). The server's part is O(1):
        counters and sizes, no walk over connections or timers."""
        journal, snapshots = self.journal, self.snapshots
        return {
            "server": f"rsd/{__version__}",
            "time": time.time(),
            "connections": len(self.conns),
            "connections_refused": self.refused_total,
            "max_connections": self.max_connections,
            "max_connections_per_peer": self.max_connections_per_peer,
            "output_pauses": self.batches.output_pauses,
            "client_buffer_bytes": self.budget.total,
            "max_client_buffer_bytes": self.budget.limit,
            "client_buffer_evictions": self.budget.evictions,
            "auth": {**self.auth.stats(), **self.refusals.stats()},
            "tls": self.tls is not None,
            "loop": self.watchdog.stats(),
            "gc": None if self.collector is None else self.collector.stats(),
            "core": self.core.stats(),
            "journal": None if journal is None or snapshots is None else {
                "fsync": journal.policy,
                "segment": journal.seq,
                "bytes_since_snapshot": snapshots.bytes_since,
                "snapshot_running": snapshots.pid is not None,
                **journal.stats,
                **snapshots.stats,
            },
            "held_batches": 0 if self.commit is None else len(self.commit.held),
            "cluster": None if self.cluster_status is None else self.cluster_status(),
            **summary(self),
        }

    def unready(self) -> str | None:
        """Why this server cannot do its job now, one line (None: it can): /readyz's
        answer for a node that serves (http/probes.py). O(1). A change that has waited
        ``unready_wait_seconds`` (``Policy.UNREADY_WAIT_SECONDS``, lower only in rsd's own
        tests) for its acknowledgement says the journal cannot be
        fsynced in time (a stuck disk) or no standby holds it; a cluster's primary under
        ``--fsync always`` without a synchronous standby can acknowledge no change at all.
        (A write or fsync that fails ends the process, exit 74: journal.py.)"""
        commit = self.commit
        if commit is None:
            return None
        if commit.replicas is not None and self.feeds is not None and self.feeds.sync is None:
            return "primary without a synchronous standby: no change can be acknowledged"
        oldest = commit.oldest_wait(self.loop.time())
        if oldest is not None and oldest[0] >= self.unready_wait_seconds:
            waited, fsynced = oldest
            return (f"changes waiting {waited:.0f} s for "
                    f"{'the synchronous standby' if fsynced else 'the journal fsync'}")
        return None

    def lapsed(self) -> None:
        """The leadership deadline passed: this node may have been replaced, so from now
        on nothing leaves it: every connection is aborted (what its transport still
        buffered is dropped, held replies are never sent), timers stop, and the cluster
        is told (``on_lapsed``). The journal stays as written."""
        if self._on_lapsed is None:
            return
        on_lapsed, self._on_lapsed = self._on_lapsed, None
        log.warning("leadership may have lapsed: answering nothing more, stepping down")
        self.timer.cancel()
        self.watchdog.stop()
        self.needs.stop()  # no grant is taken or renewed for a core that may be replaced
        if self.commit is not None:
            self.commit.held.clear()
        self.commit = None
        self.feeds = None
        for conn in [*self.conns.values(), *self._refused]:
            if conn.transport is not None:
                conn.transport.abort()
        on_lapsed()

    def snapshot_asked(self) -> None:
        """Hand the core's SNAPSHOT_NOW requests to the snapshots (answered once one
        written after them is in place); without a journal there is nothing to snapshot."""
        asks, self.core.effects.snapshot_asks = self.core.effects.snapshot_asks, []
        for conn_id, rid in asks:
            if self.snapshots is not None and self.journal is not None:
                self.snapshots.ask(conn_id, rid)
            else:
                self.core.effects.error(
                    conn_id, rid, ErrorCode.UNAVAILABLE,
                    "this server keeps no journal (no data directory): nothing to snapshot",
                )

    def drop(self, conn: Connection) -> None:
        """``conn`` is gone: forget it, and free its place under the limits."""
        if conn.served:
            conn.served = False
            del self.conns[conn.id]
            left = self._peers[conn.peer_host] - 1
            if left:
                self._peers[conn.peer_host] = left
            else:
                del self._peers[conn.peer_host]
        self._refused.discard(conn)
        self.moves.forget(conn)
        self.backups.forget(conn.id)
        if self.feeds is not None:
            self.feeds.gone(conn)
        self.output.forget(conn)
        self.budget.forget(conn)
        self.watchdog.frame_done(conn)
        if conn.holder is not None:
            now = self.loop.time()
            if not conn.closing:  # (a failed connection runs nothing more it sent)
                self.batches.settle_what_was_read(conn, now)
            self.core.disconnected(conn.id, now)
            self.output.schedule_flush()

    # ---- admission -------------------------------------------------------------------

    def admit(self, conn: Connection) -> tuple[ErrorCode, str] | None:
        """Count ``conn`` in and serve it; or, over a limit (or from a peer this server
        does not serve), the refusal's code and message."""
        refusal = None
        code = ErrorCode.RESOURCE_EXHAUSTED
        if self.loopback_only and not is_loopback(conn.peer_host):
            code = ErrorCode.UNAUTHENTICATED
            refusal = (
                f"this server serves loopback clients only ({conn.peer_host} is not one): it "
                "has no tokens file (--tokens-file)"
            )
        elif len(self.conns) >= self.max_connections:
            refusal = (
                f"connection limit reached: this server serves at most "
                f"{self.max_connections} connections (--max-connections)"
            )
        elif self._peers.get(conn.peer_host, 0) >= self.max_connections_per_peer:
            refusal = (
                f"per-peer connection limit reached: at most {self.max_connections_per_peer} "
                f"connections from {conn.peer_host} (--max-connections-per-peer)"
            )
        if refusal is not None:
            self.refused_total += 1
            now = self.loop.time()
            if now - self._refusal_logged >= _REFUSAL_LOG_SECONDS:
                self._refusal_logged = now
                log.warning(
                    "refusing connection from %s (%d refused so far): %s",
                    conn.peer, self.refused_total, refusal,
                )
            return code, refusal
        conn.served = True
        self.metrics.accepted += 1
        self.conns[conn.id] = conn
        self._peers[conn.peer_host] = self._peers.get(conn.peer_host, 0) + 1
        return None

    def linger_refused(self, conn: Connection) -> bool:
        """Whether a refused ``conn`` may linger until its peer has read the refusal (else
        it is closed at once: refused connections must not eat the descriptor reserve)."""
        if len(self._refused) >= self.max_refused_lingering:
            return False
        self._refused.add(conn)
        return True

    def _frame_overdue(self, conn: Connection) -> None:
        conn.fail(
            ErrorCode.PROTOCOL_ERROR,
            f"frame not completed within {self.watchdog.frame_timeout:g} s of its first byte",
        )
