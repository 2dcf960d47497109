"""Over the wire, with the Python SDK: a lease taken with ``release_on_disconnect`` ends
the moment its holder's connection closes, so a holder killed with SIGKILL hands its
claim, its pool slot or its task on at once; the SDK marks such a lease lost the moment
its own connection drops; a lease taken without the flag still outlives its connection.

Every lease here is 600 s long, so only the connection's end can explain a takeover
within the tests' waits (no timing is asserted: bench/ measures it).
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.aio import equals
from support.process import HELPERS, Rsd

from rsclient import AsyncRunstate, InvalidArgumentError, LeaseLostError
from rsclient.sync import Runstate

LONG = 600  # seconds: a lease that cannot run out during a test
MakeClient = Callable[..., AsyncRunstate]
Eventually = Callable[..., Awaitable[None]]
# Each test works in runs of its own (and pools, quotas and mailboxes under names that
# mean the same wherever they recur), so they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


async def _spawn(script: str, *args: str, env: dict[str, str]) -> Any:
    return await asyncio.create_subprocess_exec(
        sys.executable, str(HELPERS / script), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )


async def _line(proc: Any, timeout: float = 15.0) -> list[str]:
    line = await asyncio.wait_for(proc.stdout.readline(), timeout)
    if not line:
        err = await proc.stderr.read()
        raise AssertionError(f"helper exited ({await proc.wait()}) early: {err.decode()}")
    return line.decode().split()


async def _kill(proc: Any) -> None:
    proc.kill()
    assert await proc.wait() == -signal.SIGKILL


@pytest.mark.parametrize("kind", ["claim", "pool"])
async def test_a_killed_holders_claim_or_slot_goes_to_its_waiter_at_once(
    rsd: Rsd, clients: MakeClient, eventually: Eventually, child_env: dict[str, str],
    kind: str,
) -> None:
    heir = clients("heir")
    run = await heir.scopes.create()
    extra = []
    if kind == "pool":
        await heir.pools.ensure("gpu", size=1)
        extra = ["--pool"]
    key = "gpu" if kind == "pool" else "k"
    proc = await _spawn(
        "holder.py", rsd.address, run.id, key, "--lease-seconds", str(LONG),
        "--holder", "doomed", "--release-on-disconnect", *extra, env=child_env,
    )
    try:
        assert (await _line(proc))[0] == "ACQUIRED"
        held = run.pool(key, LONG) if kind == "pool" else run.claim(key, LONG)
        waiting = asyncio.create_task(held.acquire(wait=True, timeout_ms=60_000))
        await eventually(lambda: equals(_waiters(held), 1))
        await _kill(proc)
        lease = await asyncio.wait_for(waiting, 30)  # well within its 600 s lease
        assert not lease.is_lost
        await lease.release()
    finally:
        if proc.returncode is None:
            await _kill(proc)


async def _waiters(held: Any) -> int:
    return int((await held.inspect())["waiters"])


async def test_a_killed_workers_task_goes_back_to_the_queue_at_once(
    rsd: Rsd, clients: MakeClient, child_env: dict[str, str]
) -> None:
    planner = clients("planner")
    await planner.mailboxes.ensure("jobs", mode="WORK")
    run = await planner.scopes.create()
    ticket = await run.mailbox("jobs").submit({"n": 1}, key="t")
    proc = await _spawn(
        "worker.py", rsd.address, run.id, "jobs", "--lease-seconds", str(LONG),
        "--holder", "doomed", "--release-on-disconnect", env=child_env,
    )
    try:
        assert (await _line(proc))[:3] == ["HANDLING", ticket.id, "1"]
        await _kill(proc)
        delivery = await run.mailbox("jobs").receive(wait=True, timeout_ms=30_000)
        assert delivery is not None and delivery.id == ticket.id
        assert delivery.attempt == 2
        await delivery.complete()
    finally:
        if proc.returncode is None:
            await _kill(proc)


async def test_the_sdk_marks_a_bound_lease_lost_when_its_connection_drops(
    restartable: Rsd, eventually: Eventually
) -> None:
    async with AsyncRunstate(holder="h", address=restartable.address) as rs:
        await rs.mailboxes.ensure("jobs", mode="WORK")
        run = await rs.scopes.create()
        await run.mailbox("jobs").submit(None, key="t")
        bound = await run.claim("bound", LONG, release_on_disconnect=True).acquire()
        plain = await run.claim("plain", LONG).acquire()
        delivery = await run.mailbox("jobs").receive(release_on_disconnect=True)
        assert delivery is not None
        assert bound.release_on_disconnect and not plain.release_on_disconnect
        await restartable.stop()
        await eventually(lambda: _true(bound.is_lost and delivery.is_lost))
        assert bound.lost_reason is not None and "release_on_disconnect" in bound.lost_reason
        assert not plain.is_lost  # re-attached once the client reconnects
        await restartable.start()
        await plain.renew()  # from the new connection: still its lease
        assert (await run.claim("bound").inspect())["held"] is False
        with pytest.raises(LeaseLostError):
            await bound.release()
        with pytest.raises(LeaseLostError):
            await delivery.complete()
        await plain.release()


async def _true(value: bool) -> bool:
    return value


async def test_release_on_disconnect_must_be_a_bool(clients: MakeClient) -> None:
    rs = clients("h")
    run = rs.scope("any")
    with pytest.raises(InvalidArgumentError, match="release_on_disconnect must be a bool"):
        run.claim("k", release_on_disconnect="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="release_on_disconnect must be a bool"):
        run.pool("p", release_on_disconnect=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="release_on_disconnect must be a bool"):
        await run.mailbox("jobs").receive(release_on_disconnect="no")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="release_on_disconnect must be a bool"):
        await run.mailbox("jobs").consume(
            lambda data, delivery: None, release_on_disconnect=None,  # type: ignore[arg-type]
        )


def test_the_sync_client_takes_release_on_disconnect(rsd: Rsd) -> None:
    with Runstate(holder="sync", address=rsd.address) as rs:
        run = rs.scopes.create()
        lease = run.claim("k", release_on_disconnect=True).acquire()
        assert lease.release_on_disconnect
        lease.release()
