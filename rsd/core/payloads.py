"""Client payloads (a task's data, a delivery's outcome): the one check, and the
canonical digest that makes submissions idempotent.

What always holds:
- a payload is refused with INVALID_ARGUMENT, naming the limit, if maps and arrays nest
  more than ``Limits.MAX_PAYLOAD_DEPTH`` levels, if it cannot be encoded, or if it is
  more than ``Limits.MAX_PAYLOAD_BYTES`` encoded;
- equal input gives an equal digest whatever the order of any map's keys.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from rsproto import Limits

from .validate import invalid

__all__ = ["canonical_digest", "checked_payload", "nested_deeper_than", "payload_size"]


def _canonical(value: Any) -> Any:
    if type(value) is dict:
        return {
            k: _canonical(value[k])
            for k in sorted(value, key=lambda k: (type(k).__name__, k))
        }
    if type(value) in (list, tuple):
        return [_canonical(v) for v in value]
    return value


_CONTAINERS = (dict, list, tuple)


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether maps and arrays nest more than ``limit`` levels (a scalar is level 0)."""
    kind = type(value)
    if kind not in _CONTAINERS:
        return False
    if limit == 0:
        return True
    children = value.values() if kind is dict else value
    return any(type(v) in _CONTAINERS and nested_deeper_than(v, limit - 1) for v in children)


def canonical_digest(value: Any, salt: str = "") -> tuple[bytes, int]:
    """Digest of a value with every map's keys in sorted order (equal input, equal
    digest), salted with ``salt``; and the value's encoded size, so that the caller
    need not encode it a second time to check its size."""
    encoded = msgpack.packb(_canonical(value), use_bin_type=True)
    digest = hashlib.blake2b(encoded, digest_size=16, person=b"rsd-input")
    digest.update(salt.encode())
    return digest.digest(), len(encoded)


def payload_size(value: Any) -> int:
    """The encoded size of a value; INVALID_ARGUMENT if it cannot be encoded."""
    try:
        return len(msgpack.packb(value, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise invalid(f"payload cannot be encoded: {exc}") from None


def checked_payload(name: str, value: Any, salt: str | None = None) -> bytes | None:
    """The one check of a client payload (data, outcome): nesting depth, encodability and
    size, each refused with INVALID_ARGUMENT naming the limit. With ``salt``, returns the
    payload's canonical digest (for idempotency), computed in the same pass."""
    if nested_deeper_than(value, Limits.MAX_PAYLOAD_DEPTH):
        raise invalid(
            f"{name} nests maps and arrays more than {Limits.MAX_PAYLOAD_DEPTH} levels deep"
        )
    digest = None
    if salt is None:
        size = payload_size(value)
    else:
        try:
            digest, size = canonical_digest(value, salt)
        except (TypeError, ValueError, OverflowError) as exc:
            raise invalid(f"{name} cannot be encoded: {exc}") from None
    if size > Limits.MAX_PAYLOAD_BYTES:
        raise invalid(
            f"{name} is {size} bytes encoded; the limit is {Limits.MAX_PAYLOAD_BYTES} bytes"
        )
    return digest
