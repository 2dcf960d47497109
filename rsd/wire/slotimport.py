"""A move of slots that hold runs, between the two primaries (issue 32): SLOTS_IMPORT, the
target's half (``Imports``), and the channel the source sends it on (``ImportChannel``).

The source exports the runs of the moving slots (``Core.export_slots``) in parts of at
most ``PART_BYTES`` (a client frame holds 1 MiB) and sends each, in order, as one
SLOTS_IMPORT over a client connection to the target's primary, authenticated with the
cluster token (the one a standby follows its primary with: an admin token). The target
imports each part as one journaled record (``Core.import_runs``): the answer leaves
only once it is fsynced and acknowledged by the target's synchronous standby (output.py
holds it, as any reply to a batch that asked for a sync), so a part answered is a part
the target's shard keeps through the loss of its primary. A part refused, or a channel
broken, aborts the move: the source sends SLOTS_IMPORT ``abort`` (best effort) and the
target drops what it took of those slots (nobody routes to them there: the map has not
switched).

What always holds:
- the target takes runs only for slots its map gives another shard, and only from a
  source whose map is not older than its own (``map_epoch``): it never drops or
  overwrites runs of its own slots;
- the first part of a move (``index`` 0) first drops whatever runs the target still
  holds in those slots (what an earlier move cut short left: a copy nobody routes to),
  so a move tried again is not refused for meeting its own leftovers;
- strays, runs a node holds in slots its map gives another shard, are dropped
  (``Imports.drop_strays``) once they have been strays for ``settle`` seconds on end:
  a source restarted (or a standby promoted) after the switch and before its drop, or a
  target left a copy by a move that never switched. The wait lets a move whose parts
  are all acknowledged finish its switch before a promoted target looks (the source
  ends its switch, or gives up, within its cluster lease); the slots of a move under
  way to this node are never strays.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TYPE_CHECKING, Any, Protocol

import rsproto as wire
from rsproto import ErrorCode, Kind, Op

from .. import __version__
from ..core import CoreError
from ..disk import failpoints

if TYPE_CHECKING:
    from ..core import Core
    from ..slotowner import SlotOwner

__all__ = ["PART_BYTES", "ImportChannel", "Imports", "ImportsHost"]

log = logging.getLogger("rsd")

# The budget of one part's records: half a client frame (rsproto's MAX_FRAME_BYTES,
# 1 MiB), so the part with its request's envelope fits one frame.
PART_BYTES = wire.MAX_FRAME_BYTES // 2
_REPLY, _ERROR = int(Kind.REPLY), int(Kind.ERROR)


class ImportsHost(Protocol):
    """What SLOTS_IMPORT uses of the server (server.py's ``Server`` is one)."""

    core: Core
    loop: asyncio.AbstractEventLoop
    slots: SlotOwner
    cluster: str | None
    cluster_lease_seconds: int | None

    def schedule_flush(self) -> None: ...


class Imports:
    """SLOTS_IMPORT on the target, and the strays any node drops."""

    def __init__(self, server: ImportsHost) -> None:
        self.server = server
        self.importing: tuple[int, int] | None = None  # the slots of a move under way to here
        self._strays_since: dict[tuple[int, int], float] = {}
        self._check: asyncio.TimerHandle | None = None
        # ``settle`` set outright (--test-stray-settle-seconds, rsd's own tests only).
        self.settle_seconds: float | None = None

    def take(self, conn_id: int, args: dict[str, Any]) -> dict[str, Any]:
        """SLOTS_IMPORT's answer (CoreError when refused, nothing then changed)."""
        server = self.server
        core = server.core
        if not core.is_admin(conn_id):
            raise CoreError(ErrorCode.PERMISSION_DENIED, "SLOTS_IMPORT is an admin "
                            "operation; this connection's token has the client role")
        if server.cluster is None or not core.tables.slot_count:
            raise CoreError(ErrorCode.INVALID_ARGUMENT, "a server alone is one shard: it "
                            "imports no runs")
        owner = server.slots
        lo, hi = args.get("lo"), args.get("hi")
        if type(lo) is not int or type(hi) is not int or not 0 <= lo <= hi < owner.map.slots:
            raise CoreError(ErrorCode.INVALID_ARGUMENT, f"lo and hi must be slots with 0 <= "
                            f"lo <= hi < {owner.map.slots}, got {lo!r}-{hi!r}")
        for start, end, shard in owner.map.ranges:
            if shard == owner.shard and start <= hi and end >= lo:
                raise CoreError(ErrorCode.INVALID_ARGUMENT, f"slot {max(start, lo)} is this "
                                f"shard's ({owner.shard!r}) already: runs of its own slots "
                                "are not imported")
        now = server.loop.time()
        if args.get("abort") is True:
            dropped = self._drop(now, lo, hi)
            if self.importing == (lo, hi):
                self.importing = None
            log.warning("a move of slots %d-%d to this shard was abandoned: %d runs taken "
                        "for it dropped", lo, hi, dropped)
            return {"dropped": dropped}
        epoch, index, part = args.get("map_epoch"), args.get("index"), args.get("part")
        if type(epoch) is not int or type(index) is not int or not isinstance(part, list):
            raise CoreError(ErrorCode.INVALID_ARGUMENT, "SLOTS_IMPORT takes map_epoch and "
                            "index (integers) and part (a RUNS_IMPORTED record)")
        if epoch < owner.map.epoch:
            raise CoreError(ErrorCode.UNAVAILABLE, f"the source's slot map (epoch {epoch}) "
                            f"is older than this shard's ({owner.map.epoch})")
        if index == 0:
            self.importing = (lo, hi)
            self._drop(now, lo, hi)  # an earlier move's leftovers
        elif self.importing != (lo, hi):
            raise CoreError(ErrorCode.INVALID_ARGUMENT, f"part {index} of slots {lo}-{hi} "
                            "without its move's first part")
        failpoints.hit("slots.import_part.hold")  # a test seam: mid-import
        return core.import_runs(now, part)

    def _drop(self, now: float, lo: int, hi: int) -> int:
        """The runs of ``lo``..``hi`` (slots this shard does not own) leave this core."""
        owner = self.server.slots
        dropped = self.server.core.drop_slots(now, lo, hi, owner.moved(lo)[2])
        self.server.schedule_flush()
        return dropped

    # ---- strays ------------------------------------------------------------------------

    def adopted(self) -> None:
        """A map was adopted (or this node began to serve): look for strays now and, while
        any remain, again until they have been strays for ``settle`` seconds."""
        owner = self.server.slots
        if self.importing is not None and owner.owns(self.importing[0]):
            self.importing = None  # the move to here switched
        self.drop_strays()

    @property
    def settle(self) -> float:
        """Seconds runs are strays before they are dropped: twice the cluster lease (a
        source ends its switch, or gives up, within one), unless a test set it."""
        if self.settle_seconds is not None:
            return self.settle_seconds
        return 2.0 * (self.server.cluster_lease_seconds or 1)

    def drop_strays(self) -> int:
        """Drop the runs of every range this node's map gives another shard that has held
        runs here for ``settle`` seconds (see the module docstring). How many runs."""
        server = self.server
        core, owner = server.core, server.slots
        self._check = None
        if server.cluster is None or not core.tables.slot_count or owner.owns_all:
            self._strays_since.clear()
            return 0
        now = server.loop.time()
        since: dict[tuple[int, int], float] = {}
        dropped = 0
        for lo, hi, shard in owner.map.ranges:
            if shard == owner.shard or _meets(self.importing, lo, hi):
                continue
            if not core.runs_in_slots(lo, hi):
                continue
            first = self._strays_since.get((lo, hi), now)
            if now - first < self.settle:
                since[(lo, hi)] = first
                continue
            count = core.drop_slots(now, lo, hi, owner.moved(lo)[2])
            log.warning("dropped %d runs of slots %d-%d: the slot map gives them to shard "
                        "%r (a move that switched before this shard dropped them, or one "
                        "that never switched)", count, lo, hi, shard)
            dropped += count
        self._strays_since = since
        if dropped:
            server.schedule_flush()
        if since and self._check is None:
            self._check = server.loop.call_later(self.settle / 4, self.drop_strays)
        return dropped

    def stop(self) -> None:
        if self._check is not None:
            self._check.cancel()
            self._check = None


def _meets(span: tuple[int, int] | None, lo: int, hi: int) -> bool:
    return span is not None and span[0] <= hi and span[1] >= lo


class ImportRefused(Exception):
    """The target refused a part (or the channel broke): ``code`` and ``message``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class ImportChannel:
    """The source's connection to the target's primary for one move."""

    def __init__(self, address: str, token: str | None, tls: ssl.SSLContext | None,
                 timeout: float) -> None:
        self.address, self.token, self.tls, self.timeout = address, token, tls, timeout
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.decoder = wire.Decoder(wire.MAX_FRAME_BYTES, "frame")
        self.next_id = 1
        self.pending: list[Any] = []

    async def open(self, node: str) -> None:
        """Connected and greeted; ``ImportRefused`` if the target cannot be reached (the
        map may still name a primary that just died) or refuses the HELLO."""
        host, _, port = self.address.rpartition(":")
        try:
            self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(
                host, int(port), ssl=self.tls,
                server_hostname=host if self.tls is not None else None), self.timeout)
        except (OSError, TimeoutError) as exc:
            raise ImportRefused("UNAVAILABLE", f"{exc or type(exc).__name__}") from None
        args: dict[str, Any] = {"version": wire.PROTOCOL_VERSION, "holder": f"move:{node}",
                                "client": f"rsd/{__version__}"}
        if self.token is not None:
            args["token"] = self.token
        await self.call(Op.HELLO, args)

    async def call(self, op: int, args: dict[str, Any]) -> Any:
        """One request and its answer; ``ImportRefused`` for an error or no answer."""
        assert self.reader is not None and self.writer is not None
        rid, self.next_id = self.next_id, self.next_id + 1
        self.writer.write(wire.request_frame(rid, int(op), args))
        try:
            while not self.pending:
                data = await asyncio.wait_for(self.reader.read(1 << 16), self.timeout)
                if not data:
                    raise ImportRefused("UNAVAILABLE", "the target closed the connection")
                self.pending.extend(self.decoder.feed(data))
        except (OSError, TimeoutError, wire.FrameError) as exc:
            raise ImportRefused("UNAVAILABLE", f"the target did not answer: "
                                f"{exc or type(exc).__name__}") from None
        msg = self.pending.pop(0)
        if type(msg) is not list or len(msg) < 3 or msg[1] != rid:
            raise ImportRefused("UNAVAILABLE", f"unexpected answer {msg!r:.80}")
        if msg[0] == _ERROR:
            raise ImportRefused(str(msg[2]), str(msg[3]) if len(msg) > 3 else "")
        return msg[2]

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
