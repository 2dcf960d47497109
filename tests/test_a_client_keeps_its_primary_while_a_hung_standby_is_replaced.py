"""A client keeps its healthy primary while the primary replaces a hung synchronous
standby, with the defaults of rsd and of the SDK.

A cluster's primary acknowledges a change only once its synchronous standby holds it,
and the replies of a connection that wrote meanwhile wait for that. A standby that hangs
(SIGSTOP: its kernel still acknowledges the stream's TCP data) is replaced only after
the stream's deadline, the cluster lease (rsd's default, 5 s) since it first owed a
batch (tests/test_a_hung_sync_standby_is_replaced.py): a write sent just after the
hang waits that long. Meanwhile the client's silence probe (rsclient/connection.py: a
PING after 1.5 s without a byte, the connection given up after as long again) must be
answered: a PING's reply leaves before its connection's held replies (rsd/wire/output.py).
It used to wait behind them: the client gave up the healthy primary 3 to 4.5 s into the
wait, and its write in flight, a submit without a key (not sent again: it could make a
second task), raised UnavailableError.

Every write acknowledged is durable: once the held one is acknowledged, the primary is
killed, and the node that replaced the hung standby, the only one that may take over
while it is still stopped, has every task that was acknowledged.

Why a real cluster: what is checked is the real replacement's timing (the stream's
deadline, the naming in etcd) against the SDK's own probe, both at their defaults, and
that no acknowledged change is lost when the primary dies right after.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from support.cluster import a_standby_about_to_hang, named_syncs, primary
from support.etcd import EtcdCluster


async def test_a_write_held_for_a_hung_standby_keeps_its_client_on_the_primary(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    async with a_standby_about_to_hang(tmp_path, etcd_cluster(3), "planner") as at:
        acknowledged = [await at.mailbox.submit({"n": 0})]  # no key: never sent again
        other = next(node for node in at.nodes if node not in (at.primary, at.hung))
        at.hung.pause()
        # Held until the other standby is named in the hung one's place; meanwhile the
        # client's probe is answered, so it keeps the connection and gets the reply.
        acknowledged.append(await at.mailbox.submit({"n": 1}))
        assert len(named_syncs(at.primary.log())) > at.namings, (
            "acknowledged before a new standby")
        assert [event.kind for event in at.events] == ["connected"], at.events
        assert at.hung.proc is not None and at.hung.proc.poll() is None  # still stopped

        await at.primary.kill()  # every acknowledged write is on the standby that replaced it
        _, successor, _ = await primary([other], after=at.epoch)
        for ticket in acknowledged:
            status = await successor.scope(at.run.id).task(ticket.id).status()
            assert status["id"] == ticket.id, status
        await successor.close()
