"""With --etcd-cacert/--etcd-cert/--etcd-key, rsd speaks to etcd over TLS and presents its
client certificate, on a channel over every member (each member's certificate checked for
the first endpoint's host); etcd refuses a node without a certificate, or without TLS,
and a member whose certificate is not for the name checked is refused
(rsd/cluster/client.py: EtcdClient.connect; rsd/cluster/options.py: EtcdTls). A node
given ``https://`` endpoints speaks TLS to etcd; ``http://`` ones with TLS options are a
contradiction it refuses (exit 2) before it starts. Both tests share one etcd cluster of
three serving TLS (its CA's certificates with it), each under a cluster name of its own."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.certs import Certs
from support.cluster import CLUSTER, kill_all, primary
from support.etcd import EtcdCluster, stores
from support.process import Rsd

from rsd.cluster.client import EtcdError
from rsd.cluster.options import EtcdTls


@pytest.fixture(scope="module")
def tls_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EtcdCluster, Certs]]:
    """An etcd cluster of three that serves TLS and requires client certificates, and
    the certificates of its CA."""
    root = tmp_path_factory.mktemp("tls-etcd")
    certs = Certs(root / "certs")
    etcd = EtcdCluster(root / "etcd", 3, certs).start()
    try:
        yield etcd, certs
    finally:
        etcd.stop()


async def test_a_node_with_a_client_certificate_campaigns_over_tls_and_others_are_refused(
    tls_etcd: tuple[EtcdCluster, Certs],
) -> None:
    cluster, certs = tls_etcd
    cert, key = certs.client_files("rsd-a")
    tls = EtcdTls(cacert=str(certs.ca_file), cert=str(cert), key=str(key))
    async with stores(cluster.endpoints, "a", tls=tls) as (a,):
        await a.register("127.0.0.1:7001", "standby")
        assert await a.campaign() == 1
        assert await a.name_sync("a")
        view = await a.view()
        assert (view.leader, view.epoch, view.sync) == ("a", 1, "a")
        assert view.address_of("a") == "127.0.0.1:7001"

    wrong_name = EtcdTls(str(certs.ca_file), str(cert), str(key), server_name="etcd.example")

    async def refused(tls: EtcdTls | None, node: str) -> None:
        # The shortest lease: its call timeout (1 s) bounds the wait for a connection
        # that never comes.
        with pytest.raises(EtcdError):
            async with stores(cluster.endpoints, node, tls=tls, lease_seconds=2):
                pass

    await asyncio.gather(*(refused(tls, f"b{n}") for n, tls in enumerate(
        (EtcdTls(cacert=str(certs.ca_file)), None, wrong_name))))


async def test_a_node_given_https_endpoints_speaks_tls_to_etcd(
    tls_etcd: tuple[EtcdCluster, Certs], tmp_path: Path
) -> None:
    cluster, certs = tls_etcd
    cert, key = certs.client_files("rsd-a")
    tls = ["--etcd-cacert", str(certs.ca_file), "--etcd-cert", str(cert), "--etcd-key", str(key)]
    node = Rsd(tmp_path / "a")
    plain = [f"http://{endpoint}" for endpoint in cluster.endpoints]
    assert await node.refused("--etcd", ",".join(plain), "--cluster", f"{CLUSTER}-https",
                              "--node", "a", *tls) == 2
    assert "--etcd gives http:// endpoints (no TLS), but --etcd-cacert, --etcd-cert, " \
        "--etcd-key asks for TLS" in node.log()
    secure = [f"https://{endpoint}" for endpoint in cluster.endpoints]
    try:
        await node.start("--etcd", ",".join(secure), "--cluster", f"{CLUSTER}-https", "--node",
                         "a", *tls)
        _, rs, epoch = await primary([node])
        await rs.close()
        assert epoch == 1
    finally:
        await kill_all([node])
