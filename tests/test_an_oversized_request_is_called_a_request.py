"""A request over the 1 MiB limit is refused in the words its sender knows: a "request"
of so many bytes over the limit per request, never a "frame body" (a word of the wire
format, which a user of the SDK never sees). The SDK refuses it before sending; rsd,
reading a header that declares more, says the same before the body arrives.
"""

from __future__ import annotations

import struct
from collections.abc import Awaitable, Callable

import pytest
from support.process import Rsd
from support.raw import RawConn

from rsclient import AsyncRunstate, InvalidArgumentError, wire

LIMIT = wire.MAX_FRAME_BYTES


def said_as_a_request(message: str, size: int) -> None:
    assert f"request of {size} bytes" in message, message
    assert f"over the limit of {LIMIT} bytes per request" in message, message
    assert "frame" not in message, message


async def test_the_sdk_refuses_an_oversized_request_naming_it_a_request(
    clients: Callable[..., AsyncRunstate],
) -> None:
    rs = clients("big-submitter")
    await rs.mailboxes.ensure("jobs")
    run = await rs.scopes.create()
    with pytest.raises(InvalidArgumentError) as caught:
        await run.mailbox("jobs").submit({"blob": b"x" * (2 * LIMIT)})
    size = int(str(caught.value).split("request of ")[1].split(" ")[0])
    assert size > 2 * LIMIT
    said_as_a_request(str(caught.value), size)
    assert sum((await run.status())["tasks"].values()) == 0  # nothing was sent


async def test_rsd_refuses_an_oversized_request_naming_it_a_request(
    rsd: Rsd, raw_connect: Callable[[str], Awaitable[RawConn]]
) -> None:
    conn = await raw_connect(rsd.address)
    await conn.hello()
    await conn.send(struct.pack(">I", LIMIT + 1))  # the header alone: refused at once
    _, message = await conn.closed_with(wire.ErrorCode.FRAME_TOO_LARGE)
    said_as_a_request(message, LIMIT + 1)
