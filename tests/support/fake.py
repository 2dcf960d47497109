"""Fake rsd nodes: real sockets speaking frames, answering exactly what a test scripts.

For rules of the SDK that a real rsd cannot be made to show at will: a standby's
NOT_PRIMARY, a primary stepping down between two requests, a reply that never comes.
(The same pattern as the scripted server of test_a_slowed_down_hello_is_retried_a_
refused_one_never.py, made reusable: one ``FakeNode`` per node of a fake cluster.)

What always holds:
- ``hello`` decides each HELLO's answer: ``ACCEPT``, or ``not_primary(primary)`` (the
  ERROR for the HELLO, then the connection-level error, then close, as protocol.md's
  handshake says);
- every other request goes to ``handlers[op]`` (default: ``DEFAULT_REPLIES``, else
  ``{}``), which returns a reply map, a ``Refusal`` (an ERROR frame for that request),
  ``DROP`` (the connection is cut, that request unanswered) or ``HOLD`` (no answer, the
  connection kept: a request in flight);
- everything a node saw is kept: ``hellos`` (a count), ``requests`` (op and args, in
  order), and ``greeted_at`` (the place of each of its HELLOs in the order of every
  fake node's HELLOs), so a test asserts on what the client sent where, and in which
  order it tried the nodes;
- ``pause()``: the node reads on but answers nothing, on the connections it has and on
  new ones (a paused process, SIGSTOP: its kernel still accepts connections);
- ``cluster_lease``: if set, the HELLO reply tells it (``cluster.lease_seconds``);
  ``shard``: if set, the HELLO reply tells it (``shard``: a sharded cluster's node).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rsclient import wire
from rsproto import ErrorCode, Op


@dataclass(frozen=True)
class Refusal:
    """An ERROR frame: code, message, details."""

    code: str
    message: str = "refused by the fake node"
    details: dict[str, Any] | None = None


_HELLOS = itertools.count(1)  # every fake node's HELLOs, in the order they came

ACCEPT = None  # a HELLO accepted
DROP = object()  # cut the connection instead of answering
HOLD = object()  # answer nothing, keep the connection


def not_primary(primary: str | None, epoch: int = 1) -> Refusal:
    """The NOT_PRIMARY a standby (or a primary that stepped down) answers with."""
    return Refusal(ErrorCode.NOT_PRIMARY, "this node is not the primary",
                   {"primary": primary, "epoch": epoch})


def _renewed(args: dict[str, Any]) -> dict[str, Any]:
    return {"results": [None] * len(args["leases"])}


DEFAULT_REPLIES: dict[int, Callable[[dict[str, Any]], Any]] = {
    Op.PING: lambda args: {"time": 0.0},
    Op.LEASE_RENEW: _renewed,
}


class FakeNode:
    """One fake rsd node on 127.0.0.1 (see the module docstring)."""

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.hello: Refusal | None = ACCEPT
        self.handlers: dict[int, Callable[[dict[str, Any]], Any]] = dict(DEFAULT_REPLIES)
        self.hellos = 0
        self.greeted_at: list[int] = []
        self.requests: list[tuple[int, dict[str, Any]]] = []
        self.paused = False
        self.cluster_lease: float | None = None
        self.shard: dict[str, Any] | None = None  # {"name", "slots", "map_epoch"}
        self.address = ""
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        """Listen on a free port; the node's ``HOST:PORT``."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self.address

    def ops(self) -> list[int]:
        """The op of every request this node got after HELLO, in order."""
        return [op for op, _ in self.requests]

    def pause(self) -> None:
        """Answer nothing from now on (see the module docstring)."""
        self.paused = True

    def drop(self) -> None:
        """Cut every open connection (as a node that dies does)."""
        for writer in list(self._writers):
            writer.transport.abort()

    def step_down(self, primary: str | None, epoch: int = 2) -> None:
        """Stop being the primary: connections get a connection-level NOT_PRIMARY and
        are closed; new ones get it for their HELLO."""
        refusal = not_primary(primary, epoch)
        self.hello = refusal
        for writer in list(self._writers):
            writer.write(wire.encode(
                [wire.Kind.ERROR, 0, refusal.code, refusal.message, refusal.details]
            ))
            writer.close()

    async def close(self) -> None:
        self.drop()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        decoder = wire.Decoder(wire.MAX_FRAME_BYTES)
        greeted = False
        try:
            while data := await reader.read(1 << 16):
                for _kind, rid, op, args in decoder.feed(data):
                    if not greeted:
                        assert op == Op.HELLO, f"{self.name}: first request {op}, not HELLO"
                        self.hellos += 1
                        self.greeted_at.append(next(_HELLOS))
                    if self.paused:
                        continue
                    if not greeted:
                        refusal = self.hello
                        if refusal is not None:
                            writer.write(wire.encode([wire.Kind.ERROR, rid, refusal.code,
                                                      refusal.message, refusal.details]))
                            writer.write(wire.encode([wire.Kind.ERROR, 0, refusal.code,
                                                      "handshake failed", refusal.details]))
                            writer.close()
                            return
                        greeted = True
                        info: dict[str, Any] = {
                            "version": 1, "server": f"fake/{self.name}",
                            "connection": self.hellos, "time": 0.0, "limits": {},
                            "tenant": "default", "role": "admin",
                        }
                        if self.cluster_lease is not None:
                            info["cluster"] = {"name": "fake",
                                               "lease_seconds": self.cluster_lease}
                        if self.shard is not None:
                            info["shard"] = dict(self.shard)
                        writer.write(wire.encode([wire.Kind.REPLY, rid, info]))
                        continue
                    self.requests.append((op, args))
                    handler = self.handlers.get(op)
                    answer = handler(args) if handler is not None else {}
                    if answer is DROP:
                        writer.transport.abort()
                        return
                    if answer is HOLD:
                        continue
                    if isinstance(answer, Refusal):
                        writer.write(wire.encode([wire.Kind.ERROR, rid, answer.code,
                                                  answer.message, answer.details]))
                    else:
                        writer.write(wire.encode([wire.Kind.REPLY, rid, answer]))
        except (ConnectionError, OSError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
