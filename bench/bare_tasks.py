"""The floor of a task's client half: bench.tasks' two processes with the SDK taken out.

The same shape and the same frames as ``bench.tasks --fsync no`` (one planner process
keeping --inflight tasks submitted, each awaiting its outcome-only result; one worker
process holding --concurrency deliveries, each settled with ``take_next=1``), written
with nothing but the wire work: ``rsproto``'s codec, one future per request in a dict
keyed by request id, one ``transport.write`` per loop turn (``call_soon``), uvloop.
The planner keeps a coroutine per task in flight (as any caller of ``submit`` and
``ticket.result()`` has); the worker awaits one coroutine handler per delivery (as
``consume()``'s handler is), or with --callbacks settles from the reply's callback
with no coroutine at all. What the SDK costs on top of this is per-request
bookkeeping; what this costs is the floor any asyncio client of this protocol pays.

    .venv/bin/python -m bench.bare_tasks [--seconds 10] [--inflight 64]
                                         [--concurrency 64] [--callbacks]

Prints tasks/s and the CPU per task of rsd (--fsync no), the planner and the worker,
as bench.tasks does.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.harness import rsd_process
from rsproto import PROTOCOL_VERSION, REPLY, REQUEST, Decoder, Op, pack_body, pack_header

MAILBOX = "bench-tasks"


class Bare(asyncio.Protocol):
    """One connection: requests out (one write a loop turn), replies to futures or callbacks."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.decoder = Decoder(1 << 24, from_rsd=True)
        self.pending: dict[int, Any] = {}
        self.out: list[bytes] = []
        self.next_id = 1
        self.flushing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        pending = self.pending
        for msg in self.decoder.feed(data):
            waiter = pending.pop(msg[1])
            if msg[0] != REPLY:
                raise RuntimeError(f"refused: {msg!r}")
            if type(waiter) is asyncio.Future or isinstance(waiter, asyncio.Future):
                waiter.set_result(msg[2])
            else:
                waiter(msg[2])

    def send(self, op: int, args: dict[str, Any], waiter: Any) -> None:
        rid = self.next_id
        self.next_id = rid + 1
        body = pack_body([REQUEST, rid, op, args])
        self.pending[rid] = waiter
        self.out.append(pack_header(len(body)) + body)
        if not self.flushing:
            self.flushing = True
            self.loop.call_soon(self.flush)

    def request(self, op: int, args: dict[str, Any]) -> asyncio.Future[Any]:
        fut = self.loop.create_future()
        self.send(op, args, fut)
        return fut

    def flush(self) -> None:
        self.flushing = False
        assert self.transport is not None
        self.transport.write(b"".join(self.out))
        self.out.clear()


async def connect(address: str, holder: str) -> Bare:
    host, _, port = address.rpartition(":")
    _, conn = await asyncio.get_running_loop().create_connection(Bare, host, int(port))
    await conn.request(Op.HELLO, {"version": PROTOCOL_VERSION, "holder": holder})
    return conn


def consuming(conn: Bare, scope: str, concurrency: int, lease_seconds: float,
              callbacks: bool = False) -> asyncio.Future[None]:
    """The bare worker on ``conn``, started: RECEIVE up to ``concurrency`` deliveries of
    ``scope``'s queue, each completed with the next taken in the same request (a coroutine
    per slot, or with ``callbacks`` none per task); the receiving task, to cancel."""
    receive = {"scope": scope, "mailbox": MAILBOX, "lease_seconds": lease_seconds,
               "wait": True, "timeout_ms": 30_000, "max": concurrency}
    take_next = {"lease_seconds": lease_seconds, "max": 1}

    async def handle(data: dict[str, Any]) -> dict[str, Any]:
        return {"n": data["n"], "t": time.monotonic()}

    def settle(outcome: Any, body: dict[str, Any], on_reply: Callable[[Any], None]) -> None:
        conn.send(Op.DELIVERY_COMPLETE, {"lease": body["lease"], "outcome": outcome,
                                         "next": take_next}, on_reply)

    def settled(reply: dict[str, Any]) -> None:  # --callbacks: no coroutine per task
        for body in reply.get("next") or ():
            settle({"n": body["data"]["n"], "t": time.monotonic()}, body, settled)

    async def slot(body: dict[str, Any] | None) -> None:
        while body is not None:
            outcome = await handle(body["data"])
            reply = await conn.request(Op.DELIVERY_COMPLETE, {
                "lease": body["lease"], "outcome": outcome, "next": take_next})
            bodies = reply.get("next")
            body = bodies[0] if bodies else None

    slots: set[asyncio.Future[None]] = set()

    async def receiver() -> None:
        while True:
            reply = await conn.request(Op.RECEIVE, receive)
            bodies = reply.get("deliveries") or []
            if callbacks:
                settled({"next": bodies})
            else:
                for body in bodies:
                    started = asyncio.ensure_future(slot(body))
                    slots.add(started)
                    started.add_done_callback(slots.discard)

    return asyncio.ensure_future(receiver())


async def worker(address: str, scope: str, concurrency: int, callbacks: bool) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    conn = await connect(address, "bare-worker")
    print("READY", flush=True)
    cpu_before = time.process_time()
    task = consuming(conn, scope, concurrency, 30, callbacks)
    await stop.wait()
    print(f"CPU {time.process_time() - cpu_before:.6f}", flush=True)
    task.cancel()


async def planner(address: str, seconds: float, inflight: int, concurrency: int,
                  callbacks: bool, server_cpu: Callable[[], float]) -> None:
    conn = await connect(address, "bare-planner")
    await conn.request(Op.MAILBOX_ENSURE, {"name": MAILBOX, "mode": "WORK"})
    run = (await conn.request(Op.SCOPE_CREATE, {}))["scope"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.bare_tasks", "--role", "worker", "--address", address,
        "--scope", run, "--concurrency", str(concurrency),
        *(["--callbacks"] if callbacks else []), stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    await proc.stdout.readline()
    done = counter = 0
    stop_at = time.perf_counter() + seconds

    async def one_at_a_time() -> None:
        nonlocal done, counter
        while time.perf_counter() < stop_at:
            counter += 1
            view = await conn.request(Op.TASK_SUBMIT, {
                "scope": run, "mailbox": MAILBOX, "data": {"n": counter},
                "key": f"task-{counter}", "slim": True})
            await conn.request(Op.TASK_RESULT, {
                "scope": run, "task": view["id"], "timeout_ms": 30_000, "outcome_only": True})
            done += 1

    started = time.perf_counter()
    rsd_before = server_cpu()
    planner_before = time.process_time()
    await asyncio.gather(*(one_at_a_time() for _ in range(inflight)))
    elapsed = time.perf_counter() - started
    planner_cpu = time.process_time() - planner_before
    rsd_cpu = server_cpu() - rsd_before
    proc.send_signal(signal.SIGTERM)
    said = (await proc.stdout.read()).decode()
    await proc.wait()
    worker_cpu = next(float(line[4:]) for line in said.splitlines() if line.startswith("CPU "))
    print(f"bare tasks ({'callbacks' if callbacks else 'a coroutine handler'} in the worker),"
          f" {inflight} in flight: {done / elapsed:,.0f} tasks/s ({done} tasks)")
    print(f"CPU per task: rsd {rsd_cpu / done * 1e6:.1f} us, planner "
          f"{planner_cpu / done * 1e6:.1f} us, worker {worker_cpu / done * 1e6:.1f} us")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--role", choices=["planner", "worker"], default="planner")
    parser.add_argument("--address")
    parser.add_argument("--scope")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--callbacks", action="store_true")
    args = parser.parse_args()
    if args.role == "worker":
        await worker(args.address, args.scope, args.concurrency, args.callbacks)
        return
    async with rsd_process("--fsync", "no") as server:
        await planner(server.address, args.seconds, args.inflight, args.concurrency,
                      args.callbacks, server.cpu_seconds)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
