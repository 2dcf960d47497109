"""Who holds the HTTP listener's places, and whose place a newcomer takes. httpserver.py
asks and performs (aborts the displaced); this module decides. No sockets, no clock: the
listener says when a holder's request is whole and when a loop turn has passed.

Why: a slowloris holds places by never finishing its request. The shares per peer and
per network (``ratelimit.peer_keys``) bound what one host or one network holds, but an
attacker with many networks (64 /24s, one connection each), or with several addresses in
the scraper's own /24, fills every place within the shares, and a scraper found none
(issue 30: 1 of 24 scrapes served, 0 of 24 with 128 networks). So, as servers defend
against slowloris, the slow pay and the prompt do not: a place whose request is still
unfinished is the one a newcomer takes, the one that has waited longest for its request
first. A request that arrives promptly is whole before anyone can take its place, and a
whole request is never displaced for a newcomer while an unfinished one can go.

What always holds:
- at most ``most`` holders; at most ``per_peer`` with one peer key (an IPv4 address, an
  IPv6 /64) and ``per_network`` with one network key (an IPv4 /24, an IPv6 /56);
- a newcomer whose peer holds its share takes the place of that peer's slowest holder
  (the oldest whose request is unfinished); one whose network holds its share, that
  network's slowest; when every place is taken, the slowest of the network holding the
  most places among those with an unfinished request (so a churn of newcomers from a few
  networks displaces those networks' own slow ones first; ties: the oldest goes);
- a holder is slow (displaceable for being unfinished) once the listener has read part
  of its request and not the whole (``heard``), or once two loop turns have begun since
  it was admitted (``new_turn``) with nothing read: a connection accepted in a burst of
  newcomers keeps its place until the listener has had a turn to read what it sent, so
  a churn of newcomers cannot displace a prompt request before its head is read;
- when every place is taken and no unfinished holder can go (every place holds a whole
  request, its answer being worked out or read slowly), a newcomer from a network holding
  at least two fewer than the network holding the most takes the place of that network's
  oldest whole request, so slow readers of many networks still share out;
- otherwise the newcomer is refused: over a share with no slow holder there, or every
  network holds about as much as its own;
- every call is O(``most``) at worst.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, KeysView
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..security.ratelimit import peer_keys

__all__ = ["Places"]

Holder = TypeVar("Holder", bound=Hashable)


@dataclass(slots=True)
class _Seat:
    peer: str
    network: str
    turn: int  # the loop turn it was admitted in
    number: int  # its admission's number: the lower, the older
    whole: bool = False  # its request has arrived whole (or was answered: an error)
    heard: bool = False  # part of its request has been read


class Places(Generic[Holder]):
    """The places of one listener and the rules for taking one."""

    def __init__(self, most: int, per_peer: int, per_network: int) -> None:
        self.most = most
        self.per_peer = per_peer
        self.per_network = per_network
        self.turn = 0
        self._admitted = 0
        self._seats: dict[Holder, _Seat] = {}  # admission order: oldest first
        self._peers: dict[str, int] = {}  # holders per peer key
        self._lines: dict[str, list[Holder]] = {}  # holders per network key, oldest first

    def __len__(self) -> int:
        return len(self._seats)

    def holders(self) -> KeysView[Holder]:
        return self._seats.keys()

    def admit(self, holder: Holder, host: str) -> tuple[bool, Holder | None]:
        """Whether ``holder`` (connected from ``host``) gets a place, and whose place it
        took (already forgotten here; the caller closes it), if anyone's."""
        peer, network = peer_keys(host)
        line = self._lines.get(network, [])
        victim: Holder | None
        if self._peers.get(peer, 0) >= self.per_peer:
            victim = self._slowest(held for held in line if self._seats[held].peer == peer)
        elif len(line) >= self.per_network:
            victim = self._slowest(line)
        elif len(self._seats) >= self.most:
            victim = self._slowest_anywhere()
            if victim is None:
                victim = self._oldest_of_a_larger_network(len(line))
        else:
            victim = None  # room within every bound
        if victim is not None:
            self.forget(victim)  # the newcomer's peer, network or the total: one less
        elif len(self._seats) >= self.most or len(line) >= self.per_network or (
                self._peers.get(peer, 0) >= self.per_peer):
            return False, None
        self._admitted += 1
        self._seats[holder] = _Seat(peer, network, self.turn, self._admitted)
        self._peers[peer] = self._peers.get(peer, 0) + 1
        self._lines.setdefault(network, []).append(holder)
        return True, victim

    def whole(self, holder: Holder) -> None:
        """``holder``'s request has arrived whole (or it is being answered an error): it
        is no longer slow. Idempotent; nothing for a holder that holds no place."""
        seat = self._seats.get(holder)
        if seat is not None:
            seat.whole = True

    def heard(self, holder: Holder) -> None:
        """Part of ``holder``'s request has been read: slow from now on, until it is
        whole. Idempotent."""
        seat = self._seats.get(holder)
        if seat is not None:
            seat.heard = True

    def new_turn(self) -> None:
        """A loop turn begins: the holders admitted two turns ago or earlier have had a
        turn to be read, and are slow from now on if nothing of their request came."""
        self.turn += 1

    def forget(self, holder: Holder) -> None:
        """``holder`` no longer holds a place (closed, or displaced). Idempotent."""
        seat = self._seats.pop(holder, None)
        if seat is None:
            return
        left = self._peers[seat.peer] - 1
        if left:
            self._peers[seat.peer] = left
        else:
            del self._peers[seat.peer]
        line = self._lines[seat.network]
        line.remove(holder)  # at most per_network long
        if not line:
            del self._lines[seat.network]

    # ---- whose place ------------------------------------------------------------------

    def _slowest(self, line: Iterable[Holder]) -> Holder | None:
        """The oldest of ``line`` (oldest first) that is slow: unfinished, and heard or
        admitted two turns ago or earlier."""
        read_by = self.turn - 2
        for held in line:
            seat = self._seats[held]
            if not seat.whole and (seat.heard or seat.turn <= read_by):
                return held
        return None

    def _slowest_anywhere(self) -> Holder | None:
        """The slowest holder of the network holding the most places among those that
        have a slow one (ties: the one whose slowest is oldest)."""
        chosen: Holder | None = None
        best = (0, 0)  # (places held, -admission number of its slowest): the larger goes
        for line in self._lines.values():
            slowest = self._slowest(line)
            if slowest is None:
                continue
            rank = (len(line), -self._seats[slowest].number)
            if chosen is None or rank > best:
                chosen, best = slowest, rank
        return chosen

    def _oldest_of_a_larger_network(self, held: int) -> Holder | None:
        """The oldest whole request of the network holding the most, if that network holds
        at least two more than the newcomer's (``held``)."""
        largest = max(self._lines.values(), key=len)
        if len(largest) < held + 2:
            return None
        return next((other for other in largest if self._seats[other].whole), None)
