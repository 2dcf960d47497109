"""A leader may act until the send time of its last answered keep-alive + the lease's TTL
- a margin, never from the time the answer came: etcd starts counting when it receives
the request, so that deadline falls before the lease can end. A keep-alive that cannot
reach etcd extends nothing, and the elector gives up leadership at the deadline, even
though etcd never said so (rsd/cluster/etcd.py: keep_alive; rsd/cluster/elector.py)."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from support.aio import now
from support.etcd import EtcdCluster, stores

from rsd.cluster.client import EtcdError
from rsd.cluster.elector import Elector

LEASE = 2  # rsd's shortest cluster lease (rsd/cluster/options.py: LEASE_RANGE)
MARGIN = 0.25
HELD = 0.5  # how long etcd is paused while a keep-alive waits for its answer
SLACK = 0.2  # the loop's clock resolution and scheduling, generously (but under HELD)


async def test_a_late_answer_counts_from_when_the_keep_alive_was_sent(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    async with stores(cluster.endpoints, "a", lease_seconds=LEASE, margin=MARGIN) as (a,):
        assert await a.campaign() == 1
        cluster.pause()
        sent = now()
        refresh = asyncio.create_task(a.keep_alive())
        await asyncio.sleep(HELD)
        cluster.resume()
        deadline = await refresh
        answered = now()
        assert answered - sent >= HELD
        assert deadline is not None
        assert sent + LEASE - MARGIN <= deadline <= sent + LEASE - MARGIN + SLACK
        assert a.lease_deadline == deadline

        # No answer at all: an error, and the deadline stays where it was.
        cluster.pause()
        try:
            with pytest.raises(EtcdError):
                await a.keep_alive()
        finally:
            cluster.resume()
        assert a.lease_deadline == deadline


async def test_without_answered_keep_alives_the_leader_stops_leading_at_its_deadline(
    etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    cluster = etcd_cluster(size=1)
    primary, lost = asyncio.Event(), asyncio.Event()
    epochs: list[int] = []
    lost_at: list[tuple[float, float]] = []  # when, and the deadline then

    def on_primary(epoch: int) -> None:
        epochs.append(epoch)
        primary.set()

    def on_lost() -> None:
        lost_at.append((now(), a.lease_deadline))
        lost.set()

    async with stores(cluster.endpoints, "a", lease_seconds=LEASE, margin=MARGIN) as (a,):
        elector = Elector(a, "127.0.0.1:7001", may_lead=lambda: True, on_primary=on_primary,
                          on_standby=lambda *seen: None, on_lost=on_lost)
        elector.start()
        try:
            await asyncio.wait_for(primary.wait(), 5)
            primary.clear()
            assert elector.is_primary

            cluster.pause()  # etcd hangs: no keep-alive sent from now on is answered
            paused = now()
            assert paused < elector.deadline
            await asyncio.wait_for(lost.wait(), LEASE + 2)
            assert elector.deadline == -math.inf and not elector.is_primary
            [(when, deadline)] = lost_at
            assert deadline <= paused + LEASE - MARGIN  # counted from a send before the pause
            assert deadline <= when <= deadline + 0.5

            # etcd back: the old term is closed there too, the next comes with a new epoch.
            cluster.resume()
            await asyncio.wait_for(primary.wait(), 5)
            assert epochs == [1, 2]
            assert await a.leader() == ("a", 2)
        finally:
            cluster.resume()
            await elector.stop()


async def test_a_leader_woken_from_a_suspend_of_the_machine_no_longer_leads(
    etcd_cluster: Callable[..., EtcdCluster], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop's clock (CLOCK_MONOTONIC) stops while the machine is suspended; etcd's
    lease does not. The leadership clock adds the time suspended (CLOCK_BOOTTIME's lead
    over CLOCK_MONOTONIC; rsd/cluster/leaseclock.py), so on waking the deadline the
    server checks before anything leaves is already past. A suspend is made here by
    moving what the clock reads as suspended."""
    from rsd.cluster import leaseclock

    cluster = etcd_cluster(size=1)
    primary = asyncio.Event()
    async with stores(cluster.endpoints, "a", lease_seconds=LEASE, margin=MARGIN) as (a,):
        elector = Elector(a, "127.0.0.1:7001", may_lead=lambda: True,
                          on_primary=lambda epoch: primary.set(),
                          on_standby=lambda *seen: None, on_lost=lambda: None)
        elector.start()
        try:
            await asyncio.wait_for(primary.wait(), 5)
            loop = asyncio.get_running_loop()
            assert elector.is_primary and elector.deadline > loop.time()
            monkeypatch.setattr(leaseclock, "suspended", lambda: 10.0 * LEASE)
            # At once, before any timer or keep-alive: the server's check (output.py
            # compares the deadline with the loop's clock) and is_primary both say no.
            assert elector.deadline <= loop.time()
            assert not elector.is_primary
        finally:
            await elector.stop()
