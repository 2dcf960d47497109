"""The replication stream's deadline (feeds.py), rule by rule, on a primary in this
process whose standbys are bare connections that acknowledge, or stop acknowledging,
at the test's word:

- a synchronous standby silent for the deadline is replaced by one that answers: the
  held write is acknowledged on the new one's word, and the silent one's stream is
  closed (UNAVAILABLE);
- when every standby falls silent (a primary cut off from them), none replaces the
  synchronous one, not even one that answered a moment longer (a standby silent about
  as long is not known to answer), and the cluster is told that no standby answers
  (``on_silent``) while the writes wait;
- a primary whose changes all reached its synchronous standby is never told so.

In-process because the rules are about which feed is relied on when, which a bare
standby shows exactly (a real one cannot be made to stop acknowledging at will but by
SIGSTOP, which the cluster tests use: tests/test_a_hung_sync_standby_is_replaced.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from support.aio import eventually_true
from support.raw import RawConn, raw_connect

import rsproto as wire
from rsclient import AsyncRunstate
from rsd.core import Core
from rsd.disk.snapshots import Snapshots
from rsd.server import Server
from rsd.startup import recover
from rsd.wire.feeds import Feeds
from rsproto import Op, Push

CLUSTER = "test"
SILENCE = 1.0  # the deadline here (a cluster's is its lease; the rules do not depend on it)


class BareStandby:
    """A standby that acknowledges its copy and each batch while ``answering``."""

    def __init__(self, raw: RawConn, node: str) -> None:
        self.raw = raw
        self.node = node
        self.answering = True
        self.acked = -2
        self.closed_with: Any = None  # the connection error that ended its stream
        self.task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        with contextlib.suppress(EOFError, ConnectionError):
            while True:
                msg = await self.raw.recv(timeout=60)
                if msg[0] == wire.Kind.ERROR:
                    self.closed_with = msg[2]
                    return
                if msg[0] != wire.Kind.PUSH:
                    continue
                body = msg[2]
                if msg[1] == Push.REPL_COPY and body.get("done"):
                    n = body["after"]
                elif msg[1] == Push.REPL_BATCH:
                    n = body["n"]
                else:
                    continue
                if self.answering:
                    self.acked = n
                    await self.raw.request(Op.REPL_ACK, {"n": n})


class Primary:
    """A primary with its journal and feeds; etcd names a proposed standby at once."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.named: list[str | None] = []
        self.silent = 0  # times the feeds said no standby answers

    async def start(self) -> str:
        loop = asyncio.get_running_loop()
        ids = itertools.count(1)
        core = Core(lambda: f"run-{next(ids)}", wall_offset=0.0)
        journal, _ = recover(self.directory, core, loop.time())
        server: Server | None = None

        def acked() -> None:
            if server is not None and server.commit is not None:
                server.commit.acked()

        def propose(node: str | None) -> None:
            self.named.append(node)
            loop.call_soon(self.feeds.named, node)

        def silent() -> None:
            self.silent += 1

        self.feeds = Feeds(core, loop, lambda: 1, acked, propose, silence=SILENCE,
                           on_silent=silent)
        server = self.server = Server(core, loop, journal=journal,
                                      snapshots=Snapshots(journal, core), feeds=self.feeds,
                                      cluster=CLUSTER, on_lapsed=lambda: None)
        host, port = await server.start("127.0.0.1", 0)
        return f"{host}:{port}"


@contextlib.asynccontextmanager
async def cluster(directory: Path) -> AsyncIterator[tuple[Primary, AsyncRunstate,
                                                          list[BareStandby]]]:
    """A primary, a client of it, and two bare standbys (the first one named)."""
    primary = Primary(directory)
    address = await primary.start()
    standbys: list[BareStandby] = []
    rs = AsyncRunstate(holder="planner", address=address)
    try:
        for node in ("a", "b"):
            raw = await raw_connect(address)
            await raw.hello(f"standby:{node}",
                            replicate={"cluster": CLUSTER, "node": node, "epoch": 1})
            standbys.append(BareStandby(raw, node))
            await eventually_true(lambda: standbys[-1].acked >= -1)
        await eventually_true(lambda: primary.feeds.sync is not None)
        yield primary, rs, standbys
    finally:
        await rs.close()
        for standby in standbys:
            standby.raw.close()
            standby.task.cancel()
        await primary.server.stop()


async def test_a_silent_sync_standby_is_replaced_by_one_that_answers(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (primary, rs, (a, b)):
        assert primary.named == ["a"]
        run = await rs.scopes.create()
        await rs.mailboxes.ensure("work", mode="WORK")
        a.answering = False
        ticket = await asyncio.wait_for(run.mailbox("work").submit({"n": 1}, key="k1"), 30)
        assert primary.named == ["a", "b"]
        sync = primary.feeds.sync
        assert sync is not None and sync.node == "b"
        assert b.acked >= primary.feeds.relied_upto  # it holds all that was relied on
        await eventually_true(lambda: a.closed_with is not None)
        assert a.closed_with == "UNAVAILABLE"
        assert (await run.task(ticket.id).status())["key"] == "k1"
        assert primary.silent == 0  # a standby answered throughout


async def test_standbys_silent_alike_replace_none_and_the_cluster_is_told(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path) as (primary, rs, (a, b)):
        run = await rs.scopes.create()
        await rs.mailboxes.ensure("work", mode="WORK")
        a.answering = False
        held = b.acked
        waiting = [asyncio.ensure_future(run.mailbox("work").submit({"n": 1}, key="k1"))]
        await eventually_true(lambda: b.acked > held)  # b answered a moment longer
        b.answering = False
        waiting.append(asyncio.ensure_future(run.mailbox("work").submit({"n": 2}, key="k2")))
        await eventually_true(lambda: primary.silent > 0, timeout=30)
        assert not any(wait.done() for wait in waiting)  # nothing relied on a silent one
        assert primary.named == ["a"]
        sync = primary.feeds.sync
        assert sync is not None and sync.node == "a"
        for wait in waiting:
            wait.cancel()


async def test_a_primary_whose_standby_holds_everything_is_not_told(tmp_path: Path) -> None:
    async with cluster(tmp_path) as (primary, rs, (_, b)):
        run = await rs.scopes.create()
        await rs.mailboxes.ensure("work", mode="WORK")
        b.answering = False  # not the synchronous one: nothing waits for it
        for n in range(3):
            await run.mailbox("work").submit({"n": n}, key=f"k{n}")
        loop = asyncio.get_running_loop()
        quiet_until = loop.time() + 2 * SILENCE  # (longer than the deadline: not a timing)
        while loop.time() < quiet_until:
            await asyncio.sleep(SILENCE / 4)
        assert primary.silent == 0
        assert primary.named == ["a"]


async def test_standbys_whose_streams_broke_are_silent_too(tmp_path: Path) -> None:
    """A partition whose TCP gave up (TCP_USER_TIMEOUT closed the feeds): no standby
    left to answer, and the writes wait: the cluster is told as well."""
    async with cluster(tmp_path) as (primary, rs, standbys):
        run = await rs.scopes.create()
        await rs.mailboxes.ensure("work", mode="WORK")
        for standby in standbys:
            standby.raw.close()
        await eventually_true(lambda: not primary.feeds.feeds)
        waiting = asyncio.ensure_future(run.mailbox("work").submit({"n": 1}, key="k1"))
        await eventually_true(lambda: primary.silent > 0, timeout=30)
        assert not waiting.done()
        waiting.cancel()
