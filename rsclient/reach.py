"""Why a connect failed, in words: the one message of a connect given up (one node or
several), a NOT_PRIMARY answer, and the cause of each failed attempt (refused, timed out,
a TLS mix-up). The TypeScript SDK's ``reach.ts`` says the same, in the same words."""

from __future__ import annotations

import ssl
from typing import Any

from .errors import RunstateError
from .nodes import Node

__all__ = [
    "NOT_TLS", "describe", "looks_like_tls", "not_primary_words", "unreachable",
    "unreachable_nodes",
]

# What the TLS layer says when the other end does not speak TLS (a plain rsd port).
NOT_TLS = frozenset({
    "WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "RECORD_LAYER_FAILURE",
    "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST", "UNEXPECTED_RECORD",
})


def unreachable(host: str, port: int, cause: str, within: float | None = None) -> str:
    """The one message of a connect that failed: where, how long it tried, and why."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if within is None:
        return f"cannot reach rsd at {where}: {cause}"
    return f"cannot reach rsd at {where} within {within:g} s: {cause}"


def unreachable_nodes(nodes: tuple[Node, ...], causes: dict[Node, str], within: float) -> str:
    """The one message of a connect to several nodes that failed: the nodes given, how
    long it tried, and why each node tried failed (the last cause of each, in the order
    they were first tried; nodes a redirect named included)."""
    where = ", ".join(str(node) for node in nodes)
    why = "; ".join(f"{node}: {cause}" for node, cause in causes.items())
    return f"cannot reach rsd's primary at {where} within {within:g} s: {why}"


def not_primary_words(details: dict[str, Any]) -> str:
    """What a NOT_PRIMARY answer says, in words (no code prefix); or a node of another
    shard of a sharded cluster (``shard``: its shard), refused as one."""
    primary = details.get("primary")
    shard = details.get("shard")
    if isinstance(shard, str):
        named = f"its slot map names {primary}" if isinstance(primary, str) and primary else (
            "its slot map names none")
        return f"a node of another shard ({shard!r}; {named} as the primary of ours)"
    if isinstance(primary, str) and primary:
        return f"not the primary (it names {primary} as the primary)"
    return "not the primary, and it knows of none (an election may be in progress)"


def describe(exc: BaseException) -> str:
    """The cause of a failed connect attempt, in words (no error code prefixes)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, RunstateError):
        return exc.message
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is rsd running there?)"
    if isinstance(exc, ssl.SSLError):
        reason = exc.reason or type(exc).__name__
        words = f"TLS handshake failed: {reason.lower().replace('_', ' ')}"
        if reason in NOT_TLS:
            words += " (the server there does not speak TLS: is it a plain rsd port?)"
        return words
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return str(exc) or type(exc).__name__


def looks_like_tls(data: bytes) -> bool:
    """Whether the first bytes a peer sent are a TLS record (an alert or a handshake),
    which no rsd frame can be: its 4-byte length would be far over MAX_FRAME_BYTES."""
    return len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 0x03
