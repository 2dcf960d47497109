"""The two kinds of client ``bench.hostile`` runs beside an attack.

- ``Raw``: a bare connection speaking the protocol through the ``rsproto`` codec, for
  what the SDK would never send (thousands of pipelined requests, unread replies,
  garbage, half frames). Every read has a deadline, so an attack never hangs.
- the bystander (``python -m bench.hostile --bystander ADDRESS``, run as a separate
  process so that the attacker's CPU use cannot slow it): a polite SDK client that holds
  a 5 s claim, renewed by the SDK, and PINGs about every 10 ms. On each ``report`` line
  on stdin it prints, as one JSON line, what it saw since the previous report: the
  PING round trips (a PING still unanswered counts with its age), and how many times
  its lease was lost (after a loss it takes the claim again, waiting for it).
  Percentiles are corrected for coordinated omission: a PING that took T stands also
  for the PINGs that would have been sent during it, every 10 ms, which would have
  waited T - 10 ms, T - 20 ms, ... (so one stall of seconds weighs in p99 as it
  should, instead of as one sample among thousands).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
import time
from collections import deque
from typing import Any

from rsproto import MAX_FRAME_BYTES, PROTOCOL_VERSION, REQUEST, Decoder, Op, encode

__all__ = ["Raw", "bystander_main", "percentile"]

PING_EVERY = 0.01  # seconds between the end of one bystander PING and the next
BYSTANDER_LEASE = 5  # seconds: the shortest lease, the first to fall in a stall


class Raw:
    """One bare connection to rsd: frames out, decoded messages in."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = Decoder(2 * MAX_FRAME_BYTES)  # read whatever the server sends
        self.inbox: deque[Any] = deque()
        self.next_id = 1
        self.eof = False

    @classmethod
    async def open(cls, address: str, *, hello: bool = True, timeout: float = 5.0) -> Raw:
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, int(port), limit=1 << 20), timeout
        )
        conn = cls(reader, writer)
        if hello:
            msg = await conn.call(Op.HELLO, {"version": PROTOCOL_VERSION, "holder": "hostile"},
                                  timeout)
            if msg[0] != 2:
                raise RuntimeError(f"HELLO refused: {msg!r}")
        return conn

    def frame(self, op: int, args: Any) -> bytes:
        """A request frame under the next request id."""
        rid = self.next_id
        self.next_id += 1
        return encode([REQUEST, rid, op, args])

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def drain(self, timeout: float = 30.0) -> None:
        await asyncio.wait_for(self.writer.drain(), timeout)

    async def _fill(self, timeout: float) -> None:
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if not data:
            self.eof = True
            raise EOFError("rsd closed the connection")
        self.inbox.extend(self.decoder.feed(data))

    async def collect(self, count: int, timeout: float) -> list[Any]:
        """Up to ``count`` messages: all of them, or those that came before the deadline
        or the end of the connection."""
        deadline = time.monotonic() + timeout
        out: list[Any] = []
        while len(out) < count:
            while self.inbox and len(out) < count:
                out.append(self.inbox.popleft())
            if len(out) >= count:
                break
            left = deadline - time.monotonic()
            if left <= 0 or self.eof:
                break
            try:
                await self._fill(left)
            except (TimeoutError, EOFError):
                break
        return out

    async def call(self, op: int, args: Any, timeout: float = 10.0) -> Any:
        """One request and its answer ([2, id, result] or [3, id, code, ...])."""
        rid = self.next_id
        self.send(self.frame(op, args))
        await self.drain(timeout)
        deadline = time.monotonic() + timeout
        while True:
            got = await self.collect(1, max(0.0, deadline - time.monotonic()))
            if not got:
                raise TimeoutError(f"no answer to op {op} within {timeout} s")
            if got[0][1] == rid:
                return got[0]

    async def ok(self, op: int, args: Any, timeout: float = 10.0) -> Any:
        msg = await self.call(op, args, timeout)
        if msg[0] != 2:
            raise RuntimeError(f"op {op} refused: {msg!r}")
        return msg[2]

    async def roundtrip(self, frames: list[bytes], timeout: float) -> list[Any]:
        """Send ``frames`` in one write and read as many messages back."""
        self.send(b"".join(frames))
        await self.drain(timeout)
        return await self.collect(len(frames), timeout)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.transport.abort()


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# ---- the bystander process ------------------------------------------------------------


def _omitted(took: float) -> list[float]:
    """The waits of the PINGs a stall of ``took`` seconds kept from being sent."""
    count = min(int(took / PING_EVERY), 1_000_000)
    return [took - k * PING_EVERY for k in range(1, count + 1)]


class _Window:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: list[float] = []
        self.lost = 0
        self.errors = 0
        self.pending_since: float | None = None

    def report(self) -> dict[str, Any]:
        with self.lock:
            samples, self.samples = self.samples, []
            lost, self.lost = self.lost, 0
            errors, self.errors = self.errors, 0
            if self.pending_since is not None:
                age = time.monotonic() - self.pending_since
                samples.append(age)
                samples.extend(_omitted(age))
        return {
            "pings": len(samples),
            "max_ms": 1000 * max(samples, default=float("nan")),
            "p99_ms": 1000 * percentile(samples, 0.99),
            "lost": lost,
            "errors": errors,
        }


async def _bystand(address: str, window: _Window, ready: threading.Event) -> None:
    from rsclient import AsyncRunstate  # the polite client; imported in the child only

    async with AsyncRunstate(holder="bystander", address=address) as rs:
        run = await rs.scopes.create()
        claim = run.claim("bystander", lease_seconds=BYSTANDER_LEASE)
        lease = await claim.acquire()
        regaining: asyncio.Task[Any] | None = None
        print("ready", flush=True)
        ready.set()
        while True:
            started = time.monotonic()
            with window.lock:
                window.pending_since = started
            try:
                await asyncio.wait_for(rs.ping(), 60)
                failed = False
            except Exception:
                failed = True
            took = time.monotonic() - started
            with window.lock:
                window.pending_since = None
                window.samples.append(took)
                window.samples.extend(_omitted(took))
                window.errors += failed
            if regaining is None and lease.is_lost:
                with window.lock:
                    window.lost += 1
                regaining = asyncio.ensure_future(claim.acquire(wait=True, timeout_ms=60_000))
            if regaining is not None and regaining.done():
                if regaining.exception() is None:
                    lease = regaining.result()
                regaining = None
            await asyncio.sleep(PING_EVERY)


def bystander_main(address: str) -> None:
    """Run the bystander until stdin closes; answer each ``report`` line with JSON."""
    window = _Window()
    ready = threading.Event()

    def commands() -> None:
        ready.wait()
        for line in sys.stdin:
            if line.strip() == "report":
                print(json.dumps(window.report()), flush=True)
        import os

        os._exit(0)  # stdin closed: the bench is done with us

    threading.Thread(target=commands, daemon=True).start()
    try:
        import uvloop

        uvloop.run(_bystand(address, window, ready))
    except ImportError:
        asyncio.run(_bystand(address, window, ready))
