"""Connections opened and closed leave no reference cycles in the server.

rsd's collector (collector.py) freezes what survives, so a connection object caught in a
cycle when it closes would never be freed. A real server is churned through every way a
connection ends (a clean close, a close in the middle of a wait, a broken frame, a HELLO
refused, a close before HELLO, over TLS too); a snapshot's collector step then collects
everything not yet frozen, and SERVER_STATS' ``gc.collected`` (the unreachable objects
the server's collections found) must not have grown with the churn.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Awaitable, Callable
from pathlib import Path

from support.certs import Certs
from support.process import Rsd
from support.raw import RawConn

from rsproto import Op

RawConnect = Callable[..., Awaitable[RawConn]]
CHURN = 120  # connections per way of ending (TLS: TLS_CHURN, its handshakes cost more)
TLS_CHURN = 40
SLACK = 20  # unreachable objects allowed for the whole churn (a cycle per connection is more)


async def found(raw: RawConn) -> tuple[int, int]:
    """(unreachable objects the server's collections found so far, full collections run),
    after a snapshot: its collector step collects everything not frozen yet."""
    await raw.ok(Op.SNAPSHOT_NOW, {})
    stats = (await raw.ok(Op.SERVER_STATS, {}))["gc"]
    return sum(stats["collected"]), stats["collections"][2]


async def closed(raw: RawConn) -> None:
    raw.close()
    # Over TLS the client's close_notify may cross the server's own goodbye (its error
    # frame and close_notify, already on their way): asyncio's client then fails its
    # shutdown (APPLICATION_DATA_AFTER_CLOSE_NOTIFY), seen in about 1 of 10 full runs
    # on a loaded machine. The socket is closed either way; what is measured here is
    # the server's memory, not the TLS goodbye.
    with contextlib.suppress(ssl.SSLError):
        await raw.writer.wait_closed()


async def churn(
    connect: Callable[[], Awaitable[RawConn]], run: str, tag: str, count: int
) -> None:
    """Open and end ``count`` connections each way (claims named after ``tag``)."""
    for n in range(count):
        served = await connect()
        await served.hello(f"churn-{n}")
        await served.ok(Op.CLAIM_ACQUIRE, {"scope": run, "key": f"{tag}-{n}", "lease_seconds": 5})
        await served.error(Op.CLAIM_ACQUIRE, {"scope": "never-made", "key": "k"})
        await served.request(Op.CLAIM_ACQUIRE, {"scope": run, "key": "held", "wait": True})
        await closed(served)  # in the middle of a wait (or holding "held")

        broken = await connect()
        await broken.hello(f"broken-{n}")
        await broken.send((8).to_bytes(4, "big") + b"\xc1" * 8)  # a frame, not msgpack
        await broken.closed_with("PROTOCOL_ERROR")
        await closed(broken)

        refused = await connect()
        await refused.send(refused.frame(Op.HELLO, {"version": 999, "holder": "x"})[1])
        await refused.closed_with("UNSUPPORTED_VERSION")
        await closed(refused)

        silent = await connect()
        await closed(silent)  # never said anything


async def assert_churn_leaves_no_cycles(
    connect: Callable[[], Awaitable[RawConn]], count: int = CHURN
) -> None:
    admin = await connect()
    await admin.hello("admin")
    run = (await admin.ok(Op.SCOPE_CREATE, {}))["scope"]
    await churn(connect, run, "first", count)  # first use: imports, caches, interned names
    before, runs_before = await found(admin)
    await churn(connect, run, "second", count)
    after, runs_after = await found(admin)
    assert runs_after > runs_before  # the server did collect what was there
    assert after - before <= SLACK, (
        f"{after - before} objects in reference cycles after {4 * count} connections"
    )


async def test_plain_connections_leave_no_cycles(rsd: Rsd, raw_connect: RawConnect) -> None:
    await assert_churn_leaves_no_cycles(lambda: raw_connect(rsd.address))


async def test_tls_connections_leave_no_cycles(
    rsds: Callable[..., Rsd], tmp_path: Path, raw_connect: RawConnect
) -> None:
    certs = Certs(tmp_path / "certs")
    server = rsds("tls")
    await server.start(*certs.server_flags())
    context = certs.client_context()
    await assert_churn_leaves_no_cycles(
        lambda: raw_connect(server.address, context), TLS_CHURN)
    assert await server.stop() == 0

