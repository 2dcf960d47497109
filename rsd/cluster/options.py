"""The cluster's settings, in plain Python (no gRPC is loaded by importing this module):
the etcd endpoints and the gRPC target they make, the names, TLS, and their check taken
together.

The options themselves belong in rsd's one table (rsd/options.py), which this module does
not import (so that table may import this one):

- ``--etcd HOST:PORT,...`` (PATH kind, default None): every etcd member; without it, rsd
  is one node alone, as before, and the options below are ignored;
- ``--cluster NAME`` (default "rsd"): the cluster's keys are ``/rsd/<NAME>/`` in etcd;
- ``--node-name NAME`` (default None: the host name), unique in the cluster;
- ``--cluster-lease-seconds`` (INTEGER, ``LEASE_SECONDS``, 2 to 60): this node's etcd
  lease; a dead primary is replaced about this long after its last keep-alive, and a
  primary cut off from etcd stops acting before it ends;
- ``--etcd-cacert``, ``--etcd-cert``, ``--etcd-key`` (PATH): TLS to etcd as soon as one
  is given (``etcd_tls``); cert and key together.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LEASE_RANGE",
    "LEASE_SECONDS",
    "NAME_RULE",
    "EtcdTls",
    "cluster_option_problem",
    "endpoint_host",
    "etcd_tls",
    "grpc_target",
    "parse_endpoints",
    "tls_problem",
    "valid_name",
]

LEASE_SECONDS = 5  # --cluster-lease-seconds' default
LEASE_RANGE = (2, 60)  # etcd grants no lease under ~1.5 election timeouts (2 s by default)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
NAME_RULE = "1 to 63 letters, digits, '.', '-' or '_', starting with a letter or digit"


@dataclass(frozen=True)
class EtcdTls:
    """TLS to etcd: ``cacert`` verifies the members (None: the system's roots), ``cert``
    and ``key`` are this node's client certificate (both or neither). ``server_name`` is
    the name checked in every member's certificate (default: the first endpoint's host;
    an IP address is matched against the certificate's IP addresses)."""

    cacert: str | None = None
    cert: str | None = None
    key: str | None = None
    server_name: str | None = None


def etcd_tls(cacert: str | None, cert: str | None, key: str | None) -> EtcdTls | None:
    """TLS to etcd if any of its options is given, else None."""
    if cacert is None and cert is None and key is None:
        return None
    return EtcdTls(cacert=cacert, cert=cert, key=key)


def tls_problem(cacert: str | None, cert: str | None, key: str | None) -> str | None:
    """What is wrong with the etcd TLS options taken together, or None."""
    if bool(cert) != bool(key):
        return "--etcd-cert and --etcd-key go together: give both, or neither"
    return None


def valid_name(name: str) -> bool:
    """A cluster or node name (a part of an etcd key): ``NAME_RULE``."""
    return _NAME.fullmatch(name) is not None


def parse_endpoints(text: str) -> list[str]:
    """``HOST:PORT[,HOST:PORT...]`` as a list; ValueError naming what is wrong."""
    endpoints = [part.strip() for part in text.split(",") if part.strip()]
    if not endpoints:
        raise ValueError("no etcd endpoint given: HOST:PORT[,HOST:PORT...]")
    for endpoint in endpoints:
        host, sep, port = endpoint.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
            raise ValueError(f"etcd endpoint {endpoint!r} is not HOST:PORT")
    return endpoints


def endpoint_host(endpoint: str) -> str:
    """The host of ``HOST:PORT`` (an IPv6 address without its brackets)."""
    return endpoint.rpartition(":")[0].strip("[]")


def _family(host: str) -> int | None:
    """4 or 6 for an IP literal, None for a name."""
    try:
        return ipaddress.ip_address(host).version
    except ValueError:
        return None


def grpc_target(endpoints: Sequence[str]) -> str:
    """One gRPC target for every endpoint: ``ipv4:A:P,B:P`` for IPv4 literals,
    ``ipv6:[A]:P,...`` for IPv6 ones, or one DNS name (which may resolve to every
    member). ValueError for a mix, or for several names (gRPC has no target for those)."""
    hosts = [endpoint_host(endpoint) for endpoint in endpoints]
    families = {_family(host) for host in hosts}
    if families == {4}:
        return "ipv4:" + ",".join(endpoints)
    if families == {6}:
        return "ipv6:" + ",".join(f"[{host}]:{endpoint.rpartition(':')[2]}"
                                  for host, endpoint in zip(hosts, endpoints, strict=True))
    if families == {None} and len(endpoints) == 1:
        return endpoints[0]
    raise ValueError(
        "etcd endpoints must all be IPv4 addresses, all IPv6 addresses, or one DNS name "
        f"(that may resolve to every member): got {', '.join(endpoints)}"
    )


def cluster_option_problem(
    etcd: str | None,
    cluster: str,
    node_name: str | None,
    lease_seconds: int,
    cacert: str | None,
    cert: str | None,
    key: str | None,
) -> str | None:
    """What is wrong with the cluster options taken together, or None (also when
    ``etcd`` is None: the others are then ignored)."""
    if etcd is None:
        return None
    try:
        grpc_target(parse_endpoints(etcd))
    except ValueError as exc:
        return f"--etcd: {exc}"
    for flag, name in (("--cluster", cluster), ("--node-name", node_name)):
        if name is not None and not valid_name(name):
            return f"{flag} {name!r}: {NAME_RULE}"
    low, high = LEASE_RANGE
    if not low <= lease_seconds <= high:
        return f"--cluster-lease-seconds must be from {low} to {high}, got {lease_seconds}"
    return tls_problem(cacert, cert, key)
