"""A renewal that wrote no record and renewed every lease it named (a quiet renewal) is
answered at the flush of its own loop turn, ahead of its connection's replies held for
an fsync (or a synchronous standby), as a PING's is (rsd/wire/output.py).

It reveals nothing journaled: every lease it names is live, and a client can name only
a lease whose grant it was told, once durable. So a holder whose connection also has a
write held (in a cluster, for up to one lease while a hung standby is replaced) has its
renewal confirmed before its own deadline, instead of declaring lost a lease the server
renewed. A renewal that revealed something (a STALE_CLAIM: the lease may have ended in a
change not yet durable) keeps its place among the held replies. The server answers in
its order of processing; only the delivery changes, and never between two replies about
one lease: "renew L; release L" is answered renewed first anyway, and "release L; renew
L" gets a STALE_CLAIM, held behind the release.

In-process, on recording transports, with an fsync that ends when the test says: which
bytes leave in which write is exact, not timed.
"""

from __future__ import annotations

import asyncio
from typing import Any

from support.shell import Shell, transport, turn
from test_a_pings_answer_leaves_ahead_of_its_connections_held_replies import (
    FsyncOnCue,
    NoSnapshots,
    request,
    written,
)

from rsd.disk.groupcommit import GroupCommit
from rsd.wire.connection import Connection
from rsproto import LEASE_HANDLE_BYTES, Kind, Op


async def answer(conn: Connection, op: int, args: dict[str, Any]) -> Any:
    """Send one request while nothing is held: its reply's result."""
    before = len(transport(conn).writes)
    rid, frame = request(op, args)
    conn.data_received(frame)
    await turn()
    (reply,) = [msg for write in written(conn, before) for msg in write]
    assert reply[:2] == [Kind.REPLY, rid], reply
    return reply[2]


def heads(writes: list[list[Any]]) -> list[list[list[Any]]]:
    """Each write's messages as [kind, request id]."""
    return [[msg[:2] for msg in write] for write in writes]


async def test_a_quiet_renewals_answer_leaves_ahead_of_its_connections_held_replies() -> None:
    shell = Shell()
    conn = shell.connect("holder")
    await turn()
    await answer(conn, Op.MAILBOX_ENSURE, {"name": "jobs"})
    scope = (await answer(conn, Op.SCOPE_CREATE, {}))["scope"]
    first, second = [
        (await answer(conn, Op.CLAIM_ACQUIRE, {"scope": scope, "key": key}))["lease"]
        for key in ("a", "b")
    ]
    journal = FsyncOnCue()
    shell.commit = GroupCommit(
        journal, NoSnapshots(), asyncio.get_running_loop(),  # type: ignore[arg-type]
        shell.output.send_held)
    before = len(transport(conn).writes)

    # One read: a submit (held for its record's fsync), then renewals: of one lease, of
    # both, of a lease that is not live (STALE_CLAIM: held), of one lease again.
    (submit, a), (one, b), (both, c), (stale, d), (behind, e) = (
        request(Op.TASK_SUBMIT, {"scope": scope, "mailbox": "jobs", "data": None}),
        request(Op.LEASE_RENEW, {"leases": [first]}),
        request(Op.LEASE_RENEW, {"leases": [first, second]}),
        request(Op.LEASE_RENEW, {"leases": [bytes(LEASE_HANDLE_BYTES)]}),
        request(Op.LEASE_RENEW, {"leases": [second]}))
    conn.data_received(a + b + c + d + e)
    await turn()
    assert journal.running is not None and journal.durable == 0
    answers = written(conn, before)
    assert heads(answers) == [[[Kind.REPLY, one], [Kind.REPLY, both], [Kind.REPLY, behind]]], (
        "not the quiet renewals alone, in one write, in order")
    assert [msg[2] for msg in answers[0]] == [
        {"results": [None]}, {"results": [None, None]}, {"results": [None]}]

    # A later turn: "renew L; release L" (the renewal first, at once; the release held),
    # then "release L; renew L" (the renewal finds L ended: STALE_CLAIM, held behind).
    (renew_first, f), (release_first, g) = (
        request(Op.LEASE_RENEW, {"leases": [first]}),
        request(Op.CLAIM_RELEASE, {"lease": first}))
    (release_second, h), (renew_second, i) = (
        request(Op.CLAIM_RELEASE, {"lease": second}),
        request(Op.LEASE_RENEW, {"leases": [second]}))
    conn.data_received(f + g + h + i)
    await turn()
    assert heads(written(conn, before + 1)) == [[[Kind.REPLY, renew_first]]]
    assert conn.held_bytes > 0

    journal.finish()  # covers the submit only: what it released leaves, in order
    await turn()
    assert heads(written(conn, before + 2)) == [
        [[Kind.REPLY, submit], [Kind.REPLY, stale]]]
    assert journal.running is not None, "the releases' records are not yet durable"
    journal.finish()
    await turn()
    released = written(conn, before + 3)
    assert heads(released) == [[
        [Kind.REPLY, release_first], [Kind.REPLY, release_second], [Kind.REPLY, renew_second]]]
    assert released[0][2][2] == {"results": ["STALE_CLAIM"]}
    assert journal.durable == journal.writes and conn.held_bytes == 0
