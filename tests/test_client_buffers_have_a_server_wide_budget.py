"""Bytes held for all clients together stay under ``--max-client-buffer-bytes``.

Each connection is bounded on its own, but many at their bounds add up (100 connections
each holding a 1 MiB unfinished frame: 100 MiB). Past the server-wide budget the
connections holding the most are closed, largest first, with RESOURCE_EXHAUSTED naming
the option; their unfinished input is dropped at once. A connection holding less is never
closed before a larger one, one holding nothing never, and a stale figure (a write buffer
that drained without a callback) never closes anyone. In-process, on recording transports.
"""

from __future__ import annotations

import struct

from support.shell import Shell, transport, turn

import rsproto as wire
from rsd.wire.connection import Connection
from rsproto import MAX_FRAME_BYTES, Kind, Op

LIMIT = 4 << 20  # the smallest budget the option allows
PIECE = 64 << 10


def total_measured(shell: Shell, conns: list[Connection]) -> int:
    return sum(shell.budget.measure(conn) for conn in conns)


def closed_for_budget(conn: Connection) -> bool:
    last = transport(conn).messages()[-1]
    return (
        last[:3] == [int(Kind.ERROR), 0, "RESOURCE_EXHAUSTED"]
        and "--max-client-buffer-bytes" in last[3]
    )


async def test_partial_frames_past_the_budget_close_the_largest_never_a_small_holder() -> None:
    shell = Shell(max_client_buffer_bytes=LIMIT)
    bystander, small = shell.connect("bystander"), shell.connect("small")
    attackers = [shell.connect(f"attacker-{n}") for n in range(16)]
    everyone = [bystander, small, *attackers]
    await turn()
    small.data_received(struct.pack(">I", 1000) + b"\x00" * 100)  # 104 bytes held
    for conn in attackers:
        conn.data_received(struct.pack(">I", MAX_FRAME_BYTES))
    for _ in range(MAX_FRAME_BYTES // PIECE - 1):  # each grows towards a 1 MiB frame
        for conn in attackers:
            if not conn.closing:
                conn.data_received(b"\x00" * PIECE)
            assert shell.budget.total <= LIMIT, "a read left the total over the budget"
            assert shell.budget.total == total_measured(shell, everyone)
    await turn()
    evicted = [conn for conn in attackers if conn.closing]
    assert len(evicted) >= len(attackers) - LIMIT // MAX_FRAME_BYTES
    assert all(closed_for_budget(conn) for conn in evicted)
    assert all(conn.decoder.buffered == 0 for conn in evicted), "its input was kept"
    assert not small.closing and not bystander.closing, "a small holder was closed"
    assert shell.stats()["client_buffer_evictions"] == len(evicted)
    bystander.data_received(wire.request_frame(2, Op.PING, {}))
    await turn()
    assert transport(bystander).messages()[-1][:2] == [int(Kind.REPLY), 2]


async def test_the_largest_holder_goes_first() -> None:
    shell = Shell(max_client_buffer_bytes=LIMIT)
    big, medium = shell.connect("big"), shell.connect("medium")
    await turn()
    big.data_received(struct.pack(">I", MAX_FRAME_BYTES) + b"\x00" * (3 << 20 >> 2))
    medium.data_received(struct.pack(">I", MAX_FRAME_BYTES) + b"\x00" * (1 << 19))
    assert not big.closing and not medium.closing  # 768 KiB + 512 KiB: under
    transport(medium).buffered = 3 << 20  # output the peer does not read
    shell.budget.charge(medium)
    shell.budget.enforce()
    assert medium.closing and not big.closing, "not the largest holder was closed"


async def test_a_stale_write_buffer_figure_closes_nobody() -> None:
    shell = Shell(max_client_buffer_bytes=LIMIT)
    reader, writer = shell.connect("slow-reader"), shell.connect("writer")
    await turn()
    transport(reader).buffered = 3 << 20
    shell.budget.charge(reader)
    transport(reader).buffered = 0  # drained, and no callback said so
    writer.data_received(struct.pack(">I", MAX_FRAME_BYTES) + b"\x00" * (MAX_FRAME_BYTES - 1))
    assert not reader.closing and not writer.closing, "a stale figure closed a connection"
    assert shell.budget.total == total_measured(shell, [reader, writer])
