"""Two cores as two shards of one cluster, on the fake clock: what the tests of moving
runs between shards (rsd/core/transfer.py) share.

``shard(name)`` is a CoreDriver serving shard ``name`` of a cluster of ``SLOTS`` slots
(its item ids in the shard's namespaces, its runs kept by slot); ``placed(tag)`` is a run
id in the slot of ``tag``; ``move(a, b, slot)`` does what the shell will do: export the
slot's runs from ``a`` and import them into ``b``, the record as it goes over the wire
(msgpack round trip).
"""

from __future__ import annotations

from typing import Any

from rsproto.slots import slot_of

from .core import CoreDriver, on_disk, seeded_bytes

__all__ = ["SLOTS", "move", "placed", "shard", "slot"]

SLOTS = 64


def shard(name: str, seed: int, **options: Any) -> CoreDriver:
    """A core serving shard ``name`` (randomness seeded by ``seed``: two shards' lease
    handles differ as two processes' would)."""
    core = CoreDriver(recovered=True, random_bytes=seeded_bytes(seed), **options)
    core.serve_shard(name, SLOTS)
    return core


def placed(tag: str, rest: str = "run") -> str:
    """A run id in the slot of ``tag`` (the ``{tag}`` rule of rsproto.slots)."""
    return f"{{{tag}}}{rest}"


def slot(run_id: str) -> int:
    return slot_of(run_id, SLOTS)


def move(source: CoreDriver, target: CoreDriver, lo: int, hi: int | None = None) -> Any:
    """Export slots ``lo..hi`` of ``source`` and import them into ``target`` (at each
    core's own clock); what the import answered."""
    rec = source.export_slots(lo, lo if hi is None else hi)
    reply = target.import_runs(target.now, on_disk(rec))
    source.drain()
    target.drain()
    return reply
