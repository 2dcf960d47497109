"""What rsd's HTTP listener serves (``--http-listen``): ``/metrics`` (metricshttp.py),
the health probes ``/healthz`` and ``/readyz`` (probes.py, no token needed),
the dashboard page at ``/`` and its files under ``/static/`` (shipped in the package,
rsd/static/: its script and style, and uPlot for the chart, vendored in
rsd/static/vendor/; no CDN, no build step), and the JSON API under ``/api/`` (api.py).

What always holds: the page and its files hold no data and are served to anyone who
reaches the listener; every figure the page shows comes from ``/api/``, which decides
who asks (api.py). Without a tokens file every path, ``/metrics`` included, answers only
requests from loopback addressed to a loopback name (``api.loopback_refusal``), so no
other site's page can read the metrics by rebinding its name to 127.0.0.1. The page is
served with a content security policy that lets it load only from this origin and never
be framed.
"""

from __future__ import annotations

import asyncio
from importlib import resources

from .api import Api, loopback_refusal
from .httpserver import Request, Response, text
from .metricshttp import MetricsPage
from .probes import PATHS as PROBES
from .probes import Probes

__all__ = ["Dashboard"]

_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/static/app.css": ("app.css", "text/css; charset=utf-8"),
    # the chart library, vendored unchanged with its licence (static/vendor/README.md)
    "/static/vendor/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js",
                                         "text/javascript; charset=utf-8"),
    "/static/vendor/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
}
_PAGE_HEADERS = (
    ("Content-Security-Policy",
     "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
)


class Dashboard:
    """Routes a request to the metrics page, a static file or the API."""

    def __init__(self, metrics: MetricsPage, api: Api, probes: Probes | None = None) -> None:
        """``probes``: the health probes (None: a node always ready, for tests of the
        page alone)."""
        self.metrics = metrics
        self.api = api
        self.probes = probes if probes is not None else Probes(lambda: None)
        folder = resources.files("rsd") / "static"
        self.files = {
            path: Response(200, folder.joinpath(*name.split("/")).read_bytes(), kind, _PAGE_HEADERS)
            for path, (name, kind) in _FILES.items()
        }

    def handle(self, request: Request) -> Response | asyncio.Future[Response]:
        path = request.path
        if path.startswith("/api/"):
            return self.api.handle(request)  # the same rule, answered as the API answers
        refusal = loopback_refusal(self.api.auth, request)
        if refusal is not None:
            return text(403, refusal)
        if path == "/metrics":
            return self.metrics.answer(request)
        if path in PROBES:
            return self.probes.answer(request)
        found = self.files.get(path)
        if found is None:
            return text(404, "not found: the dashboard is at /")
        if request.method not in ("GET", "HEAD"):
            return text(405, "only GET and HEAD", ("Allow", "GET, HEAD"))
        return found
