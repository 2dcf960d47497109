"""The pure core on a fake clock: one driver for every ``test_core_*`` file.

``CoreDriver`` is a ``rsd.core.Core`` (so a test reaches its state exactly as the shell
does) with the bookkeeping a test needs on top:

- a fake clock: ``now`` is a float the test moves (``advance``) or passes to a call;
  the core's wall clock is ``now + WALL`` (``wall_offset``);
- connections that said HELLO (by default 1..4 as alice, bob, carol and dave) and, by
  default, the mailbox "jobs" with default settings, set up at time 0;
- ``call``/``refused`` to send a request as a connection with a fresh request id;
- ``drain`` to take what the core emitted; records taken so are kept, in order, in
  ``records`` (everything the journal would hold since the driver was made);
- ``fresh``/``replay`` for a new core with the same options, empty or rebuilt from records
  read back as the journal stores them (msgpack round trip), as recovery does.

Nothing here sleeps or does I/O, and the driver never touches the core's internals: it
uses what the shell uses (handle, tick, apply, connected, recovered, effects, snapshot).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgpack
import pytest

from rsd.core import Core, CoreError
from rsproto import Op

ALICE, BOB, CAROL, DAVE = 1, 2, 3, 4
HOLDERS: Mapping[int, str] = {ALICE: "alice", BOB: "bob", CAROL: "carol", DAVE: "dave"}
WALL = 1_700_000_000.0  # the core's wall clock is now + WALL
_rids = itertools.count(1000)


def next_rid() -> int:
    """A request id no other call in this test run has used."""
    return next(_rids)


def on_disk(rec: Any) -> Any:
    """A record as recovery reads it back: encoded and decoded like logfile.scan does."""
    return msgpack.unpackb(msgpack.packb(rec, use_bin_type=True), raw=False, strict_map_key=False)


def numbered_scopes(prefix: str = "scope") -> Callable[[], str]:
    """A scope id generator: ``scope-1``, ``scope-2``, ..."""
    counter = itertools.count(1)
    return lambda: f"{prefix}-{next(counter)}"


class CoreDriver(Core):
    """A Core on a fake clock, with connections, a mailbox and a record of its journal."""

    def __init__(
        self,
        *,
        holders: Mapping[int, str] = HOLDERS,
        mailbox: str | None = "jobs",
        recovered: bool = False,
        scope_ids: Callable[[], str] | None = None,
        wall_offset: float = WALL,
        **options: Any,
    ) -> None:
        super().__init__(scope_ids or numbered_scopes(), wall_offset=wall_offset, **options)
        clash = _OWN & (set(vars(self)) | set(dir(Core)))
        assert not clash, f"the driver would hide the core's own {sorted(clash)}"
        self.setup = (scope_ids, wall_offset)
        self.options = options
        self.now = 0.0
        self.records: list[Any] = []
        if recovered:
            self.recovered(0.0, clean=True)
        for conn, holder in holders.items():
            self.connected(conn, holder)
        if mailbox is not None:
            self.call(Op.MAILBOX_ENSURE, {"name": mailbox})
        self.drain()

    # ---- requests ------------------------------------------------------------------------

    def call(
        self,
        op: int,
        args: dict[str, Any],
        conn: int = ALICE,
        *,
        now: float | None = None,
        rid: int | None = None,
    ) -> Any:
        """Send a request as ``conn`` at ``now`` (the driver's clock by default)."""
        at = self.now if now is None else now
        return self.handle(at, conn, next(_rids) if rid is None else rid, op, args)

    def refused(
        self, op: int, args: dict[str, Any], conn: int = ALICE, *, now: float | None = None
    ) -> CoreError:
        """Send a request that must be refused; the CoreError."""
        with pytest.raises(CoreError) as info:
            self.call(op, args, conn, now=now)
        return info.value

    # ---- time ----------------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the clock on and let every timer due by then fire: ticks until nothing is
        due, as the shell's timer does (a tick fires a bounded number, the rest at once)."""
        self.now += seconds
        self.tick(self.now)
        while (deadline := self.next_deadline()) is not None and deadline <= self.now:
            self.tick(self.now)

    # ---- what the core emitted -------------------------------------------------------------

    def drain(self) -> list[Any]:
        """Take everything emitted: records (kept in ``records``), the sync flag, and the
        messages, which are returned."""
        self.records.extend(self.effects.take_records())
        self.effects.take_sync()
        return self.effects.take_messages()

    # ---- recovery --------------------------------------------------------------------------

    def fresh(self, holders: Mapping[int, str] | None = None) -> CoreDriver:
        """A new core with the same options; nothing applied, only ``holders`` connected."""
        scope_ids, wall_offset = self.setup
        return CoreDriver(holders=holders or {}, mailbox=None, scope_ids=scope_ids,
                          wall_offset=wall_offset, **self.options)

    def replay(self, records: Iterable[Any] | None = None, now: float | None = None) -> CoreDriver:
        """A fresh core rebuilt from ``records`` (by default everything drained so far),
        each read back as the journal stores it, applied at ``now``."""
        rebuilt = self.fresh()
        at = self.now if now is None else now
        for rec in self.records if records is None else records:
            rebuilt.apply(on_disk(rec), at)
        return rebuilt


_OWN = {"now", "records", "setup", "options"} | {
    name for name in vars(CoreDriver) if not name.startswith("__")
}


# ---- thin request helpers, for tests written as call(core, now, ...) ----------------------


def call(
    core: CoreDriver, now: float, op: int, args: dict[str, Any], conn: int = ALICE,
    rid: int | None = None,
) -> Any:
    return core.call(op, args, conn, now=now, rid=rid)


def refused(
    core: CoreDriver, now: float, op: int, args: dict[str, Any], conn: int = ALICE
) -> CoreError:
    return core.refused(op, args, conn, now=now)
