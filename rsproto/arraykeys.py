"""Whether a value msgspec decoded holds an array used as a map key: the one thing
msgspec reads from a client's frame that msgpack-python refuses (codec.py).

What always holds: msgspec decodes every array as a list except one used as a map key
(or inside one), which it decodes as a tuple, since a map key must be hashable; so a
decoded value holds an array key exactly when some map in it has a tuple key. Only maps
and lists are descended into: a tuple or a scalar is never opened.

Compiled with the core (pyproject.toml, ``[tool.rsd.mypyc]``): it runs over every
request a client sends, and as Python bytecode the walk would cost about as much as the
decoding msgspec saves.
"""

from __future__ import annotations

from typing import Any

__all__ = ["array_key_in"]


def array_key_in(value: Any) -> bool:
    """Whether any map in ``value`` (a decoded value: maps, lists and scalars; a tuple
    only as a map key) has a tuple key. Recurses once per level of nesting, which the
    decoder bounded (msgspec stops at the interpreter's recursion limit)."""
    if type(value) is dict:
        mapping: dict[Any, Any] = value
        for key, item in mapping.items():
            if type(key) is tuple:
                return True
            kind = type(item)
            if (kind is dict or kind is list) and array_key_in(item):
                return True
    elif type(value) is list:
        items: list[Any] = value
        for item in items:
            kind = type(item)
            if (kind is dict or kind is list) and array_key_in(item):
                return True
    return False
