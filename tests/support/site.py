"""rsd's HTTP listener as cli.py builds it (the dashboard's router over the API and the
metrics page), in the test's own process and loop, with no server behind the API: what
is decided before any core call (who asks, the Host, the body) can be tested without
starting rsd. A route that reaches the core answers 503, as on a standby."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rsd.http.api import Api
from rsd.http.dashboard import Dashboard
from rsd.http.httpserver import DEADLINE_SECONDS, HttpEndpoint
from rsd.http.metricshttp import MetricsPage
from rsd.security.auth import Authenticator

__all__ = ["Site", "exchange"]


class Site:
    """The listener on a free loopback port; ``close()`` when done."""

    def __init__(self, auth: Authenticator, endpoint: HttpEndpoint, port: int) -> None:
        self.auth, self.endpoint, self.port = auth, endpoint, port

    @classmethod
    async def start(cls, tokens: Path | None = None,
                    deadline: float = DEADLINE_SECONDS) -> Site:
        loop = asyncio.get_running_loop()
        auth = Authenticator(None if tokens is None else str(tokens))
        site = Dashboard(MetricsPage(loop, lambda: b"rsd_up 1\n"), Api(loop, auth, lambda: None))
        endpoint = HttpEndpoint(loop, site.handle, deadline=deadline)
        _, port = await endpoint.bind("127.0.0.1", 0)
        await endpoint.start()
        return cls(auth, endpoint, port)

    def close(self) -> None:
        self.endpoint.close()


async def exchange(port: int, request: bytes) -> tuple[int | None, bytes]:
    """Send ``request`` whole on a connection of its own: the answer's status (None if
    the connection ended with no answer) and body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    try:
        answer = await asyncio.wait_for(reader.read(), 30)
    except ConnectionResetError:
        answer = b""
    finally:
        writer.close()
    if not answer:
        return None, b""
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body
