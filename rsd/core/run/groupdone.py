"""The ``done`` list a met GROUP_WAIT answers with, and its one bound.

What always holds:
- ``done`` holds the first ``need`` successes of the group, in the order they
  succeeded, each ``{"id", "key"}`` plus ``"outcome"`` when outcomes are asked for;
- with outcomes, the encoded outcomes together never pass ``Limits.MAX_FRAME_BYTES``: a
  reply that large could never be sent, so it is refused (RESOURCE_EXHAUSTED, naming the
  limit) before anything is built past it, instead of being encoded whole (up to
  10,000 outcomes of 256 KiB, 2.5 GB) and only then found too large. Outcomes are
  measured one by one, so the check costs at most the bytes it lets through.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from rsproto import ErrorCode, Limits

from ..ground.errors import CoreError
from ..ground.payloads import payload_size

if TYPE_CHECKING:
    from .items import Item

__all__ = ["done_entries"]


def done_entries(
    name: str, succeeded: Iterable[Item], need: int, outcomes: bool
) -> list[dict[str, Any]]:
    """The first ``need`` of ``succeeded`` as GROUP_WAIT's ``done`` entries."""
    done: list[dict[str, Any]] = []
    room = Limits.MAX_FRAME_BYTES
    for item in succeeded:
        if len(done) == need:
            break
        entry = {"id": item.id, "key": item.key}
        if outcomes:
            entry["outcome"] = item.outcome
            if item.outcome is not None:
                room -= payload_size(item.outcome)
                if room < 0:
                    raise CoreError(
                        ErrorCode.RESOURCE_EXHAUSTED,
                        f"the outcomes of the first {len(done) + 1} successes of group "
                        f"{name!r} pass {Limits.MAX_FRAME_BYTES} bytes, the frame limit; "
                        "wait with outcomes false and read each result by TASK_STATUS",
                    )
        done.append(entry)
    return done
