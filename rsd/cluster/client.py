"""How rsd reaches etcd: one gRPC channel over every member's address, with or without TLS.

What always holds:
- the channel is given every member (``ipv4:A,B,C``, one gRPC target for a list of
  addresses; pick_first tries them in order), never one alone: a channel on a single
  member keeps failing through gRPC's reconnect backoff after that member comes back;
- a member that answers but cannot serve (cut off from its cluster: "no leader"; or two
  failed calls in a row) is left for the next: ``Link`` opens a new channel with the
  list turned by one, at most once per call timeout, and closes the old one once no call
  can still be running on it (its watch ends with it and is made again). Every node is
  given the members in the same order; without this, one member cut off from the others
  would hold every node, and no primary could be elected;
- the channel pings every second and drops a connection whose ping goes unanswered for
  the call timeout (``CHANNEL_OPTIONS``, ``open_client``): a ping is a round trip, and
  etcd may be as far as that (options.call_timeout_for), so a hung member (SIGSTOP, a
  dead host) is left for the next one within a second + the call timeout (2 s up to a
  lease of 3.75 s, 2.4 s for the default 5 s). etcd must allow such pings: start every
  member with ``--grpc-keepalive-min-time=1s`` (its default, 5 s, answers a 1 s ping with
  GOAWAY ``too_many_pings``, which ends every idle watch);
- every call carries ``hasleader: true``: a member cut off from its cluster's leader
  refuses calls at once ("no leader") and ends its watches within a few election
  timeouts, instead of waiting on a leader that does not come;
- every call has a deadline (``EtcdStore``'s call timeout), and every failure to get an
  answer is an ``EtcdError``;
- aetcd 1.0.0 (pinned) has no TLS: ``Client.connect`` is replaced by one that opens a
  secure channel when given credentials and an insecure one otherwise. It fills the same
  attributes aetcd's own ``connect`` does (the stubs, the watcher); a new aetcd may rename
  them, hence the pin.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from typing import Any

import aetcd
import grpc
from aetcd import rpc, watcher

from .options import EtcdTls, endpoint_host, grpc_target

__all__ = [
    "CHANNEL_OPTIONS",
    "EtcdClient",
    "EtcdError",
    "Link",
    "channel_credentials",
    "open_client",
]

log = logging.getLogger("rsd")

# gRPC keepalive: ping every second, also while no call is running (an idle watch); a
# connection whose ping is not answered within the call timeout is given up
# (grpc.http2.ping_timeout_ms, set by open_client, is the one that acts;
# keepalive_timeout_ms had no effect in grpcio 1.85).
# A member that could not be reached is tried again within a second, not after gRPC's
# backoff, which grows to two minutes: a node that waited for etcd (clustermode.py) would join
# that late after etcd came up.
CHANNEL_OPTIONS: dict[str, Any] = {
    "grpc.keepalive_time_ms": 1000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.max_pings_without_data": 0,
    "grpc.max_reconnect_backoff_ms": 1000,
}
# etcd's rpctypes.MetadataRequireLeaderKey: refuse (UNAVAILABLE, "no leader") on a member
# that has lost its leader.
REQUIRE_LEADER = (("hasleader", "true"),)
NO_LEADER = "no leader"  # in etcd's answer when a member has lost its leader
FAILURES_TO_MOVE = 2  # failed calls in a row before the channel moves to the next member


class EtcdError(Exception):
    """etcd could not be used: not reached in time, refused the call, or holds under
    rsd's prefix what rsd did not write. The state in etcd is unknown to the caller."""


def channel_credentials(tls: EtcdTls) -> grpc.ChannelCredentials:
    """The channel credentials of ``tls``, from its files as they are now (OSError if one
    cannot be read)."""

    def read(path: str | None) -> bytes | None:
        if path is None:
            return None
        with open(path, "rb") as file:
            return file.read()

    return grpc.ssl_channel_credentials(
        root_certificates=read(tls.cacert),
        private_key=read(tls.key),
        certificate_chain=read(tls.cert),
    )


class EtcdClient(aetcd.Client):  # type: ignore[misc]  # aetcd has no type information
    """aetcd's client on a channel of our making (see the module docstring)."""

    def __init__(
        self, target: str, credentials: grpc.ChannelCredentials | None, timeout: float,
        options: dict[str, Any],
    ) -> None:
        super().__init__(timeout=timeout, options=options)
        self._target = target
        self._credentials = credentials

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        options = list(self._options.items())
        if self._credentials is None:
            self.channel = rpc.insecure_channel(self._target, options=options)
        else:
            self.channel = rpc.secure_channel(self._target, self._credentials, options=options)
        self.metadata = REQUIRE_LEADER
        self.kvstub = rpc.KVStub(self.channel)
        self.clusterstub = rpc.ClusterStub(self.channel)
        self.leasestub = rpc.LeaseStub(self.channel)
        self.maintenancestub = rpc.MaintenanceStub(self.channel)
        self._watcher = watcher.Watcher(
            rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
        )
        self._connected.set()

    async def ready(self) -> None:
        """Until the channel has a connection to a member (no deadline of its own)."""
        await self.connect()
        await self.channel.channel_ready()


def open_client(
    endpoints: Sequence[str], call_timeout: float, tls: EtcdTls | None
) -> EtcdClient:
    """An aetcd client on every endpoint (its channel opens lazily, at the first call),
    whose calls and pings wait ``call_timeout`` for their answers. ValueError for
    endpoints no gRPC target can hold, OSError for unreadable TLS files."""
    target = grpc_target(endpoints)
    options = {**CHANNEL_OPTIONS, "grpc.http2.ping_timeout_ms": round(call_timeout * 1000)}
    credentials = None
    if tls is not None:
        credentials = channel_credentials(tls)
        options["grpc.ssl_target_name_override"] = tls.server_name or endpoint_host(endpoints[0])
    return EtcdClient(target, credentials, call_timeout, options)


class Link:
    """The way to etcd: one client at a time on every member, moved on to the next member
    when the one it is on cannot serve (see the module docstring). Call ``client()`` for
    each call and report how it went (``succeeded``, ``failed``)."""

    def __init__(self, endpoints: Sequence[str], call_timeout: float, tls: EtcdTls | None,
                 name: str) -> None:
        self.order = list(endpoints)
        self.call_timeout = call_timeout
        self.tls = tls
        self.name = name  # for the log
        self.moves = 0
        self._client: EtcdClient | None = None
        self._failures = 0
        self._moved_at = -math.inf
        self._retiring: set[asyncio.Task[None]] = set()

    def client(self) -> EtcdClient:
        if self._client is None:
            self._client = open_client(self.order, self.call_timeout, self.tls)
        return self._client

    def succeeded(self) -> None:
        self._failures = 0

    def failed(self, why: str) -> None:
        self._failures += 1
        if NO_LEADER not in why and self._failures < FAILURES_TO_MOVE:
            return
        now = asyncio.get_running_loop().time()
        if self._client is None or len(self.order) < 2 or now - self._moved_at < self.call_timeout:
            return
        old, self._client = self._client, None
        self._moved_at, self._failures = now, 0
        self.order = self.order[1:] + self.order[:1]
        self.moves += 1
        log.info("%s: etcd channel moved to %s first (%s)", self.name, self.order[0], why)
        task = asyncio.get_running_loop().create_task(self._retire(old))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def _retire(self, old: EtcdClient) -> None:
        """Close ``old`` once every call begun on it has met its deadline."""
        try:
            await asyncio.sleep(self.call_timeout + 0.5)
        finally:
            await old.close()

    async def close(self) -> None:
        """Close the client, and those being retired, now."""
        for task in list(self._retiring):
            task.cancel()
        client, self._client = self._client, None
        if client is not None:
            await client.close()
        if self._retiring:
            await asyncio.wait(self._retiring)
