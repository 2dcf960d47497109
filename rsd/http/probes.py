"""The health probes on rsd's HTTP listener (``--http-listen``), for a supervisor, a load
balancer or Kubernetes: ``GET /healthz`` and ``GET /readyz`` (HEAD too).

- ``/healthz``: the process serves (200, ``{"ok": true}``): its loop turns and answers.
  A process that stopped answering, or ended (a failed journal write or fsync ends it,
  exit 74), is seen by the probe getting no answer at all.
- ``/readyz``: this node can do its job now: 200 ``{"ready": true}``, else 503
  ``{"ready": false, "reason": "..."}``, the reason one line. Its job is, for a server
  alone or a cluster's primary, to serve with its changes acknowledged in time
  (``Server.unready``: no change held past ``Policy.UNREADY_WAIT_SECONDS`` for its
  fsync or its synchronous standby; a primary under ``--fsync always`` has a
  synchronous standby); for a standby, to hold a copy caught up with its primary
  (``Follower.unready``: every batch its primary had journaled when the stream began,
  the stream still open); a node stopping or stepping down is not ready; nor is one
  still joining (no copy yet).

What always holds: the probes need no token, even where a tokens file makes the API
need one, and reveal nothing but that: no tenant, no name, no count beyond what the
reason needs (how far behind, how long a change has waited). Without a tokens file they
follow the listener's loopback rule, as every path does (dashboard.py). Each answer is
O(1): it reads a few fields, never walks state.
"""

from __future__ import annotations

import json
from collections.abc import Callable

from .httpserver import Request, Response, text

__all__ = ["PATHS", "Probes"]

PATHS = frozenset({"/healthz", "/readyz"})
_JSON = "application/json"
_HEALTHY = Response(200, b'{"ok":true}', _JSON)
_READY = Response(200, b'{"ready":true}', _JSON)


class Probes:
    """Answers ``PATHS``; ``unready()`` says why this node cannot do its job now (None:
    it can), in O(1) (cli.py's ``Mode.unready``)."""

    def __init__(self, unready: Callable[[], str | None]) -> None:
        self.unready = unready

    def answer(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return text(405, "only GET and HEAD", ("Allow", "GET, HEAD"))
        if request.path == "/healthz":
            return _HEALTHY
        reason = self.unready()
        if reason is None:
            return _READY
        body = json.dumps({"ready": False, "reason": reason}, separators=(",", ":"))
        return Response(503, body.encode(), _JSON)
