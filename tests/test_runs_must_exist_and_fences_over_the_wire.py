"""Over the wire: a mistyped run id fails at once with NotFoundError (never a worker
waiting forever), a chosen run id is created once, and the fence op refuses a stale
token after a takeover (a holder whose lease expired, another took over)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from support.process import SHORT_LEASE, SHORT_LEASES

from rsclient import AsyncRunstate, InvalidArgumentError, NotFoundError
from rsclient.sync import Runstate
from rsproto import Op

# Each test works in runs of its own (chosen run ids are each one test's), so they share
# one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


async def test_a_mistyped_run_id_is_not_found_at_once_for_a_waiting_worker(
    clients: Callable[..., AsyncRunstate],
) -> None:
    rs = clients("worker")
    await rs.mailboxes.ensure("jobs")
    run = await rs.scopes.create(id="nightly-2026-12-01")
    typo = rs.scope("nightly-2026-12-10")  # synchronous: no I/O yet
    started = time.monotonic()
    with pytest.raises(NotFoundError) as info:
        await typo.mailbox("jobs").receive(wait=True, timeout_ms=60_000)
    assert time.monotonic() - started < 5.0
    assert str(info.value) == (
        "NOT_FOUND: run 'nightly-2026-12-10' does not exist; create it first "
        "(SCOPE_CREATE, rs.scopes.create)"
    )
    with pytest.raises(NotFoundError):
        await typo.claim("k").acquire()
    assert await run.mailbox("jobs").receive() is None  # the real one works


async def test_a_chosen_run_id_is_created_once_whoever_asks(
    clients: Callable[..., AsyncRunstate],
) -> None:
    first = await clients("a").scopes.create(id="job-42")
    again = await clients("b").scopes.create(id="job-42")
    assert (first.id, first.created, again.id, again.created) == ("job-42", True, "job-42", False)
    assert clients("c").scope("job-42").created is None  # a handle asks nothing


async def test_the_fence_refuses_a_stale_token_after_expiry_and_takeover(
    rsd_factory: Callable[..., Any], raw_connect: Any, clients: Callable[..., AsyncRunstate],
) -> None:
    """The old holder is a raw connection that never renews (a paused process). Its
    lease is short, as it must run out; long enough for one fence check before."""
    rsd = rsd_factory(*SHORT_LEASES)
    heir = clients("heir", rsd.address)
    run = await heir.scopes.create()
    paused = await raw_connect(rsd.address)
    await paused.hello("paused")
    grant = await paused.ok(
        Op.CLAIM_ACQUIRE, {"scope": run.id, "key": "k", "lease_seconds": 2 * SHORT_LEASE}
    )
    stale = grant["lease"].hex()
    assert await heir.fence.check(run, "k", stale) is True
    lease = await run.claim("k").acquire(wait=True, timeout_ms=15_000)  # after expiry
    assert lease.generation > grant["generation"]
    assert await heir.fence.check(run, "k", stale) is False
    assert await heir.fence.status(run.id, "k", lease.token()) == {
        "current": True, "generation": lease.generation,
    }
    # The paused holder wakes up: told its lease expired, its renewal is refused, and
    # its token stays stale.
    push = await paused.recv()
    assert push[2] == {"lease": grant["lease"], "reason": "expired"}
    renewed = await paused.ok(Op.LEASE_RENEW, {"leases": [grant["lease"]]})
    assert renewed["results"] == ["STALE_CLAIM"]
    assert await heir.fence.check(run, "k", stale) is False
    await lease.release()


def test_the_sync_client_creates_chosen_runs_and_checks_fences(rsd: Any) -> None:
    with Runstate(holder="sync-fence", address=rsd.address) as rs:
        run = rs.scopes.create(id="sync-nightly")
        assert run.created is True and rs.scopes.create(id="sync-nightly").created is False
        with run.claim("k").acquire() as lease:
            assert rs.fence.check(run, "k", lease.token()) is True
            token = lease.token()
        assert rs.fence.check("sync-nightly", "k", token) is False
        with pytest.raises(NotFoundError):
            rs.fence.check("never-created", "k", token)


async def test_a_malformed_token_is_refused_before_any_request(
    clients: Callable[..., AsyncRunstate],
) -> None:
    rs = clients("fence")
    for token in ("not-hex", "ab" * 8, b"short"):
        with pytest.raises(InvalidArgumentError):
            await rs.fence.check("r", "k", token)
