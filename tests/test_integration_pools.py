"""Pools and quotas end to end: the rsclient SDK (and one raw connection) against a real rsd.

Covers what a user relies on: N+3 workers on a pool of N never hold more than N slots at
once (checked from a recorded history), and so do tasks that need a pool of 2 among 5
workers, a killed holder's slot frees after one lease and
a paused one finds its slot lost, the claim's API on a pool (POOL_FULL, ``try_acquire``,
``async with``), and a quota wait answered by the server by itself, with no request from
the client after the take.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from support.aio import equals, now
from support.process import HELPERS, SHORT_LEASES, TAKEOVER_LEASE

from rsclient import AsyncRunstate, ConflictError, InvalidArgumentError, NotFoundError, wire

HOLDER_SCRIPT = HELPERS / "holder.py"

MakeClient = Callable[..., AsyncRunstate]
Eventually = Callable[..., Awaitable[None]]
# Each test works in runs of its own (and pools, quotas and mailboxes under names that
# mean the same wherever they recur), so they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


async def test_n_plus_3_workers_on_a_pool_of_n_never_hold_more_than_n_at_once(
    clients: MakeClient,
) -> None:
    size, workers, rounds = 3, 6, 6
    setup = clients("setup")
    await setup.pools.ensure("gpu", size=size)
    run = await setup.scopes.create()
    history: list[tuple[str, int]] = []  # ("in" | "out", worker), in the order they happened
    generations: list[int] = []

    async def worker(n: int) -> None:
        pool = clients(f"worker-{n}").scope(run.id).pool("gpu", lease_seconds=10)

        async def use(lease: Any) -> None:
            history.append(("in", n))
            generations.append(lease.generation)
            await asyncio.sleep(0.01 * (1 + n % 3))
            history.append(("out", n))  # before the release leaves: a slot counts till then

        for _ in range(rounds):
            await pool.run(use, wait=True, timeout_ms=20_000)

    await asyncio.gather(*(worker(n) for n in range(workers)))
    held, most = 0, 0
    for event, _ in history:
        held += 1 if event == "in" else -1
        most = max(most, held)
        assert held <= size, f"{held} slots held at once on a pool of {size}: {history}"
    assert most == size  # the pool was used to the full, not one at a time
    assert len(history) == 2 * workers * rounds
    assert len(set(generations)) == len(generations)  # each grant its own generation
    view = await setup.pools.inspect("gpu")
    assert (view["held"], view["waiters"]) == (0, 0)


async def test_a_pool_has_the_claims_api_and_refuses_with_pool_full(clients: MakeClient) -> None:
    rs = clients("one")
    await rs.pools.ensure("seat", size=1)
    run = await rs.scopes.create()
    async with run.pool("seat") as lease:
        assert lease.generation >= 1
        assert lease.token()
        with pytest.raises(ConflictError) as info:
            await run.pool("seat").acquire()
        assert info.value.code == "POOL_FULL"
        assert await run.pool("seat").try_acquire() == {"kind": "busy"}
        view = await rs.pools.inspect("seat")
        assert [(h["holder"], h["run"]) for h in view["holders"]] == [("one", run.id)]
    attempt = await run.pool("seat").try_acquire()
    assert attempt["kind"] == "acquired"
    await attempt["lease"].release()
    assert await run.pool("seat").run(lambda lease: lease.generation) > lease.generation
    with pytest.raises(NotFoundError):
        await run.pool("nope").acquire()
    with pytest.raises(InvalidArgumentError):
        await rs.pools.ensure("bad", size=0)


@pytest.mark.rsd_flags(*SHORT_LEASES)
async def test_a_killed_holders_slot_frees_after_one_lease_and_a_paused_one_is_lost(
    clients: MakeClient, eventually: Eventually, child_env: dict[str, str], rsd: Any,
) -> None:
    """Leases of TAKEOVER_LEASE (3 s, on a server that allows it) renewed every second:
    the holder says when its first renewal was confirmed and when it was sent
    (helpers/holder.py ``RENEWED``); its slot goes to the waiter no earlier than a lease
    after that send (the lease outlived its holder and was renewed, read from the
    holder's own record whatever the load did to the moment of the stop), and does come
    free (within a lease and 5 s of the stop)."""
    setup = clients("setup")
    await setup.pools.ensure("solo-k", size=1)
    await setup.pools.ensure("solo-s", size=1)
    run = await setup.scopes.create()

    async def takeover(pool: str, stop: signal.Signals) -> tuple[float, float, Any]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(HOLDER_SCRIPT), rsd.address, run.id, pool, "--pool",
            "--lease-seconds", f"{TAKEOVER_LEASE:g}", "--holder", f"doomed-{pool}",
            "--say-renewed",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=child_env,
        )
        try:
            first = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().split()
            assert first[0] == "ACQUIRED", first
            heir = clients(f"heir-{pool}").scope(run.id).pool(pool)
            waiting = asyncio.create_task(heir.acquire(wait=True, timeout_ms=20_000))
            await eventually(
                lambda: equals(_waiters(setup, pool), 1)
            )
            renewed = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().split()
            assert renewed[0] == "RENEWED", renewed
            proc.send_signal(stop)
            stopped_at = now()
            lease = await asyncio.wait_for(waiting, 15)
            granted_at = now()
            assert lease.generation > int(first[1])
            if stop == signal.SIGSTOP:
                proc.send_signal(signal.SIGCONT)
                lost = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode().split()
                released = (await asyncio.wait_for(proc.stdout.readline(), 10)).decode()
                assert lost == ["LOST", "True"]
                assert released.split() == ["RELEASE", "LeaseLostError", "STALE_CLAIM"]
            await lease.release()
            return granted_at - float(renewed[1]), granted_at - stopped_at, proc
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

    (killed_renewal, killed, _), (paused_renewal, paused, _) = await asyncio.gather(
        takeover("solo-k", signal.SIGKILL), takeover("solo-s", signal.SIGSTOP)
    )
    print(f"\nslot freed {killed:.2f} s after SIGKILL, {paused:.2f} s after SIGSTOP")
    assert killed_renewal >= TAKEOVER_LEASE - 0.001 and paused_renewal >= TAKEOVER_LEASE - 0.001
    assert killed <= TAKEOVER_LEASE + 5.0 and paused <= TAKEOVER_LEASE + 5.0


async def _waiters(rs: AsyncRunstate, pool: str) -> int:
    return (await rs.pools.inspect(pool))["waiters"]


async def test_a_quota_wait_is_answered_by_the_server_without_another_request(
    rsd: Any, raw_connect: Callable[..., Awaitable[Any]], clients: MakeClient,
) -> None:
    rs = clients("sdk")
    await rs.quotas.ensure("api", limit=4, per_seconds=2)  # 2 per second, burst 4
    run = await rs.scopes.create()
    emptied = now()  # before the bucket is emptied: it refills from a moment after this
    assert (await run.quota("api").take(4))["taken"] == 4
    with pytest.raises(ConflictError) as info:
        await run.quota("api").take(1, wait=False)
    assert info.value.code == "QUOTA_EXHAUSTED"
    with pytest.raises(InvalidArgumentError):
        await run.quota("api").take(5)
    conn = await raw_connect(rsd.address)
    await conn.hello()
    started = now()
    rid = await conn.request(
        wire.Op.QUOTA_TAKE,
        {"scope": run.id, "quota": "api", "amount": 2, "wait": True, "timeout_ms": 5000},
    )
    reply = await conn.recv(timeout=5.0)  # nothing else is sent: the server answers by itself
    answered = now()
    assert reply[0] == wire.Kind.REPLY and reply[1] == rid, reply
    assert reply[2]["taken"] == 2
    # 2 tokens at 2 per second, from the bucket emptied by the take of 4: not before a
    # second after it, however long the request took to be sent (the refill runs
    # meanwhile: a loaded machine once spent 0.36 s between the two).
    assert answered - emptied >= 1.0, answered - emptied
    assert 0 < reply[2]["waited_ms"] <= (answered - started) * 1000 + 1, reply
    sdk = await run.quota("api").take(1, timeout_ms=5000)  # the SDK's wait, served likewise
    assert sdk["taken"] == 1 and sdk["waited_ms"] > 0


async def test_tasks_needing_a_pool_of_2_run_at_most_2_at_once_among_5_workers(
    clients: MakeClient,
) -> None:
    """Tasks submitted with ``needs`` and a plain task behind them, consumed by 5 workers
    (each its own connection): the history of handler entries and exits never shows more
    than 2 needing tasks at once, every task ran once, the plain one was not held up by
    the blocked ones, and the pool is free at the end."""
    size, workers, count = 2, 5, 16
    setup = clients("setup")
    await setup.mailboxes.ensure("gpu-jobs")
    await setup.pools.ensure("gpu2", size=size)
    run = await setup.scopes.create()
    box = run.mailbox("gpu-jobs")
    tickets = [await box.submit(n, needs={"pools": ["gpu2"]}) for n in range(count)]
    plain = await box.submit("plain")
    history: list[tuple[str, Any]] = []
    stop = asyncio.Event()

    async def handle(data: Any, delivery: Any) -> Any:
        history.append(("in", data))
        if data != "plain":
            view = await setup.pools.inspect("gpu2")
            assert view["held"] <= size
            await asyncio.sleep(0.02)
        history.append(("out", data))
        return data

    consumers = [
        asyncio.create_task(
            clients(f"worker-{n}").scope(run.id).mailbox("gpu-jobs").consume(
                handle, stop_event=stop, lease_seconds=10
            )
        )
        for n in range(workers)
    ]
    try:
        for ticket in [*tickets, plain]:
            assert (await ticket.result(timeout_ms=20_000))["state"] == "SUCCEEDED"
    finally:
        stop.set()
        await asyncio.gather(*consumers)
    running, most = 0, 0
    for event, data in history:
        if data == "plain":
            continue
        running += 1 if event == "in" else -1
        most = max(most, running)
        assert running <= size, f"{running} tasks needing a pool of {size} ran at once"
    assert most == size  # the pool was used to the full
    assert sorted(d for e, d in history if e == "in" and d != "plain") == list(range(count))
    plain_in = history.index(("in", "plain"))
    done_before = sum(1 for e, d in history[:plain_in] if e == "out")
    assert done_before < count - size  # it did not wait behind the blocked tasks
    view = await setup.pools.inspect("gpu2")
    assert (view["held"], view["waiters"]) == (0, 0)
