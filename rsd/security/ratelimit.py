"""Failed HELLOs, counted per client address and per network prefix, in bounded memory.

What always holds:
- every failure counts against two keys: its address (an IPv4 address, or the /64 of an
  IPv6 one, since one host commonly owns a whole /64) and its network (the /24 of an
  IPv4 address, the /56 of an IPv6 one), so rotating source addresses inside one network
  does not start a fresh count;
- a key's count leaks away at its kind's rate; while a count stays within its kind's
  ``free`` allowance a refusal waits for nothing, past it each failure doubles the wait,
  from ``FIRST_DELAY`` up to ``MAX_DELAY``. The wait of a refusal is the larger of its
  address's and its network's;
- nothing here refuses anyone: it only says how long the answer to a token already
  found wrong waits. A valid token never reaches this table, so no one's failures slow a
  valid token down;
- each kind holds at most ``max_keys`` counts: the least recently failed one is
  forgotten first (a forgotten key starts again from nothing, the cost of a bounded
  table). Only failures create entries, so well-behaved clients take no room;
- every call is O(1) and takes ``now``: no clock is read here.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from typing import NamedTuple

__all__ = [
    "FIRST_DELAY", "MAX_DELAY", "FailureCounts", "FailureLimiter", "PeerKeys", "delay_for",
    "peer_keys",
]

FIRST_DELAY = 0.1  # seconds the first refusal past an allowance waits; doubling from there
MAX_DELAY = 5.0  # and never more than this


class PeerKeys(NamedTuple):
    """What a peer's failures count against: its address and its network."""

    address: str
    network: str


def peer_keys(host: str) -> PeerKeys:
    """IPv4 (also IPv4-mapped): the address and its /24; IPv6: its /64 and its /56."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return PeerKeys(host, host)  # not an IP address (a Unix socket): one key for it
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is None:
            return PeerKeys(
                str(ipaddress.IPv6Network((address, 64), strict=False)),
                str(ipaddress.IPv6Network((address, 56), strict=False)),
            )
        address = address.ipv4_mapped
    return PeerKeys(str(address), str(ipaddress.IPv4Network((address, 24), strict=False)))


class FailureCounts:
    """A leaking count of failures per key, in an LRU table of bounded size."""

    __slots__ = ("counts", "evicted", "free", "max_keys", "per_second")

    def __init__(self, free: int, per_second: float, max_keys: int) -> None:
        if free < 0 or per_second <= 0 or max_keys < 1:
            raise ValueError("free must be at least 0, per_second above 0, max_keys at least 1")
        self.free = free
        self.per_second = per_second
        self.max_keys = max_keys
        self.counts: OrderedDict[str, list[float]] = OrderedDict()  # key -> [count, at]
        self.evicted = 0

    def _level(self, entry: list[float], now: float) -> float:
        return max(0.0, entry[0] - (now - entry[1]) * self.per_second)

    def failed(self, key: str, now: float) -> float:
        """Count a failure of ``key``; how far its count is now past the allowance."""
        counts = self.counts
        entry = counts.get(key)
        if entry is None:
            if len(counts) >= self.max_keys:
                counts.popitem(last=False)
                self.evicted += 1
            entry = counts[key] = [0.0, now]
        else:
            counts.move_to_end(key)
        entry[0] = self._level(entry, now) + 1
        entry[1] = now
        return entry[0] - self.free

    def over(self, key: str, now: float) -> float:
        """How far ``key``'s count is past its allowance now (0 or less: within it)."""
        entry = self.counts.get(key)
        return -self.free if entry is None else self._level(entry, now) - self.free


def delay_for(over: float) -> float:
    """The wait of a refusal whose count is ``over`` past its allowance."""
    if over <= 0:
        return 0.0
    return min(MAX_DELAY, FIRST_DELAY * 2 ** min(over - 1, 32))


class FailureLimiter:
    """The failure counts of addresses and of networks, and the wait they give a refusal."""

    __slots__ = ("addresses", "networks")

    def __init__(self, addresses: FailureCounts, networks: FailureCounts) -> None:
        self.addresses = addresses
        self.networks = networks

    def failed(self, keys: PeerKeys, now: float) -> float:
        """Count a failure from ``keys``; the seconds its refusal waits (0: none)."""
        address = self.addresses.failed(keys.address, now)
        return delay_for(max(address, self.networks.failed(keys.network, now)))

    def __len__(self) -> int:
        return len(self.addresses.counts) + len(self.networks.counts)
