"""Input that arrives while a connection's output is full waits undecoded.

No request of such a read can run (batches.py), so its bytes stay in the connection's
decoder, where the server-wide client buffer budget (clientbudget.py) counts them. Kept
as decoded messages they could take 64 times their size (a 1 MiB frame of empty arrays
decodes into 67 MB of lists) that the budget never saw: six connections that did not
read their replies held 440 MB of a server whose budget counted 2.4 MB.
"""

from __future__ import annotations

from test_a_framing_error_behind_a_backlog_builds_no_cycle import FakeConn, batches, request

import rsproto as wire
from rsd.policy import Policy
from rsd.wire.clientbudget import ClientBudget
from rsproto import Op


def junk() -> bytes:
    """A frame whose body is mostly empty arrays: a byte each, 64 once decoded."""
    body = wire.pack_body([1, 9, int(Op.PING), {"junk": [[]] * 100_000}])
    return wire.pack_header(len(body)) + body


def test_a_read_behind_a_full_output_is_kept_as_bytes_and_charged() -> None:
    runner = batches()
    conn = FakeConn()
    conn.out_bytes = Policy.OUTPUT_HIGH_WATER_BYTES  # this turn's replies reached the mark
    data = request(7) + junk()
    assert runner.run(conn, data, 0.0) == 0  # type: ignore[arg-type]
    assert conn.backlog == [] and conn.decoder.buffered == len(data)
    conn.out_bytes = 0
    assert ClientBudget.measure(conn) == len(data)  # type: ignore[arg-type]


def test_a_read_behind_owed_output_is_kept_as_bytes() -> None:
    runner = batches()
    conn = FakeConn()
    conn.owed.append(object())  # deferred replies wait for room
    data = junk() + request(7)
    runner.run(conn, data, 0.0)  # type: ignore[arg-type]
    assert conn.backlog == [] and conn.decoder.buffered == len(data)


def test_a_frame_too_large_behind_a_full_output_fails_the_connection_after_it() -> None:
    runner = batches()
    conn = FakeConn()
    conn.owed.append(object())
    runner.run(conn, (wire.MAX_FRAME_BYTES + 1).to_bytes(4, "big"), 0.0)  # type: ignore[arg-type]
    assert conn.backlog == [] and conn.error is not None
    assert conn.error.code == "FRAME_TOO_LARGE"
