"""Server policy: limits this server chooses, as opposed to the protocol's own limits.

``rsproto.Limits`` is what the protocol promises every client. The values here are this
server's choices (an operator may tune some of them by flag); the HELLO reply announces
both, so a client sees one table.
"""

from __future__ import annotations

from rsproto import Limits

__all__ = ["Policy", "announced_limits"]


class Policy:
    """Every option's one default: the flags, the core and the journal all read them here."""

    LISTEN = ("127.0.0.1", 7420)
    DATA_DIR = "var"
    FSYNC = "always"
    SNAPSHOT_BYTES = 64 << 20
    RETENTION_SECONDS = 7 * 24 * 3600
    DEDUPE_SECONDS = 7 * 24 * 3600
    TOMBSTONE_SECONDS = 30 * 24 * 3600
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
