"""Hostile connections against a real rsd, for the suite and for ``bench.fuzz``.

Each connection sends, in one stream, a HELLO (fuzzed one time in five), then requests
with right and wrong args (support/fuzz.py); two connections in five are hostile: wrong-
shaped frames among the requests, and the whole stream damaged four times in ten. At the
end comes a PING with a request id of its own (the sentinel). It reads while it sends (a
server that stops reading a connection whose output is not taken would otherwise stall
both). What it must get back, checked message by message:

- every message well formed: a reply, an error with a code in ``ErrorCode`` and never
  INTERNAL, or a push; an error for a request with a code protocol.md lists for requests;
- then either the sentinel's answer or a connection-level error (request id 0) of a code
  protocol.md lists for connections, followed by the end of the stream and nothing else;
- on an undamaged stream that reached its sentinel, every request answered: those still
  open can only be waits, or replies held for an fsync (a PING's reply, the sentinel's,
  leaves ahead of them: rsd/wire/output.py), and are cancelled (CANCEL: it ends a wait,
  and changes nothing else); every one of them, the second sentinel and the CANCELs
  are answered then.

A broken promise is returned as a problem (text), never raised, so a long run lists them
all. ``token`` is put in every HELLO that is not fuzzed, for a server with a tokens file.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from typing import Any

from rsproto import PROTOCOL_VERSION, ErrorCode, Kind, Op

from . import fuzz
from .fuzz import Known, Tally
from .raw import RawConn, raw_connect

__all__ = ["Bystander", "fuzz_connection", "fuzz_server"]

SENTINEL = 2**62  # the final PING's request id; the second one is SENTINEL + 1
REQUEST_CODES = fuzz.documented_codes("request") - {"INTERNAL"}
CONNECTION_CODES = fuzz.documented_codes("connection")
CODES = frozenset(code.value for code in ErrorCode)


def _wrong(msg: Any) -> str | None:
    """What is wrong with a message from the server, if anything."""
    if type(msg) is not list or not msg or msg[0] not in (Kind.REPLY, Kind.ERROR, Kind.PUSH):
        return f"not a server message: {msg!r:.200}"
    if msg[0] == Kind.ERROR:
        if len(msg) != 5 or msg[2] not in CODES or not isinstance(msg[3], str):
            return f"malformed error: {msg!r:.200}"
        codes = CONNECTION_CODES if msg[1] == 0 else REQUEST_CODES
        if msg[2] not in codes:
            return f"error code {msg[2]} not documented for this use: {msg!r:.200}"
    return None


async def _send(conn: RawConn, data: bytes, rng: random.Random) -> None:
    """Write ``data`` in random pieces; a server that closed first ends the sending."""
    with contextlib.suppress(ConnectionError, OSError):
        pos = 0
        while pos < len(data):
            step = rng.choice([7, 100, 4096, 65_536, len(data)])
            conn.writer.write(data[pos:pos + step])
            pos += step
            await conn.writer.drain()


class _Reader:
    """The answers of one connection, read up to a sentinel or the end."""

    def __init__(self, conn: RawConn, known: Known, tally: Tally, timeout: float) -> None:
        self.conn = conn
        self.known = known
        self.tally = tally
        self.timeout = timeout
        self.answered: set[int] = set()
        self.closed_with: str | None = None

    async def until(self, *rids: int) -> str | None:
        """Read until each of ``rids`` is answered or the connection ends; a problem or
        None."""
        while not self.answered.issuperset(rids):
            try:
                msg = await self.conn.recv(self.timeout)
            except EOFError:
                if self.closed_with is None:
                    return "the connection ended without an answer or an error frame"
                return None
            except TimeoutError:
                missing = sorted(set(rids) - self.answered)[:5]
                return f"no answer within {self.timeout} s (waiting for {missing})"
            problem = _wrong(msg)
            if problem:
                return problem
            if self.closed_with is not None:
                return f"a message after the connection error: {msg!r:.200}"
            if msg[0] == Kind.PUSH:
                continue
            rid = msg[1]
            if msg[0] == Kind.ERROR:
                self.tally.refusals[msg[2]] += 1
                if rid == 0:
                    self.closed_with = msg[2]
                    continue
            else:
                self.tally.answered += 1
                self.known.learn(msg[2])
            self.answered.add(rid)
        return None


async def fuzz_connection(
    address: str, rng: random.Random, known: Known, tally: Tally, *, frames: int = 40,
    token: str | None = None, timeout: float = 15.0,
) -> str | None:
    """One hostile connection (see the module's docstring); a problem or None."""
    conn = await raw_connect(address)
    tally.connections += 1
    try:
        return await _exchange(conn, rng, known, tally, frames, token, timeout)
    finally:
        conn.close()


async def _exchange(
    conn: RawConn, rng: random.Random, known: Known, tally: Tally, frames: int,
    token: str | None, timeout: float,
) -> str | None:
    hello = fuzz.hello(rng, token) if rng.random() < 0.2 else {
        "version": PROTOCOL_VERSION, "holder": f"fuzz-{rng.randrange(9)}",
        **({} if token is None else {"token": token}),
    }
    parts = [fuzz.encode_request(1, Op.HELLO, hello)]
    tracked = {1}
    hostile = rng.random() < 0.4  # else every frame is a request: each one is executed
    for rid in range(2, frames + 2):
        if not hostile or rng.random() < 0.7:
            op, args = fuzz.request(rng, known, map_args=False)
            parts.append(fuzz.encode_request(rid, op, args))
            tracked.add(rid)
        else:
            parts.append(fuzz.frame(fuzz.hostile_body(rng, known)))
    data = b"".join(parts)
    damaged = hostile and rng.random() < 0.4
    if damaged:
        data = fuzz.mutated(rng, data)
    data += fuzz.encode_request(SENTINEL, Op.PING, {})
    tally.inputs += frames + 2
    reader = _Reader(conn, known, tally, timeout)
    sender = asyncio.ensure_future(_send(conn, data, rng))
    try:
        problem = await reader.until(SENTINEL)
        if problem or reader.closed_with is not None or damaged:
            return problem
        open_ = sorted(tracked - reader.answered)  # waits, or replies held: cancel them
        cancels = []
        for index, rid in enumerate(open_):
            cancels.append(SENTINEL + 2 + index)
            await conn.send(fuzz.encode_request(cancels[-1], Op.CANCEL, {"request": rid}))
        await conn.send(fuzz.encode_request(SENTINEL + 1, Op.PING, {}))
        problem = await reader.until(SENTINEL + 1, *open_, *cancels)
        if problem is None and reader.closed_with is not None:
            problem = f"closed with {reader.closed_with} after valid requests only"
        return problem
    finally:
        sender.cancel()
        with contextlib.suppress(BaseException):
            await sender


async def fuzz_server(
    address: str, seed: int, tally: Tally, *, connections: int, concurrency: int = 32,
    frames: int = 40, token: str | None = None, timeout: float = 15.0,
    enough: Callable[[], bool] | None = None,
) -> list[str]:
    """``connections`` hostile connections, ``concurrency`` at a time (fewer if
    ``enough()`` becomes true first); their problems."""
    known = Known()
    problems: list[str] = []
    queue = iter(range(connections))

    async def worker() -> None:
        for number in queue:
            if enough is not None and enough():
                return
            rng = random.Random(seed * 1_000_003 + number)
            try:
                problem = await fuzz_connection(address, rng, known, tally, frames=frames,
                                                token=token, timeout=timeout)
            except Exception as exc:  # the connection itself failed: a problem too
                tally.unhandled += 1
                problem = f"{type(exc).__name__}: {exc}"
            if problem:
                problems.append(f"connection {number} (seed {seed}): {problem}")

    await asyncio.gather(*(worker() for _ in range(min(concurrency, connections))))
    return problems


class Bystander:
    """A well-behaved client beside the fuzzing: it PINGs every ``interval`` and records
    how long each answer took; a PING unanswered within ``limit`` seconds is a problem."""

    def __init__(self, conn: RawConn, interval: float = 0.02, limit: float = 5.0) -> None:
        self.conn = conn
        self.interval = interval
        self.limit = limit
        self.latencies: list[float] = []
        self.problem: str | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._stopping:
            began = loop.time()
            try:
                reply = await self.conn.call(Op.PING, {}, timeout=self.limit)
            except Exception as exc:
                self.problem = f"the bystander's PING failed: {type(exc).__name__} {exc}"
                return
            if reply[0] != Kind.REPLY:
                self.problem = f"the bystander's PING was refused: {reply!r}"
                return
            self.latencies.append(loop.time() - began)
            await asyncio.sleep(self.interval)

    async def stop(self) -> None:
        """Stop after the PING in flight is answered (never cancel it halfway: its answer
        would then be read as the answer to the connection's next request)."""
        if self._task is not None:
            self._stopping = True
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.limit + 1)
            except BaseException:
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
