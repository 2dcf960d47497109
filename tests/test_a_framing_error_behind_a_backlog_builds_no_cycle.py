"""A framing error kept behind a backlog builds no reference cycle through its connection.

When a broken frame follows requests that wait in a connection's backlog (its output
full, or its turn cut after a heavy reply), the framing error is kept on the connection
until the backlog has run (batches.py). A connection that goes away meanwhile must be
freed by reference counting: rsd's collector freezes what survives a step
(collector.py), so a cycle formed through a connection that had already been frozen
would never be reclaimed, and with it the connection's backlog and buffers. The
exception's traceback held the frame of ``Batches._decode``, whose locals hold the
connection: connection -> error -> traceback -> frame -> connection.
"""

from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace
from typing import Any

import rsproto as wire
from rsd.core.ground.effects import Effects
from rsd.metrics import Metrics
from rsd.policy import Policy
from rsd.wire.batches import Batches
from rsproto import Op


class FakeConn:
    """What ``Batches`` touches of a connection (its output empty to begin with)."""

    def __init__(self) -> None:
        self.id = 1
        self.holder = "h"
        self.peer = "fake"
        self.transport = SimpleNamespace(get_write_buffer_size=lambda: 0,
                                         is_closing=lambda: False)
        self.closing = False
        self.feed = False  # a client's, not a standby's feed
        self.owed: list[Any] = []
        self.held_bytes = 0
        self.out: list[bytes] = []
        self.out_bytes = 0
        self.decoder = wire.Decoder(wire.MAX_FRAME_BYTES)
        self.backlog: list[Any] | None = None
        self.error: Any = None
        self.yielded = False
        self.chunk = 128
        self.quiet_bytes = 0
        self.overtaking: list[int] = []

    def pending(self) -> int:
        return self.out_bytes + self.held_bytes

    def block(self, rest: list[Any]) -> None:
        self.backlog = rest

    def fail(self, code: Any, message: str) -> None:
        raise AssertionError("the error must wait for the backlog")


def batches() -> Batches:
    """A runner whose core answers every request with half the output's mark: the
    second reply of a read reaches it."""
    big = {"pad": "x" * (Policy.OUTPUT_HIGH_WATER_BYTES // 2 + 10)}
    core = SimpleNamespace(tick=lambda now: None, lease_renew=None,
                           effects=Effects(),
                           handle=lambda now, conn, rid, op, args: big)
    return Batches(
        core,  # type: ignore[arg-type]
        lambda: 0.0,
        SimpleNamespace(share=1.0),  # type: ignore[arg-type]
        Metrics(),
        None,  # type: ignore[arg-type]  # no session op is sent
        lambda conn: None,
        lambda conn: None,
    )


def request(rid: int) -> bytes:
    body = wire.pack_body([1, rid, int(Op.SCOPE_STATUS), {"scope": "s"}])
    return wire.pack_header(len(body)) + body


def test_a_connection_gone_with_a_framing_error_behind_its_backlog_is_freed_at_once() -> None:
    runner = batches()
    conn = FakeConn()
    broken = (8).to_bytes(4, "big") + b"\xc1" * 8  # a frame, not msgpack
    runner.run(conn, request(7) + request(8) + request(9) + broken, 0.0)  # type: ignore[arg-type]
    assert conn.backlog is not None and len(conn.backlog) == 1  # the third waits
    assert conn.error is not None and conn.error.code == "PROTOCOL_ERROR"
    gone = weakref.ref(conn)
    gc.disable()
    try:
        del conn
        assert gone() is None, "the connection is kept alive by a reference cycle"
    finally:
        gc.enable()
