"""A start that fails before serving leaves the data directory as a clean stop would.

rsd takes its address before recovery writes anything, and closes the journal cleanly
if anything fails between recovery and serving; so the next start finds a clean stop:
no "the last stop was not clean", no jump of ids and generations (a new key starts at
generation 1, not 4097)."""

from __future__ import annotations

import socket
from collections.abc import Callable

from rsclient import AsyncRunstate
from tests.support.process import Rsd


async def first_generation(address: str) -> int:
    async with AsyncRunstate(holder="after", address=address) as rs:
        await rs.scopes.create(id="s")  # runs must exist
        lease = await rs.scope("s").claim("fresh-key", lease_seconds=5).acquire()
        generation = lease.generation
        await lease.release()
        return generation


async def test_a_start_on_a_busy_port_leaves_a_clean_stop(rsds: Callable[..., Rsd]) -> None:
    server = rsds("busy")
    await server.start()  # a data directory with a journal, stopped cleanly
    assert await server.stop() == 0
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", server.port))
        squatter.listen()
        assert await server.refused() == 1
        assert "cannot listen on" in server.log()
        assert "address already in use" in server.log()
    files = sorted(path.name for path in server.data.iterdir())
    address = await server.start()
    assert "the last stop was not clean" not in server.log()
    assert "recovered in" in server.log()
    assert await first_generation(address) == 1
    assert await server.stop() == 0
    # The failed start wrote no journal segment at all.
    assert len([name for name in files if name.startswith("journal-")]) == 1


async def test_a_start_on_a_busy_port_with_a_new_data_directory_writes_nothing(
    rsds: Callable[..., Rsd],
) -> None:
    server = rsds("fresh")
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        server.port = squatter.getsockname()[1]  # its first start meets a busy port
        assert await server.refused() == 1
    assert server.segments() == []
    address = await server.start()
    assert "the last stop was not clean" not in server.log()
    assert await first_generation(address) == 1
    assert await server.stop() == 0
