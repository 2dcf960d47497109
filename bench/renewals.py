"""Pipelined renewals: rsd's LEASE_RENEW frames/s beside a bare uvloop msgpack echo server.

Both servers are driven by the same raw pipelined client (no SDK): it keeps --window
frames in flight on one connection, writing them in batches and counting replies. The
echo server is the ceiling for "decode a frame, encode a reply" on this machine; rsd's
figure includes the lease lookup and renewal. Also reports leases/s when one frame
carries a batch of renewals (what the SDK sends).

    .venv/bin/python -m bench.renewals [--seconds 3] [--window 512] [--batch 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections.abc import Callable
from typing import Any, cast

import rsproto as wire
from bench.harness import rsd_process
from rsproto import Kind, Op

TARGET_US_PER_RENEWAL_FRAME = 1.6  # issue 12: rsd's CPU per pipelined renewal frame


class Echo(asyncio.Protocol):
    """The baseline: decode each frame, reply with a frame echoing its id."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream's (uvloop's: no subclass)
        self.decoder = wire.Decoder()

    def data_received(self, data: bytes) -> None:
        out = [wire.reply_frame(msg[1], None) for msg in self.decoder.feed(data)]
        if out:
            self.transport.write(b"".join(out))


class Client(asyncio.Protocol):
    def __init__(self) -> None:
        self.decoder = wire.Decoder()
        self.replies = 0
        self.errors = 0
        self.waiter: asyncio.Future[None] | None = None
        self.want = 0
        self.on_reply: Callable[[Any], object] | None = None  # (uvloop caches methods)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream's (uvloop's: no subclass)

    def data_received(self, data: bytes) -> None:
        for msg in self.decoder.feed(data):
            self.replies += 1
            if msg[0] == Kind.ERROR:
                self.errors += 1
            if self.on_reply is not None:
                self.on_reply(msg)
        if self.waiter is not None and self.replies >= self.want:
            self.waiter.set_result(None)
            self.waiter = None

    async def until(self, count: int) -> None:
        self.want = count
        if self.replies < count:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter


async def connect(address: str) -> Client:
    host, _, port = address.rpartition(":")
    _, client = await asyncio.get_running_loop().create_connection(Client, host, int(port))
    return client


async def drive(client: Client, frames: list[bytes], seconds: float, window: int) -> float:
    """Keep ``window`` frames in flight for ``seconds``; returns replies per second."""
    sent = 0
    start_replies = client.replies
    started = time.perf_counter()
    stop_at = started + seconds
    chunk = max(1, window // 4)
    while time.perf_counter() < stop_at:
        burst = b"".join(frames[(sent + i) % len(frames)] for i in range(chunk))
        client.transport.write(burst)
        sent += chunk
        await client.until(start_replies + sent - window + chunk)
    await client.until(start_replies + sent)
    return (client.replies - start_replies) / (time.perf_counter() - started)


async def hello(client: Client, holder: str) -> None:
    args = {"version": wire.PROTOCOL_VERSION, "holder": holder}
    client.transport.write(wire.request_frame(1, Op.HELLO, args))
    await client.until(client.replies + 1)


async def request(client: Client, op: int, args: dict[str, Any]) -> Any:
    """One request on the connection and its reply's value; a refusal raises."""
    got: list[Any] = []
    client.on_reply = got.append
    client.transport.write(wire.request_frame(1, op, args))
    await client.until(client.replies + 1)
    client.on_reply = None
    if got[0][0] != Kind.REPLY:
        raise RuntimeError(f"{Op(op).name} refused: {got[0]}")
    return got[0][2]


async def create_scope(client: Client) -> str:
    """A fresh run id (SCOPE_CREATE) on the connection."""
    return str((await request(client, Op.SCOPE_CREATE, {}))["scope"])


async def pipelined(
    client: Client, frames: list[bytes], field: str, chunk: int = 4096
) -> list[Any]:
    """Send ``frames`` (``chunk`` in flight at most) and return ``field`` of each reply."""
    got: list[Any] = []
    client.on_reply = lambda msg: got.append(msg[2][field]) if msg[0] == Kind.REPLY else None
    for at in range(0, len(frames), chunk):
        part = frames[at:at + chunk]
        before = client.replies
        client.transport.write(b"".join(part))
        await client.until(before + len(part))
    client.on_reply = None
    return got


async def acquire_leases(client: Client, count: int, prefix: str = "k") -> list[bytes]:
    """Acquire ``count`` claims in a fresh run on the connection; returns their leases."""
    scope = await create_scope(client)
    return await pipelined(client, [
        wire.request_frame(i + 1, Op.CLAIM_ACQUIRE,
                           {"scope": scope, "key": f"{prefix}{i}", "lease_seconds": 600})
        for i in range(count)
    ], "lease")


async def echo_rate(seconds: float, window: int) -> float:
    """Frames/s of the bare echo server, in a process (so a core) of its own like rsd."""
    echo_proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "from bench.renewals import serve_echo; serve_echo()",
        stdout=asyncio.subprocess.PIPE,
    )
    assert echo_proc.stdout is not None
    try:
        echo_address = (await echo_proc.stdout.readline()).decode().strip()
        client = await connect(echo_address)
        ping = [wire.request_frame(i, Op.PING, {}) for i in range(1, 1025)]
        rate = await drive(client, ping, seconds, window)
        client.transport.close()
        return rate
    finally:
        echo_proc.terminate()
        await echo_proc.wait()


async def renewal_rates(
    address: str, seconds: float, window: int, batch: int,
    server_cpu: Callable[[], float] | None = None,
) -> tuple[float, float, int, float | None]:
    """rsd's single-lease LEASE_RENEW frames/s, lease renewals/s with ``batch`` leases per
    frame, the count of error replies (0 when every renewal was granted), and, given
    ``server_cpu`` (the rsd process's CPU seconds so far), its CPU per single-lease frame
    in microseconds."""
    client = await connect(address)
    try:
        await hello(client, "bench-renewals")
        leases = await acquire_leases(client, max(batch, 1024))
        single = [
            wire.request_frame(i + 1, Op.LEASE_RENEW, {"leases": [lease]})
            for i, lease in enumerate(leases[:1024])
        ]
        cpu_before = server_cpu() if server_cpu is not None else 0.0
        started = time.perf_counter()
        rate = await drive(client, single, seconds, window)
        frames_sent = rate * (time.perf_counter() - started)
        us = None
        if server_cpu is not None and frames_sent:
            us = (server_cpu() - cpu_before) / frames_sent * 1e6
        frames = [wire.request_frame(1, Op.LEASE_RENEW, {"leases": leases[:batch]})]
        batched = await drive(client, frames, seconds, 8) * batch
        return rate, batched, client.errors, us
    finally:
        client.transport.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--address", help="use a running rsd instead of starting one")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--window", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    echo = await echo_rate(args.seconds, args.window)
    print(f"bare uvloop msgpack echo server, pipelined (window {args.window}): "
          f"{echo:,.0f} frames/s")
    async with contextlib.AsyncExitStack() as stack:
        if args.address:
            address, server_cpu = args.address, None
        else:
            server = await stack.enter_async_context(rsd_process("--fsync", "no"))
            address, server_cpu = server.address, server.cpu_seconds
        rate, batched, errors, us = await renewal_rates(
            address, args.seconds, args.window, args.batch, server_cpu
        )
    print(f"rsd LEASE_RENEW, one lease per frame, pipelined: {rate:,.0f} frames/s "
          f"({rate / echo:.0%} of echo)")
    if us is not None:
        print(f"rsd CPU per renewal frame: {us:.2f} us "
              f"(target <= {TARGET_US_PER_RENEWAL_FRAME} us)")
    print(f"rsd LEASE_RENEW, {args.batch} leases per frame: {batched:,.0f} lease renewals/s")
    if errors:
        print(f"(errors: {errors})")


def serve_echo() -> None:
    import uvloop

    async def run() -> None:
        server = await asyncio.get_running_loop().create_server(Echo, "127.0.0.1", 0)
        print(f"127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    uvloop.run(run())


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
