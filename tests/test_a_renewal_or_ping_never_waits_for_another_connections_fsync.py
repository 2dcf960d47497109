"""A renewal or PING that reveals nothing journaled never waits for another's fsync.

Under ``--fsync always`` a connection's submit is held until the fsync covering it
completes. A failpoint holds that fsync (``journal.fsync.hold``: the fsync thread waits
while a file exists), so what follows is deterministic, not timed: a bystander's PING,
its one-lease and two-lease renewals are answered while the fsync is held; the
submitter's reply is not. A bystander's reply that could reveal a change (a renewal of
a lease that is not live) waits for the fsync, and so does everything after it on that
connection that could (held replies keep their order). But a PING's answer and a
renewal's that renewed its lease, which reveal nothing, leave ahead of it, whether
read with it or later. Once the fsync is let go, everything held arrives, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from support.process import Rsd
from support.raw import RawConn, raw_connect

from rsclient import wire
from rsproto import LEASE_HANDLE_BYTES, Op

ANSWER_TIMEOUT = 10.0  # seconds: only a reply wrongly held would take that long


async def wait_for_file(path: Path) -> None:
    for _ in range(int(ANSWER_TIMEOUT / 0.01)):
        if path.exists():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{path} never appeared: the held fsync was not reached")


async def nothing_arrives(conn: RawConn) -> None:
    """Nothing is readable on ``conn`` right now (what is held cannot arrive)."""
    with contextlib.suppress(TimeoutError):
        msg = await conn.recv(0.2)
        raise AssertionError(f"a reply arrived before its fsync: {msg!r}")


async def test_a_bystanders_ping_and_renewals_are_answered_while_an_fsync_is_held(
    rsds: Callable[..., Rsd], tmp_path: Path
) -> None:
    hold = tmp_path / "hold-fsync"
    rsd = rsds()
    await rsd.start("--fsync", "always", failpoints="journal.fsync.hold",
                    env={"RSD_FAILPOINTS_HOLD_FILE": str(hold)})
    bystander, writer = await raw_connect(rsd.address), await raw_connect(rsd.address)
    try:
        await bystander.hello("bystander")
        scope = (await bystander.ok(Op.SCOPE_CREATE, {}))["scope"]
        leases = [
            (await bystander.ok(Op.CLAIM_ACQUIRE, {"scope": scope, "key": key}))["lease"]
            for key in ("a", "b")
        ]
        await writer.hello("writer")
        await writer.ok(Op.MAILBOX_ENSURE, {"name": "jobs"})
        run = (await writer.ok(Op.SCOPE_CREATE, {}))["scope"]

        hold.touch()
        submit = await writer.request(Op.TASK_SUBMIT_MANY, {
            "scope": run, "mailbox": "jobs", "items": [{"key": "t", "data": None}],
        })
        await wait_for_file(Path(f"{hold}.reached"))  # its fsync is held now

        ping = await bystander.call(Op.PING, {}, ANSWER_TIMEOUT)
        assert ping[0] == wire.Kind.REPLY, ping
        one = await bystander.call(Op.LEASE_RENEW, {"leases": leases[:1]}, ANSWER_TIMEOUT)
        assert one[0] == wire.Kind.REPLY and one[2] == {"results": [None]}, one
        two = await bystander.call(Op.LEASE_RENEW, {"leases": leases}, ANSWER_TIMEOUT)
        assert two[0] == wire.Kind.REPLY and two[2] == {"results": [None, None]}, two
        await nothing_arrives(writer)

        # A STALE_CLAIM may reveal an end: it waits, and a reply behind it that could
        # reveal one (a release); the renewal and the PING sent with them do not.
        stale, stale_frame = bystander.frame(Op.LEASE_RENEW,
                                             {"leases": [bytes(LEASE_HANDLE_BYTES)]})
        release, release_frame = bystander.frame(Op.CLAIM_RELEASE, {"lease": leases[1]})
        behind, behind_frame = bystander.frame(Op.LEASE_RENEW, {"leases": leases[:1]})
        ping_with, ping_frame = bystander.frame(Op.PING, {})
        await bystander.send(stale_frame + release_frame + behind_frame + ping_frame)
        renewed = await bystander.recv(ANSWER_TIMEOUT)
        assert renewed[:2] == [wire.Kind.REPLY, behind], renewed
        assert renewed[2] == {"results": [None]}, renewed
        answered = await bystander.recv(ANSWER_TIMEOUT)
        assert answered[:2] == [wire.Kind.REPLY, ping_with], answered
        later = await bystander.call(Op.PING, {}, ANSWER_TIMEOUT)  # sent after them
        assert later[0] == wire.Kind.REPLY, later
        await nothing_arrives(bystander)

        hold.unlink()
        answer: Any = await writer.recv(ANSWER_TIMEOUT)
        assert answer[:2] == [wire.Kind.REPLY, submit], answer
        assert answer[2]["results"][0]["created"] is True
        first = await bystander.recv(ANSWER_TIMEOUT)
        second = await bystander.recv(ANSWER_TIMEOUT)
        assert first[:2] == [wire.Kind.REPLY, stale] and second[:2] == [wire.Kind.REPLY, release]
        assert first[2] == {"results": ["STALE_CLAIM"]}, first
        assert second[2] == {}, second
    finally:
        hold.unlink(missing_ok=True)
        bystander.close()
        writer.close()
    assert await rsd.stop() == 0
