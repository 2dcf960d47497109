"""Two cores as two shards of one cluster, on the fake clock: what the tests of moving
runs between shards (rsd/core/transfer.py) share.

``shard(name)`` is a CoreDriver serving shard ``name`` of a cluster of ``SLOTS`` slots
(its item ids in the shard's namespaces, its runs kept by slot); ``placed(tag)`` is a run
id in the slot of ``tag``; ``move(a, b, slot)`` does what the shell will do: export the
slot's runs from ``a`` and import them into ``b``, each part as it goes over the wire
(msgpack round trip); ``one_of_everything`` fills a run with every kind of state.
"""

from __future__ import annotations

from typing import Any

from rsproto import Op
from rsproto.slots import slot_of

from .core import ALICE, CoreDriver, on_disk, seeded_bytes

__all__ = ["SLOTS", "move", "one_of_everything", "placed", "shard", "slot"]

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
    """Export slots ``lo..hi`` of ``source`` and import them into ``target``, part after
    part (at the target's clock); the runs and records imported, summed."""
    total = {"runs": 0, "records": 0}
    for part in source.export_slots(lo, lo if hi is None else hi):
        reply = target.import_runs(target.now, on_disk(part))
        total = {key: total[key] + reply[key] for key in total}
    source.drain()
    target.drain()
    return total


def one_of_everything(a: CoreDriver, run: str) -> dict[str, Any]:
    """Run ``run`` made on ``a`` holding one of everything a run can hold (a held claim,
    a released one, a result, a delivery in flight, a delayed task, a ready line with a
    priority, a dedupe entry, a group, a dead letter, a schedule); what was answered."""

    def call(core: CoreDriver, op: Op, conn: int = ALICE, **args: Any) -> Any:
        return core.call(op, {"scope": run, **args}, conn)

    a.call(Op.MAILBOX_ENSURE, {"name": "once", "max_attempts": 1})
    for name in ("line", "ticks"):  # declared on A only: the move declares them on B
        a.call(Op.MAILBOX_ENSURE, {"name": name})
    a.create_runs(run)
    got: dict[str, Any] = {}
    got["held"] = call(a, Op.CLAIM_ACQUIRE, key="held", lease_seconds=30)
    stale = call(a, Op.CLAIM_ACQUIRE, key="freed")
    a.call(Op.CLAIM_RELEASE, {"lease": stale["lease"]})
    got["stale"] = stale
    done = call(a, Op.TASK_SUBMIT, mailbox="jobs", key="done", data=1)
    first = call(a, Op.RECEIVE, mailbox="jobs")["delivery"]
    a.call(Op.DELIVERY_COMPLETE, {"lease": first["lease"], "outcome": {"ok": 1}})
    got["done"] = done
    got["inflight"] = call(a, Op.TASK_SUBMIT, mailbox="jobs", key="inflight", data=2)
    got["delivery"] = call(a, Op.RECEIVE, mailbox="jobs", lease_seconds=30)["delivery"]
    got["later"] = call(a, Op.TASK_SUBMIT, mailbox="jobs", key="later", data=3,
                        delay_ms=5000)
    for n in range(20):  # a ready line (SNAP_QUEUED records), in order
        call(a, Op.TASK_SUBMIT, mailbox="line", key=f"q{n}", data=n)
    got["urgent"] = call(a, Op.TASK_SUBMIT, mailbox="line", key="urgent", data=-1,
                         priority=5)
    got["sent"] = call(a, Op.MESSAGE_SEND, mailbox="jobs", data="x", work_key="w")
    call(a, Op.TASK_SUBMIT, mailbox="jobs", key="member", data=4, group="g")
    call(a, Op.TASK_SUBMIT, mailbox="once", key="doomed", data=5)
    doomed = call(a, Op.RECEIVE, mailbox="once")["delivery"]
    a.call(Op.DELIVERY_REJECT, {"lease": doomed["lease"], "reason": "bad"})
    call(a, Op.SCHEDULE_ENSURE, name="tick", mailbox="ticks", every_seconds=10)
    return got
