"""The cluster's options are checked together before anything starts, and a refusal names
the option and what it wants; every list of etcd endpoints that is accepted becomes one
gRPC target over all of them, written ``HOST:PORT`` or as etcd writes them
(``http://HOST:PORT``, ``https://HOST:PORT``: TLS, and no TLS options with http://); and
each call to etcd waits as long as the cluster lease lets an answer still keep a primary
(rsd/cluster/options.py)."""

from __future__ import annotations

import pytest

from rsd.cluster.options import (
    LEASE_MARGIN,
    MIN_CALL_TIMEOUT,
    Endpoints,
    EtcdTls,
    call_timeout_for,
    cluster_option_problem,
    etcd_tls,
    grpc_target,
    parse_endpoints,
)


def test_endpoints_become_one_target_over_every_member() -> None:
    assert grpc_target(["127.0.0.1:1", "10.0.0.2:2"]) == "ipv4:127.0.0.1:1,10.0.0.2:2"
    assert grpc_target(["[::1]:1", "[fe80::2]:2"]) == "ipv6:[::1]:1,[fe80::2]:2"
    assert grpc_target(["etcd.internal:2379"]) == "etcd.internal:2379"
    for unheld in (["127.0.0.1:1", "[::1]:2"], ["a.example:1", "b.example:1"],
                   ["127.0.0.1:1", "b.example:1"]):
        with pytest.raises(ValueError, match="IPv4 addresses, all IPv6 addresses, or one DNS name"):
            grpc_target(unheld)
    assert parse_endpoints(" 127.0.0.1:1, 127.0.0.1:2 ,") == Endpoints(
        ["127.0.0.1:1", "127.0.0.1:2"], None)
    for bad in ("", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:x", ":2379"):
        with pytest.raises(ValueError):
            parse_endpoints(bad)


def test_endpoints_may_be_written_as_etcd_writes_them() -> None:
    # The form of etcdctl --endpoints and of etcd's own --advertise-client-urls.
    assert parse_endpoints("http://10.0.0.1:2379,http://10.0.0.2:2379") == Endpoints(
        ["10.0.0.1:2379", "10.0.0.2:2379"], "http")
    assert parse_endpoints("HTTPS://[::1]:2379/, [::2]:2379") == Endpoints(
        ["[::1]:2379", "[::2]:2379"], "https")  # a bare one takes the others' scheme
    assert parse_endpoints("https://etcd.internal:2379").scheme == "https"
    refused = {
        "unix:///run/etcd.sock": "unix:// is not http:// or https://",
        "http://10.0.0.1": "is not HOST:PORT, http://HOST:PORT or https://HOST:PORT",
        "https://10.0.0.1:99999": "with a port from 1 to 65535",
        "http://10.0.0.1:2379/v3": "a path, query or user is not allowed",
        "http://root:secret@10.0.0.1:2379": "a path, query or user is not allowed",
        "http://10.0.0.1:2379,https://10.0.0.2:2379": "mix http:// and https://",
    }
    for text, why in refused.items():
        with pytest.raises(ValueError, match=why):
            parse_endpoints(text)


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

    assert problem(etcd="http://10.0.0.1:2379,http://10.0.0.2:2379") is None
    assert (problem(etcd="http://10.0.0.1:2379,https://10.0.0.2:2379") or "").startswith(
        "--etcd: etcd endpoints mix http:// and https://")
    # https:// is TLS (the system's CAs without --etcd-cacert); http:// is none, and
    # TLS options beside it contradict it.
    assert problem(etcd="https://10.0.0.1:2379") is None
    assert etcd_tls(None, None, None, "https") == EtcdTls()
    assert problem(etcd="https://10.0.0.1:2379", cacert="ca.pem", cert="c", key="k") is None
    assert etcd_tls(None, None, None, "http") is None
    contradiction = problem(etcd="http://10.0.0.1:2379", cacert="ca.pem") or ""
    assert contradiction.startswith("--etcd gives http:// endpoints (no TLS), but "
                                    "--etcd-cacert asks for TLS"), contradiction
    assert "--etcd-cert, --etcd-key" in (
        problem(etcd="http://10.0.0.1:2379", cert="c", key="k") or "")


@pytest.mark.parametrize("lease", [2, 3, 4, 5, 10, 60])
def test_a_call_waits_as_long_as_its_answer_can_still_keep_a_primary(lease: int) -> None:
    """A keep-alive goes out a third of the lease after the last one's answer, and the
    primary leads until that one's send time + the lease - the margin: two round trips
    of the call timeout and the third fit (the floor apart), and no more."""
    timeout = call_timeout_for(lease)
    fits = 2 * timeout + lease / 3
    if timeout > MIN_CALL_TIMEOUT:
        assert fits == pytest.approx(lease - LEASE_MARGIN)
    else:
        assert fits >= lease - LEASE_MARGIN and timeout == MIN_CALL_TIMEOUT
    assert call_timeout_for(5) == pytest.approx(1.4167, abs=1e-4)  # the manual's figure
