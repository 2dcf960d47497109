"""Every series the manual's metrics table documents (docs/metrics.md) is exported by
rsd, and every series rsd exports is in the table: a renamed or dropped series, or a new
one nobody wrote down, fails here.

What rsd exports is gathered from each kind of node: a server alone (a real process,
after a snapshot, so its disk series are there), the primary of a shard of a cluster
and a standby (rsd/metrics.py's ``render`` of a server in this process with a slot map
and a cluster status, and ``render_standby``: the cluster side only feeds them)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from support.http import http
from support.manual import page
from support.process import Rsd

from rsclient import AsyncRunstate
from rsd.core import Core
from rsd.metrics import render, render_standby
from rsd.server import Server
from rsd.slotowner import SlotOwner
from rsproto.slots import SlotMap

MAP = SlotMap(64, 2, ((0, 31, "a"), (32, 63, "b")), {"a": "127.0.0.1:1", "b": "127.0.0.1:2"})
VIEW: dict[str, Any] = {
    "cluster": "c", "epoch": 3, "primary": "n1", "node": "n1", "role": "primary",
    "takeovers": 1, "members": [
        {"node": "n1", "address": "127.0.0.1:1", "role": "primary", "sync": False,
         "lag_records": 0, "lag_bytes": 0},
        {"node": "n2", "address": "127.0.0.1:3", "role": "standby", "sync": True,
         "lag_records": 2, "lag_bytes": 90}],
}


def documented() -> set[str]:
    """The series named in the first column of the manual's metrics table."""
    names: set[str] = set()
    for line in page("metrics.md").splitlines():
        if line.startswith("| `rsd_"):
            names.update(re.findall(r"`(rsd_[a-z0-9_]+)", line.split(" | ")[0]))
    return names


def families(text: str) -> set[str]:
    """The series of a /metrics text, by their ``# TYPE`` lines."""
    return set(re.findall(r"^# TYPE (rsd_[a-z0-9_]+) ", text, re.MULTILINE))


class _Held:
    copies, last_batch, records, received_bytes = 1, 7, 9, 512

    def batch_age(self) -> float | None:
        return 0.5


async def _alone(rsd_factory: Callable[..., Rsd]) -> str:
    server = rsd_factory("--http-listen", "127.0.0.1:0")
    async with AsyncRunstate(holder="metrics", address=server.address) as rs:
        await rs.admin.snapshot()  # the snapshot series exist once one was written
    status, text = await http(server.metrics_port(), "GET", "/metrics")
    assert status == 200
    return str(text)


async def test_every_documented_series_is_exported_and_every_exported_one_documented(
    rsd_factory: Callable[..., Rsd],
) -> None:
    alone = await _alone(rsd_factory)
    primary = Server(Core(lambda: "unused"), asyncio.get_running_loop(), cluster="c",
                     slots=SlotOwner(MAP, "a"))
    primary.cluster_status = lambda: VIEW
    shard_primary = render(primary).decode()
    standby = render_standby({**VIEW, "role": "standby", "node": "n2"}, _Held(), 0.0, 1.0,
                             ("a", MAP)).decode()
    exported = families(alone) | families(shard_primary) | families(standby)

    table = documented()
    assert len(table) > 40  # the table was read
    assert sorted(table - exported) == [], "documented, not exported"
    assert sorted(exported - table) == [], "exported, not documented"
    # A server alone is one shard: no cluster or shard series of its own.
    assert not {"rsd_shard_info", "rsd_slots_owned", "rsd_cluster_epoch"} & families(alone)
    assert 'rsd_shard_info{shard="a"} 1' in shard_primary
    assert "rsd_slots_owned 32" in shard_primary and "rsd_slots_owned 32" in standby
