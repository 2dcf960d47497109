"""rsd's own half of a renewal frame and of a task, alone: the server in-process, its
connections on transports that keep what is written, driven by clients that do only
the wire work, with nothing of the clients counted.

``bench.renewals`` and ``bench.tasks`` read rsd's CPU from ``/proc``; on a shared
machine their figures move with the load (a loaded rsd reads bigger batches per
wake-up, and pays less per frame). Here one process runs a ``rsd.server.Server`` (a
journal under ``--fsync no`` in a temporary directory, as ``bench.tasks`` starts rsd)
on the running loop, and only what rsd does is measured: each read handed to its
connection (``data_received``) and each loop turn's flush (``Output.flush``, run by the
loop as rsd's is). The clients' own encoding and decoding are left out.

- ``renewals``: one connection holding 1,024 leases sends LEASE_RENEW frames of one
  lease each, --read frames per read (``bench.renewals`` keeps 512 in flight and writes
  128 at a time), each read followed by its loop turn;
- ``tasks``: the six frames of ``bench.bare_tasks``' task (TASK_SUBMIT ``slim`` with a
  key, TASK_RESULT ``outcome_only``, DELIVERY_COMPLETE taking the next delivery, and
  their replies), --inflight tasks kept going by a planner connection, a worker
  connection holding the deliveries; each turn, each client's requests in one read.

Timed (the default), prints rsd's CPU time per frame or task (``time.process_time``
around rsd's calls only; the best of --rounds rounds of --count each). Under callgrind,
``--callgrind`` counts only rsd's calls (collection is off elsewhere: run valgrind with
``--collect-atstart=no``) and prints nothing but what it did: the difference of the
counts of two values of --count, over their difference, is rsd's instructions per frame
or task, in user space (the kernel's socket calls are not in it: the transports here
only keep what is written).

    .venv/bin/python -m bench.server_path --shape renewals|tasks [--count N] [--rounds 5]
    valgrind --tool=callgrind --collect-atstart=no .venv/bin/python -m bench.server_path \\
        --shape S --count N --callgrind
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import gc
import itertools
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import rsproto as wire
from rsd.collector import NEVER
from rsd.core import Core
from rsd.disk.snapshots import Snapshots
from rsd.server import Server
from rsd.startup import recover
from rsd.wire.connection import Connection
from rsproto import Op

MAILBOX = "bench-tasks"
_TOGGLE_C = """
#include <valgrind/callgrind.h>
void toggle(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


def callgrind_toggle() -> Callable[[], None]:
    """A function that turns callgrind's collection on or off (a no-op outside valgrind):
    a client request, compiled once into a temporary library."""
    folder = Path(tempfile.mkdtemp(prefix="rsd-toggle-"))
    (folder / "toggle.c").write_text(_TOGGLE_C)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(folder / "toggle.so"),
                    str(folder / "toggle.c")], check=True)
    toggle: Callable[[], None] = ctypes.CDLL(str(folder / "toggle.so")).toggle
    return toggle


class Keeper:
    """A transport that keeps what is written (``taken()`` hands it over)."""

    def __init__(self, port: int) -> None:
        self.peer = ("127.0.0.1", port)
        self.writes: list[bytes] = []

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def pause_reading(self) -> None:
        raise AssertionError("rsd paused reading: a read outgrew its share of a turn")

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def taken(self) -> bytes:
        data = b"".join(self.writes)
        self.writes.clear()
        return data


class Meter:
    """rsd's calls, measured: CPU time summed, callgrind's collection on around them."""

    def __init__(self, toggle: Callable[[], None] | None) -> None:
        self.toggle = toggle
        self.cpu = 0.0
        self.depth = 0  # (a flush run inside a read is counted once)

    @contextmanager
    def counting(self) -> Iterator[None]:
        self.depth += 1
        if self.depth > 1:
            try:
                yield
            finally:
                self.depth -= 1
            return
        toggle = self.toggle
        if toggle is not None:
            toggle()
        began = time.process_time()
        try:
            yield
        finally:
            self.cpu += time.process_time() - began
            self.depth -= 1
            if toggle is not None:
                toggle()


class Rig:
    """An rsd (``Server`` with a journal, ``--fsync no``) on the running loop; its flush
    runs in the meter."""

    def __init__(self, directory: Path, meter: Meter) -> None:
        numbers = itertools.count(1)
        self.core = Core(lambda: f"run-{next(numbers)}", time.time(), random_bytes=os.urandom)
        journal, _ = recover(directory, self.core, 0.0, policy="no")
        self.server = Server(self.core, asyncio.get_running_loop(), journal=journal,
                             snapshots=Snapshots(journal, self.core))
        # No read is cut short by its share of a loop turn (under callgrind everything
        # runs some 50 times slower: the same reads would be cut, and the shape change).
        turns = self.server.turns
        turns.budget = turns.share = turns.floor = 3600.0
        self.meter = meter
        self.ports = itertools.count(50000)
        output = self.server.output
        flush = output.flush

        def measured_flush() -> None:
            with meter.counting():
                flush()

        output.flush = measured_flush  # type: ignore[method-assign]

    async def connect(self, holder: str) -> tuple[Connection, Keeper]:
        conn = self.server.protocol_factory()
        keeper = Keeper(next(self.ports))
        conn.connection_made(keeper)  # type: ignore[arg-type]
        await ask(self, conn, keeper, [wire.request_frame(
            1, Op.HELLO, {"version": wire.PROTOCOL_VERSION, "holder": holder})])
        return conn, keeper

    def feed(self, conn: Connection, data: bytes) -> None:
        with self.meter.counting():
            conn.data_received(data)


async def ask(rig: Rig, conn: Connection, keeper: Keeper, frames: list[bytes]) -> list[Any]:
    """Send ``frames`` in one read and return their replies (once all have come: some
    wait for an fsync)."""
    rig.feed(conn, b"".join(frames))
    decoder = wire.Decoder(1 << 24, from_rsd=True)
    got: list[Any] = []
    while len(got) < len(frames):
        await asyncio.sleep(0.001 if got or keeper.writes else 0)
        got += decoder.feed(keeper.taken())
    return got


async def renewals(rig: Rig, count: int, per_read: int) -> int:
    """``count`` one-lease renewal frames (a multiple of ``per_read``); frames sent."""
    conn, keeper = await rig.connect("bench-renewals")
    [run] = await ask(rig, conn, keeper, [wire.request_frame(2, Op.SCOPE_CREATE, {})])
    acquired = []
    for at in range(0, 1024, 128):
        acquired += await ask(rig, conn, keeper, [
            wire.request_frame(3 + i, Op.CLAIM_ACQUIRE,
                               {"scope": run[2]["scope"], "key": f"k{i}", "lease_seconds": 600})
            for i in range(at, at + 128)])
    frames = [wire.request_frame(i + 1, Op.LEASE_RENEW, {"leases": [reply[2]["lease"]]})
              for i, reply in enumerate(acquired)]
    reads = [b"".join(frames[(at + i) % len(frames)] for i in range(per_read))
             for at in range(0, len(frames), per_read)]
    rig.meter.cpu = 0.0
    sent = 0
    for data in itertools.islice(itertools.cycle(reads), count // per_read):
        rig.feed(conn, data)
        await asyncio.sleep(0)
        keeper.writes.clear()
        sent += per_read
    return sent


async def tasks(rig: Rig, count: int, inflight: int) -> int:
    """``count`` tasks through a planner and a worker connection; tasks completed."""
    planner, planned = await rig.connect("bench-planner")
    worker, worked = await rig.connect("bench-worker")
    await ask(rig, planner, planned,
              [wire.request_frame(2, Op.MAILBOX_ENSURE, {"name": MAILBOX, "mode": "WORK"})])
    [made] = await ask(rig, planner, planned, [wire.request_frame(3, Op.SCOPE_CREATE, {})])
    run = made[2]["scope"]
    ids = itertools.count(10)
    numbers = itertools.count(1)
    submits: dict[int, None] = {}  # request ids of submits in flight
    take_next = {"lease_seconds": 30, "max": 1}

    def submit() -> bytes:
        rid, n = next(ids), next(numbers)
        submits[rid] = None
        return wire.request_frame(rid, Op.TASK_SUBMIT, {
            "scope": run, "mailbox": MAILBOX, "data": {"n": n}, "key": f"task-{n}",
            "slim": True})

    def complete(body: dict[str, Any]) -> bytes:
        return wire.request_frame(next(ids), Op.DELIVERY_COMPLETE, {
            "lease": body["lease"], "outcome": {"n": body["data"]["n"], "t": 1.5},
            "next": take_next})

    receive = {"scope": run, "mailbox": MAILBOX, "lease_seconds": 30, "wait": True,
               "timeout_ms": 30_000, "max": inflight}
    worker_out = [wire.request_frame(next(ids), Op.RECEIVE, receive)]
    planner_out = [submit() for _ in range(inflight)]
    rig.meter.cpu = 0.0
    done = 0
    while done < count:
        if worker_out:
            rig.feed(worker, b"".join(worker_out))
            worker_out = []
        if planner_out:
            rig.feed(planner, b"".join(planner_out))
            planner_out = []
        await asyncio.sleep(0)
        for kind, rid, body in wire.Decoder(1 << 24, from_rsd=True).feed(planned.taken()):
            assert kind == wire.REPLY, body
            if submits.pop(rid, 0) is None:
                planner_out.append(wire.request_frame(next(ids), Op.TASK_RESULT, {
                    "scope": run, "task": body["id"], "timeout_ms": 30_000,
                    "outcome_only": True}))
            else:
                done += 1
                if done + len(submits) < count + inflight:
                    planner_out.append(submit())
        for kind, _, body in wire.Decoder(1 << 24, from_rsd=True).feed(worked.taken()):
            assert kind == wire.REPLY, body
            if "deliveries" in body:  # a RECEIVE's: the next RECEIVE waits (bare_tasks)
                worker_out.append(wire.request_frame(next(ids), Op.RECEIVE, receive))
                worker_out += map(complete, body["deliveries"])
            else:
                worker_out += map(complete, body.get("next") or ())
    return done


async def measure(shape: str, count: int, rounds: int, per_read: int, inflight: int,
                  toggle: Callable[[], None] | None) -> list[float]:
    """rsd's CPU seconds per frame or task, one figure a round, each on a fresh rsd."""
    figures = []
    saved = gc.get_threshold()
    gc.set_threshold(saved[0], saved[1], NEVER)  # as rsd serves (rsd/collector.py)
    try:
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="rsd-server-path-") as directory:
                meter = Meter(toggle)
                rig = Rig(Path(directory), meter)
                if shape == "renewals":
                    done = await renewals(rig, count, per_read)
                else:
                    done = await tasks(rig, count, inflight)
                figures.append(meter.cpu / done)
                if toggle is not None:
                    print(f"done {done}")  # (tasks: a few over --count, a turn's worth)
                await rig.server.stop()
    finally:
        gc.set_threshold(*saved)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=["renewals", "tasks"], default="renewals")
    parser.add_argument("--count", type=int, default=0,
                        help="frames or tasks a round (default 256,000 / 40,000)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--read", type=int, default=128, help="renewal frames a read")
    parser.add_argument("--inflight", type=int, default=64, help="tasks in flight")
    parser.add_argument("--callgrind", action="store_true",
                        help="count rsd's calls only, one round, print nothing")
    args = parser.parse_args()
    count = args.count or (256_000 if args.shape == "renewals" else 40_000)
    if args.shape == "renewals":
        count -= count % args.read
    import uvloop

    toggle = callgrind_toggle() if args.callgrind else None
    figures = uvloop.run(measure(args.shape, count, 1 if args.callgrind else args.rounds,
                                 args.read, args.inflight, toggle))
    if args.callgrind:
        return
    what = "renewal frame" if args.shape == "renewals" else "task"
    print(f"rsd's CPU per {what} ({count:,} a round): best {min(figures) * 1e6:.3f} us, "
          f"rounds {', '.join(f'{f * 1e6:.3f}' for f in figures)}")


if __name__ == "__main__":
    main()
