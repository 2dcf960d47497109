"""The pure core on a fake clock: one driver for every ``test_core_*`` file.

``CoreDriver`` is a ``rsd.core.Core`` (so a test reaches its state exactly as the shell
does) with the bookkeeping a test needs on top:

- a fake clock: ``now`` is a float the test moves (``advance``) or passes to a call;
  the core's wall clock is ``now + WALL`` (``wall_offset``);
- connections that said HELLO (by default 1..4 as alice, bob, carol and dave) and, by
  default, the mailbox "jobs" with default settings and the run "s" (``RUNS``), made for
  each tenant through SCOPE_CREATE with that chosen id, at time 0: a run must be created
  before any op names it, so a test names its other runs in ``runs=`` or makes them
  with ``create_runs``;
- ``call``/``refused`` to send a request as a connection with a fresh request id;
- ``drain`` to take what the core emitted; records taken so are kept, in order, in
  ``records`` (everything the journal would hold since the driver was made);
- ``fresh``/``replay`` for a new core with the same options, empty or rebuilt from records
  read back as the journal stores them (msgpack round trip), as recovery does;
- lease handles whose random part comes from a seeded generator (``seeded_bytes``), so
  a run is reproducible; ``tenants`` maps connections to ``(tenant, admin)`` for the
  tests of isolation (every connection is tenant "default" with admin rights unless
  named there).

Nothing here sleeps or does I/O, and the driver never touches the core's internals: it
uses what the shell uses (handle, tick, apply, connected, recovered, effects, snapshot).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgpack
import pytest

from rsd.core import Core, CoreError
from rsd.core.restore import Restore
from rsproto import Op

ALICE, BOB, CAROL, DAVE = 1, 2, 3, 4
HOLDERS: Mapping[int, str] = {ALICE: "alice", BOB: "bob", CAROL: "carol", DAVE: "dave"}
WALL = 1_700_000_000.0  # the core's wall clock is now + WALL
RUNS: tuple[str, ...] = ("s",)  # the runs every tenant's first connection creates at setup
_rids = itertools.count(1000)


def next_rid() -> int:
    """A request id no other call in this test run has used."""
    return next(_rids)


def on_disk(rec: Any) -> Any:
    """A record as recovery reads it back: encoded and decoded like logfile.scan does."""
    return msgpack.unpackb(msgpack.packb(rec, use_bin_type=True), raw=False, strict_map_key=False)


def seeded_bytes(seed: int = 7) -> Callable[[int], bytes]:
    """Reproducible randomness for lease handles (the shell passes os.urandom)."""
    rng = random.Random(seed)
    return lambda n: rng.randbytes(n)


def handle(lease_id: int, secret: bytes = b"\x5a" * 8) -> bytes:
    """A lease handle made up by hand: ``lease_id`` with a random part that was (almost
    surely) never drawn, for requests that must find nothing and for hand-made records."""
    return lease_id.to_bytes(8, "big") + secret


def lease_id(lease_handle: bytes) -> int:
    """The lease id inside a handle (its first 8 bytes, big-endian)."""
    return int.from_bytes(lease_handle[:8], "big")


def wheel_but_quiet_runs(core: Core) -> int:
    """The wheel's entries but the quiet runs' line (runends.py: on the wheel, as one
    entry, while any run holds nothing, like run "s" made at setup): what a test of
    other timers counts."""
    return len(core.wheel) - (1 if len(core.run_ends.line) else 0)


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
        tenants: Mapping[int, tuple[str, bool]] | None = None,
        runs: Iterable[str] = RUNS,
        **options: Any,
    ) -> None:
        options.setdefault("random_bytes", seeded_bytes())
        super().__init__(scope_ids or numbered_scopes(), wall_offset=wall_offset, **options)
        clash = _OWN & (set(vars(self)) | set(dir(Core)))
        assert not clash, f"the driver would hide the core's own {sorted(clash)}"
        self.setup = (scope_ids, wall_offset, tenants)
        self.options = options
        self.now = 0.0
        self.records: list[Any] = []
        if recovered:
            self.recovered(0.0, clean=True)
        for conn, holder in holders.items():
            tenant, admin = (tenants or {}).get(conn, ("default", True))
            self.connected(conn, holder, tenant=tenant, admin=admin)
        for conn in _one_conn_per_tenant(holders, tenants or {}):
            if mailbox is not None:
                self.call(Op.MAILBOX_ENSURE, {"name": mailbox}, conn)
            self.create_runs(*runs, conn=conn)
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

    def create_runs(self, *scope_ids: str, conn: int = ALICE) -> None:
        """Create the runs ``scope_ids`` for ``conn``'s tenant (SCOPE_CREATE with each
        chosen id; one that exists is left as it is)."""
        for scope_id in scope_ids:
            self.call(Op.SCOPE_CREATE, {"scope": scope_id}, conn)

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
        scope_ids, wall_offset, tenants = self.setup
        return CoreDriver(holders=holders or {}, mailbox=None, scope_ids=scope_ids,
                          wall_offset=wall_offset, tenants=tenants, runs=(), **self.options)

    def replay(self, records: Iterable[Any] | None = None, now: float | None = None) -> CoreDriver:
        """A fresh core rebuilt from ``records`` (by default everything drained so far),
        each read back as the journal stores it, applied at ``now``."""
        rebuilt = self.fresh()
        at = self.now if now is None else now
        for rec in self.records if records is None else records:
            rebuilt.apply(on_disk(rec), at)
        return rebuilt

    def rebuilt(self, from_snapshot: bool = False) -> CoreDriver:
        """This core as recovery rebuilds it: from everything drained so far (its
        journal), or from its snapshot (``Restore``, as a snapshot file is read), applied
        at its instant, which the rebuilt core goes on from."""
        if from_snapshot:
            rebuilt = self.fresh()
            Restore(rebuilt).apply([on_disk(rec) for rec in self.snapshot()], self.now)
        else:
            rebuilt = self.replay()
        rebuilt.now = self.now
        return rebuilt


def _one_conn_per_tenant(
    holders: Mapping[int, str], tenants: Mapping[int, tuple[str, bool]]
) -> list[int]:
    seen: dict[str, int] = {}
    for conn in holders:
        seen.setdefault(tenants.get(conn, ("default", True))[0], conn)
    return list(seen.values())


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
