"""Client payloads (a task's data, a delivery's outcome): the one check, and the
canonical digest that makes submissions idempotent.

What always holds:
- a payload is refused with INVALID_ARGUMENT, naming the limit, if maps and arrays nest
  more than ``Limits.MAX_PAYLOAD_DEPTH`` levels, if it cannot be encoded, or if it is
  more than ``Limits.MAX_PAYLOAD_BYTES`` encoded;
- equal input gives an equal digest whatever the order of any map's keys;
- the size the check measures (``measured_payload``) is what a tenant's stored bytes
  are charged (tenants.py), so storing a payload never encodes it a second time; nil is
  stored as nothing and charged 0 (``stored_size``), live and in replay alike.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

from rsproto import Limits, pack_from_rsd

from .validate import invalid

__all__ = [
    "canonical_digest",
    "checked_payload",
    "dedupe_size",
    "encode",
    "measured_payload",
    "nested_deeper_than",
    "payload_size",
    "stored_size",
    "subscription_size",
    "subscriptions_size",
]

_MAX_PAYLOAD_DEPTH: Final = Limits.MAX_PAYLOAD_DEPTH
_MAX_PAYLOAD_BYTES: Final = Limits.MAX_PAYLOAD_BYTES


# The wire's encoder (rsproto: msgspec, the bytes msgpack-python's Packer wrote) for
# every size measured and digest taken: what is measured is what is sent and stored.
# Encoding raises TypeError, ValueError, OverflowError or RecursionError (past the
# interpreter's recursion limit: rsproto.ENCODE_ERRORS), each caught below.
_pack: Final = pack_from_rsd
# ``encode(value)``: the same encoding, for values known to encode (read from a record):
# restore.py measures every recovered payload with it.
encode: Final = _pack


# The digest's hasher before any byte: each digest copies it (a copy is a memcpy; a new
# hasher parses its keywords and sets up its parameter block at every call).
_DIGEST_START: Final = hashlib.blake2b(digest_size=16, person=b"rsd-input")


class _TooDeep(Exception):
    """Raised inside ``_canonical`` when a payload nests deeper than allowed."""


def _order(key: Any) -> tuple[str, Any]:
    return (type(key).__name__, key)


def _canonical(value: Any, room: int) -> Any:
    """``value`` with every map's keys in canonical order (maps and arrays copied, tuples
    as lists), checking the nesting in the same walk: ``room`` is how many more levels
    of maps and arrays may open here (raises _TooDeep past it). A scalar is returned
    itself, and a child is only descended into if it is a map or an array."""
    kind = type(value)
    if kind is dict:
        if not room:
            raise _TooDeep
        room -= 1
        out = {}
        for k in sorted(value, key=_order) if len(value) > 1 else value:
            v = value[k]
            t = type(v)
            out[k] = _canonical(v, room) if t is dict or t is list or t is tuple else v
        return out
    if kind is list or kind is tuple:
        if not room:
            raise _TooDeep
        room -= 1
        return [
            _canonical(v, room) if type(v) is dict or type(v) is list or type(v) is tuple
            else v
            for v in value
        ]
    return value


def nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether maps and arrays nest more than ``limit`` levels (a scalar is level 0)."""
    kind = type(value)
    if kind is not dict and kind is not list and kind is not tuple:
        return False
    if limit == 0:
        return True
    for v in value.values() if kind is dict else value:
        t = type(v)
        if (t is dict or t is list or t is tuple) and nested_deeper_than(v, limit - 1):
            return True
    return False


def canonical_digest(value: Any, salt: str = "") -> tuple[bytes, int]:
    """Digest of a value with every map's keys in sorted order (equal input, equal
    digest), salted with ``salt``; and the value's encoded size, so that the caller
    need not encode it a second time to check its size. Raises _TooDeep for a value
    nesting more than ``Limits.MAX_PAYLOAD_DEPTH`` levels."""
    encoded = _pack(_canonical(value, _MAX_PAYLOAD_DEPTH))
    digest = _DIGEST_START.copy()
    digest.update(encoded)
    digest.update(salt.encode())
    return digest.digest(), len(encoded)


def payload_size(value: Any) -> int:
    """The encoded size of a value; INVALID_ARGUMENT if it cannot be encoded."""
    try:
        return len(_pack(value))
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise invalid(f"payload cannot be encoded: {exc}") from None


def _too_deep(name: str) -> Exception:
    return invalid(
        f"{name} nests maps and arrays more than {_MAX_PAYLOAD_DEPTH} levels deep"
    )


def stored_size(value: Any) -> int:
    """What storing ``value`` charges its tenant when its size was not measured on the
    way in (replay, snapshots): its encoded size, 0 for nil."""
    return 0 if value is None else payload_size(value)


# What a message's work_key dedupe entry keeps beside the key (the message id, the
# digest, the expiry, the table slot and its timer): counted so that sends with tiny
# keys cannot keep millions of entries after their messages are gone.
DEDUPE_ENTRY_BYTES: Final = 128


def dedupe_size(work_key: str) -> int:
    """What a work_key's dedupe entry charges its tenant's stored bytes, for the dedupe
    window: the key's UTF-8 length and DEDUPE_ENTRY_BYTES."""
    return len(work_key.encode()) + DEDUPE_ENTRY_BYTES


def subscription_size(subscriber: str, scope: str | None) -> int:
    """What one subscription of a task (its id and its scope, both client-chosen) charges
    its tenant's stored bytes: their UTF-8 lengths."""
    return len(subscriber.encode()) + (0 if scope is None else len(scope.encode()))


def subscriptions_size(subscribers: Mapping[str, str | None]) -> int:
    """``subscription_size`` of every subscription of a task (at most
    MAX_SUBSCRIBERS_PER_TASK: each was a request of its own)."""
    return sum(subscription_size(sub, scope) for sub, scope in subscribers.items())


def checked_payload(name: str, value: Any, salt: str | None = None) -> bytes | None:
    """The one check of a client payload (data, outcome): nesting depth, encodability and
    size, each refused with INVALID_ARGUMENT naming the limit. With ``salt``, returns the
    payload's canonical digest (for idempotency), computed in the same pass."""
    return measured_payload(name, value, salt)[0]


def measured_payload(name: str, value: Any, salt: str | None = None) -> tuple[bytes | None, int]:
    """``checked_payload``'s digest, and the size its tenant is charged for storing the
    payload (``stored_size``: 0 for nil), measured in the same pass."""
    if value is None:
        return (None if salt is None else canonical_digest(None, salt)[0]), 0
    digest = None
    if salt is None:
        # Encoded first: nesting more than MAX_PAYLOAD_DEPTH levels takes more than that
        # many bytes (one per level at least), so a smaller value needs no walk for it.
        depth = _MAX_PAYLOAD_DEPTH
        try:
            size = len(_pack(value))
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            if nested_deeper_than(value, depth):  # (the encoder's own nesting limit)
                raise _too_deep(name) from None
            raise invalid(f"payload cannot be encoded: {exc}") from None
        if size > depth and nested_deeper_than(value, depth):
            raise _too_deep(name)
    else:
        try:  # the nesting is checked in the same walk that orders the keys
            digest, size = canonical_digest(value, salt)
        except _TooDeep:
            raise _too_deep(name) from None
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise invalid(f"{name} cannot be encoded: {exc}") from None
    if size > _MAX_PAYLOAD_BYTES:
        raise invalid(
            f"{name} is {size} bytes encoded; the limit is {_MAX_PAYLOAD_BYTES} bytes"
        )
    return digest, size
