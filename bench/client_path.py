"""The client half of a task, alone: the SDK's planner and worker against a stand-in rsd in
the same process, beside bare clients that do only the wire work (``bench.bare_tasks``).

``bench.tasks`` reads each process's CPU per task, but on a shared machine its figures
move with the load (a loaded worker reads bigger batches per wake-up, and pays less per
task). Here one event loop runs a stand-in rsd (``FakeRsd``: a queue of tasks, answers
built from constants, the same frames as rsd's) and a planner and a worker, each the
SDK's or a bare one, on real loopback sockets: one process's CPU time, the same batching
every run, so that a change of a microsecond per task in a client is seen. Each shape is
run for --seconds after a warm-up; the lines give the CPU per task of the whole process
for each pairing, and the SDK's part: the SDK planner's (SDK planner + bare worker, less
bare + bare) and the SDK worker's (bare planner + SDK worker, less bare + bare).

    .venv/bin/python -m bench.client_path [--seconds 3] [--inflight 64] [--rounds 3]
    valgrind --tool=callgrind .venv/bin/python -m bench.client_path --tasks N --shape S

CPU time still moves with a loaded machine's caches; an instruction count does not:
``--tasks N --shape S`` runs N tasks of one shape untimed, and callgrind's count for
two values of N, their difference divided by theirs, is the shape's user-space
instructions per task (kernel time, the socket calls, is not in it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

from bench.bare_tasks import MAILBOX, Bare, consuming
from rsclient import AsyncRunstate, Delivery
from rsproto import ERROR, REPLY, Decoder, Op, pack_body, pack_header

LEASE_SECONDS = 30


class FakeRsd(asyncio.Protocol):
    """One connection of the stand-in rsd; the queue (``Queue``) is shared."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.decoder = Decoder(1 << 24)
        self.transport: asyncio.Transport | None = None
        self.out: list[bytes] = []
        self.flushing = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def reply(self, rid: int, result: Any) -> None:
        body = pack_body([REPLY, rid, result])
        self.out.append(pack_header(len(body)) + body)
        if not self.flushing:
            self.flushing = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.flushing = False
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self.out))
        self.out.clear()

    def data_received(self, data: bytes) -> None:
        for _, rid, op, args in self.decoder.feed(data):
            self.queue.handle(self, rid, op, args)


class Queue:
    """The tasks of the stand-in rsd: submitted, delivered, completed, their waiters."""

    def __init__(self) -> None:
        self.ready: deque[dict[str, Any]] = deque()
        self.receivers: deque[tuple[FakeRsd, int, int]] = deque()  # parked RECEIVEs
        self.waiters: dict[str, tuple[FakeRsd, int]] = {}  # parked TASK_RESULTs by task
        self.outcomes: dict[str, Any] = {}
        self.leases: dict[bytes, str] = {}
        self.next_id = 0
        self.completed = 0

    def body(self, task: dict[str, Any]) -> dict[str, Any]:
        self.next_id += 1
        lease = self.next_id.to_bytes(16, "big")
        self.leases[lease] = task["id"]
        return {"id": task["id"], "kind": "task", "task_id": task["id"], "key": task["key"],
                "data": task["data"], "attempt": 1, "lease": lease,
                "lease_seconds": LEASE_SECONDS}

    def take(self, most: int) -> list[dict[str, Any]]:
        ready = self.ready
        return [self.body(ready.popleft()) for _ in range(min(most, len(ready)))]

    def handle(self, conn: FakeRsd, rid: int, op: int, args: dict[str, Any]) -> None:
        if op == Op.TASK_SUBMIT:
            self.next_id += 1
            task_id = f"t{self.next_id:023d}"
            self.ready.append({"id": task_id, "key": args.get("key"), "data": args["data"]})
            conn.reply(rid, {"id": task_id, "state": "PENDING", "created": True})
            if self.receivers:
                there, wanted, most = self.receivers.popleft()
                there.reply(wanted, {"deliveries": self.take(most)})
        elif op == Op.TASK_RESULT:
            task_id = args["task"]
            if task_id in self.outcomes:
                conn.reply(rid, self.result(task_id))
            else:
                self.waiters[task_id] = (conn, rid)
        elif op == Op.DELIVERY_COMPLETE:
            task_id = self.leases.pop(args["lease"])
            self.outcomes[task_id] = args["outcome"]
            self.completed += 1
            take_next = args.get("next")
            reply: dict[str, Any] = {"state": "SUCCEEDED"}
            if take_next is not None:
                reply["next"] = self.take(take_next["max"])
            conn.reply(rid, reply)
            waiter = self.waiters.pop(task_id, None)
            if waiter is not None:
                waiter[0].reply(waiter[1], self.result(task_id))
        elif op == Op.RECEIVE:
            most = args.get("max", 1)
            if self.ready:
                conn.reply(rid, {"deliveries": self.take(most)})
            else:
                self.receivers.append((conn, rid, most))
        elif op == Op.HELLO:
            conn.reply(rid, {"version": 1, "server": "fake-rsd"})
        elif op == Op.SCOPE_CREATE:
            conn.reply(rid, {"scope": "r" + "0" * 23, "created": True})
        elif op in (Op.MAILBOX_ENSURE, Op.DELIVERY_RELEASE, Op.PING, Op.CANCEL):
            conn.reply(rid, {})
        else:
            body = pack_body([ERROR, rid, "INVALID_ARGUMENT", f"fake rsd: op {op}"])
            conn.out.append(pack_header(len(body)) + body)

    def result(self, task_id: str) -> dict[str, Any]:
        return {"id": task_id, "state": "SUCCEEDED", "outcome": self.outcomes.pop(task_id),
                "reason": None}


async def sdk_planner(address: str, inflight: int, running: Callable[[], bool]) -> None:
    async with AsyncRunstate(holder="path-planner", address=address) as rs:
        mailbox = rs.scope("r" + "0" * 23).mailbox(MAILBOX)
        counter = 0

        async def one_at_a_time() -> None:
            nonlocal counter
            while running():
                counter += 1
                ticket = await mailbox.submit({"n": counter}, key=f"task-{counter}", slim=True)
                await ticket.result(timeout_ms=30_000, outcome_only=True)

        await asyncio.gather(*(one_at_a_time() for _ in range(inflight)))


async def bare_planner(address: str, inflight: int, running: Callable[[], bool]) -> None:
    host, _, port = address.rpartition(":")
    _, conn = await asyncio.get_running_loop().create_connection(Bare, host, int(port))
    run = "r" + "0" * 23
    counter = 0

    async def one_at_a_time() -> None:
        nonlocal counter
        while running():
            counter += 1
            view = await conn.request(Op.TASK_SUBMIT, {
                "scope": run, "mailbox": MAILBOX, "data": {"n": counter},
                "key": f"task-{counter}", "slim": True})
            await conn.request(Op.TASK_RESULT, {
                "scope": run, "task": view["id"], "timeout_ms": 30_000, "outcome_only": True})

    await asyncio.gather(*(one_at_a_time() for _ in range(inflight)))
    assert conn.transport is not None
    conn.transport.close()


async def sdk_worker(address: str, concurrency: int, stop: asyncio.Event) -> None:
    async with AsyncRunstate(holder="path-worker", address=address) as rs:
        async def handle(data: dict[str, Any], delivery: Delivery) -> None:
            await delivery.complete(result={"payload": {"n": data["n"], "t": time.monotonic()}})

        await rs.scope("r" + "0" * 23).mailbox(MAILBOX).consume(
            handle, concurrency=concurrency, lease_seconds=LEASE_SECONDS, stop_event=stop,
            shutdown_timeout=0.1,
        )


async def bare_worker(address: str, concurrency: int, stop: asyncio.Event) -> None:
    host, _, port = address.rpartition(":")
    _, conn = await asyncio.get_running_loop().create_connection(Bare, host, int(port))
    task = consuming(conn, "r" + "0" * 23, concurrency, LEASE_SECONDS)
    await stop.wait()
    task.cancel()
    assert conn.transport is not None
    conn.transport.close()


@contextlib.asynccontextmanager
async def serving(worker_sdk: bool, inflight: int) -> AsyncIterator[tuple[str, Queue]]:
    """A stand-in rsd and a worker (the SDK's or a bare one) consuming its queue: its
    address and its queue; the worker stopped after."""
    queue = Queue()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: FakeRsd(queue), "127.0.0.1", 0)
    stop = asyncio.Event()
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    worker = asyncio.ensure_future(
        (sdk_worker if worker_sdk else bare_worker)(address, inflight, stop))
    try:
        yield address, queue
    finally:
        stop.set()
        await worker
        server.close()


async def one(planner_sdk: bool, worker_sdk: bool, seconds: float, inflight: int) -> float:
    """CPU microseconds per task of this process (stand-in rsd, planner and worker)."""
    planner = sdk_planner if planner_sdk else bare_planner
    async with serving(worker_sdk, inflight) as (address, queue):
        warm_until = time.perf_counter() + min(1.0, seconds / 3)
        await planner(address, inflight, lambda: time.perf_counter() < warm_until)
        done_before, cpu_before = queue.completed, time.process_time()
        stop_at = time.perf_counter() + seconds
        await planner(address, inflight, lambda: time.perf_counter() < stop_at)
        cpu, done = time.process_time() - cpu_before, queue.completed - done_before
    return cpu / done * 1e6


SHAPES = {"bare+bare": (False, False), "sdk planner+bare": (True, False),
          "bare+sdk worker": (False, True), "sdk+sdk": (True, True)}


async def counted(planner_sdk: bool, worker_sdk: bool, tasks: int, inflight: int) -> None:
    """``tasks`` tasks of one shape, untimed, for an instruction count (``valgrind
    --tool=callgrind``: the same count on any load; run it with two counts and divide
    the difference by theirs)."""
    left = [tasks]

    def running() -> bool:
        left[0] -= 1
        return left[0] >= 0

    async with serving(worker_sdk, inflight) as (address, _):
        await (sdk_planner if planner_sdk else bare_planner)(address, inflight, running)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tasks", type=int, help="run this many tasks of --shape, no timing")
    parser.add_argument("--shape", choices=list(SHAPES), default="sdk+sdk")
    args = parser.parse_args()
    if args.tasks is not None:
        await counted(*SHAPES[args.shape], args.tasks, args.inflight)
        return
    got: dict[str, list[float]] = {name: [] for name in SHAPES}
    for _ in range(args.rounds):  # interleaved: a change of load touches every shape
        for name, (planner_sdk, worker_sdk) in SHAPES.items():
            got[name].append(await one(planner_sdk, worker_sdk, args.seconds, args.inflight))
    median = {name: statistics.median(values) for name, values in got.items()}
    for name, values in got.items():
        print(f"{name:18} {median[name]:6.2f} us per task (whole process; rounds "
              + ", ".join(f"{v:.2f}" for v in values) + ")")
    print(f"SDK planner's part {median['sdk planner+bare'] - median['bare+bare']:.2f} us, "
          f"SDK worker's part {median['bare+sdk worker'] - median['bare+bare']:.2f} us per task "
          f"above the bare clients")


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
