"""One HTTP/1.1 request on its own connection, for the tests of rsd's HTTP listener
(the dashboard's API, /metrics): the status and the JSON body (or the text)."""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any

__all__ = ["http"]


async def http(port: int, method: str, path: str, token: str | None = None,
               body: Any = None, tls: ssl.SSLContext | None = None) -> tuple[int, Any]:
    """One request on its own connection: the status and the JSON body (or the text)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    data = b"" if body is None else json.dumps(body).encode()
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Length: {len(data)}\r\nContent-Type: application/json\r\n")
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    writer.write(head.encode() + b"\r\n" + data)
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    top, _, payload = answer.partition(b"\r\n\r\n")
    status = int(top.split(b" ", 2)[1])
    try:
        return status, json.loads(payload)
    except ValueError:
        return status, payload.decode()
