"""The Prometheus page, ``GET /metrics`` (``metrics.render``), as the HTTP listener
(httpserver.py) serves it, beside the dashboard (dashboard.py) or alone
(``MetricsEndpoint``: a listener that serves nothing else).

Why not ``prometheus_client``: its registry and its HTTP server run in a thread of their
own and read the metrics from there under locks; rsd keeps every figure on the loop's
thread, bumped without locks on the hot path. Writing the text format here (metrics.py)
is a hundred lines, and the parser test checks it to the letter.

What always holds:
- rendering costs O(series), bounded (metrics.py), and a scrape within
  ``MIN_RENDER_SECONDS`` of the last render gets the same bytes, so scraping in a loop
  cannot take more than a sliver of the event loop;
- nothing here touches the core: it only reads counters; no authentication (the series
  name tenants and mailboxes: the listener belongs on loopback or a private network).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from .httpserver import (
    DEADLINE_SECONDS,
    MAX_HEAD_BYTES,
    HttpEndpoint,
    Request,
    Response,
    text,
)

__all__ = [
    "CONTENT_TYPE", "DEADLINE_SECONDS", "DESCRIPTORS", "MAX_CONNECTIONS", "MAX_PER_NETWORK",
    "MAX_PER_PEER", "MAX_REQUEST_BYTES", "MetricsEndpoint", "MetricsPage",
]

# The bounds of a listener that serves /metrics alone (a scrape takes milliseconds: a
# well-behaved scraper holds one connection); the dashboard's: httpserver.py.
MAX_CONNECTIONS = 16
MAX_PER_PEER = 4
MAX_PER_NETWORK = 8
DESCRIPTORS = 1 + 2 * MAX_CONNECTIONS
MAX_REQUEST_BYTES = MAX_HEAD_BYTES
MIN_RENDER_SECONDS = 0.5
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsPage:
    """``render()``'s bytes at most once per ``min_render`` seconds."""

    def __init__(self, loop: asyncio.AbstractEventLoop, render: Callable[[], bytes],
                 min_render: float = MIN_RENDER_SECONDS) -> None:
        self.loop = loop
        self._render = render
        self.min_render = min_render
        self.scrapes = 0
        self._body = b""
        self._rendered_at = float("-inf")

    def answer(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return text(405, "only GET and HEAD", ("Allow", "GET, HEAD"))
        now = self.loop.time()
        if now - self._rendered_at >= self.min_render:
            self._body = self._render()
            self._rendered_at = now
        self.scrapes += 1
        return Response(200, self._body, CONTENT_TYPE)


class MetricsEndpoint(HttpEndpoint):
    """A listener serving /metrics only (404 elsewhere)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, render: Callable[[], bytes], *,
                 min_render: float = MIN_RENDER_SECONDS, max_request: int = MAX_REQUEST_BYTES,
                 deadline: float = DEADLINE_SECONDS, **bounds: Any) -> None:
        self.page = MetricsPage(loop, render, min_render)
        bounds.setdefault("max_connections", MAX_CONNECTIONS)
        bounds.setdefault("max_per_peer", MAX_PER_PEER)
        bounds.setdefault("max_per_network", MAX_PER_NETWORK)
        super().__init__(loop, self._route, max_head=max_request, deadline=deadline, **bounds)

    @property
    def scrapes(self) -> int:
        return self.page.scrapes

    def _route(self, request: Request) -> Response:
        if request.path != "/metrics":
            return text(404, "the metrics are at /metrics")
        return self.page.answer(request)
