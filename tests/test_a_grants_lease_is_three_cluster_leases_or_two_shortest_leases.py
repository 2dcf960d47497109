"""A grant of another shard's pool (rsd/wire/remoteneeds.py, ``RemoteNeeds.lease``) is
held under a lease of three cluster leases, so that it outlives a takeover of either
shard, and never under two of the shortest leases the node grants: the protocol's
(10 s as shipped), or the lower one of rsd's own tests (``--test-min-lease-seconds``),
so that the tests that wait for a grant to lapse wait 6 s with a 2 s cluster lease, not
10. No real time: the property is read off a node's settings.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from rsd.wire.remoteneeds import GRANT_LEASE_SECONDS, RemoteNeeds
from rsproto import Limits


def _lease(cluster_lease: int | None, min_lease: float = Limits.MIN_LEASE_SECONDS) -> float:
    host: Any = SimpleNamespace(cluster_lease_seconds=cluster_lease,
                                core=SimpleNamespace(tables=SimpleNamespace(
                                    min_lease_seconds=min_lease)))
    return RemoteNeeds(cast(Any, host)).lease


@pytest.mark.parametrize(("cluster_lease", "lease"), [(None, 10.0), (2, 10.0), (3, 10.0),
                                                      (4, 12.0), (5, 15.0), (60, 180.0)])
def test_as_shipped_a_grants_lease_is_ten_seconds_or_three_cluster_leases(
    cluster_lease: int | None, lease: float,
) -> None:
    assert GRANT_LEASE_SECONDS == 2 * Limits.MIN_LEASE_SECONDS
    assert _lease(cluster_lease) == lease


@pytest.mark.parametrize(("min_lease", "lease"), [(1.0, 6.0), (2.5, 6.0), (4.0, 8.0),
                                                  (5.0, 10.0)])
def test_a_tests_lower_shortest_lease_lowers_it_to_three_cluster_leases(
    min_lease: float, lease: float,
) -> None:
    assert _lease(2, min_lease) == lease
