"""deploy/grafana/rsd.json, the Grafana dashboard: every query of every panel (and of its
template variables) names only metrics rsd exports, so a metric renamed or removed in
rsd/metrics.py fails here instead of leaving an empty panel. What rsd exports is read
from its own renderer (``rsd.metrics.render`` of a server with a journal that is a
cluster's primary of a sharded cluster, and ``render_standby``): every family any node
can show, without starting one. The board covers what the issue asks for: throughput,
latency, queue depths, leases, fsync, loop lag, cluster roles and lag.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from rsd.core import Core
from rsd.disk.journal import Journal
from rsd.disk.snapshots import Snapshots
from rsd.metrics import render, render_standby
from rsd.server import Server
from rsproto.slots import SlotMap

BOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "rsd.json"
_SUFFIXES = {"histogram": ("_bucket", "_sum", "_count")}
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_METRIC = re.compile(r"(?<![A-Za-z0-9_:])rsd_[A-Za-z0-9_:]*")


class _Held:
    copies = last_batch = records = received_bytes = 1

    def batch_age(self) -> float | None:
        return 0.5


def _names(text: str) -> set[str]:
    """Every series name in exposition text, histogram samples' names included."""
    names: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            names.add(name)
            names.update(name + suffix for suffix in _SUFFIXES.get(kind, ()))
    return names


async def exported(tmp_path: Path) -> set[str]:
    """The metric names rsd can export: a primary's of a sharded cluster, with a journal,
    a snapshot written and a client connected, and a standby's."""
    core = Core(lambda: "s")
    journal = Journal(tmp_path, 1)
    server = Server(core, asyncio.get_running_loop(), journal=journal,
                    snapshots=Snapshots(journal, core, snapshot_bytes=1 << 30))
    server.metrics.last_snapshot_at = 1.0
    view = {"role": "primary", "epoch": 2, "takeovers": 1, "members": [
        {"node": "a", "role": "primary"},
        {"node": "b", "role": "standby", "lag_records": 0, "lag_bytes": 0}]}
    server.cluster, server.cluster_status = "c", lambda: view
    try:
        names = _names(render(server).decode())
    finally:
        journal.close()
    standby = {**view, "role": "standby"}
    shard = (server.slots.shard, SlotMap.whole(server.slots.shard))
    return names | _names(render_standby(standby, _Held(), 0.0, 1.0, shard).decode())


def queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(where, query) of every panel target and every query variable."""
    found = []
    panels = list(board["panels"])
    while panels:
        panel = panels.pop(0)
        panels += panel.get("panels", [])
        for target in panel.get("targets", []):
            found.append((f"panel {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            found.append((f"variable {variable['name']!r}", variable["query"]["query"]))
    return found


def metrics_named(query: str) -> set[str]:
    """The rsd metric names a PromQL query names (label values in quotes left out)."""
    return set(_METRIC.findall(_STRING.sub('""', query)))


def unknown(board: dict[str, Any], known: set[str]) -> list[str]:
    """Each query that names no rsd metric or one rsd does not export."""
    problems = []
    for where, query in queries(board):
        named = metrics_named(query)
        if not named:
            problems.append(f"{where} names no rsd metric: {query}")
        problems += [f"{where} names {name}, which rsd does not export: {query}"
                     for name in sorted(named - known)]
    return problems


async def test_every_panel_queries_metrics_rsd_exports(tmp_path: Path) -> None:
    board = json.loads(BOARD.read_text())
    known = await exported(tmp_path)
    assert "rsd_requests_total" in known and "rsd_fsync_seconds_bucket" in known
    assert "rsd_standby_last_batch_age_seconds" in known and "rsd_cluster_lag_records" in known
    assert unknown(board, known) == []
    # The check finds a name that is not exported (a metric renamed under the board).
    doctored = json.loads(BOARD.read_text())
    doctored["panels"][1]["targets"][0]["expr"] = 'sum(rate(rsd_request_total{op="x"}[5m]))'
    [problem] = unknown(doctored, known)
    assert "rsd_request_total" in problem
    # What the board must show, by the metrics each part reads.
    named = set().union(*(metrics_named(query) for _, query in queries(board)))
    for needed in ("rsd_requests_total", "rsd_request_batch_seconds_bucket",
                   "rsd_commit_wait_seconds_bucket", "rsd_mailbox_ready", "rsd_leases",
                   "rsd_fsync_seconds_bucket", "rsd_event_loop_lag_seconds_bucket",
                   "rsd_cluster_role", "rsd_cluster_lag_records"):
        assert needed in named, f"the board shows nothing of {needed}"


def test_the_board_is_one_importable_dashboard() -> None:
    """Unique panel ids, a Prometheus data source chosen by a variable, every panel on
    the grid: what Grafana's import needs."""
    board = json.loads(BOARD.read_text())
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    assert board["uid"] == "rsd-overview" and board["schemaVersion"] >= 36
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
