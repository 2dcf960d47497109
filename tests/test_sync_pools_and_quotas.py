"""The sync client's pools and quotas are the async client's behind plain calls.

Threads sharing one client on a pool of N never hold more than N slots at once (each
thread waits in the server's line), a full pool without waiting is POOL_FULL, a slot is a
``with`` block or a ``run()``; a quota taken from threads never gives more than its
budget and says QUOTA_EXHAUSTED when it cannot wait.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rsclient.sync import ConflictError, InvalidArgumentError, Runstate

# Each test works in runs of its own (and pools, quotas and mailboxes under names that
# mean the same wherever they recur), so they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


@pytest.fixture
def rs(rsd: Any) -> Any:
    client = Runstate(holder="sync-pools", address=rsd.address)
    yield client
    client.close()


def test_threads_on_a_pool_of_two_never_hold_more_than_two_slots(rs: Any) -> None:
    rs.pools.ensure("sync-gpu", size=2)
    run = rs.scopes.create()
    inside = most = 0
    lock = threading.Lock()

    def work(lease: Any) -> int:
        nonlocal inside, most
        with lock:
            inside += 1
            most = max(most, inside)
        time.sleep(0.02)
        with lock:
            inside -= 1
        return lease.generation

    with ThreadPoolExecutor(6) as pool:
        generations = list(pool.map(
            lambda _: run.pool("sync-gpu").run(work, wait=True, timeout_ms=20_000), range(12)
        ))
    assert most == 2
    assert len(generations) == 12
    assert rs.pools.inspect("sync-gpu")["held"] == 0


def test_a_full_pool_is_pool_full_and_a_with_block_frees_its_slot(rs: Any) -> None:
    rs.pools.ensure("sync-one", size=1)
    run = rs.scopes.create()
    with run.pool("sync-one").acquire() as lease:
        assert lease.token()
        with pytest.raises(ConflictError) as caught:
            run.pool("sync-one").acquire()
        assert caught.value.code == "POOL_FULL"
        assert run.pool("sync-one").try_acquire() == {"kind": "busy"}
    attempt = run.pool("sync-one").try_acquire()
    assert attempt["kind"] == "acquired"
    attempt["lease"].release()


def test_quota_takes_from_threads_never_exceed_the_budget(rs: Any) -> None:
    rs.quotas.ensure("sync-api", limit=10, per_seconds=3600)
    run = rs.scopes.create()
    quota = run.quota("sync-api")

    def take(_: int) -> str:
        try:
            quota.take(2, wait=False)
            return "taken"
        except ConflictError as exc:
            return exc.code

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(take, range(8)))
    assert outcomes.count("taken") == 5
    assert outcomes.count("QUOTA_EXHAUSTED") == 3
    assert rs.quotas.inspect("sync-api")["level"] < 1
    with pytest.raises(InvalidArgumentError):
        quota.take(11)
