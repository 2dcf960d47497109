"""The servers tests start (``tests/support/process.py``'s ``Rsd``, ``rsclient.testing``'s
``RsdServer``) let rsd bind port 0 and take the port from its ``rsd listening on
HOST:PORT`` line: a port picked by the test and bound by rsd later can be taken in
between by another process ("address already in use" on a loaded machine). A restart
binds the reported port again, so clients find the server where it was; if another
socket took that port meanwhile (any outgoing connection of the machine may get it as its
ephemeral port once rsd is gone: seen once in a full run, in the kill -9 loop), it waits
for the port rather than failing the test.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from support.process import Rsd

from rsclient import AsyncRunstate
from rsclient.testing import RsdServer


def listen_arg(args: Any) -> str:
    argv = [str(arg) for arg in args]
    return argv[argv.index("--listen") + 1]


async def test_a_restartable_rsd_of_the_suite_binds_port_0_then_the_port_it_reported(
    restartable: Rsd,
) -> None:
    server, address = restartable, restartable.address
    assert server.proc is not None and listen_arg(server.proc.args) == "127.0.0.1:0"
    assert server.port != 0 and address == f"127.0.0.1:{server.port}"
    assert await server.restart() == address
    assert listen_arg(server.proc.args) == address


async def test_rsclient_testing_server_binds_port_0_then_the_port_it_reported() -> None:
    server = RsdServer()
    try:
        address = await asyncio.to_thread(server.start)
        assert server.proc is not None and listen_arg(server.proc.args) == "127.0.0.1:0"
        assert server.port != 0
        async with AsyncRunstate(holder="a", address=address) as rs:
            await rs.ping()
        assert await asyncio.to_thread(server.restart) == address
        assert listen_arg(server.proc.args) == address
    finally:
        await asyncio.to_thread(server.stop)


async def test_a_restart_waits_for_its_port_taken_meanwhile_by_another_socket(
    restartable: Rsd,
) -> None:
    server, address = restartable, restartable.address
    assert await server.stop() == 0
    taken = socket.socket()  # as a connection's ephemeral port: bound, no SO_REUSEADDR
    taken.bind(("127.0.0.1", server.port))
    try:
        restarting = asyncio.ensure_future(server.start())
        for _ in range(300):  # until a start was refused the port (a loaded machine: slow)
            if any("address already in use" in server.log(n) for n in range(len(server.logs))):
                break
            await asyncio.sleep(0.05)
        assert not restarting.done()
    finally:
        taken.close()
    assert await restarting == address
