"""etcd a round trip farther than the old fixed 1 s call timeout, within the call timeout
the cluster lease gives (rsd/cluster/options.py: call_timeout_for; docs/cluster.md says
how far etcd may be), neither keeps a node from starting nor takes its primary down: three
nodes whose three etcd members are each behind a proxy that delays every byte 0.6 s each
way (support/proxy.py) start, elect a primary and keep it for two leases from when it
says it leads, clients submitting, completing and claiming from when it has named a
standby (with etcd this far, a few round trips after its election) to the end, and some
of it acknowledged in the last lease; the history (support/history.py) keeps every rule
of the checker.

Before: every call to etcd had 1 s, a round trip here takes 1.2 s, and each node exited
1 at start ("etcd did not answer a lease grant within 1 s"); made far once a primary led,
the primary stepped down (exit 75) at its first deadline, and no other could be elected.
Real etcd, real gRPC and real time: what is tested is how the timeouts of both meet a far
etcd, which no fake clock has.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from pathlib import Path

import pytest
from support.cluster import kill_all, node_args, primary, watch_primaries
from support.etcd import EtcdCluster
from support.history import History, Process, Unanswered, check, release, report
from support.process import Rsd
from support.proxy import Proxy

from rsclient import AsyncRunstate, RunstateError
from rsclient.client import Scope
from rsclient.deliveries import Delivery
from rsd.cluster.options import MIN_CALL_TIMEOUT, call_timeout_for

FAR = 0.6  # seconds each way between every node and every etcd member
# The cluster lease: 7 s gives each call to etcd 2.08 s, 0.88 s more than the 1.2 s round
# trip. At the default 5 s (1.42 s a call) the slack was 0.22 s, which a loaded machine's
# stall of a node or of a proxy overran (the primary stepped down, or none was elected in
# 40 s: twice in CI-like runs with six workers beside the other test jobs on two cores).
# What the test shows is unchanged: a round trip over the old fixed 1 s keeps a primary.
LEASE_SECONDS = 7
LEASES = 2  # how long the primary is kept from when it says it leads, in leases
CLAIM_LEASE = 5  # seconds, the least a claim may ask for


async def _planner(proc: Process, run: Scope, stop: asyncio.Event) -> None:
    """Submit keyed tasks, one after another (each key once, and again at the end)."""
    n = 0
    while not stop.is_set():
        with contextlib.suppress(RunstateError):
            await proc.call("submit", {"key": f"k{n}", "input": {"n": n}},
                            functools.partial(run.mailbox("work").submit, {"n": n},
                                              key=f"k{n}"),
                            reply=lambda ticket: {"task": ticket.id})
        n += 1
        await asyncio.sleep(0.05)


async def _worker(proc: Process, run: Scope, stop: asyncio.Event) -> None:
    async def handle(data: dict[str, int], delivery: Delivery) -> None:
        outcome = {"n": data["n"], "attempt": delivery.attempt}
        await proc.call("complete", {"task": delivery.task_id, "outcome": outcome},
                        lambda: delivery.complete(result={"payload": outcome}),
                        reply=lambda _: {})

    await run.mailbox("work").consume(handle, concurrency=2, lease_seconds=CLAIM_LEASE,
                                      stop_event=stop, shutdown_timeout=2.0,
                                      on_error=lambda exc, delivery: None)


async def _holder(proc: Process, rs: AsyncRunstate, run: Scope, stop: asyncio.Event) -> None:
    """Acquire a claim, check its token, release; again."""
    while not stop.is_set():
        try:
            lease = await proc.call("acquire", {"key": "c"},
                                    run.claim("c", lease_seconds=CLAIM_LEASE).acquire,
                                    reply=lambda lease: {"token": lease.token(),
                                                         "generation": lease.generation})
        except RunstateError:
            await asyncio.sleep(0.1)
            continue
        proc.hold(lease)
        mine = {"key": "c", "token": lease.token(), "generation": lease.generation}
        with contextlib.suppress(RunstateError):
            await proc.call("fence", mine,
                            functools.partial(rs.fence.status, run, "c", mine["token"]),
                            reply=lambda status: {"current": status["current"],
                                                  "generation": status["generation"]})
        with contextlib.suppress(RunstateError, Unanswered):
            await proc.call("release", mine, functools.partial(release, lease),
                            reply=lambda _: {})
        await asyncio.sleep(0.1)


async def test_a_cluster_whose_etcd_is_far_starts_and_keeps_its_primary(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    assert call_timeout_for(LEASE_SECONDS) > 2 * FAR > MIN_CALL_TIMEOUT  # (see LEASE_SECONDS)
    etcd = etcd_cluster(3)
    proxies = [await Proxy("127.0.0.1", member.client_port, delay=FAR).start()
               for member in etcd.members]
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    history = History(float(LEASE_SECONDS))
    clients: list[AsyncRunstate] = []
    work: list[asyncio.Task[None]] = []
    stop = asyncio.Event()

    def client(name: str) -> tuple[Process, AsyncRunstate]:
        rs = AsyncRunstate(holder=name, address=everyone, connect_timeout=30.0)
        clients.append(rs)
        return history.process(name, rs), rs

    def seen(node: Rsd, epoch: int) -> None:
        history.node("primary", node.address, epoch)

    try:
        far = ",".join(proxy.address for proxy in proxies)
        await asyncio.gather(*(
            node.start(*node_args(etcd, f"n{i}", str(LEASE_SECONDS))[2:], "--etcd", far)
            for i, node in enumerate(nodes)))
        for node in nodes:
            history.node("started", node.address)
        everyone = ",".join(node.address for node in nodes)
        async with watch_primaries(nodes, seen):
            first, probe, epoch = await primary(nodes, timeout=60)
            elected = history.now()  # (it said so sooner)
            await probe.close()
            _, setup = client("setup")
            await setup.mailboxes.ensure("work", mode="WORK")  # once a standby is named
            run = await setup.scopes.create()
            loop = asyncio.get_running_loop()
            began = history.now()
            proc, rs = client("planner")
            work.append(loop.create_task(_planner(proc, rs.scope(run.id), stop)))
            proc, rs = client("worker")
            work.append(loop.create_task(_worker(proc, rs.scope(run.id), stop)))
            proc, rs = client("holder")
            work.append(loop.create_task(_holder(proc, rs, rs.scope(run.id), stop)))
            # Two leases since its election (the workload's last lease in them), and the
            # workload for a lease at least (a setup that took longer on a loaded machine).
            await asyncio.sleep(max(elected + LEASES * LEASE_SECONDS - history.now(),
                                    began + LEASE_SECONDS - history.now()))
            stop.set()
            ended = await asyncio.wait_for(asyncio.gather(*work, return_exceptions=True), 10)
            assert not [end for end in ended if isinstance(end, BaseException)], ended

            history.begin_final()
            final, rs = client("final")
            scope = rs.scope(run.id)
            submitted = {op.value["key"]: op.value["input"] for op in history.ops
                         if op.f == "submit" and op.ok}
            tasks = {op.value["task"] for op in history.ops if op.f == "complete" and op.ok}
            await asyncio.gather(
                *(final.call("submit", {"key": key, "input": data},
                             functools.partial(scope.mailbox("work").submit, data, key=key),
                             reply=lambda ticket: {"task": ticket.id})
                  for key, data in sorted(submitted.items())),
                *(final.call("status", {"task": task}, scope.task(task).status,
                             reply=lambda view: {"state": view["state"],
                                                 "outcome": view.get("outcome")})
                  for task in sorted(tasks)),
                final.call("inspect", {"key": "c"}, scope.claim("c").inspect,
                           reply=lambda view: {"held": view["held"],
                                               "generation": view["generation"]}))

        logs = {node.address: node.log() for node in nodes}
        dead = {node.address: (node.proc and node.proc.returncode, node.log()[-3000:])
                for node in nodes if not node.alive}
        assert not dead, dead  # (exit code and the end of its log: 75 is a step-down)
        assert [(event.node, event.epoch) for event in history.nodes
                if event.kind == "primary"] == [(first.address, epoch)], logs
        assert not [log for log in logs.values() if "lost leadership" in log], logs
        late = [op for op in history.ops if op.ok and op.f in ("submit", "complete")
                and op.invoked > max(elected + (LEASES - 1) * LEASE_SECONDS, began)
                and (history.final_at is None or op.invoked < history.final_at)]
        assert late, f"nothing acknowledged in the last lease of the run: {history.ops[-5:]}"
    finally:
        stop.set()
        for task in work:
            task.cancel()
        for rs in clients:
            with contextlib.suppress(Exception):
                await rs.close()
        await kill_all(nodes)
        for proxy in proxies:
            await proxy.close()
        history.dump(tmp_path / "history.jsonl")
    violations = check(history)
    if violations:
        pytest.fail(report(history, violations) + f"\nhistory: {tmp_path}/history.jsonl")
