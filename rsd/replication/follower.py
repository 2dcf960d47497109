"""A standby's side of replication: follow the primary's journal, a hot standby.

The standby connects to the primary like a client, with a HELLO that asks to
``replicate`` (feeds.py is the other side), and receives:
1. a copy of the primary's whole state (REPL_COPY pushes), applied to a fresh core and
   written to the data directory as a snapshot newer than anything there, after which
   what the directory held before is deleted: a standby that comes back after being
   away, or a primary that was replaced, starts over from the primary's state, never
   from its own (its own may hold changes the cluster never acknowledged);
2. then every batch the primary journals (REPL_BATCH): written to the standby's own
   journal, applied to its core, and, once fsynced, acknowledged (REPL_ACK ``{n}``).

What always holds:
- the standby's core only applies what it is sent: nothing here calls ``Core.tick`` or
  ``Core.handle``, so it never expires, delivers or grants anything by itself;
- a batch is acknowledged only once it is written and fsynced (under every fsync
  policy but ``no``) in the standby's own journal; batches come in order, numbered one
  after another from the copy's ``after``, and a gap or a repeat ends the stream;
- a copy or batch of an epoch older than the one the standby knows ends the stream: a
  primary that was replaced cannot make a standby take anything from it;
- what the standby holds is always a data directory a plain ``rsd`` start recovers
  (the copy's snapshot, then the journal), so promotion is recovery's last step
  (``promote``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import rsproto as wire
from rsproto import ErrorCode, Kind, Op, Push

from .. import __version__
from ..core import Core
from ..core.records import Rec, StreamAt
from ..core.restore import Restore
from ..disk.datadir import segments, snapshot_name, snapshots
from ..disk.journal import Journal
from ..disk.snapshotfile import delete_covered, write_snapshot
from ..disk.snapshots import Snapshots
from ..policy import Policy

__all__ = ["FollowRefused", "Follower", "Standby"]

log = logging.getLogger("rsd.cluster")

_PUSH, _REPLY, _ERROR = int(Kind.PUSH), int(Kind.REPLY), int(Kind.ERROR)
_COPY, _BATCH = int(Push.REPL_COPY), int(Push.REPL_BATCH)


class FollowRefused(Exception):
    """The node asked refused to be followed (NOT_PRIMARY names the primary, if known)."""

    def __init__(self, code: str, message: str, details: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.details = details if isinstance(details, dict) else {}


class StreamBroken(Exception):
    """The stream broke a rule (a gap, an older epoch, a malformed frame)."""


@dataclass
class Standby:
    """What a follower holds once it has a copy: a core and its journal and snapshots,
    caught up to batch ``last`` of the primary of ``epoch``."""

    core: Core
    journal: Journal
    snapshots: Snapshots
    epoch: int
    last: int


class Follower:
    """Follows one primary until the stream ends; keeps what it built in ``standby``."""

    def __init__(
        self,
        directory: Path,
        new_core: Any,
        *,
        cluster: str,
        node: str,
        token: str | None,
        policy: str = Policy.FSYNC,
        snapshot_bytes: int = Policy.SNAPSHOT_BYTES,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``new_core``: makes an empty core (the server's options); ``token``: an
        admin token of the primary's tokens file (None without one)."""
        self.directory = Path(directory)
        self.new_core = new_core
        self.cluster = cluster
        self.node = node
        self.token = token
        self.policy = policy
        self.snapshot_bytes = snapshot_bytes
        self.tls = tls
        self.standby: Standby | None = None
        self.known_epoch = 0  # the highest epoch seen (etcd's, or a stream's)
        # What it received, for its metrics (metrics.py's StandbyHeld).
        self.copies = 0
        self.records = 0
        self.received_bytes = 0
        self._batch_at: float | None = None  # the loop's time of the last batch
        # The stream now: admitted by a primary (its HELLO answered), and the last batch
        # that primary had journaled when it answered (or its copy's ``after``): a
        # standby is caught up once it holds that batch (``unready``).
        self.streaming = False
        self.primary_had = -1

    @property
    def last_batch(self) -> int:
        """The last batch of the primary's journal held (-1: no copy held)."""
        return self.standby.last if self.standby is not None else -1

    def batch_age(self) -> float | None:
        """Seconds since the last batch (or copy) came, None before any."""
        if self._batch_at is None:
            return None
        return asyncio.get_running_loop().time() - self._batch_at

    def unready(self) -> str | None:
        """Why this standby is not caught up with its primary, one line (None: it is):
        /readyz's answer (http/probes.py). O(1). Caught up: it holds a copy of the
        state of the newest epoch it knows (etcd's or a stream's), its stream is open,
        and it holds every batch the primary had journaled when the stream began (the
        HELLO reply's ``written``, or the copy's ``after``); from then on each batch is
        pushed the moment it is written, and a standby that falls further behind than
        the primary keeps for it (``Policy.MAX_FEED_BACKLOG_BYTES``) or acknowledges
        nothing for the cluster lease has its stream closed, and is unready again until
        it has caught up on its next one."""
        standby = self.standby
        if standby is None:
            return "joining: no copy of the primary's state yet"
        if standby.epoch < self.known_epoch:
            return (f"standby holds the state of epoch {standby.epoch}, the cluster is at "
                    f"epoch {self.known_epoch}")
        if not self.streaming:
            return "standby not following a primary"
        behind = self.primary_had - standby.last
        if behind > 0:
            return f"standby {behind} batches behind its primary"
        return None

    async def follow(self, host: str, port: int) -> None:
        """Follow the primary at ``host:port`` until the stream ends (returns) or is
        refused (FollowRefused). A copy received replaces ``standby``."""
        reader, writer = await asyncio.open_connection(host, port, ssl=self.tls)
        self.primary_had = -1
        try:
            await self._stream(reader, writer)
        finally:
            self.streaming = False
            writer.close()

    def _hello(self, writer: asyncio.StreamWriter, standby: Standby | None) -> None:
        """The HELLO that asks the primary for its stream, saying what ``standby`` holds
        (if any): the primary may resume from it instead of sending a copy."""
        replicate: dict[str, Any] = {
            "cluster": self.cluster, "node": self.node, "epoch": self.known_epoch,
        }
        if standby is not None:
            replicate["have"] = {"epoch": standby.epoch, "n": standby.last}
        args: dict[str, Any] = {
            "version": wire.PROTOCOL_VERSION, "holder": f"standby:{self.node}",
            "client": f"rsd/{__version__}", "replicate": replicate,
        }
        if self.token is not None:
            args["token"] = self.token
        writer.write(wire.request_frame(1, int(Op.HELLO), args))

    def _acknowledge(
        self, writer: asyncio.StreamWriter, standby: Standby, loop: asyncio.AbstractEventLoop
    ) -> None:
        """After a read's batches are written: synced (unless ``--fsync no``), then
        acknowledged to the primary, and a snapshot started when one is due."""
        if self.policy != "no":
            standby.journal.sync_now()
        writer.write(wire.request_frame(2, int(Op.REPL_ACK), {"n": standby.last}))
        if standby.snapshots.due():
            pid = standby.snapshots.start()
            standby.snapshots.watch(loop, pid)

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        standby: Standby | None = self.standby
        self._hello(writer, standby)
        decoder = wire.Decoder(Policy.MAX_REPL_FRAME_BYTES, "replication frame")
        copy: Core | None = None
        restore: Restore | None = None
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(1 << 20)
            if not data:
                return  # the primary closed the stream
            self.received_bytes += len(data)
            wrote = False
            for msg in decoder.feed(data):
                if type(msg) is not list or not msg:
                    raise StreamBroken(f"malformed frame {msg!r:.80}")
                kind = msg[0]
                if kind == _ERROR:
                    raise FollowRefused(msg[2], msg[3], msg[4] if len(msg) > 4 else None)
                if kind == _REPLY:  # the HELLO's: resumed, what it holds is acknowledged
                    self._admitted(writer, standby, msg[2] if len(msg) > 2 else None)
                    continue
                if kind != _PUSH or len(msg) != 3 or type(msg[2]) is not dict:
                    raise StreamBroken(f"unexpected frame {msg!r:.80}")
                event, body = msg[1], msg[2]
                now = loop.time()
                if event == _COPY:
                    if copy is None:
                        copy = self.new_core()
                        restore = Restore(copy)
                    assert restore is not None
                    restore.apply(list(body.get("records", ())), now)
                    if body.get("done"):
                        restore.apply([_stream_at(body.get("epoch"), body.get("after"))], now)
                        standby = self._keep(copy, body, now)
                        self.primary_had = max(self.primary_had, standby.last)
                        self.copies += 1
                        self._batch_at = now
                        copy = restore = None
                        writer.write(wire.request_frame(  # the copy is fsynced: held
                            2, int(Op.REPL_ACK), {"n": standby.last}
                        ))
                elif event == _BATCH:
                    if standby is None:
                        raise StreamBroken("a batch before the copy")
                    self._batch(standby, body, now)
                    wrote = True
                else:
                    raise StreamBroken(f"unexpected push {event!r}")
            if wrote and standby is not None:
                self._acknowledge(writer, standby, loop)

    def _admitted(self, writer: asyncio.StreamWriter, standby: Standby | None,
                  reply: Any) -> None:
        """The primary answered the HELLO: a feed from now on (what it had written then
        is what this standby must hold to be caught up); a stream resumed acknowledges
        what this standby holds."""
        if type(reply) is not dict:
            return
        written = reply.get("written")
        if type(written) is int:
            self.primary_had = max(self.primary_had, written)
        self.streaming = True
        if standby is not None and reply.get("resumed"):
            if self.policy != "no":  # what an earlier stream left unsynced
                standby.journal.sync_now()
            writer.write(wire.request_frame(2, int(Op.REPL_ACK), {"n": standby.last}))

    def _check_epoch(self, epoch: Any) -> int:
        if type(epoch) is not int or epoch < self.known_epoch:
            raise StreamBroken(
                f"a stream of epoch {epoch!r}, older than the epoch {self.known_epoch} known"
            )
        self.known_epoch = epoch
        return epoch

    def _keep(self, core: Core, body: dict[str, Any], now: float) -> Standby:
        """The copy is whole: write it as the newest snapshot, delete everything older,
        and open a journal after it."""
        epoch = self._check_epoch(body.get("epoch"))
        after = body.get("after")
        if type(after) is not int:
            raise StreamBroken("a copy that does not say which batch it ends with")
        if self.standby is not None:
            self.close()
        names = os.listdir(self.directory)
        newest = max([seq for seq, _ in segments(names)] + [seq for seq, _ in snapshots(names)]
                     + [0])
        covers = newest + 1
        write_snapshot(self.directory, core, covers, os.getpid())
        delete_covered(self.directory, covers, snapshot_name(covers))
        journal = Journal(self.directory, covers + 1, self.policy)
        log.info("copy of the primary's state kept (epoch %d, up to batch %d)", epoch, after,
                 extra={"epoch": epoch, "batch": after})
        self.standby = Standby(core, journal, Snapshots(journal, core, self.snapshot_bytes),
                               epoch, after)
        return self.standby

    def _batch(self, standby: Standby, body: dict[str, Any], now: float) -> None:
        epoch = self._check_epoch(body.get("epoch"))
        n = body.get("n")
        if epoch != standby.epoch or n != standby.last + 1:
            raise StreamBroken(f"batch {n!r} of epoch {epoch}: expected batch "
                               f"{standby.last + 1} of epoch {standby.epoch}")
        records = body.get("records")
        if type(records) is not list:
            raise StreamBroken("a batch without records")
        records.append(StreamAt(Rec.STREAM_AT, epoch, n, False))  # in the same write
        standby.journal.write(records)
        apply = standby.core.apply
        for rec in records:
            apply(rec, now)
        standby.last = n
        self.records += len(records)
        self._batch_at = now

    def hold(self, standby: Standby) -> None:
        """Hold what this node's own directory held at start (a standby's state, its
        STREAM_AT says up to which batch of which epoch): followed on from there, or
        replaced by a new copy if the primary cannot resume it."""
        self.close()
        self.standby = standby
        self.known_epoch = max(self.known_epoch, standby.epoch)

    def close(self) -> None:
        """Close the journal of what is held (a clean stop of the standby's files)."""
        if self.standby is not None:
            self.standby.snapshots.stop()
            self.standby.journal.close()
            self.standby = None

    def promote(self, now: float) -> Standby:
        """This standby takes over: every live lease gets one full lease from ``now``,
        ids and generations jump past anything the old primary may have granted (as
        after an unclean stop), and those records are journaled and fsynced."""
        standby = self.standby
        if standby is None:
            raise RuntimeError("nothing to promote: no copy was ever received")
        standby.core.promoted(now)
        standby.journal.write(standby.core.effects.take_records())
        standby.core.effects.take_sync()
        standby.journal.sync_now()
        self.standby = None  # the server owns it now
        return standby


def _stream_at(epoch: Any, after: Any) -> StreamAt:
    """The mark put into a copy's snapshot: it holds the primary's batches up to
    ``after`` (both checked by ``_keep`` before the snapshot is written)."""
    if type(epoch) is not int or type(after) is not int:
        raise StreamBroken("a copy that does not say its epoch and last batch")
    return StreamAt(Rec.STREAM_AT, epoch, after, False)


def refused_primary(exc: FollowRefused) -> str | None:
    """The primary a NOT_PRIMARY refusal names, if any."""
    if exc.code == ErrorCode.NOT_PRIMARY:
        primary = exc.details.get("primary")
        return primary if isinstance(primary, str) else None
    return None
