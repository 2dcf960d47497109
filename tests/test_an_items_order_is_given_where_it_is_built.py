"""An item's order (its delay, priority and fairness key: itemorder.py) is given to the
one constructor every path builds an item with (``Item`` in rsd/core/run/items.py), whichever
record it comes from (ITEM_ENQUEUED, SNAP_ITEM, a SNAP_QUEUED row), and never set by hand
afterwards: a path that set it by hand could forget one of the three. Its record,
ITEM_ENQUEUED, is built in one place too (``enqueued`` in rsd/core/records/itemrecords.py),
whose defaults for what a path leaves out are the record's own."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from support.sources import parsed

import rsd

ORDER = {"not_before", "priority", "fairness_key"}
ROOT = Path(rsd.__file__).parent


def _set_by_hand(tree: ast.AST, path: Path) -> list[str]:
    """``x.<order field> = ...`` anywhere but in a constructor (``__init__``)."""
    found: list[str] = []

    def visit(node: ast.AST, in_init: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_init = node.name == "__init__"
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in ORDER and not in_init:
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} sets .{target.attr}")
        for child in ast.iter_child_nodes(node):
            visit(child, in_init)

    visit(tree, False)
    return found


def test_no_production_code_sets_an_items_order_after_building_it() -> None:
    found = [
        line
        for path in sorted(ROOT.rglob("*.py"))
        for line in _set_by_hand(parsed(path), path)
    ]
    assert not found, "an item's order is given to Item(...), not set afterwards:\n" + (
        "\n".join(found)
    )


def _records_built_by_hand(tree: ast.AST, path: Path) -> list[str]:
    """``ItemEnqueued(...)``, or ``built(ItemEnqueued, ...)`` (itemrecords.py: the tuple
    made straight), anywhere but in its builder, ``enqueued``."""
    found: list[str] = []

    def visit(node: ast.AST, in_builder: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_builder = node.name == "enqueued" and path == BUILDER
        if isinstance(node, ast.Call) and not in_builder:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if name == "built" and node.args:
                first = node.args[0]
                name = first.id if isinstance(first, ast.Name) else getattr(first, "attr", None)
            if name == "ItemEnqueued":
                found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} builds ItemEnqueued")
        for child in ast.iter_child_nodes(node):
            visit(child, in_builder)

    visit(tree, False)
    return found


BUILDER = ROOT / "core" / "records" / "itemrecords.py"


def test_no_production_code_builds_an_item_enqueued_but_its_builder() -> None:
    found = [
        line
        for path in sorted(ROOT.rglob("*.py"))
        for line in _records_built_by_hand(parsed(path), path)
    ]
    assert not found, "an ITEM_ENQUEUED is built by enqueued(...) (itemrecords.py):\n" + (
        "\n".join(found)
    )


def test_the_builders_defaults_are_the_records_own() -> None:
    from rsd.core.records.itemrecords import ItemEnqueued, enqueued

    defaults = {
        name: parameter.default
        for name, parameter in inspect.signature(enqueued).parameters.items()
        if parameter.default is not inspect.Parameter.empty
    }
    assert defaults == ItemEnqueued._field_defaults


def test_an_item_made_with_a_delay_is_delayed_until_it() -> None:
    from rsd.core.run.items import Item, State

    delayed = Item("t", "t1", False, "s", "m", None, None, None, 1.0, None, 5.0, 3, "k")
    assert (delayed.state, delayed.visible_at, delayed.not_before) == (State.DELAYED, 5.0, 5.0)
    assert (delayed.priority, delayed.fairness_key) == (3, "k")
    ready = Item("t", "t2", False, "s", "m", None, None, None, 1.0, None, None, 0, None)
    assert (ready.state, ready.visible_at, ready.not_before) == (State.PENDING, 0.0, None)
