"""``rsd --etcd ... --cluster NAME --node NAME``: serve as one node of a cluster.

The node binds its client port first (as a single rsd does), prints its ready line as
soon as it answers there (NOT_PRIMARY, until etcd makes it the primary), waits for etcd
as long as it takes (``wait_for_etcd``: etcd may start after the nodes, or be out of
reach for a while; a node that gave up would need its supervisor to start it again, and
again), and runs its role (node.py) until SIGTERM: then it leaves etcd at once (a
standby takes over without waiting for its lease to expire) and stops cleanly. Exit
codes: 0 after SIGTERM (also while it waits for etcd), 2 for options it refuses (TLS
files for etcd it cannot read among them), 75 (node.py's ``EXIT_STEPPED_DOWN``) when its
leadership may have lapsed: a supervisor starts it again and it rejoins as a standby.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from ..core import Core
from ..disk.recovery import RecoveryError
from ..http.api import Api
from ..http.dashboard import Dashboard
from ..http.history import History
from ..http.httpserver import HttpEndpoint
from ..http.metricshttp import MetricsPage
from ..metrics import render, render_standby
from ..notify import Notifier
from ..options import Settings
from ..replication.node import ClusterNode
from ..server import Server
from .client import EtcdError, channel_credentials
from .etcd import EtcdStore
from .options import cluster_option_problem, etcd_tls, parse_endpoints

__all__ = ["serve_node"]

log = logging.getLogger("rsd")

FIRST_RETRY_SECONDS = 0.2  # after the first failed attempt to reach etcd; then doubled


def cluster_problem(args: Settings) -> str | None:
    """What is wrong with the cluster options, or None (rsd/cluster/options.py checks
    them taken together)."""
    if args.cluster is None or args.node is None:
        return "--etcd needs --cluster NAME and --node NAME"
    return cluster_option_problem(
        args.etcd, args.cluster, args.node, args.cluster_lease_seconds, args.etcd_cacert,
        args.etcd_cert, args.etcd_key,
    )


async def serve_node(
    args: Settings,
    bind: Callable[[Callable[[], asyncio.BaseProtocol]], Awaitable[asyncio.base_events.Server]],
    new_core: Callable[[], Core],
    new_server: Callable[..., Server],
    stopping: asyncio.Event,
    notifier: Notifier,
) -> int:
    problem = cluster_problem(args)
    if problem is not None:
        log.critical("%s", problem)
        return 2
    assert args.cluster is not None and args.node is not None and args.etcd is not None
    token = None
    if args.cluster_token_file is not None:
        try:
            token = Path(args.cluster_token_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            log.critical("cannot read --cluster-token-file: %s", exc)
            return 2
    endpoints = parse_endpoints(args.etcd)
    tls = etcd_tls(args.etcd_cacert, args.etcd_cert, args.etcd_key, endpoints.scheme)
    if tls is not None:
        try:
            channel_credentials(tls)  # read now: a file that cannot be read is an option error
        except OSError as exc:
            log.critical("cannot read the TLS files for etcd: %s", exc)
            return 2
    follow_tls = None
    if args.tls_cert is not None and args.tls_key is not None:  # the nodes speak TLS
        try:
            follow_tls = ssl.create_default_context(cafile=args.cluster_ca)
            follow_tls.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            log.critical("cannot make the TLS context to follow a primary: %s", exc)
            return 2
    node: ClusterNode | None = None

    def protocol() -> asyncio.BaseProtocol:
        assert node is not None  # nothing is accepted before the node exists
        return node.protocol()

    try:
        listener = await bind(protocol)
    except OSError as exc:
        log.critical("cannot listen on %s:%d: %s", *args.listen, exc)
        return 1
    host, port = listener.sockets[0].getsockname()[:2]
    advertise = args.advertise or (host, port)
    address = f"{advertise[0]}:{advertise[1]}"
    store = EtcdStore(
        endpoints.addresses, args.cluster, args.node,
        lease_seconds=args.cluster_lease_seconds, tls=tls,
    )

    def server(core: Core, journal: Any, snapshots: Any, feeds: Any, on_lapsed: Any) -> Server:
        made = new_server(core, journal, snapshots, feeds=feeds, cluster=args.cluster,
                          on_lapsed=on_lapsed)
        made.cluster_lease_seconds = args.cluster_lease_seconds  # HELLO's ``cluster``
        return made

    node = ClusterNode(
        store, address, Path(args.data_dir), new_core, server, policy=args.fsync,
        snapshot_bytes=args.snapshot_bytes, token=token, tls=follow_tls,
    )
    try:
        node.load(asyncio.get_running_loop().time())
    except RecoveryError as exc:
        log.critical("cannot use the data directory %s: %s", args.data_dir, exc)
        listener.close()
        await store.close()
        return 1
    metrics = history = None
    started_wall, started = time.time(), time.monotonic()
    if args.http_listen is not None:  # the primary's series, or a standby's own

        def text() -> bytes:
            assert node is not None
            if node.server is not None:
                return render(node.server)
            return render_standby(node.status(), node.follower, started_wall,
                                  time.monotonic() - started)

        loop = asyncio.get_running_loop()
        history = History(loop, lambda: node.server)  # the primary's, while it is one
        api = Api(loop, args.auth, lambda: node.server, node.status, history)
        site = Dashboard(MetricsPage(loop, text), api)
        metrics = HttpEndpoint(loop, site.handle,
                               tls=None if args.tls is None else args.tls.context)
        try:
            mhost, mport = await metrics.bind(*args.http_listen)
        except OSError as exc:
            log.critical("cannot serve HTTP on %s:%d: %s", *args.http_listen, exc)
            listener.close()
            await store.close()
            return 1
        await metrics.start()
        history.start()
        scheme = "http" if args.tls is None else "https"
        at = f"[{mhost}]:{mport}" if ":" in mhost else f"{mhost}:{mport}"
        log.info("dashboard at %s://%s/, metrics at %s://%s/metrics", scheme, at, scheme, at)
    await listener.start_serving()
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    log.info("rsd node %s of cluster %s listening on %s (advertised as %s), etcd at %s "
             "(each call to it may take %.3g s)", args.node, args.cluster, where, address,
             args.etcd, store.call_timeout)
    print(f"rsd listening on {where}", flush=True)
    notifier.ready(f"listening on {where}")
    notifier.start_watchdog(asyncio.get_running_loop())
    if await wait_for_etcd(store, stopping, notifier):
        node.start(listener)
        await stopping.wait()
    notifier.stopping()
    log.info("rsd stopping")
    if metrics is not None:
        metrics.close()
    if history is not None:
        history.stop()
    await node.stop()
    await store.close()
    listener.close()
    log.info("rsd stopped cleanly")
    return 0


async def wait_for_etcd(store: EtcdStore, stopping: asyncio.Event, notifier: Notifier) -> bool:
    """Grant this node's first lease, trying again until etcd answers: True once it has,
    False if ``stopping`` was set first. Each failure is logged, with how long the node
    has waited and when it tries again: the pause starts at ``FIRST_RETRY_SECONDS`` and
    doubles up to the lease (a node that waited is then in the cluster about a lease
    after etcd answers again at the latest, as soon as a takeover would take)."""
    loop = asyncio.get_running_loop()
    began, pause, failed = loop.time(), FIRST_RETRY_SECONDS, False
    stopped = loop.create_task(stopping.wait())
    try:
        while True:
            grant = loop.create_task(store.connect())
            await asyncio.wait((grant, stopped), return_when=asyncio.FIRST_COMPLETED)
            if not grant.done():  # stopping: a call in flight is not waited for
                grant.cancel()
                await asyncio.wait((grant,))
                return False
            try:
                grant.result()
            except EtcdError as exc:
                failed, waited = True, loop.time() - began
                log.warning("cluster %s: %s waits for etcd at %s (%.0f s so far): %s; "
                            "trying again in %.3g s", store.cluster, store.node,
                            ",".join(store.endpoints), waited, exc, pause)
                notifier.send(f"STATUS=waiting for etcd ({waited:.0f} s so far)")
                await asyncio.wait((stopped,), timeout=pause)
                if stopped.done():
                    return False
                pause = min(2 * pause, store.lease_seconds)
                continue
            if failed:
                log.info("cluster %s: %s reached etcd after %.0f s", store.cluster,
                         store.node, loop.time() - began)
                notifier.send("STATUS=etcd reached, in the cluster")
            return True
    finally:
        stopped.cancel()
