"""Client load never takes the descriptors rsd needs for itself.

rsd serves at most ``--max-connections`` connections (by default the file limit minus
the descriptors kept for persistence, accept bursts and refusals) and at most
``--max-connections-per-peer`` from one IP address. A connection over a limit gets one
connection-level RESOURCE_EXHAUSTED frame naming the limit and end-of-stream, and none of
its requests is read; the connections served carry on, and a place freed is taken again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.process import Rsd
from support.raw import RawConn

from rsd.cli import parse_args
from rsd.descriptors import budget
from rsd.policy import Policy
from rsproto import ErrorCode, Op

RawConnect = Callable[[str], Awaitable[Any]]


async def connect_from(address: str, source: str) -> RawConn:
    """A raw connection from the loopback address ``source`` (another peer)."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port), local_addr=(source, 0))
    return RawConn(reader, writer)


async def served(raw: RawConn) -> None:
    await raw.hello()
    assert "time" in await raw.ok(Op.PING, {})


async def refused(raw: RawConn, option: str) -> str:
    """The connection is refused naming ``option``, even though it sent a request."""
    await raw.send(raw.frame(Op.HELLO, {"version": 1, "holder": "late"})[1])
    before, message = await raw.closed_with(ErrorCode.RESOURCE_EXHAUSTED)
    assert before == []  # its HELLO was never read
    assert option in message, message
    return message


async def test_connections_over_the_total_limit_are_refused_and_the_rest_served(
    rsd_factory: Callable[..., Rsd], raw_connect: RawConnect
) -> None:
    server = rsd_factory("--max-connections", "4")
    first = [await raw_connect(server.address) for _ in range(4)]
    for raw in first:
        await served(raw)
    for _ in range(10):
        await refused(await raw_connect(server.address), "--max-connections")
    for raw in first:  # still served
        assert "time" in await raw.ok(Op.PING, {})
    stats = await first[0].ok(Op.SERVER_STATS, {})
    assert (stats["connections"], stats["connections_refused"]) == (4, 10)
    assert stats["max_connections"] == 4

    first[0].close()

    async def taken() -> None:
        while True:
            raw = await raw_connect(server.address)
            try:
                await served(raw)
                return
            except (AssertionError, EOFError):
                await asyncio.sleep(0.05)

    await asyncio.wait_for(taken(), 5)  # the freed place is served again


async def test_connections_over_the_per_peer_limit_are_refused_other_peers_served(
    rsd_factory: Callable[..., Rsd]
) -> None:
    server = rsd_factory("--max-connections", "10", "--max-connections-per-peer", "2")
    mine = [await connect_from(server.address, "127.0.0.1") for _ in range(2)]
    for raw in mine:
        await served(raw)
    message = await refused(
        await connect_from(server.address, "127.0.0.1"), "--max-connections-per-peer"
    )
    assert "127.0.0.1" in message
    other = await connect_from(server.address, "127.0.0.2")
    await served(other)  # another peer has places of its own
    for raw in [*mine, other]:
        raw.close()


async def test_a_flood_of_connections_never_stops_the_server(
    rsd_factory: Callable[..., Rsd], raw_connect: RawConnect
) -> None:
    """Many more connections than the limit at once, each sending HELLO: rsd refuses the
    extra ones and keeps serving and persisting (a snapshot opens files meanwhile)."""
    server = rsd_factory("--max-connections", "8", "--snapshot-bytes", "4096")
    keeper = await raw_connect(server.address)
    await served(keeper)

    opened: list[RawConn] = []

    async def one() -> str:
        """Each connection stays open until all have their answer, so the flood is
        really concurrent however slowly the machine runs the 200 of them."""
        raw = await raw_connect(server.address)
        opened.append(raw)
        try:
            await raw.send(raw.frame(Op.HELLO, {"version": 1, "holder": "flood"})[1])
            msg = await raw.recv()
            return "served" if msg[1] != 0 else str(msg[2])
        except (EOFError, ConnectionError):
            return "closed"

    try:
        outcomes = await asyncio.gather(*(one() for _ in range(200)))
    finally:
        for raw in opened:
            raw.close()
    assert outcomes.count("served") <= 7, outcomes  # the keeper holds the eighth place
    assert outcomes.count(ErrorCode.RESOURCE_EXHAUSTED) > 100, outcomes
    await keeper.ok(Op.SCOPE_CREATE, {"scope": "s"})  # runs must exist
    for n in range(200):  # enough journal for several snapshots
        await keeper.ok(Op.CLAIM_ACQUIRE, {"scope": "s", "key": f"k{n}"})
    assert server.alive
    stats = await keeper.ok(Op.SERVER_STATS, {})
    assert stats["journal"]["snapshots"] >= 1


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--max-connections", "0"], "--max-connections must be from 1 to"),
        (["--max-connections", "100000000"], "--max-connections must be from 1 to"),
        (["--max-connections", "many"], "--max-connections"),
        (["--max-connections", "5", "--max-connections-per-peer", "6"],
         "--max-connections-per-peer must be from 1 to"),
        (["--max-connections-per-peer", "0"], "--max-connections-per-peer must be from 1"),
        (["--frame-timeout", "0"], "--frame-timeout"),
    ],
)
def test_bad_limits_refuse_to_start_naming_the_option(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parse_args(flags, file_limit=20_000)
    assert info.value.code == 2
    assert named in capsys.readouterr().err


def test_the_default_limits_follow_the_file_limit_and_keep_the_reserve() -> None:
    args = parse_args([], file_limit=20_000)
    share = budget(20_000)
    assert args.max_connections == share.max_connections
    assert args.max_connections + Policy.RESERVED_DESCRIPTORS + share.backlog + share.refused \
        == 20_000
    assert args.max_connections_per_peer == Policy.MAX_CONNECTIONS_PER_PEER
    small = parse_args([], file_limit=256)  # a small limit still serves, below it
    assert 0 < small.max_connections < 256 - Policy.RESERVED_DESCRIPTORS
    assert small.max_connections_per_peer == small.max_connections
    with pytest.raises(SystemExit):
        parse_args([], file_limit=Policy.RESERVED_DESCRIPTORS)  # nothing left to serve
