"""Elections as the server sees them (rsd/cluster/elector.py), on uvloop as rsd runs: the
first node that may lead becomes primary; the others hear who leads and where; when the
primary dies, a standby that may lead takes over once the dead one's lease has run out,
with the next epoch, and one that may not lead never campaigns; a standby allowed later
takes over when asked to reconsider. One log line per election won and per leader seen."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
import uvloop
from support.etcd import EtcdCluster

from rsd.cluster.elector import Elector
from rsd.cluster.etcd import EtcdStore

LEASE = 2
WITHIN = 10.0  # seconds for an election to be seen (a lease to run out, generously)


@dataclass
class Node:
    """An elector and what its callbacks heard, in order."""

    name: str
    store: EtcdStore
    allowed: bool
    heard: list[tuple[object, ...]] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    elector: Elector | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{7000 + ord(self.name[0])}"

    def start(self) -> Elector:
        def hear(*what: object) -> None:
            self.heard.append(what)
            self.changed.set()

        self.elector = Elector(
            self.store, self.address, may_lead=lambda: self.allowed,
            on_primary=lambda epoch: hear("primary", epoch),
            on_standby=lambda leader, address, epoch: hear("standby", leader, address, epoch),
            on_lost=lambda: hear("lost"),
        )
        self.elector.start()
        return self.elector

    async def hears(self, *what: object) -> None:
        async def wait() -> None:
            while what not in self.heard:
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), WITHIN)


async def _members(store: EtcdStore, names: list[str]) -> None:
    """Wait until exactly these members are registered (each one registers when its lease
    is granted, which may come after it heard who leads)."""
    async def wait() -> None:
        while [m["name"] for m in await store.members()] != names:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(wait(), WITHIN)


async def _scenario(endpoints: list[str]) -> list[tuple[object, ...]]:
    """Runs the elections; what b heard."""

    def node(name: str, allowed: bool) -> Node:
        return Node(name, EtcdStore(endpoints, "test", name, lease_seconds=LEASE), allowed)

    a, b, c = node("a", True), node("b", False), node("c", True)
    try:
        a.start()
        await a.hears("primary", 1)
        b.start()
        c.start()
        await b.hears("standby", "a", a.address, 1)
        await c.hears("standby", "a", a.address, 1)
        await _members(b.store, ["a", "b", "c"])

        # a dies: no resignation, its lease runs out.
        assert a.elector is not None
        await a.elector.stop(resign=False)
        await a.store.close()
        await c.hears("primary", 2)
        await b.hears("standby", "c", c.address, 2)
        assert c.elector is not None and c.elector.is_primary
        await _members(b.store, ["b", "c"])  # a's record went with its lease
        assert [m["role"] for m in await b.store.members()] == ["standby", "primary"]

        # c resigns: b sees no leader and, not allowed to lead, does not campaign...
        await c.elector.stop()
        await b.hears("standby", None, None, 2)
        assert b.elector is not None and not b.elector.is_primary
        assert await b.store.leader() == (None, 2)
        # ... until it may, and is asked to reconsider.
        b.allowed = True
        b.elector.reconsider()
        await b.hears("primary", 3)
        assert [what[0] for what in b.heard].count("primary") == 1
        assert ("lost",) not in a.heard + b.heard + c.heard
        return b.heard
    finally:
        for one in (a, b, c):
            if one.elector is not None:
                await one.elector.stop()
            await one.store.close()


def test_a_standby_that_may_lead_takes_over_and_one_that_may_not_never_campaigns(
    etcd_cluster: Callable[..., EtcdCluster], caplog: pytest.LogCaptureFixture
) -> None:
    cluster = etcd_cluster(size=3)
    with caplog.at_level(logging.INFO, logger="rsd"):
        heard_by_b = uvloop.run(_scenario(cluster.endpoints))
    lines = [record.getMessage() for record in caplog.records]
    assert [line for line in lines if "elected primary" in line] == [
        "cluster test: a elected primary at epoch 1",
        "cluster test: c elected primary at epoch 2",
        "cluster test: b elected primary at epoch 3",
    ]
    # One line for each leader b was told of (between a and c, perhaps a moment of none).
    said = [f"cluster test: b sees leader {leader} at {address} (epoch {epoch})"
            if leader is not None else f"cluster test: b sees no leader (epoch {epoch})"
            for kind, leader, address, epoch in (h for h in heard_by_b if h[0] == "standby")]
    assert [line for line in lines if line.startswith("cluster test: b sees")] == said
    assert said[0] == "cluster test: b sees leader a at 127.0.0.1:7097 (epoch 1)"
    assert "cluster test: b sees leader c at 127.0.0.1:7099 (epoch 2)" in said
