"""The connection-level error frame is the last message a failed connection gets.

A connection that fails (a broken frame) gets every answer already produced for it, then
its error frame (request id 0), then the end of the stream. What the core produces for
it after that (a LEASE_LOST push because another client cancelled the scope its lease
was in, while its last replies still wait for their fsync) is dropped: a client reads
the error frame as the last word of the connection.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

from support.process import Rsd

from rsproto import ErrorCode, Op

RawConnect = Callable[[str], Awaitable[Any]]

TRIALS = 40
GARBAGE = struct.pack(">I", 3) + b"\xc1\xc1\xc1"  # well framed, not msgpack


async def test_no_push_follows_the_connection_error_frame(
    rsd: Rsd, raw_connect: RawConnect
) -> None:
    watcher = await raw_connect(rsd.address)
    await watcher.hello("watcher")
    for trial in range(TRIALS):
        failing = await raw_connect(rsd.address)
        await failing.hello("failing")
        scope = f"s{trial}"
        await failing.ok(Op.SCOPE_CREATE, {"scope": scope})  # runs must exist
        _, acquire = failing.frame(Op.CLAIM_ACQUIRE, {"scope": scope, "key": "k"})
        _, cancel = watcher.frame(Op.SCOPE_CANCEL, {"scope": scope})
        # the claim is granted and the connection fails in one turn; its grant and error
        # frame wait for the fsync while the cancel, a moment later, ends its lease
        await failing.send(acquire + GARBAGE)
        await asyncio.sleep((trial % 4) * 0.0005)
        await watcher.send(cancel)
        before, _ = await failing.closed_with(ErrorCode.PROTOCOL_ERROR)
        # the grant (or a refusal), and the push if the cancel came before the failure
        assert [msg[0] for msg in before] in ([2], [3], [2, 4]), before
        assert (await watcher.recv())[0] == 2
