"""The nodes a client may reach, and the order in which one connect tries them.

A client is given one address or a comma-separated list of them (``"h1:7420,h2:7420"``):
the nodes of one rsd cluster, of which one at a time is the primary (see protocol.md,
"Clusters"). What always holds:

- an address is ``HOST:PORT``, ``[v6]:PORT`` or ``tls://`` before either; anything else,
  an empty list or an empty entry is refused with InvalidArgumentError naming it, and a
  node listed twice is kept once, in its first place;
- a ``Route`` is the order of one connect's attempts: the node last known as the
  primary first, then the listed nodes in their order, each once per round, but the
  node the client just gave up on (its connection lost or silent: ``last``) at the end
  of every round, never first: a node that died, paused or was cut off is the least
  likely to answer, and one that accepts TCP but answers nothing (a paused process)
  would cost a whole attempt before the live nodes are tried. A redirect to it is not
  followed at once either (the nodes that name it may not know yet that it is gone): it
  keeps its place at the end of the round;
- a node that answers NOT_PRIMARY naming the primary sends the route there next, even to
  a node that is not listed (the cluster's advertised address), but at most
  ``MAX_REDIRECTS`` times in a row: one more ends the round, so redirects going round
  between nodes never spin; any other failure resets the count;
- a NOT_PRIMARY without a primary (no leader now: an election) or any other failure
  moves on to the next node of the round; when the round is over the caller pauses
  (backoff with jitter) and starts the next one;
- a node named by a redirect is reached the way its listed twin is, else the way the
  node that named it was (TLS or not), unless it carries ``tls://`` itself;
- nodes are the same node when host and port are (``Node`` compares those alone).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rsproto import sdkrules

from .errors import InvalidArgumentError

__all__ = [
    "MAX_REDIRECTS", "TLS_SCHEME", "Node", "Route", "parse_address", "parse_addresses", "resolve",
]

TLS_SCHEME = "tls://"
MAX_REDIRECTS = sdkrules.MAX_REDIRECTS  # NOT_PRIMARY redirects in a row before a pause
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``tls://HOST:PORT``; ``[v6]:PORT``) as host and port.
    InvalidArgumentError (a ValueError) for anything else, naming a scheme to drop."""
    address = address.strip()
    if address.startswith(TLS_SCHEME):
        address = address[len(TLS_SCHEME):]
    else:
        scheme = _SCHEME.match(address)
        if scheme is not None:
            raise InvalidArgumentError(
                f"address must be HOST:PORT, got {address!r} (drop the {scheme.group(0)!r})"
            )
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgumentError(f"address must be HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True, slots=True)
class Node:
    """One node's address: host, port, and whether it is reached over TLS."""

    host: str
    port: int
    tls: bool = field(default=False, compare=False)

    @classmethod
    def parse(cls, address: str) -> Node:
        """The node of one ``HOST:PORT`` or ``tls://HOST:PORT`` (InvalidArgumentError
        for anything else, a port outside 1-65535 included)."""
        host, port = parse_address(address)
        if not 0 < port < 65536:
            raise InvalidArgumentError(
                f"address must be HOST:PORT with a port from 1 to 65535, got {address.strip()!r}"
            )
        return cls(host, port, address.strip().startswith(TLS_SCHEME))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_addresses(text: str) -> tuple[Node, ...]:
    """The nodes of ``"HOST:PORT"`` or ``"HOST:PORT,HOST:PORT,..."`` in their order, each
    once (see the module docstring)."""
    if not isinstance(text, str) or not text.strip():
        raise InvalidArgumentError(f"address must be HOST:PORT, got {text!r}")
    entries = text.split(",")
    nodes: list[Node] = []
    for entry in entries:
        if not entry.strip():
            raise InvalidArgumentError(
                f"address must be HOST:PORT or a comma-separated list of them, got {text!r} "
                "(an empty entry)"
            )
        node = Node.parse(entry)
        if node not in nodes:
            nodes.append(node)
    return tuple(nodes)


class Route:
    """The order of one connect's attempts over ``nodes`` (see the module docstring)."""

    __slots__ = ("_next", "_redirects", "_round", "last", "nodes", "primary")

    def __init__(
        self, nodes: tuple[Node, ...], primary: Node | None, last: Node | None = None
    ) -> None:
        self.nodes = nodes
        self.primary = primary  # the node last known as primary (or named as it)
        self.last = last  # the node just given up on: tried last in every round
        self._round: list[Node] = []  # what is left of this round, next one last
        self._next: Node | None = None  # a node to try before the rest of the round
        self._redirects = 0
        self.new_round()

    def new_round(self) -> None:
        """Start a round: the known primary first, then every listed node, the node just
        given up on last."""
        first, last = self.primary, self.last
        if first == last:
            first = None
        order = [first] if first is not None else []
        order += [node for node in self.nodes if node != first and node != last]
        if last is not None:
            order.append(last)
        self._round = order[::-1]
        self._next = None
        self._redirects = 0

    def next(self) -> Node | None:
        """The node to try now; None once the round is over."""
        node, self._next = self._next, None
        if node is not None:
            return node
        return self._round.pop() if self._round else None

    def again(self, node: Node) -> None:
        """Try ``node`` once more next (it asked to be retried after a pause)."""
        self._next = node

    def failed(self) -> None:
        """An attempt failed some other way than by a redirect: the count starts over."""
        self._redirects = 0

    def redirect(self, by: Node, primary: object) -> bool:
        """``by`` answered NOT_PRIMARY naming ``primary`` (None: it knows none). True if
        the route goes there next; False if not: none named or the node given up on
        named (the round goes on), or one redirect too many in a row (the round is
        over)."""
        target = resolve(self.nodes, by, primary)
        self.primary = target
        if target is None or target == self.last:  # (the node given up on: in its place)
            self._redirects = 0
            return False
        self._redirects += 1
        if self._redirects > MAX_REDIRECTS:
            self._round = []
            return False
        self._next = target
        return True


def resolve(nodes: tuple[Node, ...], by: Node, primary: object) -> Node | None:
    """The node that ``primary`` is, as ``by`` named it in a NOT_PRIMARY answer (the
    listed node of that host and port, else a node reached as ``by`` is); None if it
    names none (nil, or not an address)."""
    if not isinstance(primary, str) or not primary.strip():
        return None
    try:
        named = Node.parse(primary)
    except InvalidArgumentError:
        return None
    for node in nodes:
        if node == named:
            return node
    if not named.tls and by.tls:
        named = Node(named.host, named.port, True)
    return named
