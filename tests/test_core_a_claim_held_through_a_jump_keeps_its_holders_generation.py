"""A claim held through a jump of the generations (a standby's takeover, an unclean
restart) keeps its holder's generation: CLAIM_INSPECT, FENCE_CHECK, CLAIM_HELD and the
admin listing say the generation its holder was granted, the number users store with
their writes to order owners. Only the key's next grant goes above the jump, so that
nothing granted and lost with the old primary (or the crash) is given again.

The jump's floor is kept apart from the holder's generation (``Ids.jumped_to``), in the
journal (IDS_JUMPED, replayed) and in a snapshot (SNAP_COUNTERS), so a later restart
from either still grants above it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from support.core import ALICE, BOB, CoreDriver, on_disk

from rsd.core import Core, CoreError
from rsproto import ErrorCode, Op

_ARGS = {"scope": "s", "key": "k", "lease_seconds": 30}


def _rebuilt(core: CoreDriver) -> CoreDriver:
    """A new core from ``core``'s journal (kept as its own), with its connections."""
    rebuilt = core.replay()
    rebuilt.records.extend(core.records)
    rebuilt.connected(ALICE, "alice")
    rebuilt.connected(BOB, "bob")
    return rebuilt


def _takeover(core: CoreDriver) -> CoreDriver:
    """The standby's copy (the same records, applied) promoted at the core's time."""
    standby = _rebuilt(core)
    standby.promoted(core.now)
    standby.drain()
    return standby


def _crash(core: CoreDriver) -> CoreDriver:
    """An unclean restart that lost nothing: replayed, then recovered not clean."""
    rebuilt = _rebuilt(core)
    rebuilt.recovered(core.now, False)
    rebuilt.drain()
    return rebuilt


def _said(core: Core, conn: int, token: bytes) -> dict[str, Any]:
    """The generation each read gives for key "k" of run "s"."""
    inspected = core.handle(0.0, conn, 1, Op.CLAIM_INSPECT, {"scope": "s", "key": "k"})
    fenced = core.handle(0.0, conn, 2, Op.FENCE_CHECK,
                         {"scope": "s", "key": "k", "token": token})
    with pytest.raises(CoreError) as held:
        core.handle(0.0, BOB, 3, Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    assert held.value.code == ErrorCode.CLAIM_HELD
    listed = core.handle(0.0, conn, 4, Op.ADMIN_CLAIMS, {"scope": "s"})["claims"]
    return {
        "inspect": inspected["generation"], "fence": fenced["generation"],
        "current": fenced["current"], "held": held.value.details["generation"],
        "admin": [claim["generation"] for claim in listed],
    }


@pytest.mark.parametrize("jump", [_takeover, _crash], ids=["takeover", "unclean restart"])
def test_the_holder_keeps_its_generation_and_the_next_grant_goes_above_the_jump(
    jump: Callable[[CoreDriver], CoreDriver],
) -> None:
    core = CoreDriver(recovered=True)
    first = core.call(Op.CLAIM_ACQUIRE, _ARGS)
    core.call(Op.CLAIM_RELEASE, {"lease": first["lease"]})
    grant = core.call(Op.CLAIM_ACQUIRE, _ARGS)  # generation 2, held through the jump
    core.drain()
    after = jump(core)
    floor = after.ids.generation_floor  # the jump: above whatever may have been lost
    assert floor > grant["generation"]
    generation = grant["generation"]
    assert _said(after, ALICE, grant["lease"]) == {
        "inspect": generation, "fence": generation, "current": True, "held": generation,
        "admin": [generation],
    }
    # A second jump (another takeover) still leaves the holder's generation alone.
    again = jump(after)
    assert _said(again, ALICE, grant["lease"])["inspect"] == generation
    # The next owner's generation lies above everything the jumps covered.
    again.call(Op.CLAIM_ACQUIRE, {**_ARGS, "wait": True, "timeout_ms": 5000}, BOB)
    again.call(Op.CLAIM_RELEASE, {"lease": grant["lease"]})
    (granted,) = [msg[-1] for conn, msg in again.drain()
                  if conn == BOB and isinstance(msg[-1], dict) and "lease" in msg[-1]]
    assert granted["generation"] == again.ids.generation_floor + 1
    assert granted["generation"] > floor > generation


@pytest.mark.parametrize("from_snapshot", [False, True], ids=["journal", "snapshot"])
def test_a_restart_after_the_jump_still_grants_above_it(from_snapshot: bool) -> None:
    core = CoreDriver(recovered=True)
    grant = core.call(Op.CLAIM_ACQUIRE, _ARGS)
    core.drain()
    after = _crash(core)
    floor = after.ids.generation_floor
    records = (
        [on_disk(rec) for rec in after.snapshot()] if from_snapshot
        else after.records
    )
    restarted = after.fresh({ALICE: "alice", BOB: "bob"})
    for rec in records:
        restarted.apply(on_disk(rec), after.now)
    restarted.recovered(after.now, True)  # a clean stop: no jump of its own
    restarted.drain()
    assert restarted.ids.generation_floor == floor
    assert _said(restarted, ALICE, grant["lease"])["inspect"] == grant["generation"]
    restarted.call(Op.CLAIM_RELEASE, {"lease": grant["lease"]})
    assert restarted.call(Op.CLAIM_ACQUIRE, _ARGS, BOB)["generation"] == floor + 1
