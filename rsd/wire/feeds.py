"""The primary's side of replication: each standby's feed of the journal's records.

A standby connects like a client, on the same port, with a HELLO that names its cluster,
its node and the epoch it knows (``replicate``) and an admin's token (without a tokens
file: from loopback, where every connection is an admin's). From then on that connection
is a feed:

1. a copy of the whole state, taken at one instant: a forked child (as a snapshot is
   taken, snapshots.py) encodes ``core.snapshot()`` into REPL_COPY pushes on a pipe, which
   the loop relays to the standby as fast as its connection drains; meanwhile the
   batches the primary journals wait in the feed, in order. A standby that comes back
   holding batch ``n`` of this primary's epoch (``have``), with every batch after it
   still in the primary's ring of recent batches (``Policy.FEED_RING_BYTES``), gets
   those batches instead: no copy;
2. then every batch the primary journals, as one REPL_BATCH push ``{epoch, n, records}``,
   sent the moment it is written (before its fsync and before any reply it covers);
3. the standby answers REPL_ACK ``{n}`` once its own fsync covers batch ``n``: first for
   the copy (``n`` its ``after``: the copy is written and fsynced as a snapshot), then
   for the batches (acks are not answered).

What always holds:
- batches are numbered by the primary, one number per journal write, growing by one;
  a feed is sent every batch after its copy, in order, none twice, none left out: the
  copy's last push names the number of the last batch it contains (``after``); a copy
  is taken only between loop turns' flushes (``start_copies``, right after the journal
  write), when the core holds exactly what the journal's batches up to ``after`` made;
- ``acked`` of a feed only grows; a feed's standby holds, fsynced, every batch up to it;
- the synchronous standby is a feed that has acknowledged its copy (it has caught up:
  it holds every batch up to its ``acked``): when there is none, the first such feed is
  proposed (``propose``: the cluster names it in etcd) and relied on only once named
  (``named``); ``sync_acked`` is its ``acked`` (-1: none, or not named yet);
- a feed is bounded: what waits for it (the copy's unsent bytes aside, which the pipe
  holds back) is at most ``Policy.MAX_FEED_BACKLOG_BYTES``; past that the feed is closed
  (UNAVAILABLE) and the standby starts again with a new copy, so a slow standby costs
  the primary memory up to that bound, never more;
- a feed whose connection closes is forgotten; if it was the synchronous standby, there
  is none until another catches up;
- the stream has an application-level deadline, ``silence`` seconds (the cluster lease:
  node.py says why), checked by one timer while anything waits for a standby, never per
  batch: a synchronous standby that owes batches and has acknowledged none for that long
  (hung: SIGSTOP, a VM freeze, a stuck disk; its kernel still acknowledges the TCP
  data, so TCP's own timeout never fires) is replaced when another feed has caught up,
  holds every batch ever relied on and answers in time: its stream is closed (it
  resumes from the ring when it wakes) and the other is proposed, named in etcd before
  it is relied on, as when a standby's connection closes. When changes have waited that
  long and no standby acknowledged anything meanwhile (none is reachable: a partition),
  the cluster is told (``on_silent``): it may step this primary down so that the
  synchronous standby, which holds every acknowledged change, takes over;
- at most ``Policy.MAX_FEEDS`` feeds, one per node: a node that follows again replaces
  its earlier feed (closed), and a feed past the bound is refused, so no client, admin
  or not, makes the primary fork without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import os
import socket
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import rsproto as wire
from rsproto import ErrorCode, Push

from ..collector import settle
from ..policy import Policy

if TYPE_CHECKING:
    from ..core import Core
    from .connection import Connection

__all__ = ["Feed", "Feeds"]

log = logging.getLogger("rsd.cluster")

_KEPT = 1 << 20  # batch record counts kept for the lag of standbys behind
_COPY_RECORDS = 64  # records per REPL_COPY push (at most ~17 MiB with 256 KiB payloads)
_PUSH = int(wire.Kind.PUSH)
_BATCH = int(Push.REPL_BATCH)
_COPY = int(Push.REPL_COPY)


class Feed:
    """One standby's feed: its connection, where its copy is, what it acknowledged."""

    __slots__ = ("acked", "after", "backlog", "backlog_bytes", "conn", "copying", "node",
                 "owed_since", "pid", "pipe", "relay")

    def __init__(self, conn: Connection, node: str) -> None:
        self.conn = conn
        self.node = node
        self.copying = True  # the copy is still being relayed: batches wait in ``backlog``
        self.after = -1  # the copy holds every batch up to this number
        self.acked = -2  # the last batch the standby holds, fsynced (-2: not even its copy)
        self.backlog: deque[bytes] = deque()
        self.backlog_bytes = 0
        self.pipe: asyncio.ReadTransport | None = None
        self.pid: int | None = None
        self.relay: asyncio.Task[None] | None = None  # relays the copy (kept: the loop's is weak)
        # The loop's time since which the standby owes a batch sent to it without having
        # acknowledged any (None: it holds every batch sent).
        self.owed_since: float | None = None

    @property
    def caught_up(self) -> bool:
        """Whether the standby has acknowledged its copy (and so holds every batch up
        to ``acked``)."""
        return self.acked >= self.after

    def silent(self, now: float, silence: float) -> bool:
        """Whether it has owed a batch for ``silence`` seconds without acknowledging any."""
        return self.owed_since is not None and now - self.owed_since >= silence

    def owes(self, now: float) -> None:
        """A batch was just sent to it."""
        if self.owed_since is None:
            self.owed_since = now


class Feeds:
    """The primary's feeds, the batch numbers, and which feed is the synchronous one."""

    def __init__(
        self,
        core: Core,
        loop: asyncio.AbstractEventLoop,
        epoch: Callable[[], int],
        acked: Callable[[], None],
        propose: Callable[[str | None], None],
        *,
        silence: float = math.inf,
        on_silent: Callable[[], None] | None = None,
    ) -> None:
        """``epoch``: the cluster epoch this primary leads in; ``acked``: told when the
        synchronous standby acknowledged more (group commit may release replies);
        ``propose``: asked to name a node the synchronous standby (None: none) in etcd,
        and to call ``named`` once it is; ``silence``: the stream's deadline (seconds;
        the module docstring); ``on_silent``: told, at most once every ``silence`` / 4
        s, while changes have waited ``silence`` s with no standby acknowledging anything."""
        self.core = core
        self.loop = loop
        self.epoch = epoch
        self._acked = acked
        self._propose = propose
        self.silence = silence
        self._on_silent = on_silent
        # The deadline's state: when some standby last acknowledged more (or this primary
        # began), since when a batch written waits for the synchronous standby (None:
        # it holds every batch written), and the one timer that checks them.
        self.acked_at = loop.time()
        self.waiting_since: float | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self.written = -1  # the number of the last batch journaled
        self.records = 0  # records journaled in all batches so far
        self.bytes = 0  # bytes of all batches' frames so far
        # batch number -> (records, bytes) journaled up to it, for the batches some
        # standby has not acknowledged yet (each entry added and dropped once; at most
        # _KEPT), and for the point each standby joined at
        self._records_at: dict[int, tuple[int, int]] = {}
        self.feeds: dict[int, Feed] = {}  # connection id -> its feed
        self.sync: Feed | None = None
        self.proposed: Feed | None = None  # being named the synchronous standby
        # The highest batch a reply was ever released on the word of (a synchronous
        # standby's ack): a standby is proposed only once it holds at least that much.
        self.relied_upto = -1
        self.joining: list[Feed] = []  # feeds whose copy starts at the next flush
        # The latest batches, encoded: (number, frame, records), oldest first, within
        # the bound.
        self.ring: deque[tuple[int, bytes, int]] = deque()
        self.ring_bytes = 0

    @property
    def sync_acked(self) -> int:
        """The batch up to which replies may be released (-1: none); what is returned
        is relied on (``relied_upto``)."""
        if self.sync is None:
            return -1
        acked = self.sync.acked
        if acked > self.relied_upto:
            self.relied_upto = acked
        return acked

    def lag(self) -> dict[str, tuple[int, int]]:
        """Each standby's lag behind the primary, in records and bytes of batches (what
        it has not acknowledged yet; all of them while it has not acknowledged its
        copy, or when where it stands is no longer known)."""
        out = {}
        for feed in self.feeds.values():
            held = self._records_at.get(feed.acked) if feed.caught_up else None
            records, size = held if held is not None else (0, 0)
            out[feed.node] = (self.records - records, self.bytes - size)
        return out

    # ---- a standby joins --------------------------------------------------------------

    def follow(self, conn: Connection, node: str, have: Any = None) -> bool:
        """``conn`` (its HELLO done) becomes ``node``'s feed. A standby that holds
        ``have`` (``{epoch, n}``: batch ``n`` of this epoch) resumes from it when the
        ring still has every batch after it (True); else its copy starts at the end of
        this loop turn's flush (``start_copies``; False)."""
        for old in list(self.feeds.values()):
            if old.node == node:  # the same node again: its earlier stream is over
                self._close(old, f"standby {node} follows again on another connection")
        feed = Feed(conn, node)
        self.feeds[conn.id] = feed
        _drop_silent(conn)
        held = self._resumable(have)
        if held is None:  # its copy holds every batch up to now (or to a batch after)
            self._records_at.setdefault(self.written, (self.records, self.bytes))
            self.joining.append(feed)
            return False
        feed.after = held
        feed.copying = False
        transport = conn.transport
        self._count_resumed(held)
        for n, frame, _ in self.ring:
            if n > held and transport is not None:
                transport.write(frame)
                feed.owes(self.loop.time())
        log.info("standby %s resumes after batch %d", node, held, extra={"node": node})
        return True

    def _count_resumed(self, held: int) -> None:
        """Keep what was journaled up to ``held`` and up to each batch after it (the
        batches a resumed standby is sent from the ring, and may acknowledge), in the
        order of their numbers (``_forget_acked`` drops from the front)."""
        records, size = self.records, self.bytes
        points = {self.written: (records, size)}
        for n, frame, count in reversed(self.ring):
            if n <= held:
                break
            records -= count
            size -= len(frame)
            points[n - 1] = (records, size)
        merged = self._records_at
        merged.update((n, at) for n, at in points.items() if n not in merged)
        self._records_at = dict(sorted(merged.items()))

    def _resumable(self, have: Any) -> int | None:
        """The batch a returning standby holds, if it can resume from it, else None."""
        if type(have) is not dict or have.get("epoch") != self.epoch():
            return None
        n = have.get("n")
        if type(n) is not int or not -1 <= n <= self.written:
            return None
        if n < self.written and (not self.ring or self.ring[0][0] > n + 1):
            return None  # batches it lacks are no longer kept
        return n

    def start_copies(self) -> None:
        """After the flush's journal write: start the copy of each feed that joined."""
        joining, self.joining = self.joining, []
        for feed in joining:
            if self.feeds.get(feed.conn.id) is feed:
                self._copy(feed)

    def _copy(self, feed: Feed) -> None:
        node = feed.node
        read, write = os.pipe()
        feed.after = self.written
        settle()  # (as snapshots.py: the child must not have the GC touch every page)
        pid = os.fork()
        if pid == 0:  # the child: encode the copy into the pipe, then leave at once
            code = 1
            try:
                gc.disable()
                os.close(read)
                _write_copy(write, self.core, feed.after, self.epoch())
                code = 0
            except BaseException:
                pass
            finally:
                os._exit(code)
        os.close(write)
        feed.pid = pid
        log.info("standby %s follows: copy of the state up to batch %d", node, feed.after,
                 extra={"node": node, "writer_pid": pid})
        feed.relay = self.loop.create_task(self._relay(feed, read), name=f"feed-{node}")

    async def _relay(self, feed: Feed, read: int) -> None:
        """Relay the child's copy to the standby as its connection drains, then what
        waited meanwhile; from then on batches go to it as they are written."""
        loop = self.loop
        transport = feed.conn.transport
        done = asyncio.Event()
        relay = _Relay(feed, done)
        pipe, _ = await loop.connect_read_pipe(lambda: relay, os.fdopen(read, "rb", 0))
        feed.pipe = pipe
        await done.wait()
        pid = feed.pid
        status = 1
        if pid is not None:
            with contextlib.suppress(ChildProcessError):
                _, status = await loop.run_in_executor(None, os.waitpid, pid, 0)
            feed.pid = None
        if self.feeds.get(feed.conn.id) is not feed or transport is None:
            return
        if status != 0 or transport.is_closing() or feed.conn.closing:
            log.warning("the copy for standby %s was cut short; it starts again", feed.node)
            self._close(feed, "the copy of the state was cut short")
            return
        feed.copying = False
        if feed.backlog:
            feed.owes(loop.time())
        while feed.backlog:
            transport.write(feed.backlog.popleft())
        feed.backlog_bytes = 0
        log.info("standby %s has its copy; batches stream from %d", feed.node, feed.after + 1)

    # ---- the stream -------------------------------------------------------------------

    def publish(self, records: list[Any]) -> None:
        """A batch was just journaled: number it and send it to every feed (after its
        copy, for a feed still copying)."""
        self.written += 1
        self.records += len(records)
        frame = _frame(
            [_PUSH, _BATCH, {"epoch": self.epoch(), "n": self.written, "records": records}]
        )
        self.bytes += len(frame)
        ring = self.ring
        ring.append((self.written, frame, len(records)))
        self.ring_bytes += len(frame)
        while self.ring_bytes > Policy.FEED_RING_BYTES and len(ring) > 1:
            self.ring_bytes -= len(ring.popleft()[1])
        now = self.loop.time()
        if self.waiting_since is None:
            self.waiting_since = now
        if self._deadline is None and self.silence < math.inf:
            self._deadline = self.loop.call_at(now + self.silence, self._check_deadline)
        if not self.feeds:
            return
        records_at = self._records_at
        records_at[self.written] = (self.records, self.bytes)
        if len(records_at) > _KEPT:  # a standby far behind: its lag is then a floor
            del records_at[next(iter(records_at))]
        for feed in list(self.feeds.values()):
            if feed.copying and feed.pid is None and feed.relay is None:
                continue  # joined this turn: its copy, taken after this write, holds it
            if feed.copying:
                feed.backlog.append(frame)
                feed.backlog_bytes += len(frame)
                if feed.backlog_bytes > Policy.MAX_FEED_BACKLOG_BYTES:
                    self._close(feed, "the standby fell too far behind")
                continue
            transport = feed.conn.transport
            if transport is None or transport.is_closing() or feed.conn.closing:
                continue
            if transport.get_write_buffer_size() > Policy.MAX_FEED_BACKLOG_BYTES:
                self._close(feed, "the standby fell too far behind")
                continue
            transport.write(frame)
            if feed.owed_since is None:
                feed.owed_since = now

    def ack(self, conn: Connection, args: Any) -> None:
        """REPL_ACK from a feed's standby: it holds, fsynced, every batch up to ``n``."""
        feed = self.feeds.get(conn.id)
        n = args.get("n") if type(args) is dict else None
        if feed is None or type(n) is not int or n > self.written or n < feed.after:
            conn.fail(ErrorCode.PROTOCOL_ERROR, "REPL_ACK from a connection that is not a "
                      "feed, or for a batch never sent")
            return
        if n <= feed.acked:
            return
        feed.acked = n
        now = self.acked_at = self.loop.time()
        feed.owed_since = None if n >= self.written else now
        self._forget_acked()
        if self.sync is None and self.proposed is None and n >= self.relied_upto:
            self.proposed = feed  # it holds all that was ever relied on
            self._propose(feed.node)
        if feed is self.sync:
            if n >= self.written:
                self.waiting_since = None
            self._acked()

    def _forget_acked(self) -> None:
        """Drop the record counts of batches every standby has acknowledged."""
        records_at = self._records_at
        if not records_at:
            return
        floor = min((feed.acked for feed in self.feeds.values()), default=self.written)
        while records_at:
            first = next(iter(records_at))
            if first >= floor:
                break
            del records_at[first]

    def named(self, node: str | None) -> None:
        """The cluster now names ``node`` the synchronous standby: rely on its feed (if
        it is still the one proposed and still here)."""
        feed, self.proposed = self.proposed, None
        if feed is None or feed.node != node or self.feeds.get(feed.conn.id) is not feed:
            self._propose_next()
            return
        self.sync = feed
        log.info("standby %s is the synchronous standby", node, extra={"node": node})
        if feed.acked >= self.written:
            self.waiting_since = None
        self._acked()

    def _propose_next(self) -> None:
        """Propose a feed that has caught up, if there is one and none is proposed."""
        if self.sync is not None or self.proposed is not None:
            return
        feed = self._candidate(self.loop.time())
        if feed is not None:
            self.proposed = feed
            self._propose(feed.node)

    def _candidate(self, now: float) -> Feed | None:
        """A feed that may be the synchronous standby: it has caught up, holds every
        batch ever relied on, and answers: it has owed nothing for half the deadline
        (a standby cut off with the one it would replace has been silent about as long)."""
        for feed in self.feeds.values():
            if (feed is not self.sync and feed.caught_up and feed.acked >= self.relied_upto
                    and not feed.silent(now, self.silence / 2)):
                return feed
        return None

    # ---- the stream's deadline --------------------------------------------------------

    def _check_deadline(self) -> None:
        """The one timer of the deadline (the module docstring): replace a silent
        synchronous standby, or tell the cluster that no standby answers; look again
        while anything waits."""
        self._deadline = None
        now = self.loop.time()
        silence = self.silence
        sync = self.sync
        if sync is not None and sync.acked >= self.written:
            self.waiting_since = None
        if sync is not None and sync.silent(now, silence):
            candidate = self._candidate(now)
            if candidate is not None:
                assert sync.owed_since is not None
                log.warning("standby %s has acknowledged nothing for %.1f s (batch %d "
                            "waits): no longer the synchronous standby, %s caught up",
                            sync.node, now - sync.owed_since, sync.acked + 1, candidate.node,
                            extra={"node": sync.node})
                self._close(sync, "the synchronous standby acknowledged nothing within "
                            f"{silence:g} s")  # (it proposes the candidate)
        waiting = self.waiting_since
        if waiting is None:
            return
        quiet_since = max(waiting, self.acked_at)
        if (now - quiet_since >= silence and self._on_silent is not None
                and self.proposed is None
                and not any(feed.copying for feed in self.feeds.values())):
            self._on_silent()  # (not while a standby is being named: it may answer)
        due = [quiet_since + silence]
        if self.sync is not None and self.sync.owed_since is not None:
            due.append(self.sync.owed_since + silence)
        at = min(due)
        if at <= now:  # told, or no standby to name yet: look again in a while
            at = now + silence / 4
        self._deadline = self.loop.call_at(at, self._check_deadline)

    def close(self) -> None:
        """This primary's term is over: the deadline's timer stops."""
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def gone(self, conn: Connection) -> None:
        """``conn`` closed: forget its feed (and the synchronous standby, if it was)."""
        feed = self.feeds.pop(conn.id, None)
        if feed is None:
            return
        if feed.pipe is not None:
            feed.pipe.close()
        if feed.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(feed.pid, 9)
        log.info("standby %s stopped following", feed.node, extra={"node": feed.node})
        self._forget_acked()
        if feed is self.sync:
            self.sync = None
            log.warning("no synchronous standby: changes wait until one catches up")
            self._propose_next()  # another that has caught up, named first
        elif feed is self.proposed:
            self.proposed = None
            self._propose_next()

    def _close(self, feed: Feed, why: str) -> None:
        feed.conn.fail(ErrorCode.UNAVAILABLE, why)
        self.gone(feed.conn)


class _Relay(asyncio.Protocol):
    """Reads the copy from the child's pipe and writes it to the standby, pausing while
    the standby's connection has more than ``Policy.OUTPUT_HIGH_WATER_BYTES`` unsent."""

    def __init__(self, feed: Feed, done: asyncio.Event) -> None:
        self.feed = feed
        self.done = done
        self.pipe: asyncio.ReadTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.pipe = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        transport = self.feed.conn.transport
        if transport is None or transport.is_closing() or self.feed.conn.closing:
            self.done.set()
            return
        transport.write(data)
        if transport.get_write_buffer_size() > Policy.OUTPUT_HIGH_WATER_BYTES and self.pipe:
            self.pipe.pause_reading()
            asyncio.get_running_loop().call_later(0.005, self._resume_when_drained)

    def _resume_when_drained(self) -> None:
        transport = self.feed.conn.transport
        pipe = self.pipe
        if pipe is None or pipe.is_closing():
            return
        if transport is None or transport.is_closing():
            self.done.set()
            return
        if transport.get_write_buffer_size() > Policy.OUTPUT_LOW_WATER_BYTES:
            asyncio.get_running_loop().call_later(0.005, self._resume_when_drained)
            return
        pipe.resume_reading()

    def eof_received(self) -> bool | None:
        self.done.set()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.done.set()


def _write_copy(fd: int, core: Core, after: int, epoch: int) -> None:
    """In the child: the whole state as REPL_COPY pushes, the last with ``done`` and the
    number of the last batch it holds."""
    chunk: list[Any] = []
    for rec in core.snapshot():
        chunk.append(rec)
        if len(chunk) == _COPY_RECORDS:
            _write_all(fd, _frame([_PUSH, _COPY, {"records": chunk}]))
            chunk = []
    last = {"records": chunk, "done": True, "after": after, "epoch": epoch}
    _write_all(fd, _frame([_PUSH, _COPY, last]))
    os.close(fd)


def _drop_silent(conn: Connection) -> None:
    """A standby that stops reading (its machine gone, a partition) is dropped once
    what was sent to it goes unacknowledged by its TCP for half of
    ``Policy.SYNC_WAIT_SECONDS`` (TCP_USER_TIMEOUT), not after the kernel's
    retransmissions (about 15 minutes): another standby can then be named."""
    transport = conn.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None or not hasattr(socket, "TCP_USER_TIMEOUT"):
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT,
                        int(Policy.SYNC_WAIT_SECONDS * 1000 / 2))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


def _frame(message: list[Any]) -> bytes:
    """A replication frame: no frame limit but the standby's (``MAX_REPL_FRAME_BYTES``),
    which one journal batch never passes (a loop turn's records are bounded by what its
    connections may read)."""
    body = wire.pack_from_rsd(message)
    return wire.pack_header(len(body)) + body


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
