"""A client keeps a claim of the shortest lease while its primary replaces a hung
synchronous standby and a write of the same connection waits for that, with the
defaults of rsd and of the SDK.

A standby that hangs (SIGSTOP) is replaced only after the stream's deadline, the
cluster lease (rsd's default, 5 s), and the replies of a connection that wrote
meanwhile are held that long (tests/test_a_hung_sync_standby_is_replaced.py). The SDK
renews a lease a third of its length after its last confirmed renewal and declares it
lost when no renewal is confirmed by then plus the lease, less its margin
(rsproto/sdkrules.py: 4 s for a 5 s lease). A renewal that renewed every lease it named
and wrote no record reveals nothing, so its reply leaves ahead of the connection's held
replies (rsd/wire/output.py). It used to wait behind them: the holder declared lost,
about 4 s into the wait, a claim that the server had renewed, and kept.

Why a real cluster: what is checked is the real replacement's timing (the stream's
deadline, the naming in etcd) against the SDK's own renewal schedule, both at their
defaults (in-process, the rule alone: test_a_quiet_renewals_answer_leaves_ahead_of_its_
connections_held_replies.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from support.cluster import a_standby_about_to_hang, named_syncs
from support.etcd import EtcdCluster

from rsproto import Limits


async def test_a_claim_renewed_while_a_write_waits_for_a_hung_standby_is_not_lost(
    tmp_path: Path, etcd_cluster: Callable[..., EtcdCluster],
) -> None:
    async with a_standby_about_to_hang(tmp_path, etcd_cluster(3), "holder") as at:
        lease = await at.run.claim("held", lease_seconds=Limits.MIN_LEASE_SECONDS).acquire()
        at.hung.pause()
        # Held until the other standby is named in the hung one's place: longer than
        # the claim's own deadline, had no renewal been confirmed meanwhile.
        await at.mailbox.submit({"n": 1})
        assert len(named_syncs(at.primary.log())) > at.namings, (
            "acknowledged before a new standby")
        assert at.hung.proc is not None and at.hung.proc.poll() is None  # still stopped
        assert not lease.is_lost, lease.lost_reason
        assert [event.kind for event in at.events] == ["connected"], at.events
        await lease.release()  # the server held it too: released, not STALE_CLAIM
        assert lease.released and not lease.is_lost
