"""No package of rsd imports one above it, and no import circle is longer than two modules.

rsd's folders are floors: each stands on the ones below it and may import only from them
(or from itself). ``FLOORS`` is the order, lowest first; a module belongs to the longest
entry its dotted name starts with, so a package's modules share its floor and a module of
rsd's own folder (``rsd/*.py``) is placed by name (the few that stand at the very bottom,
like ``policy.py``, which the core reads, or at the top, like ``server.py``, which wires
the shell together). Imports count wherever they stand: under ``if TYPE_CHECKING:`` (a
type is a dependency too) and inside a function.

In the core: the record declarations; the ground floor (time, ids, leases, waits, checks:
mechanisms that know no object); what a tenant's runs share (pools, quotas, mailboxes);
a run's own state (the run, its claims, items, queues, groups, schedules: what a shard
will own, importing nothing that registers every run); the tables and events over all
of it; then the rules: holds (claims, pools, quotas), work (an item's life), runs (runs,
groups, schedules, cancellation); and at the top the Core that wires the books
(machine.py), restore, intake (an item enters into its group: it stands on runs) and the
admin views. In the shell: the etcd side of a cluster (which never imports the server),
the disk, security, the wire, the HTTP listener, the server, and replication, which
starts servers; the entry points last.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from support.sources import parsed

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "rsd"

# The floors, lowest first. Each entry is a package (all its modules) or one module.
FLOORS: list[tuple[str, ...]] = [
    # rsd's own folder, the bottom: the package face (__version__) and what the core and
    # the shell both read; a module added to rsd/ stands here until placed higher
    ("rsd", "rsd.policy", "rsd.collector", "rsd.logsummary", "rsd.logs", "rsd.notify",
     "rsd.randomness", "rsd.watchdog", "rsd.descriptors"),
    ("rsd.cluster",),  # the etcd side: who is primary (never the server)
    ("rsd.core.records",),  # the record declarations
    ("rsd.core.ground",),  # errors, effects, timers, ids, leases, waits, checks
    ("rsd.core.tenant",),  # pools, quotas, mailboxes: what a tenant's runs share
    ("rsd.core.run",),  # a run and what lives in it: what a shard will own
    ("rsd.core.state",),  # the tables over every run and tenant, events
    ("rsd.core.holds",),  # the rules of claims, pools, quotas, fencing, renewals
    ("rsd.core.work",),  # the rules of an item's life
    ("rsd.core.runs",),  # the rules of runs, groups, schedules, cancellation
    ("rsd.core",),  # the Core (machine.py), intake, restore, admin, ids' records
    ("rsd.disk",),  # the data directory, journal, snapshots, recovery
    ("rsd.security",),  # tokens, auth, TLS, failed HELLOs counted
    ("rsd.metrics",),  # what rsd measures: the wire and the HTTP listener count into it
    ("rsd.wire",),  # a connection from bytes to replies, and the feeds to standbys
    ("rsd.http",),  # the HTTP listener: /metrics, the dashboard, its API
    ("rsd.server", "rsd.notprimary", "rsd.options", "rsd.reload"),  # the server, wired
    ("rsd.startup",),  # rebuild a core from a data directory, open its journal
    ("rsd.replication",),  # a standby following its primary; a cluster node's roles
    ("rsd.cli", "rsd.__main__", "rsd.clustermode",  # the one startup, a cluster its option,
     "rsd.localcluster"),  # and a sharded cluster on one machine (runs them as processes)
]
FLOOR = {entry: number for number, entries in enumerate(FLOORS) for entry in entries}

# The one circle of more than two modules left: a run holds its groups and schedules
# (``Scope.groups``, ``Scope.schedules``, type-only) and each knows its run (the books
# reach a run through them). Cutting it takes a Protocol as wide as Group or Schedule,
# or untyped fields: it stays inside the run's own package.
KNOWN_CIRCLES = [["rsd.core.run.group", "rsd.core.run.schedule", "rsd.core.run.scope"]]
MAX_CIRCLE = 2


@functools.cache  # read once per process: every test here reads the same files
def _modules() -> dict[str, tuple[Path, str]]:
    """Every module of rsd: dotted name -> (its file, the package its relative imports
    start from)."""
    found: dict[str, tuple[Path, str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            name = ".".join(parts[:-1])
            found[name] = (path, name)
        else:
            name = ".".join(parts)
            found[name] = (path, name.rpartition(".")[0])
    return found


@functools.cache  # parsed once per process (1.2 s of CPU), shared by the tests: none changes it
def _edges() -> dict[str, set[str]]:
    """Module -> the modules of rsd it imports (a name imported from a module counts
    as that module; a submodule imported from a package as the submodule)."""
    modules = _modules()

    def known(target: str) -> str:
        while target not in modules:
            target = target.rpartition(".")[0]
        return target

    edges: dict[str, set[str]] = {}
    for name, (path, package) in modules.items():
        found: set[str] = set()
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    module = ".".join([*base, node.module] if node.module else base)
                else:
                    module = node.module or ""
                subs = [f"{module}.{alias.name}" for alias in node.names]
                targets = [s for s in subs if s in modules] or [module]
            else:
                continue
            found |= {known(t) for t in targets if t == "rsd" or t.startswith("rsd.")}
        edges[name] = found - {name}
    return edges


def _floor_entry(module: str) -> str:
    """The longest entry of ``FLOORS`` the module's name starts with."""
    entries = [e for e in FLOOR if module == e or module.startswith(e + ".")]
    return max(entries, key=len)


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def test_the_edge_collection_sees_type_only_relative_and_function_level_imports() -> None:
    edges = _edges()
    assert len(edges) > 100  # it read all of rsd
    assert "rsd.core" in edges["rsd.server"]  # ``from .core import Core``
    assert "rsd.disk.logfile_v1" in edges["rsd.disk.logfile"]  # inside a function
    assert "rsd.wire.connection" in edges["rsd.wire.clientbudget"]  # under TYPE_CHECKING
    assert "rsd.policy" in edges["rsd.core.ground.tenants"]  # ``from ...policy import``
    assert "rsd.core.run.claim" in edges["rsd.core.run.scope"]  # type-only, in the core
    # ``from . import itemrecords``: the submodule, not the package
    assert "rsd.core.records.itemrecords" in edges["rsd.core.records"]


def test_the_circle_finder_finds_a_circle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert _circles(edges) == [["a", "b", "c"]]


def test_every_package_of_rsd_has_its_floor() -> None:
    packages = {
        ".".join(path.parent.relative_to(ROOT).parts) for path in PACKAGE.rglob("__init__.py")
    }
    unplaced = sorted(packages - set(FLOOR))
    assert not unplaced, f"packages without a floor in FLOORS: {unplaced}"
    missing = sorted(entry for entry in FLOOR if entry not in _modules())
    assert not missing, f"FLOORS names what is not there: {missing}"


def test_no_package_imports_one_above_it() -> None:
    upward = []
    for module, targets in sorted(_edges().items()):
        floor = FLOOR[_floor_entry(module)]
        for target in sorted(targets):
            if FLOOR[_floor_entry(target)] > floor:
                upward.append(f"{module} -> {target} ({_floor_entry(target)} is above)")
    assert not upward, "imports of a floor above:\n" + "\n".join(upward)


def test_no_import_circle_of_more_than_two_modules() -> None:
    too_long = [
        circle for circle in _circles(_edges())
        if len(circle) > MAX_CIRCLE and circle not in KNOWN_CIRCLES
    ]
    assert not too_long, f"import circles of more than {MAX_CIRCLE} modules: {too_long}"


def test_the_known_circles_are_still_there() -> None:
    """A circle cut is taken off ``KNOWN_CIRCLES``, so it cannot come back unseen."""
    circles = _circles(_edges())
    assert all(circle in circles for circle in KNOWN_CIRCLES), circles


def test_no_part_of_the_shell_depends_on_the_server() -> None:
    """server.py wires the shell's parts together; none of them reaches back for it,
    only what starts one (the entry points, and a cluster node taking the primary's role)."""
    starters = {"rsd.cli", "rsd.clustermode", "rsd.replication.node"}
    reaching = {m for m, targets in _edges().items() if "rsd.server" in targets}
    assert reaching <= starters, f"modules that import rsd.server: {sorted(reaching)}"


def test_no_book_of_the_core_depends_on_the_core_that_wires_them() -> None:
    """machine.py makes the books and wires who hears which event; none reaches back
    (the package's face exports the Core; restore.py drives one in recovery)."""
    reaching = sorted(
        m for m, targets in _edges().items()
        if "rsd.core.machine" in targets and m.startswith("rsd.core")
    )
    assert reaching == ["rsd.core", "rsd.core.restore"], reaching
