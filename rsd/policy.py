"""Server policy: limits this server chooses, as opposed to the protocol's own limits.

``rsproto.Limits`` is what the protocol promises every client. The values here are this
server's choices (an operator may tune some of them by flag); the HELLO reply announces
both, so a client sees one table.
"""

from __future__ import annotations

from rsproto import Limits

__all__ = ["Policy", "announced_limits"]


class Policy:
    MAX_WAITS_PER_CONNECTION = 65_536
    HANDSHAKE_TIMEOUT_SECONDS = 10


def announced_limits(handshake_timeout: float) -> dict[str, int | float]:
    """The ``limits`` map of a HELLO reply, in the order protocol.md lists them."""
    whole = handshake_timeout == int(handshake_timeout)
    timeout = int(handshake_timeout) if whole else handshake_timeout
    return {
        **Limits.as_dict(),
        "max_waits_per_connection": Policy.MAX_WAITS_PER_CONNECTION,
        "handshake_timeout_seconds": timeout,
    }
