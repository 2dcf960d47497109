"""The cluster's settings, in plain Python (no gRPC is loaded by importing this module):
the etcd endpoints and the gRPC target they make, the names, TLS, their check taken
together, and how long a call to etcd may take (``call_timeout_for`` the lease).

The options themselves belong in rsd's one table (rsd/options.py), which this module does
not import (so that table may import this one):

- ``--etcd ENDPOINT,...`` (default None): every etcd member, each ``HOST:PORT``,
  ``http://HOST:PORT`` or ``https://HOST:PORT`` (etcd's own form, as ``etcdctl
  --endpoints`` takes it); without it, rsd is one node alone, as before, and the options
  below are ignored;
- ``--cluster NAME`` (default "rsd"): the cluster's keys are ``/rsd/<NAME>/`` in etcd;
- ``--node-name NAME`` (default None: the host name), unique in the cluster;
- ``--cluster-lease-seconds`` (INTEGER, ``LEASE_SECONDS``, 2 to 60): this node's etcd
  lease; a dead primary is replaced about this long after its last keep-alive, and a
  primary cut off from etcd stops acting before it ends; every call to etcd may take
  ``call_timeout_for`` it, which is also how far etcd may be;
- ``--etcd-cacert``, ``--etcd-cert``, ``--etcd-key`` (PATH): TLS to etcd as soon as one
  is given, or the endpoints are ``https://`` (``etcd_tls``); cert and key together, and
  none of them with ``http://`` endpoints (``tls_problem``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "LEASE_MARGIN",
    "LEASE_RANGE",
    "LEASE_SECONDS",
    "MIN_CALL_TIMEOUT",
    "NAME_RULE",
    "Endpoints",
    "EtcdTls",
    "call_timeout_for",
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
# How much earlier than a keep-alive's send time + TTL a primary's leadership ends
# (etcd.py: EtcdStore's ``margin``).
LEASE_MARGIN = 0.5
KEEP_ALIVES_PER_LEASE = 3  # elector.py sends a keep-alive a third of the lease after the last
MIN_CALL_TIMEOUT = 1.0  # seconds: the least a call to etcd is given, whatever the lease
SCHEMES = ("http", "https")
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


@dataclass(frozen=True)
class Endpoints:
    """``--etcd`` as given: every member's ``HOST:PORT``, and the scheme the endpoints
    were written with: "http" (no TLS), "https" (TLS), or None (bare ``HOST:PORT``: TLS
    as the TLS options say)."""

    addresses: list[str]
    scheme: str | None = None


def call_timeout_for(lease_seconds: float, margin: float = LEASE_MARGIN) -> float:
    """How long a call to etcd waits for its answer, for a cluster lease of
    ``lease_seconds``: ``max(MIN_CALL_TIMEOUT, (lease - margin - lease / 3) / 2)``, 1.42 s
    for the default 5 s lease (1 s up to a lease of 3.75 s, 3.08 s for 10 s).

    Why: a primary leads until the send time of its last answered keep-alive + the lease
    - ``margin`` (etcd.py), and it sends the next keep-alive a third of the lease after
    that answer (elector.py). So the lease less the margin must hold that third and two
    round trips: the answered keep-alive's own and the next one's. Each may take half of
    what is left, and no more: a keep-alive answered later keeps no primary, however it
    goes, so waiting longer for any call serves nothing, and a member that has not
    answered by then (hung, or cut off) is left for another the soonest (client.py: the
    channel's pings wait as long). It is therefore also how far etcd may be: a round trip
    up to it keeps a primary; farther, a longer lease is needed (docs/cluster.md says so).

    Never under ``MIN_CALL_TIMEOUT``: under a lease of about 3.75 s the formula asks for
    less than a loaded etcd may take to answer a write (it fsyncs first), and each call
    that times out is sent again, or moves the channel to another member; a lease that
    short keeps a primary only with etcd near."""
    keep_alive_wait = lease_seconds / KEEP_ALIVES_PER_LEASE
    return max(MIN_CALL_TIMEOUT, (lease_seconds - margin - keep_alive_wait) / 2)


def etcd_tls(
    cacert: str | None, cert: str | None, key: str | None, scheme: str | None = None
) -> EtcdTls | None:
    """TLS to etcd if the endpoints are ``https://`` (``scheme``) or any TLS option is
    given, else None (``tls_problem`` refuses TLS options with ``http://`` endpoints)."""
    if scheme != "https" and cacert is None and cert is None and key is None:
        return None
    return EtcdTls(cacert=cacert, cert=cert, key=key)


def tls_problem(
    cacert: str | None, cert: str | None, key: str | None, scheme: str | None = None
) -> str | None:
    """What is wrong with the etcd TLS options taken together, and with the endpoints'
    ``scheme``, or None."""
    if bool(cert) != bool(key):
        return "--etcd-cert and --etcd-key go together: give both, or neither"
    if scheme == "http" and (cacert or cert or key):
        given = ", ".join(flag for flag, value in (
            ("--etcd-cacert", cacert), ("--etcd-cert", cert), ("--etcd-key", key)) if value)
        return (f"--etcd gives http:// endpoints (no TLS), but {given} asks for TLS to "
                "etcd: write them https:// (or HOST:PORT), or leave out the TLS options")
    return None


def valid_name(name: str) -> bool:
    """A cluster or node name (a part of an etcd key): ``NAME_RULE``."""
    return _NAME.fullmatch(name) is not None


ENDPOINT_FORMS = "HOST:PORT, http://HOST:PORT or https://HOST:PORT"


def _endpoint(text: str) -> tuple[str, str | None]:
    """One endpoint's ``HOST:PORT`` and scheme (None: none written); ValueError."""
    address, scheme = text, None
    if "://" in text:
        written, address = text.split("://", 1)
        scheme = written.lower()
        if scheme not in SCHEMES:
            raise ValueError(f"etcd endpoint {text!r}: {written}:// is not http:// or "
                             "https://")
        if address.endswith("/"):
            address = address[:-1]  # etcd's URLs may end with the root path
        if any(part in address for part in "/?#@"):
            raise ValueError(f"etcd endpoint {text!r}: a path, query or user is not "
                             f"allowed: {ENDPOINT_FORMS}")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) <= 65535:
        raise ValueError(f"etcd endpoint {text!r} is not {ENDPOINT_FORMS} "
                         "(with a port from 1 to 65535)")
    return address, scheme


def parse_endpoints(text: str) -> Endpoints:
    """``--etcd``: endpoints separated by commas, each ``HOST:PORT``,
    ``http://HOST:PORT`` or ``https://HOST:PORT``; ValueError naming what is wrong.
    One channel reaches every member, so its endpoints are all TLS or none: http:// and
    https:// together are refused, and a bare ``HOST:PORT`` beside them takes theirs."""
    given = [part.strip() for part in text.split(",") if part.strip()]
    if not given:
        raise ValueError(f"no etcd endpoint given: {ENDPOINT_FORMS}, separated by commas")
    parsed = [_endpoint(endpoint) for endpoint in given]
    schemes = {scheme for _, scheme in parsed if scheme is not None}
    if len(schemes) > 1:
        raise ValueError("etcd endpoints mix http:// and https://: rsd reaches every member "
                         f"over one channel, all over TLS or none: got {', '.join(given)}")
    return Endpoints([address for address, _ in parsed], schemes.pop() if schemes else None)


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
    """One gRPC target for every endpoint (``HOST:PORT``): ``ipv4:A:P,B:P`` for IPv4
    literals, ``ipv6:[A]:P,...`` for IPv6 ones, or one DNS name (which may resolve to
    every member). ValueError for a mix, or for several names.

    Why not several names: one channel reaches every member (client.py), and a gRPC
    target is a list of addresses or a single name to resolve. Resolving several names
    ourselves would fix each member's address for the channel's life (gRPC resolves a
    name again when its connections fail, and a member moved to a new address would not
    be found) and would block the loop on DNS; a name that resolves to every member, or
    the members' addresses, need neither."""
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
        "(that may resolve to every member: one channel reaches them all, and gRPC takes "
        f"a list of addresses or a single name): got {', '.join(endpoints)}"
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
        endpoints = parse_endpoints(etcd)
        grpc_target(endpoints.addresses)
    except ValueError as exc:
        return f"--etcd: {exc}"
    for flag, name in (("--cluster", cluster), ("--node-name", node_name)):
        if name is not None and not valid_name(name):
            return f"{flag} {name!r}: {NAME_RULE}"
    low, high = LEASE_RANGE
    if not low <= lease_seconds <= high:
        return f"--cluster-lease-seconds must be from {low} to {high}, got {lease_seconds}"
    return tls_problem(cacert, cert, key, endpoints.scheme)
