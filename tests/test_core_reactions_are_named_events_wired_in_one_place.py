"""Where one part of the core reacts to another's change, the change is announced as a
named event (events.py), and who hears which is wired in one place (``Core._wire`` in
machine.py). A lease's expiry is decided in one place (``LeaseTable.expire``) and handed
to the owner of its kind; LEASE_LOST is built by one function (``Effects.lease_lost``);
no part reaches into another to patch a callback onto it after construction.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

from support.core import CoreDriver
from support.sources import parsed

from rsd.core.ground.leases import LeaseTable, new_handle
from rsd.core.run.claim import Claim
from rsd.core.run.items import Item
from rsd.core.state.events import Signal
from rsd.core.tenant.pool import Slot

CORE = Path(__file__).resolve().parents[1] / "rsd" / "core"


def _modules() -> dict[str, ast.Module]:
    return {
        (path.parent.name if path.stem == "__init__" else path.stem):
            parsed(path)
        for path in sorted(CORE.rglob("*.py"))
    }


def test_every_event_is_heard_and_every_kind_of_lease_has_one_owner() -> None:
    core = CoreDriver()
    events = core.tables.events
    for signal in events.signals():
        assert signal.listeners, f"nobody hears {signal.name}"
    assert set(events.lease_expired) == {Claim, Slot, Item}
    assert {signal.name for signal in events.signals()} == {  # (compiled: no __slots__)
        name for name in dir(events) if isinstance(getattr(events, name), Signal)
    }


def test_a_cancelled_run_ends_its_slots_then_its_receives_then_its_claims_and_tasks() -> None:
    """The order of the replies and pushes a SCOPE_CANCEL makes: the slots go to their
    pools' other waiters, the run's parked receives are refused, then the cascade ends
    claims and tasks (its first slice within the request), then its schedules are
    deleted and its mailboxes' pauses end."""
    core = CoreDriver()
    assert core.tables.events.run_cancelled.listeners == (
        core.pools.run_cancelled, core.deliveries.run_cancelled, core.cascade.start,
        core.schedules.run_cancelled, core.mailboxes.pauses.run_cancelled,
    )


def test_who_hears_which_event_is_wired_only_in_machine_py() -> None:
    wiring: dict[str, int] = {}
    for name, tree in _modules().items():
        for node in ast.walk(tree):
            listens = (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "listen"
            )
            owners = isinstance(node, ast.Assign) and any(
                isinstance(target, ast.Subscript)
                and isinstance(target.value, ast.Attribute)
                and target.value.attr == "lease_expired"
                for target in node.targets
            )
            if listens or owners:
                wiring[name] = wiring.get(name, 0) + 1
    assert set(wiring) == {"machine"}, f"events wired outside machine.py: {wiring}"


def test_lease_lost_is_built_by_one_function() -> None:
    building = sorted(
        name for name, tree in _modules().items()
        if any(
            isinstance(node, ast.Attribute) and node.attr == "LEASE_LOST"
            for node in ast.walk(tree)
        )
    )
    assert building == ["effects"], f"modules that build LEASE_LOST: {building}"


def test_no_part_patches_a_callback_or_a_book_onto_another() -> None:
    """``other.attr = self.method`` or ``self.part.attr = self.other_part``: wiring by
    hand after construction (what ``wheel.fresh = ...``, ``pools.on_room = ...`` and
    ``self.deliveries.tasks = self.tasks`` were)."""
    found: list[str] = []
    for name, tree in _modules().items():
        functions = {
            node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign):
                continue
            value = node.value
            is_reference = (
                isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name)
                and value.value.id == "self"
            ) or (isinstance(value, ast.Name) and value.id in functions)
            if not is_reference:
                continue
            for target in node.targets:
                if not isinstance(target, ast.Attribute):
                    continue
                owner = target.value
                onto_another = not (isinstance(owner, ast.Name) and owner.id == "self")
                callback = (
                    isinstance(value, ast.Name)
                    or (isinstance(value, ast.Attribute) and value.attr in functions)
                )
                if onto_another and (callback or isinstance(owner, ast.Attribute)):
                    found.append(f"{name}.py:{node.lineno}: {ast.unparse(node)}")
    assert not found, "wired by hand:\n" + "\n".join(found)


class _Owner:
    """A lease owner of a kind of its own (what an item or a slot is to the table)."""

    tenant = "default"


def test_a_lease_expiry_is_decided_once_and_handed_to_the_owner_of_its_kind() -> None:
    told: list[tuple[float, Any]] = []
    owners: dict[type, Any] = {_Owner: lambda now, lease, reason: told.append((now, lease))}
    table = LeaseTable(owners)
    lease = table.add(new_handle(1, b"\x00" * 8), _Owner(), "h", 0, 5.0, now=0.0)
    table.renew(lease, 3.0, None, 0)
    for entry in table.wheel.pop_due(5.1):  # its first deadline: renewed since, re-armed
        table.expire(entry, 5.1)
    assert told == []
    due = table.wheel.pop_due(8.1)
    assert due == [lease]
    table.expire(lease, 8.1)
    assert told == [(8.1, lease)]
    table.end(lease)
    table.expire(lease, 9.0)  # an ended lease is nobody's business
    assert told == [(8.1, lease)]


def test_a_signal_calls_its_listeners_in_the_order_they_were_wired() -> None:
    heard: list[str] = []
    signal: Signal[[str]] = Signal("said")
    signal.listen(lambda word: heard.append("first " + word))
    signal.listen(lambda word: heard.append("second " + word))
    signal("hello")
    assert heard == ["first hello", "second hello"]
