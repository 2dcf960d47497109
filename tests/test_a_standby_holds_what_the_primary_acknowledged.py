"""A standby that follows a primary (follower.py, feeds.py) holds every change the primary
acknowledged, fsynced in its own data directory, in the same state; under ``--fsync
always`` a reply leaves the primary only once the synchronous standby has it too; a
standby's core grants and expires nothing by itself; promoted, it serves what it holds.

In-process, on real sockets on loopback: a primary ``Server`` with its journal and
feeds, a ``Follower`` of it, and the SDK as the client.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from pathlib import Path
from typing import Any

import pytest
from support.aio import eventually_true

from rsclient import AsyncRunstate
from rsclient.errors import UnavailableError
from rsd.core import Core, Rec
from rsd.disk.recovery import Recovery
from rsd.disk.snapshots import Snapshots
from rsd.metrics import render_standby
from rsd.replication.follower import Follower, FollowRefused
from rsd.server import Server
from rsd.startup import recover
from rsd.wire.feeds import Feeds

CLUSTER = "test"


def _new_core() -> Core:
    ids = itertools.count(1)
    return Core(lambda: f"run-{next(ids)}", wall_offset=0.0)


class Primary:
    """A primary in this process: its core, journal, server and feeds."""

    def __init__(self, directory: Path, sync_wait: float = 10.0) -> None:
        self.directory = directory
        self.sync_wait = sync_wait
        self.server: Server | None = None
        self.epoch = 1
        self.sync: list[str | None] = []

    async def start(self) -> str:
        loop = asyncio.get_running_loop()
        self.core = core = _new_core()
        journal, _ = recover(self.directory, core, loop.time())
        journal.write(core.effects.take_records())
        core.effects.take_sync()
        journal.sync_now()
        server: Server | None = None

        def acked() -> None:
            if server is not None and server.commit is not None:
                server.commit.acked()

        def propose(node: str | None) -> None:  # (no etcd here: named at once)
            self.sync.append(node)
            loop.call_soon(self.feeds.named, node)

        self.feeds = Feeds(core, loop, lambda: self.epoch, acked, propose)
        server = self.server = Server(
            core, loop, journal=journal, snapshots=Snapshots(journal, core),
            feeds=self.feeds, cluster=CLUSTER, on_lapsed=lambda: None,
            sync_wait_seconds=self.sync_wait,
        )
        host, port = await server.start("127.0.0.1", 0)
        return f"{host}:{port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop()


def _state(core: Core) -> list[Any]:
    """The whole state of ``core`` as comparable data (its snapshot's records), but for
    where it stands in the stream (STREAM_AT: the standby's own, the primary has none)."""
    return [list(rec) for rec in core.snapshot() if rec[0] != Rec.STREAM_AT]


async def test_a_standby_gets_a_copy_then_every_batch_and_holds_the_same_state(
    tmp_path: Path,
) -> None:
    (tmp_path / "primary").mkdir()
    (tmp_path / "standby").mkdir()
    primary = Primary(tmp_path / "primary")
    address = await primary.start()
    rs = AsyncRunstate(holder="planner", address=address)
    follower = Follower(tmp_path / "standby", _new_core, cluster=CLUSTER, node="n2",
                        token=None)
    try:
        # Changes before the standby comes (their replies held: no standby holds them
        # yet): they arrive in the copy.
        async def before() -> Any:
            run = await rs.scopes.create()
            await rs.mailboxes.ensure("research", mode="WORK")
            first = await run.mailbox("research").submit({"company": "acme"},
                                                         key="research:acme")
            return run, first

        early = asyncio.ensure_future(before())
        await asyncio.sleep(0.2)
        assert not early.done()
        host, port = address.rsplit(":", 1)
        following = asyncio.create_task(follower.follow(host, int(port)))
        run, first = await asyncio.wait_for(early, 10)
        assert primary.feeds.sync is not None  # caught up: the synchronous standby
        assert primary.sync == ["n2"]
        lease = await run.claim("company:acme").try_acquire()
        assert lease["kind"] == "acquired"
        # Changes after it joined: each acknowledged only once the standby has it.
        for index in range(20):
            await run.mailbox("research").submit({"n": index}, key=f"k{index}")
            standby = follower.standby
            assert standby is not None
            assert standby.last >= primary.feeds.written - 1  # the ack came before the reply
        delivery = await run.mailbox("research").receive()
        assert delivery is not None
        await delivery.complete(result={"payload": "report"})
        await lease["lease"].release()
        await eventually_true(lambda: follower.standby is not None
                     and follower.standby.last == primary.feeds.written)
        standby = follower.standby
        assert standby is not None
        assert _state(standby.core) == _state(primary.core)
        assert (await run.task(first.id).status())["state"] == "SUCCEEDED"
        # The standby's own directory recovers to the same state.
        standby.journal.sync_now()
        recovered = _new_core()
        for rec in Recovery(tmp_path / "standby").records():
            recovered.apply(rec, 0.0)
        assert _state(recovered) == _state(primary.core)
        following.cancel()
    finally:
        await rs.close()
        await primary.stop()
        follower.close()


async def test_without_a_caught_up_standby_the_primary_acknowledges_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "primary").mkdir()
    primary = Primary(tmp_path / "primary")
    address = await primary.start()
    rs = AsyncRunstate(holder="planner", address=address)
    try:
        with_reply = asyncio.ensure_future(rs.scopes.create())
        await asyncio.sleep(0.3)
        assert not with_reply.done()  # fsynced here, but on no standby: held
        (tmp_path / "standby").mkdir()
        follower = Follower(tmp_path / "standby", _new_core, cluster=CLUSTER, node="n2",
                            token=None)
        host, port = address.rsplit(":", 1)
        following = asyncio.create_task(follower.follow(host, int(port)))
        run = await asyncio.wait_for(with_reply, 10)  # released once the standby has it
        standby = follower.standby
        assert standby is not None
        assert ("default", run.id) in standby.core.scopes
        following.cancel()
        follower.close()
    finally:
        await rs.close()
        await primary.stop()


async def test_a_change_no_standby_holds_is_refused_after_a_bounded_wait(
    tmp_path: Path,
) -> None:
    """No standby at all: the reply is never sent as a success; after ``sync_wait`` the
    connection is told UNAVAILABLE (the outcome is unknown to the client), and the
    primary goes on serving."""
    (tmp_path / "primary").mkdir()
    primary = Primary(tmp_path / "primary", sync_wait=0.5)
    address = await primary.start()
    rs = AsyncRunstate(holder="planner", address=address, connect_timeout=2.0)
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(UnavailableError):
            await rs.scopes.create()
        assert 0.4 <= loop.time() - began < 5
        assert primary.server is not None and primary.server.commit is not None
        assert not primary.server.commit.held
    finally:
        await rs.close()
        await primary.stop()


async def test_a_promoted_standby_serves_what_it_holds_and_keeps_the_leases(
    tmp_path: Path,
) -> None:
    (tmp_path / "primary").mkdir()
    (tmp_path / "standby").mkdir()
    primary = Primary(tmp_path / "primary")
    address = await primary.start()
    rs = AsyncRunstate(holder="worker", address=address)
    follower = Follower(tmp_path / "standby", _new_core, cluster=CLUSTER, node="n2",
                        token=None)
    host, port = address.rsplit(":", 1)
    following = asyncio.create_task(follower.follow(host, int(port)))
    try:
        await eventually_true(lambda: follower.standby is not None)
        run = await rs.scopes.create()
        attempt = await run.claim("company:acme").try_acquire()
        assert attempt["kind"] == "acquired"
        generation = attempt["lease"].generation
    finally:
        await primary.stop()  # the primary goes away; its client still holds the claim
    await asyncio.wait_for(following, 10)  # the stream ends with the primary
    loop = asyncio.get_running_loop()
    standby = follower.promote(loop.time())
    assert standby.core.leases.all(), "the claim's lease is held on the standby"
    for lease in standby.core.leases.all():
        assert lease.expires_at >= loop.time() + 5  # a full lease from the takeover
    server = Server(standby.core, loop, journal=standby.journal, snapshots=standby.snapshots)
    new_host, new_port = await server.start("127.0.0.1", 0)
    rs2 = AsyncRunstate(holder="rival", address=f"{new_host}:{new_port}")
    try:
        busy = await rs2.scope(run.id).claim("company:acme").try_acquire()
        assert busy["kind"] == "busy"  # still held by its owner
        view = await rs2.scope(run.id).claim("company:acme").inspect()
        assert view["generation"] > generation or view["generation"] == generation
    finally:
        await rs2.close()
        await rs.close()
        await server.stop()


async def test_a_standby_refuses_a_primary_of_an_older_epoch(tmp_path: Path) -> None:
    """A standby that knows a newer epoch than the primary it reaches (that primary was
    replaced meanwhile) is refused before anything is streamed: NOT_PRIMARY."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "standby").mkdir()
    primary = Primary(tmp_path / "primary")  # leads epoch 1
    address = await primary.start()
    follower = Follower(tmp_path / "standby", _new_core, cluster=CLUSTER, node="n2",
                        token=None)
    follower.known_epoch = 2
    host, port = address.rsplit(":", 1)
    try:
        with pytest.raises(FollowRefused) as refused:
            await asyncio.wait_for(follower.follow(host, int(port)), 10)
        assert refused.value.code == "NOT_PRIMARY"
        assert follower.standby is None
        assert not primary.feeds.feeds
    finally:
        await primary.stop()


async def test_a_standby_that_comes_back_resumes_from_its_position_without_a_copy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A standby whose stream broke comes back holding batch n of the primary's epoch:
    the primary sends the batches after n from its ring of recent ones, no new copy; what
    waited for it is acknowledged once it has them."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "standby").mkdir()
    primary = Primary(tmp_path / "primary")
    address = await primary.start()
    rs = AsyncRunstate(holder="planner", address=address)
    follower = Follower(tmp_path / "standby", _new_core, cluster=CLUSTER, node="n2",
                        token=None)
    host, port = address.rsplit(":", 1)
    following = asyncio.create_task(follower.follow(host, int(port)))
    try:
        run = await rs.scopes.create()
        await rs.mailboxes.ensure("research", mode="WORK")
        for index in range(5):
            await run.mailbox("research").submit({"n": index}, key=f"a{index}")
        following.cancel()  # the stream breaks
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await eventually_true(lambda: not primary.feeds.feeds)
        held = follower.standby
        assert held is not None
        before = held.last
        waiting = asyncio.ensure_future(
            run.mailbox("research").submit({"n": 99}, key="while-away"))
        await asyncio.sleep(0.2)
        assert not waiting.done()  # no standby holds it
        caplog.set_level(logging.INFO, logger="rsd.cluster")
        caplog.clear()
        following = asyncio.create_task(follower.follow(host, int(port)))
        ticket = await asyncio.wait_for(waiting, 10)
        assert f"resumes after batch {before}" in caplog.text
        assert "copy of the state" not in caplog.text
        assert follower.standby is held  # the same hot copy, gone on
        await eventually_true(lambda: held.last == primary.feeds.written)
        assert _state(held.core) == _state(primary.core)
        assert ("default", run.id) in held.core.scopes and ticket.id
        following.cancel()
    finally:
        await rs.close()
        await primary.stop()
        follower.close()


async def test_a_primary_feeds_each_node_once_and_a_bounded_number_of_standbys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A node that follows again replaces its earlier feed; past ``MAX_FEEDS`` another
    node is refused (RESOURCE_EXHAUSTED): no client makes the primary fork copies without
    bound."""
    from rsd.policy import Policy

    for name in ("primary", "a", "b", "c"):
        (tmp_path / name).mkdir()
    primary = Primary(tmp_path / "primary")
    address = await primary.start()
    host, port = address.rsplit(":", 1)
    first = Follower(tmp_path / "a", _new_core, cluster=CLUSTER, node="n2", token=None)
    again = Follower(tmp_path / "b", _new_core, cluster=CLUSTER, node="n2", token=None)
    other = Follower(tmp_path / "c", _new_core, cluster=CLUSTER, node="n3", token=None)
    try:
        following = asyncio.create_task(first.follow(host, int(port)))
        await eventually_true(lambda: first.standby is not None)
        monkeypatch.setattr(Policy, "MAX_FEEDS", 1)
        replacing = asyncio.create_task(again.follow(host, int(port)))
        with pytest.raises(FollowRefused):  # the earlier feed of n2 was closed
            await asyncio.wait_for(following, 10)
        await eventually_true(lambda: again.standby is not None)
        assert [feed.node for feed in primary.feeds.feeds.values()] == ["n2"]
        with pytest.raises(FollowRefused) as refused:
            await asyncio.wait_for(other.follow(host, int(port)), 10)
        assert refused.value.code == "RESOURCE_EXHAUSTED"
        replacing.cancel()
    finally:
        await primary.stop()
        for follower in (first, again, other):
            follower.close()


async def test_a_caught_up_standby_lags_by_nothing_and_its_metrics_say_what_it_holds(
    tmp_path: Path,
) -> None:
    """The primary counts a standby's lag from the batch it acknowledged, also right
    after its copy and after a resume (the batches the copy or the ring covered are not
    lag); the standby's own metrics (a standby serves no client) say which batch it
    holds and how much it received."""
    (tmp_path / "primary").mkdir()
    (tmp_path / "standby").mkdir()
    primary = Primary(tmp_path / "primary")
    address = await primary.start()
    rs = AsyncRunstate(holder="planner", address=address)
    host, port = address.rsplit(":", 1)
    follower = Follower(tmp_path / "standby", _new_core, cluster=CLUSTER, node="n2",
                        token=None)
    try:
        early = asyncio.ensure_future(rs.mailboxes.ensure("research", mode="WORK"))
        await asyncio.sleep(0.1)  # journaled, its reply held: no standby yet
        following = asyncio.create_task(follower.follow(host, int(port)))
        await asyncio.wait_for(early, 10)
        run = await rs.scopes.create()
        await eventually_true(lambda: follower.standby is not None
                     and follower.standby.last == primary.feeds.written)
        assert primary.feeds.lag() == {"n2": (0, 0)}
        for index in range(5):
            await run.mailbox("research").submit({"n": index}, key=f"a{index}")
        await eventually_true(lambda: primary.feeds.lag() == {"n2": (0, 0)})
        following.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await following
        await eventually_true(lambda: not primary.feeds.feeds)
        waiting = asyncio.ensure_future(run.mailbox("research").submit({"n": 9}, key="b"))
        await asyncio.sleep(0.1)
        following = asyncio.create_task(follower.follow(host, int(port)))  # resumes
        await asyncio.wait_for(waiting, 10)
        await eventually_true(lambda: primary.feeds.lag() == {"n2": (0, 0)})
        text = render_standby(
            {"role": "standby", "epoch": 1, "takeovers": 0, "members": []}, follower,
            0.0, 1.0,
        ).decode()
        samples = dict(line.rsplit(" ", 1) for line in text.splitlines()
                       if line and not line.startswith("#"))
        assert float(samples["rsd_standby_batch"]) == primary.feeds.written
        assert float(samples["rsd_standby_copies_total"]) == 1
        assert float(samples["rsd_standby_records_total"]) == follower.records > 6
        assert float(samples["rsd_standby_received_bytes_total"]) > 0
        assert float(samples['rsd_cluster_role{role="standby"}']) == 1
        following.cancel()
    finally:
        await rs.close()
        await primary.stop()
        follower.close()
