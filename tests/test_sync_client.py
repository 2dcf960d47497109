"""The sync client is the async one behind plain calls, safe to share between threads.

Many threads on one client: a claim is held by one thread at a time, each thread's
``run()`` works, tasks submitted from threads are completed by a thread-pool consumer
that stops when its ``threading.Event`` is set. A lost lease is seen by sync code
(``is_lost``, ``lost_event``) and ``run()`` raises LeaseLostError when the function
returns. A closed client says so.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from rsclient.sync import (
    ConflictError,
    Delivery,
    Lease,
    LeaseLostError,
    Runstate,
    UnavailableError,
)

THREADS = 8
# Each test works in a run of its own, so they share one rsd (tests/conftest.py).
pytestmark = pytest.mark.rsd_per_module


@pytest.fixture
def rs(rsd: Any) -> Any:
    client = Runstate(holder="sync", address=rsd.address)
    yield client
    client.close()


def test_many_threads_share_one_client_and_a_claim_is_held_by_one_at_a_time(rs: Any) -> None:
    run = rs.scopes.create()
    inside = 0
    most = 0
    lock = threading.Lock()

    def work(i: int) -> int:
        nonlocal inside, most
        for _ in range(3):
            with run.claim("shared").acquire(wait=True, timeout_ms=20_000) as lease:
                with lock:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.005)
                with lock:
                    inside -= 1
                assert not lease.is_lost
        return run.claim(f"own-{i}").run(lambda lease: lease.generation)

    with ThreadPoolExecutor(THREADS) as pool:
        generations = list(pool.map(work, range(THREADS)))
    assert most == 1
    assert all(isinstance(g, int) for g in generations)
    assert run.claim("shared").inspect()["held"] is False


def test_try_acquire_and_conflicts_in_sync_code(rs: Any) -> None:
    run = rs.scopes.create()
    with run.claim("k") as lease:
        assert isinstance(lease, Lease)
        assert run.claim("k").try_acquire()["kind"] == "busy"
        with pytest.raises(ConflictError):
            run.claim("k").acquire()
    attempt = run.claim("k").try_acquire()
    assert attempt["kind"] == "acquired"
    attempt["lease"].release()


def test_tasks_from_threads_are_done_by_a_thread_consumer_that_stops_on_its_event(
    rs: Any,
) -> None:
    rs.mailboxes.ensure("jobs")
    run = rs.scopes.create()
    stop = threading.Event()
    seen: list[str] = []

    def handle(data: dict[str, int], delivery: Delivery) -> None:
        assert threading.current_thread() is not threading.main_thread()
        seen.append(delivery.token())
        if data["n"] == 0 and delivery.attempt == 1:
            raise RuntimeError("first try fails")
        delivery.complete(result={"payload": data["n"] * 2})

    errors: list[int] = []
    consumer = threading.Thread(
        target=run.mailbox("jobs").consume,
        args=(handle,),
        kwargs={"concurrency": 4, "stop": stop,
                "on_error": lambda exc, delivery: errors.append(delivery.attempt)},
    )
    consumer.start()

    def plan(n: int) -> Any:
        ticket = run.mailbox("jobs").submit({"n": n}, key=f"t{n}")
        return ticket.result(timeout_ms=20_000)["outcome"]

    with ThreadPoolExecutor(THREADS) as pool:
        outcomes = list(pool.map(plan, range(THREADS)))
    assert outcomes == [n * 2 for n in range(THREADS)]
    assert errors == [1]
    stop.set()
    consumer.join(5)
    assert not consumer.is_alive()
    assert run.mailbox("jobs").inspect()["consumers"] == 0


def test_manual_receive_and_plain_messages(rs: Any) -> None:
    rs.mailboxes.ensure("inbox")
    run = rs.scopes.create()
    box = run.mailbox("inbox")
    sent = box.send({"company": "acme"}, work_key="crawl:acme")
    assert box.send({"company": "acme"}, work_key="crawl:acme") == {**sent, "replay": True}
    delivery = box.receive()
    assert delivery is not None and delivery.data == {"company": "acme"}
    delivery.renew(60)
    delivery.complete()
    assert delivery.settled
    assert box.receive() is None


def test_sync_tasks_after_tasks_and_children(rs: Any) -> None:
    """after= (sync tickets or ids), submit_child, children, parents, and a keyed
    submit_and_wait after a parent, in sync code."""
    rs.mailboxes.ensure("plans")
    run = rs.scopes.create()
    box = run.mailbox("plans")
    plan = box.submit("plan")
    delivery = box.receive()
    assert delivery is not None and delivery.task_id == plan.id
    search = delivery.submit_child("plans", "search")
    summary = box.submit("summary", after=[plan, search.id])
    assert summary.view["state"] == "BLOCKED" and summary.view["after"] == [plan.id, search.id]
    delivery.complete(result={"payload": "planned"})
    assert [child["id"] for child in plan.children()] == [search.id]
    found = box.receive()
    assert found is not None and found.id == search.id and found.parents == {}
    found.complete(result={"payload": "notes"})
    last = box.receive()
    assert last is not None and last.id == summary.id
    assert {k: v["outcome"] for k, v in last.parents.items()} == {
        plan.id: "planned", search.id: "notes"}
    last.complete(result={"payload": "done"})
    bad = box.submit("bad")
    bad.cancel()
    waited = box.submit_and_wait("after a cancelled task", key="k", after=[bad],
                                 timeout_ms=5000)  # decided at submit: ended already
    assert waited["state"] == "CANCELLED"
    assert waited["reason"] == f"parent {bad.id} ended CANCELLED"


def test_sync_submit_many_receive_many_and_take_next(rs: Any) -> None:
    rs.mailboxes.ensure("batch")
    box = rs.scopes.create().mailbox("batch")
    first, conflict, *rest = box.submit_many(
        [{"data": 0, "key": "k"}, {"data": 1, "key": "k"}, {"data": 2}, {"data": 3}]
    )
    assert first.created and isinstance(conflict, ConflictError)
    got = box.receive_many(2)
    assert [d.data for d in got] == [0, 2]
    nxt = got[0].complete(take_next=5)
    assert [d.data for d in nxt] == [3] and isinstance(nxt[0], Delivery)
    for delivery in [got[1], *nxt]:
        assert delivery.complete() == []
    assert box.receive_many(5) == [] and len(rest) == 2


def test_a_lost_lease_is_seen_in_sync_code_and_run_raises_when_the_function_returns(
    rs: Any, rsd: Any
) -> None:
    run = rs.scopes.create()
    lease = run.claim("held", lease_seconds=5).acquire()
    event = lease.lost_event
    assert isinstance(event, threading.Event) and not event.is_set()
    with Runstate(holder="other", address=rsd.address) as other:
        other.scope(run.id).cancel("stop")  # ends the run's claims: the holder is told
        assert event.wait(5)
        assert lease.is_lost
        with pytest.raises(LeaseLostError):
            lease.raise_if_lost()

        second = rs.scopes.create()
        returned = []

        def work(lease: Lease) -> str:
            other.scope(second.id).cancel("taken away")
            assert lease.lost_event.wait(5)
            returned.append(True)
            return "done"

        with pytest.raises(LeaseLostError):
            second.claim("k", lease_seconds=5).run(work)
        assert returned == [True]  # the function ran to its end; then run() raised


def test_a_closed_sync_client_says_so(rsd: Any) -> None:
    rs = Runstate(holder="gone", address=rsd.address)
    run = rs.scopes.create()
    rs.close()
    rs.close()
    with pytest.raises(UnavailableError, match="client is closed"):
        rs.ping()
    with pytest.raises(UnavailableError, match="client is closed"):
        run.claim("k").acquire()
