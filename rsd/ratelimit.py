"""Failed authentication attempts, rate-limited per peer address in bounded memory.

What always holds:
- each peer key (an IPv4 address, or the /64 prefix of an IPv6 one, since one host
  commonly owns a whole /64) has a token bucket of ``burst`` failures that refills at
  ``per_second``; a peer whose bucket is empty is refused before its token is looked at;
- the table holds at most ``max_peers`` buckets: the least recently failed one is
  forgotten first (a forgotten peer starts again with a full bucket, the cost of a
  bounded table). Only failures create entries, so well-behaved clients take no room;
- every call is O(1) and takes ``now``: no clock is read here.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict

__all__ = ["FailureLimiter", "peer_key"]


def peer_key(host: str) -> str:
    """The address a peer is limited by: IPv4 as is (also when IPv4-mapped), IPv6 by /64."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host  # not an IP address (a Unix socket): one key for it
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class FailureLimiter:
    """A token bucket of failures per peer key, in an LRU table of bounded size."""

    __slots__ = ("buckets", "burst", "evicted", "max_peers", "per_second")

    def __init__(self, burst: int, per_second: float, max_peers: int) -> None:
        if burst < 1 or per_second <= 0 or max_peers < 1:
            raise ValueError("burst and max_peers must be at least 1, per_second above 0")
        self.burst = burst
        self.per_second = per_second
        self.max_peers = max_peers
        self.buckets: OrderedDict[str, list[float]] = OrderedDict()  # key -> [left, at]
        self.evicted = 0

    def _left(self, bucket: list[float], now: float) -> float:
        left = min(self.burst, bucket[0] + (now - bucket[1]) * self.per_second)
        bucket[0], bucket[1] = left, now
        return left

    def retry_after(self, key: str, now: float) -> float:
        """0 if ``key`` may try to authenticate now; else the seconds until it may."""
        bucket = self.buckets.get(key)
        if bucket is None:
            return 0.0
        left = self._left(bucket, now)
        if left >= 1:
            return 0.0
        return (1 - left) / self.per_second

    def failed(self, key: str, now: float) -> bool:
        """Count a failure of ``key``; True if it used the last one its bucket allowed."""
        buckets = self.buckets
        bucket = buckets.get(key)
        if bucket is None:
            if len(buckets) >= self.max_peers:
                buckets.popitem(last=False)
                self.evicted += 1
            bucket = buckets[key] = [float(self.burst), now]
        else:
            buckets.move_to_end(key)
        left = self._left(bucket, now) - 1
        bucket[0] = max(0.0, left)
        return left < 1
