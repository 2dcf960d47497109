"""Shared scaffolding for the work-queue core tests: a Core on a fake clock with three
connections (alice, bob, carol) and the mailbox "jobs", and thin request helpers."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from rsd.core import Core, CoreError
from rsproto import Op

ALICE, BOB, CAROL = 1, 2, 3
HOLDERS = {ALICE: "alice", BOB: "bob", CAROL: "carol"}
WALL = 1_700_000_000.0  # wall clock = now + WALL
_rids = itertools.count(1000)


def make_core(ensure: bool = True, **options: Any) -> Core:
    counter = itertools.count(1)
    core = Core(lambda: f"scope-{next(counter)}", wall_offset=WALL, **options)
    for conn, holder in HOLDERS.items():
        core.connected(conn, holder)
    if ensure:
        core.handle(0.0, ALICE, next(_rids), Op.MAILBOX_ENSURE, {"name": "jobs"})
        drain(core)
    return core


def drain(core: Core) -> None:
    core.effects.take_messages()
    core.effects.take_records()


def call(
    core: Core, now: float, op: int, args: dict[str, Any], conn: int = ALICE, rid: int | None = None
) -> Any:
    return core.handle(now, conn, next(_rids) if rid is None else rid, op, args)


def refused(core: Core, now: float, op: int, args: dict[str, Any], conn: int = ALICE) -> CoreError:
    with pytest.raises(CoreError) as info:
        call(core, now, op, args, conn)
    return info.value
