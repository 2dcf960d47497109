"""The cluster's options are checked together before anything starts, and a refusal names
the option and what it wants; every list of etcd endpoints that is accepted becomes one
gRPC target over all of them (rsd/cluster/options.py)."""

from __future__ import annotations

import pytest

from rsd.cluster.options import cluster_option_problem, etcd_tls, grpc_target, parse_endpoints


def test_endpoints_become_one_target_over_every_member() -> None:
    assert grpc_target(["127.0.0.1:1", "10.0.0.2:2"]) == "ipv4:127.0.0.1:1,10.0.0.2:2"
    assert grpc_target(["[::1]:1", "[fe80::2]:2"]) == "ipv6:[::1]:1,[fe80::2]:2"
    assert grpc_target(["etcd.internal:2379"]) == "etcd.internal:2379"
    for unheld in (["127.0.0.1:1", "[::1]:2"], ["a.example:1", "b.example:1"],
                   ["127.0.0.1:1", "b.example:1"]):
        with pytest.raises(ValueError, match="IPv4 addresses, all IPv6 addresses, or one DNS name"):
            grpc_target(unheld)
    assert parse_endpoints(" 127.0.0.1:1, 127.0.0.1:2 ,") == ["127.0.0.1:1", "127.0.0.1:2"]
    for bad in ("", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:x", ":2379"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


def test_a_refusal_names_the_option() -> None:
    def problem(**given: object) -> str | None:
        options: dict[str, object] = dict(
            etcd="127.0.0.1:2379", cluster="rsd", node_name="n1", lease_seconds=5,
            cacert=None, cert=None, key=None)
        options.update(given)
        return cluster_option_problem(**options)  # type: ignore[arg-type]

    assert problem() is None
    assert problem(etcd=None, cluster="no/slash", lease_seconds=0) is None  # one node alone
    assert (problem(etcd="a.example:1,b.example:1") or "").startswith("--etcd: ")
    assert (problem(cluster="no/slash") or "").startswith("--cluster 'no/slash': 1 to 63")
    assert (problem(node_name="-x") or "").startswith("--node-name '-x'")
    assert (problem(lease_seconds=1) or "").startswith("--cluster-lease-seconds must be")
    assert "go together" in (problem(cert="c.pem") or "")
    assert problem(cacert="ca.pem") is None
    assert etcd_tls(None, None, None) is None
    tls = etcd_tls("ca.pem", None, None)
    assert tls is not None and tls.cacert == "ca.pem"
