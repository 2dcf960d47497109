"""``rsd --etcd ... --cluster NAME --node NAME``: the cluster's part of the one start
(cli.py takes every step; this is what a node of a cluster does its own way).

- Its options are checked together before anything is touched (exit 2): the cluster's
  (cluster/options.py), the cluster token file, the TLS files for etcd and for following
  a primary.
- Its client port answers from the start, NOT_PRIMARY until etcd makes it the primary
  (cluster/node.py); its directory is read as the records left it (``ClusterNode.load``:
  a standby's copy, or a primary's own state kept aside), not recovered.
- Once it answers, it waits for etcd as long as it takes (``wait_for_etcd``: etcd may
  start after the nodes, or be out of reach for a while; a node that gave up would need
  its supervisor to start it again, and again), then runs its role until SIGTERM: then
  it leaves etcd at once (a standby takes over without waiting for its lease to expire).
- Its /metrics are the primary's series, or a standby's own; the API answers with the
  cluster as this node sees it.
- It exits 75 (``EXIT_STEPPED_DOWN``) when its leadership may have lapsed: a supervisor
  starts it again and it rejoins as a standby.
- Shards (issue 32): the node is a member of its shard (``--shard NAME``; without it,
  the default shard, whose keys are today's: cluster/etcd.py). Once etcd answers, and
  before it may lead, it makes the cluster's slot map if there is none
  (cluster/slotmap.py: every slot to its shard); a map of another slot count than
  ``--slots`` stops it at once with ``EXIT_CONFIG`` (78), saying both counts. Then it
  watches the map (with every shard's primary) and gives each new one to its server
  (``server.slots.adopt``), logging one line per map epoch; a server it starts gets the
  latest map and the switch of a slot move (``server.slots.switch``: the
  compare-and-swap in etcd), and the cluster token and TLS context a move's runs are
  sent to the target's primary with; at each map it adopts, the server drops the runs
  it still holds of slots the map gives another shard once they have stayed so a while
  (a move cut short: wire/slotimport.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rsproto.slots import DEFAULT_SHARD, SlotMap

from .cluster.client import EtcdError, channel_credentials
from .cluster.etcd import EtcdStore
from .cluster.options import EtcdTls, cluster_option_problem, etcd_tls, parse_endpoints
from .cluster.slotmap import SlotCountMismatch, SlotMapStore
from .core import Core
from .disk.journal import Journal
from .disk.recovery import RecoveryReport
from .disk.snapshots import Snapshots
from .metrics import render, render_standby
from .notify import Notifier
from .options import Settings
from .replication.node import ClusterNode
from .server import Server
from .wire.feeds import Feeds

__all__ = ["EXIT_CONFIG", "ClusterMode", "cluster_problem", "describe_map", "wait_for_etcd"]

log = logging.getLogger("rsd")

FIRST_RETRY_SECONDS = 0.2  # after the first failed attempt to reach etcd; then doubled
EXIT_CONFIG = 78  # EX_CONFIG: this node's options do not fit its cluster (its slot count)

Listener = asyncio.base_events.Server


def cluster_problem(args: Settings) -> str | None:
    """What is wrong with the cluster options, or None (rsd/cluster/options.py checks
    them taken together)."""
    if args.cluster is None or args.node is None:
        return "--etcd needs --cluster NAME and --node NAME"
    return cluster_option_problem(
        args.etcd, args.cluster, args.node, args.cluster_lease_seconds, args.etcd_cacert,
        args.etcd_cert, args.etcd_key,
    )


class ClusterMode:
    """A node of a cluster, as cli.py's ``Mode`` (the module docstring)."""

    def __init__(
        self, args: Settings, new_core: Callable[[], Core], new_server: Callable[..., Server],
        *, etcd: list[str], etcd_tls: EtcdTls | None, token: str | None,
        follow_tls: ssl.SSLContext | None,
    ) -> None:
        """``new_core``: an empty core with the options' windows; ``new_server(core,
        journal, snapshots, **cluster)``: the server around one (cli.py's); ``etcd``: every
        etcd member's HOST:PORT."""
        assert args.cluster is not None and args.node is not None and args.etcd is not None
        self.args, self.cluster, self.name = args, args.cluster, args.node
        self.new_core, self.new_server = new_core, new_server
        self.etcd, self.etcd_tls, self.token, self.follow_tls = etcd, etcd_tls, token, follow_tls
        self.shard: str | None = args.shard
        self.slots: int = args.slots
        self.store: EtcdStore | None = None
        self.slot_store: SlotMapStore | None = None
        self.slot_map: SlotMap | None = None  # the latest map seen in etcd
        self._map_watch: asyncio.Task[None] | None = None
        self.node: ClusterNode | None = None
        self.listener: Listener | None = None
        self.started_wall, self.started = time.time(), time.monotonic()

    @classmethod
    def from_settings(
        cls, args: Settings, new_core: Callable[[], Core], new_server: Callable[..., Server],
    ) -> ClusterMode | str:
        """The mode, or what is wrong with its options (a file that cannot be read
        among them: rsd exits 2 naming it)."""
        problem = cluster_problem(args)
        if problem is not None:
            return problem
        assert args.etcd is not None
        token = None
        if args.cluster_token_file is not None:
            try:
                token = Path(args.cluster_token_file).read_text(encoding="utf-8").strip()
            except OSError as exc:
                return f"cannot read --cluster-token-file: {exc}"
        endpoints = parse_endpoints(args.etcd)
        tls = etcd_tls(args.etcd_cacert, args.etcd_cert, args.etcd_key, endpoints.scheme)
        if tls is not None:
            try:
                channel_credentials(tls)  # read now: a file that cannot be read is an option error
            except OSError as exc:
                return f"cannot read the TLS files for etcd: {exc}"
        follow_tls = _follow_tls(args)
        if isinstance(follow_tls, str):
            return follow_tls
        return cls(args, new_core, new_server, etcd=endpoints.addresses, etcd_tls=tls,
                   token=token, follow_tls=follow_tls)

    def protocol(self) -> asyncio.BaseProtocol:
        assert self.node is not None  # nothing is accepted before the node exists
        return self.node.protocol()

    def served(self) -> Server | None:
        return None if self.node is None else self.node.server

    def status(self) -> dict[str, Any] | None:
        return None if self.node is None else self.node.status()

    def unready(self) -> str | None:
        return "starting" if self.node is None else self.node.unready()

    def metrics_text(self) -> bytes:
        """The primary's series, or a standby's own."""
        node = self.node
        assert node is not None  # nothing is served before the node exists
        if node.server is not None:
            return render(node.server)
        return render_standby(node.status(), node.follower, self.started_wall,
                              time.monotonic() - self.started,
                              (self.shard or DEFAULT_SHARD, self.slot_map))

    def cores(self) -> list[Core]:
        """The core served, a standby's copy, or the directory's own state kept aside."""
        node = self.node
        if node is None:
            return []
        if node.server is not None:
            return [node.server.core]
        held = node.follower.standby
        return [part.core for part in (held, node.own) if part is not None]

    def load(self, listener: Listener) -> RecoveryReport:
        """The node on this address (``--advertise``, else the one bound), its directory
        read as the records left it."""
        args = self.args
        host, port = listener.sockets[0].getsockname()[:2]
        advertise = args.advertise or (host, port)
        self.store = EtcdStore(
            self.etcd, self.cluster, self.name,
            lease_seconds=args.cluster_lease_seconds, tls=self.etcd_tls, shard=self.shard,
        )
        self.slot_store = SlotMapStore(self.store)
        self.node = ClusterNode(
            self.store, f"{advertise[0]}:{advertise[1]}", Path(args.data_dir), self.new_core,
            self._new_server, policy=args.fsync, snapshot_bytes=args.snapshot_bytes,
            token=self.token, tls=self.follow_tls,
        )
        report = self.node.load(asyncio.get_running_loop().time())
        self.started_wall, self.started = time.time(), time.monotonic()
        return report

    def _new_server(self, core: Core, journal: Journal, snapshots: Snapshots, feeds: Feeds,
                    on_lapsed: Callable[[], None]) -> Server:
        made = self.new_server(core, journal, snapshots, feeds=feeds, cluster=self.cluster,
                               on_lapsed=on_lapsed)
        made.cluster_lease_seconds = self.args.cluster_lease_seconds  # HELLO's ``cluster``
        made.moves.imports.settle_seconds = self.args.test_stray_settle_seconds
        # A primary's new item ids in its shard's namespace, its runs kept by slot (a
        # move's count and export): one walk over the runs, once per term.
        core.serve_shard(made.slots.shard, self.slots)
        # A move's runs go to the target's primary as a standby reaches its primary.
        made.moves.token, made.moves.tls = self.token, self.follow_tls
        # Grants of another shard's pools and quotas are asked of its primary the same way.
        made.needs.token, made.needs.tls = self.token, self.follow_tls
        if self.slot_store is not None:
            made.slots.switch = self.slot_store.switch
            if self.slot_map is not None:
                made.slots.adopt(self.slot_map)
                # Runs of slots the map gives another shard (a move cut short): dropped
                # once they have stayed strays a while (wire/slotimport.py).
                made.loop.call_soon(made.moves.imports.adopted)
        return made

    async def start(self, listener: Listener) -> None:
        """Answer at once (NOT_PRIMARY, until etcd makes this node the primary)."""
        self.listener = listener
        await listener.start_serving()

    def log_listening(self, where: str) -> None:
        assert self.node is not None and self.store is not None
        log.info("rsd node %s of cluster %s listening on %s (advertised as %s), etcd at %s "
                 "(each call to it may take %.3g s)", self.name, self.cluster, where,
                 self.node.address, self.args.etcd, self.store.call_timeout)

    async def run(self, stopping: asyncio.Event, notifier: Notifier) -> None:
        """Wait for etcd, then take this node's role until ``stopping``."""
        assert self.node is not None and self.store is not None and self.listener is not None
        if not await wait_for_etcd(self.store, stopping, notifier):
            return
        if not await self._ensure_map(stopping):
            return
        self._map_watch = asyncio.get_running_loop().create_task(
            self._watch_map(), name="cluster-slot-map")
        self.node.start(self.listener)
        await stopping.wait()

    async def _ensure_map(self, stopping: asyncio.Event) -> bool:
        """Make the cluster's slot map if there is none, trying again while etcd does not
        answer: True once it is there, False if ``stopping`` came first. A map of another
        slot count ends the process (``EXIT_CONFIG``), this node having led nothing."""
        assert self.slot_store is not None
        pause = FIRST_RETRY_SECONDS
        while not stopping.is_set():
            try:
                self.slot_map = await self.slot_store.ensure(self.slots, self.shard)
                return True
            except SlotCountMismatch as exc:
                log.critical("%s", exc)
                await self.abandon()
                raise SystemExit(EXIT_CONFIG) from None
            except EtcdError as exc:
                log.warning("cluster %s: %s could not read the slot map: %s; trying again "
                            "in %.3g s", self.cluster, self.name, exc, pause)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), pause)
                pause = min(2 * pause, self.args.cluster_lease_seconds)
        return False

    async def _watch_map(self) -> None:
        """Give each new map to the server (if this node serves), one line per epoch."""
        assert self.slot_store is not None
        logged = 0
        async for slot_map in self.slot_store.watch():
            self.slot_map = slot_map
            if slot_map.epoch != logged:
                logged = slot_map.epoch
                log.info("cluster %s: slot map epoch %d: %s", self.cluster, slot_map.epoch,
                         describe_map(slot_map), extra={"map_epoch": slot_map.epoch})
            server = self.served()
            if server is not None:
                try:
                    server.slots.adopt(slot_map)
                except ValueError as exc:  # (another slot count: rsd did not write it)
                    log.error("cluster %s: slot map epoch %d not adopted: %s", self.cluster,
                              slot_map.epoch, exc)
                else:
                    server.moves.imports.adopted()

    async def _stop_watching_map(self) -> None:
        task, self._map_watch = self._map_watch, None
        if task is not None:
            task.cancel()
            await asyncio.wait((task,))

    async def stop(self) -> None:
        """Stop serving and following, leave etcd at once (node.py), close the channel."""
        assert self.node is not None and self.store is not None
        await self._stop_watching_map()
        await self.node.stop()
        await self.store.close()

    async def abandon(self) -> None:
        await self._stop_watching_map()
        node = self.node
        if node is not None:  # nothing was served: the journals' stops are clean
            node.follower.close()
            if node.own is not None:
                node.own.journal.close()
        if self.store is not None:
            await self.store.close()


def describe_map(slot_map: SlotMap) -> str:
    """Each shard's slots, ranges and primary, in one line (the log's)."""
    parts = []
    for entry in slot_map.shards():
        count = sum(hi - lo + 1 for lo, hi in entry.ranges)
        spans = ",".join(f"{lo}-{hi}" for lo, hi in entry.ranges) or "none"
        parts.append(f"{entry.shard} {count} slots ({spans}) primary {entry.primary or '-'}")
    return "; ".join(parts)


def _follow_tls(args: Settings) -> ssl.SSLContext | str | None:
    """When the nodes speak TLS: the context a standby follows its primary with (this
    node's certificate, the cluster's CAs); or why it cannot be made."""
    if args.tls_cert is None or args.tls_key is None:
        return None
    try:
        context = ssl.create_default_context(cafile=args.cluster_ca)
        context.load_cert_chain(args.tls_cert, args.tls_key)
    except (OSError, ssl.SSLError) as exc:
        return f"cannot make the TLS context to follow a primary: {exc}"
    return context


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
