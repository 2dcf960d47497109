"""The pytest plugin of rsclient: a real rsd for your tests, like fakeredis but the real
thing. Installed with rsclient (a ``pytest11`` entry point), nothing to configure:

    async def test_only_one_worker_gets_the_key(run):
        lease = await run.claim("k").acquire()
        assert (await run.claim("k").try_acquire())["kind"] == "busy"

Fixtures:
- ``rsd_server``: one ``RsdServer`` (``rsclient.testing``) for the whole session, started
  on first use on a free port with a temporary data directory, stopped at the end;
- ``runstate``: an ``AsyncRunstate`` connected to it, closed after the test (async: needs
  pytest-asyncio, as async tests do);
- ``run``: a fresh scope (run) of that client, so tests never see each other's keys.

What always holds: each test gets its own client and its own run; the server is shared,
so a test that needs a server of its own (to stop or restart it) makes an ``RsdServer``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from .client import AsyncRunstate, Scope
from .testing import RsdServer

__all__ = ["rsd_server", "run", "runstate"]

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - the async fixtures need pytest-asyncio
    pytest_asyncio = None  # type: ignore[assignment]


@pytest.fixture(scope="session")
def rsd_server() -> Iterator[RsdServer]:
    """A real rsd for the session: free port, temporary data, short retention."""
    server = RsdServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()


if pytest_asyncio is not None:

    @pytest_asyncio.fixture
    async def runstate(rsd_server: RsdServer) -> AsyncIterator[AsyncRunstate]:
        """An ``AsyncRunstate`` connected to ``rsd_server``, closed after the test."""
        client = AsyncRunstate(holder="pytest", address=rsd_server.address)
        await client.connect()
        try:
            yield client
        finally:
            await client.close()

    @pytest_asyncio.fixture
    async def run(runstate: AsyncRunstate) -> Scope:
        """A fresh run (scope) of the ``runstate`` client."""
        return await runstate.scopes.create()
