"""The randomness of lease handles: the kernel's CSPRNG, drawn a block at a time.

What always holds:
- every byte handed out comes from ``os.urandom`` and is handed out once: ``RandomPool``
  only saves the system call per lease (one ``getrandom`` per ``block`` bytes, 512
  handles at the default, instead of one per handle);
- after a ``fork`` parent and child hold the same unused bytes: the only child rsd forks
  (the snapshot writer, snapshots.py) never draws any, and leaves with ``os._exit``.
"""

from __future__ import annotations

import os

__all__ = ["RandomPool"]


class RandomPool:
    """``pool(n)``: ``n`` random bytes, like ``os.urandom(n)``."""

    __slots__ = ("_block", "_buf", "_pos")

    def __init__(self, block: int = 4096) -> None:
        self._block = block
        self._buf = b""
        self._pos = 0

    def __call__(self, n: int) -> bytes:
        pos = self._pos
        end = pos + n
        if end > len(self._buf):
            if n > self._block:
                return os.urandom(n)
            self._buf = os.urandom(self._block)
            pos, end = 0, n
        self._pos = end
        return self._buf[pos:end]
