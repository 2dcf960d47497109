"""File descriptors: how many connections rsd may serve without starving its own files.

What always holds: the connections rsd serves, plus the connections a burst of accepts
can bring in before any is refused, plus the refused ones still lingering, stay below the
file limit by ``Policy.RESERVED_DESCRIPTORS``, so the journal can always open its next
segment and a snapshot its file: client load never makes rsd exit.
"""

from __future__ import annotations

import contextlib
import resource
from dataclasses import dataclass

from .policy import Policy

__all__ = ["Budget", "budget", "raise_file_limit"]

_SANE_LIMIT = 1 << 20  # what an unlimited hard limit is taken as (Linux's default nr_open)


def raise_file_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit where allowed; the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _SANE_LIMIT if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        # Above the kernel's nr_open, say: keep what we have.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _SANE_LIMIT if soft == resource.RLIM_INFINITY else int(soft)


@dataclass(frozen=True)
class Budget:
    """How a file limit is shared out. ``max_connections`` is the most connections that
    may be served at once (0: the limit is too small to serve any)."""

    file_limit: int
    reserved: int  # for persistence and the process itself
    backlog: int  # the listen backlog, and the accept burst kept free for it
    refused: int  # refused connections that may linger at once

    @property
    def max_connections(self) -> int:
        return max(0, self.file_limit - self.reserved - self.backlog - self.refused)


def budget(file_limit: int) -> Budget:
    """The share-out of ``file_limit``: the reserve first, then an accept backlog of at most
    a quarter of what is left (so a small limit still serves connections)."""
    left = max(0, file_limit - Policy.RESERVED_DESCRIPTORS)
    backlog = max(1, min(Policy.LISTEN_BACKLOG, left // 4))
    refused = min(Policy.MAX_REFUSED_LINGERING, left // 16)
    return Budget(file_limit, Policy.RESERVED_DESCRIPTORS, backlog, refused)
