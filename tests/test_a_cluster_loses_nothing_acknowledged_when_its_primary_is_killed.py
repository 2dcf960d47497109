"""A cluster of three rsd nodes and three etcd members, ``--fsync always``: when the
primary is killed (SIGKILL, mid-workload), a standby takes over within the cluster lease
and a second or two, and every change a client saw acknowledged is on it: each
acknowledged task, its result, a claim held across the takeover (still held, its token
still current, a rival refused), a mailbox paused in every run and one paused in a run
(both still paused: nothing delivered until resumed). The killed node, started again,
rejoins as a standby.

Real processes on loopback; the history is recorded by the test (what was acknowledged)
and checked against the new primary. The tests that leave etcd whole share one etcd
cluster (``shared_etcd``), each test's nodes a cluster of their own name on it
(``cluster``); the one that kills a member starts its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.certs import Certs
from support.cluster import CLUSTER, LEASE, kill_all, node_args, start_all
from support.cluster import primary as primary_of
from support.etcd import EtcdCluster
from support.history import History, Process, check, report
from support.process import Rsd
from support.proxy import Proxy

from rsclient import AsyncRunstate
from rsclient.mailboxes import Mailbox
from rsclient.tasks import Ticket
from rsctl.main import run as rsctl

_NAMES = itertools.count()


@pytest.fixture(scope="module")
def shared_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """One etcd cluster of three for the tests of this module that leave it whole."""
    etcd = EtcdCluster(tmp_path_factory.mktemp("etcd"), 3).start()
    try:
        yield etcd
    finally:
        etcd.stop()


@pytest.fixture
def cluster() -> str:
    """The test's own cluster name on ``shared_etcd``."""
    return f"{CLUSTER}-{next(_NAMES)}"


async def test_killing_the_primary_loses_no_acknowledged_change(
    tmp_path: Path, shared_etcd: EtcdCluster, cluster: str,
) -> None:
    etcd = shared_etcd
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    try:
        await start_all(etcd, nodes, cluster=cluster)
        primary, probe, epoch = await primary_of(nodes)
        await probe.close()
        everyone = ",".join(node.address for node in nodes)  # the SDK follows the primary
        rs = AsyncRunstate(holder="planner", address=everyone, connect_timeout=10.0)
        await rs.mailboxes.ensure("research", mode="WORK")
        run = await rs.scopes.create()
        held = await run.claim("company:acme").try_acquire()
        assert held["kind"] == "acquired"
        lease = held["lease"]
        token, generation = lease.token(), lease.generation
        acknowledged: dict[str, str] = {}  # task key -> task id, as acknowledged

        async def submit(index: int) -> None:
            ticket = await run.mailbox("research").submit({"n": index}, key=f"k{index}")
            acknowledged[f"k{index}"] = ticket.id

        for index in range(30):
            await submit(index)
        done = await run.mailbox("research").receive()
        assert done is not None
        await done.complete(result={"payload": "report"})
        # Paused: "review" in every run (MAILBOX_PAUSE), "research" in this run alone.
        await rs.mailboxes.ensure("review", mode="WORK")
        await run.mailbox("review").submit({"doc": 1}, key="review-1")
        assert (await rs.mailboxes.pause("review"))["paused"] is True
        assert (await run.mailbox("research").pause())["paused"] is True
        # Kill the primary with submits in flight: those unanswered may or may not survive.
        in_flight = [asyncio.ensure_future(submit(index)) for index in range(30, 60)]
        await asyncio.sleep(0.01)
        killed_at = asyncio.get_running_loop().time()
        await primary.kill()
        for future in in_flight:
            with contextlib.suppress(Exception):
                await future
        survivors = [node for node in nodes if node is not primary]
        successor, rs2, _ = await primary_of(survivors, after=epoch)
        took = asyncio.get_running_loop().time() - killed_at
        assert took < 2 * float(LEASE) + 5, f"the takeover took {took:.1f} s"
        # Every acknowledged change is there: the same key and input is the same task.
        again = rs2.scope(run.id)
        for key, task_id in sorted(acknowledged.items()):
            index = int(key[1:])
            ticket = await again.mailbox("research").submit({"n": index}, key=key)
            assert ticket.id == task_id, f"{key} was acknowledged as {task_id}"
        view = await again.task(done.task_id or "").status()
        assert view["state"] == "SUCCEEDED" and view["outcome"] == "report"
        # Both pauses hold on the new primary; resumed there, each delivers again.
        for name in ("review", "research"):
            assert (await again.mailbox(name).inspect())["paused"] is True, name
            assert await again.mailbox(name).receive() is None, name
        await rs2.mailboxes.resume("review")
        await again.mailbox("research").resume()
        for name in ("review", "research"):
            resumed = await again.mailbox(name).receive()
            assert resumed is not None, name
            await resumed.complete()
        # The claim is still held by its owner, whose token the new primary knows: a rival
        # is refused, the owner's fence check passes, and its release (sent by its own
        # client, which followed the primary) ends it; the next grant is a later one.
        rival = await again.claim("company:acme").try_acquire()
        assert rival["kind"] == "busy"
        info: Any = await again.claim("company:acme").inspect()
        assert info["held"] and info["holder"] == "planner"
        assert not lease.is_lost
        await lease.release()
        rival = await again.claim("company:acme").try_acquire()
        assert rival["kind"] == "acquired" and rival["lease"].generation > generation
        assert rival["lease"].token() != token
        await rs2.close()
        await rs.close()
        # The killed node comes back as a standby and follows the new primary.
        await primary.start(*node_args(etcd, f"n{nodes.index(primary)}", cluster=cluster))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while f"standby n{nodes.index(primary)} has its copy" not in successor.log():
            assert loop.time() < deadline, successor.log()[-3000:]
            await asyncio.sleep(0.1)
    finally:
        await kill_all(nodes)


async def test_a_primary_paused_past_its_lease_acknowledges_nothing_when_it_wakes(
    tmp_path: Path, shared_etcd: EtcdCluster, cluster: str,
) -> None:
    """SIGSTOP the primary past its lease: a standby takes over; SIGCONT: the old primary
    answers nothing that was sent to it meanwhile (it stepped down: exit 75), and what the
    new primary holds is all there is. The client's ops are recorded (support/history.py)
    and the history checked: no reply from the old primary to a request sent while it
    slept, nothing acknowledged missing on the new one."""
    etcd = shared_etcd
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    history = History(float(LEASE))
    try:
        await start_all(etcd, nodes, cluster=cluster)
        primary, old, epoch = await primary_of(nodes)
        history.node("primary", primary.address, epoch)
        client = history.process("client", old)
        await old.mailboxes.ensure("research", mode="WORK")
        run = await old.scopes.create()
        mailbox = run.mailbox("research")

        def submit(proc: Process, box: Mailbox, key: str, n: int) -> Awaitable[Ticket]:
            return proc.call("submit", {"key": key, "input": {"n": n}},
                             functools.partial(box.submit, {"n": n}, key=key),
                             reply=lambda ticket: {"task": ticket.id})

        first = await submit(client, mailbox, "before", 0)
        # A client given every node, holding a claim: it notices the paused primary's
        # silence and goes to the new one while the old one still sleeps, and keeps its
        # claim there (the SDK's silence probe: rsclient/connection.py).
        everyone = AsyncRunstate(holder="holder", connect_timeout=15.0,
                                 address=",".join(node.address for node in nodes))
        claim = await everyone.scope(run.id).claim("held", lease_seconds=30).acquire()
        paused = history.node("paused", primary.address)
        primary.pause()
        late = asyncio.ensure_future(submit(client, mailbox, "late", 1))
        survivors = [node for node in nodes if node is not primary]
        successor, rs2, epoch = await primary_of(survivors, after=epoch)
        history.node("primary", successor.address, epoch)
        moved = await asyncio.wait_for(
            everyone.scope(run.id).mailbox("research").submit({"n": 2}, key="moved"), 20)
        assert not claim.is_lost
        inspected = await rs2.scope(run.id).claim("held").inspect()
        assert inspected["held"] and inspected["holder"] == "holder"
        await asyncio.sleep(paused.at + float(LEASE) + 0.2 - history.now())  # past its lease
        history.node("resumed", primary.address)
        primary.resume()
        code = await primary.exited(10)
        assert code == 75, primary.log()[-2000:]  # stepped down, nothing more answered
        with contextlib.suppress(Exception):
            await asyncio.wait_for(late, 5)
        history.begin_final()
        final, again = history.process("final", rs2), rs2.scope(run.id).mailbox("research")
        if late.done() and late.exception() is None:
            # If the late submit was answered, it was answered by the new primary (the SDK
            # can only have sent it there again): it is there.
            status = await rs2.scope(run.id).task(late.result().id).status()
            assert status["key"] == "late"
            await submit(final, again, "late", 1)
        assert (await submit(final, again, "before", 0)).id == first.id
        assert (await again.submit({"n": 2}, key="moved")).id == moved.id
        await claim.release()
        await everyone.close()
        violations = check(history, ["no reply from a replaced primary",
                                     "acknowledged changes present"])
        assert not violations, report(history, violations)
        await rs2.close()
        await old.close()
    finally:
        await kill_all(nodes)


async def test_killing_the_synchronous_standby_names_another_and_loses_nothing(
    tmp_path: Path, shared_etcd: EtcdCluster, cluster: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    etcd = shared_etcd
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    try:
        await start_all(etcd, nodes, cluster=cluster)
        primary, rs, _ = await primary_of(nodes)
        await rs.mailboxes.ensure("research", mode="WORK")
        run = await rs.scopes.create()
        for index in range(10):
            await run.mailbox("research").submit({"n": index}, key=f"a{index}")
        named = re.findall(r"(n\d) is named the synchronous standby", primary.log())
        assert named, primary.log()[-2000:]
        sync = nodes[int(named[-1][1:])]
        # rsctl cluster, given a standby's address, is answered by the primary.
        standby = next(node for node in nodes if node is not primary and node is not sync)
        # The primary learns its members from etcd's watch: a standby that already serves
        # (and forwards to the primary) may not be in the primary's view for a moment.
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            capsys.readouterr()
            assert await rsctl(["--address", standby.address, "cluster", "--json"]) == 0
            view = json.loads(capsys.readouterr().out)
            assert view["cluster"] == cluster and view["primary"] == f"n{nodes.index(primary)}"
            by_node = {member["node"]: member for member in view["members"]}
            if set(by_node) == {"n0", "n1", "n2"} or asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        assert set(by_node) == {"n0", "n1", "n2"}
        assert by_node[named[-1]]["sync"] and by_node[named[-1]]["role"] == "standby"
        assert by_node[view["primary"]]["role"] == "primary"
        assert sum(member["sync"] for member in view["members"]) == 1
        await sync.kill()
        acknowledged = {}
        for index in range(10):  # acknowledged once another standby is named and holds them
            ticket = await asyncio.wait_for(
                run.mailbox("research").submit({"n": index}, key=f"b{index}"), 15)
            acknowledged[f"b{index}"] = ticket.id
        named = re.findall(r"(n\d) is named the synchronous standby", primary.log())
        other = nodes[int(named[-1][1:])]
        assert other is not sync and other is not primary
        # The other standby holds them: it takes over when the primary dies.
        await primary.kill()
        _, rs2, _ = await primary_of([other])
        for key, task_id in acknowledged.items():
            again = await rs2.scope(run.id).mailbox("research").submit(
                {"n": int(key[1:])}, key=key)
            assert again.id == task_id
        await rs2.close()
        await rs.close()
    finally:
        await kill_all(nodes)


async def test_losing_one_etcd_member_changes_nothing(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    """Kill one etcd member under load: the other two keep a majority; the primary keeps
    its lease (its client moves to another member) and acknowledges on, losing nothing.
    With the default lease (5 s): a keep-alive stuck on the dead member for its call
    timeout (1 s) is then retried elsewhere well before the deadline; with a 2 s lease
    the deadline (1.5 s after the last keep-alive sent) can pass first, and the primary
    then steps down, safely, but this test is about riding it out."""
    etcd = etcd_cluster(3)
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    try:
        await start_all(etcd, nodes, lease="5")
        primary, rs, epoch = await primary_of(nodes)
        await rs.mailboxes.ensure("research", mode="WORK")
        run = await rs.scopes.create()
        acknowledged = {}
        for index in range(40):
            if index == 10:
                etcd.kill(0)
            ticket = await asyncio.wait_for(
                run.mailbox("research").submit({"n": index}, key=f"k{index}"), 15)
            acknowledged[f"k{index}"] = ticket.id
            await asyncio.sleep(0.05)
        assert primary.alive
        assert re.findall(r"is the primary \(epoch (\d+)\)", primary.log())[-1] == str(epoch)
        for node in nodes:
            assert node.alive, node.log()[-2000:]
        for key, task_id in acknowledged.items():
            view = await run.task(task_id).status()
            assert view["key"] == key
        await rs.close()
    finally:
        await kill_all(nodes)


async def test_a_rolling_restart_of_every_node_loses_nothing(
    tmp_path: Path, shared_etcd: EtcdCluster, cluster: str,
) -> None:
    """Restart the standbys one at a time (each back and caught up before the next), then
    the primary (SIGTERM: it stops serving, leaves etcd, and its synchronous standby takes
    over at once); a client given every node's address loses nothing across it."""
    etcd = shared_etcd
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    try:
        await start_all(etcd, nodes, cluster=cluster)
        primary, probe, epoch = await primary_of(nodes)
        await probe.close()
        everyone = ",".join(node.address for node in nodes)
        rs = AsyncRunstate(holder="planner", address=everyone, connect_timeout=15.0)
        await rs.mailboxes.ensure("research", mode="WORK")
        run = await rs.scopes.create()
        acknowledged: dict[str, str] = {}
        counter = iter(range(10_000))

        async def some(count: int) -> None:
            for _ in range(count):
                index = next(counter)
                ticket = await asyncio.wait_for(
                    run.mailbox("research").submit({"n": index}, key=f"k{index}"), 20)
                acknowledged[f"k{index}"] = ticket.id

        await some(10)
        for node in nodes:
            if node is primary:
                continue
            name = f"n{nodes.index(node)}"
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            # Caught up before its restart: its first copy made (the standby that is not
            # the synchronous one may still be taking it when the writes above are
            # acknowledged; counted before it was done, it passed for a copy the restart
            # made: seen once in a CI-like run).
            while f"standby {name} has its copy" not in primary.log():
                assert loop.time() < deadline, primary.log()[-3000:]
                await asyncio.sleep(0.05)
            resumed = primary.log().count(f"standby {name} resumes after batch")
            copies = primary.log().count(f"standby {name} has its copy")
            assert await node.stop() == 0, node.log()[-2000:]
            await node.start(*node_args(etcd, name, cluster=cluster))
            deadline = loop.time() + 20
            # It holds its directory's state again and follows on from its last batch:
            # no new copy.
            while primary.log().count(f"standby {name} resumes after batch") <= resumed:
                assert loop.time() < deadline, primary.log()[-3000:]
                await asyncio.sleep(0.05)
            assert primary.log().count(f"standby {name} has its copy") == copies
            await some(10)
        assert await primary.stop() == 0, primary.log()[-2000:]
        await some(10)  # on the new primary, found by the client on its own
        _, probe, _ = await primary_of([node for node in nodes if node is not primary],
                                     after=epoch)
        await probe.close()
        await primary.start(*node_args(etcd, f"n{nodes.index(primary)}", cluster=cluster))
        await some(10)
        for key, task_id in acknowledged.items():
            view = await run.task(task_id).status()
            assert view["key"] == key
        assert len(acknowledged) == 50
        await rs.close()
    finally:
        await kill_all(nodes)


async def test_a_primary_cut_off_from_etcd_but_not_its_clients_acknowledges_nothing_more(
    tmp_path: Path, shared_etcd: EtcdCluster, cluster: str,
) -> None:
    """Each node reaches etcd through proxies the test controls. Cut the primary's: its
    clients still reach it, but its keep-alives do not reach etcd; past its deadline it
    answers nothing more and exits 75, a standby takes over, and a request sent to the
    old primary after its deadline is never answered as a success by it."""
    etcd = shared_etcd
    proxies: list[list[Proxy]] = []
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    try:
        for _ in nodes:
            own = []
            for endpoint in etcd.endpoints:
                host, port = endpoint.rsplit(":", 1)
                own.append(await Proxy(host, int(port)).start())
            proxies.append(own)
        args = []
        for i, own in enumerate(proxies):
            flags = node_args(etcd, f"n{i}", cluster=cluster)
            flags[1] = ",".join(proxy.address for proxy in own)
            args.append(flags)
        await asyncio.gather(*(node.start(*args[i]) for i, node in enumerate(nodes)))
        primary, old, epoch = await primary_of(nodes)
        await old.mailboxes.ensure("research", mode="WORK")
        run = await old.scopes.create()
        before = await run.mailbox("research").submit({"n": 0}, key="before")
        for proxy in proxies[nodes.index(primary)]:
            proxy.cut()
        late = [asyncio.ensure_future(run.mailbox("research").submit({"n": i}, key=f"l{i}"))
                for i in range(5)]  # to the old primary, after it was cut off
        survivors = [node for node in nodes if node is not primary]
        _, fresh, _ = await primary_of(survivors, after=epoch)
        code = await primary.exited(10)
        assert code == 75, primary.log()[-2000:]
        again = await fresh.scope(run.id).mailbox("research").submit({"n": 0}, key="before")
        assert again.id == before.id
        for future in late:  # answered (before its deadline): then on the new primary too
            with contextlib.suppress(Exception):
                await asyncio.wait_for(future, 5)
            if future.done() and not future.cancelled() and future.exception() is None:
                status = await fresh.scope(run.id).task(future.result().id).status()
                assert str(status["key"]).startswith("l")
        assert "leadership may have lapsed" in primary.log()
        await fresh.close()
        await old.close()
    finally:
        await kill_all(nodes)
        for own in proxies:
            for proxy in own:
                await proxy.close()


async def test_a_cluster_whose_nodes_speak_tls_fails_over_too(
    tmp_path: Path, shared_etcd: EtcdCluster, cluster: str,
) -> None:
    """Nodes that serve TLS (requiring client certificates): a standby follows the
    primary over TLS, checking its certificate against --cluster-ca and presenting its
    own; after the primary is killed, what it acknowledged is on the new one."""
    certs = Certs(tmp_path / "certs")
    etcd = shared_etcd
    nodes = [Rsd(tmp_path / f"n{i}") for i in range(3)]
    tls = [*certs.mutual_flags(), "--cluster-ca", str(certs.ca_file)]
    try:
        await start_all(etcd, nodes, *tls, cluster=cluster)
        client_tls = certs.client_context("planner")
        primary, rs, epoch = await primary_of(nodes, tls=client_tls)
        await rs.mailboxes.ensure("research", mode="WORK")
        run = await rs.scopes.create()
        ids = {}
        for index in range(10):
            ticket = await run.mailbox("research").submit({"n": index}, key=f"k{index}")
            ids[f"k{index}"] = ticket.id
        await primary.kill()
        _, rs2, _ = await primary_of([n for n in nodes if n is not primary], after=epoch,
                                   tls=client_tls)
        for key, task_id in ids.items():
            again = await rs2.scope(run.id).mailbox("research").submit(
                {"n": int(key[1:])}, key=key)
            assert again.id == task_id
        await rs2.close()
        await rs.close()
    finally:
        await kill_all(nodes)
