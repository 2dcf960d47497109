"""A restarted rsd runs its timers from the moment its state is loaded, whether or not a
client ever sends anything: a schedule fires when due, a delayed task comes due, a dead
holder's lease expires.

The core's deadlines are the server's one ``call_at`` (coretimer.py); it used to be
armed only after a client's request had been served, so an idle rsd restarted by a
reboot or a crash slept through every deadline (a nightly cron never ran; a fire time
found late was then treated as missed and skipped by ``catch_up="none"``).

Why a real process: the rule is about the shell's start (cli.py and the cluster's
promotion both pass through ``Server.start``), which no core test on the fake clock
reaches. While rsd is idle nothing is sent to its client port: what happened is read
from /metrics, which only renders what the core holds (no request, no timer armed), and
then confirmed with a client. Nothing here asserts a duration: the test waits for the
state, and orders what it reads by wall-clock instants taken on this machine.
"""

from __future__ import annotations

import asyncio
import math
import re
import time
from collections.abc import Callable

import pytest

from rsclient import AsyncRunstate
from tests.support import aio
from tests.support.http import http
from tests.support.process import SHORT_LEASES, TAKEOVER_LEASE, Rsd

_SAMPLE = re.compile(r"^(rsd_[a-z_]+)(\{[^}]*\})? (\S+)$", re.MULTILINE)
_IDLE_TIMEOUT = 30.0  # seconds: the due deadlines are a few seconds away; a slack for load
# Seconds (3 to 4) from the setup's start to the due time: a submit, a schedule and a
# stop fit in them on a loaded machine (they take a few hundred ms there, 0.05 s on an
# idle one), and the dead holder's lease, a TAKEOVER_LEASE from the restart, ends about
# then too: neither waits long for the other.
_SETUP_WITHIN = 3
_WATCHED = {  # /metrics once every timer ran: the fire and the delayed task are PENDING,
    'rsd_items{kind="task",state="DELAYED"}': 0,  # the dead holder's claim expired
    'rsd_items{kind="task",state="PENDING"}': 2,
    "rsd_claims": 0,
    'rsd_events_total{event="claim lease expired"}': 1,
}


async def scrape(port: int) -> dict[str, float]:
    """The /metrics samples, keyed ``name{labels}``."""
    status, text = await http(port, "GET", "/metrics")
    assert status == 200, text
    return {name + (labels or ""): float(value)
            for name, labels, value in _SAMPLE.findall(text)}


def _cron_at(wall: float) -> str:
    """A 6-field cron expression (seconds first) that fires once a year, at ``wall``."""
    at = time.gmtime(wall)
    return f"{at.tm_sec} {at.tm_min} {at.tm_hour} {at.tm_mday} {at.tm_mon} *"


async def test_an_idle_restarted_rsd_fires_schedules_delays_and_lease_expiries(
    rsds: Callable[..., Rsd],
) -> None:
    """After a clean stop and after a crash, side by side: each waits for its due time."""
    await asyncio.gather(*(idle_restart(rsds(f"idle-{stop}"), stop)
                           for stop in ("SIGTERM", "SIGKILL")))


async def idle_restart(server: Rsd, stop: str) -> None:
    metrics = ("--metrics-listen", "127.0.0.1:0", *SHORT_LEASES)
    address = await server.start(*metrics)
    holder = AsyncRunstate(holder="gone-for-good", address=address)
    try:
        await holder.mailboxes.ensure("nightly")
        run = await holder.scopes.create()
        # Its holder never comes back; renewed until the stop, the lease is live for one
        # whole lease from the restart (3 s: support/process.py's TAKEOVER_LEASE).
        await run.claim("k", lease_seconds=TAKEOVER_LEASE).acquire()
        due = math.ceil(time.time()) + _SETUP_WITHIN  # after rsd is down: only its timer
        # can reach it (and before it has been due SCHEDULE_LATE_SECONDS at the restart:
        # the fire is on time then, whatever catch_up says)
        delayed = await run.mailbox("nightly").submit({"n": 1}, not_before=due)
        await run.schedules.ensure("cron", mailbox="nightly", cron=_cron_at(due),
                                   timezone="UTC", catch_up="none")
        if stop == "SIGTERM":
            assert await server.stop() == 0
        else:
            await server.kill()
    finally:
        await aio.close_quietly(holder)  # its server is down: nothing reaches the new one
    assert time.time() < due, "the setup outlasted the due time: nothing left to check"
    await server.start(*metrics)
    port = server.metrics_port()

    seen: dict[str, float] = {}

    async def everything_ran() -> bool:
        samples = await scrape(port)
        seen.update((name, samples.get(name, 0)) for name in _WATCHED)
        return seen == _WATCHED

    try:
        await aio.eventually(everything_ran, timeout=_IDLE_TIMEOUT, interval=0.1)
    except AssertionError:
        pytest.fail(f"idle since its {stop} restart, rsd ran no timer: {seen}, not {_WATCHED}")

    came = time.time()  # the first client since the restart
    async with AsyncRunstate(holder="morning", address=server.address) as rs:
        schedule = await rs.scope(run.id).schedules.get("cron")
        assert schedule["fires"] == 1 and schedule["last_fire"] == due
        tasks = {task["id"]: task async for task in rs.admin.iter_tasks(run.id)}
        assert tasks[delayed.id]["state"] == "PENDING"
        (fire,) = (task for task in tasks.values() if task["key"] == f"schedule:cron:"
                   f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(due))}")
        assert due <= fire["created_at"] < came, "the fire waited for a client"
        taken = await rs.scope(run.id).claim("k").try_acquire()
        assert taken["kind"] == "acquired" and taken["lease"].generation > 1
    assert server.tracebacks() == []
