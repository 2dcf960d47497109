"""The parts of a task's client half, each measured bare in one process (uvloop): what
every asyncio client of rsd pays per request whatever its SDK does (the floor under
``bench.bare_tasks``; issue 33).

    .venv/bin/python -m bench.client_parts [--count 200000]

Prints the CPU per piece: a request encoded (a submit, msgpack-python, with its
header), a reply decoded (32 to a read, as a pipelined client reads them), a future
awaited by a coroutine and resolved from a callback (64 coroutines, as 64 tasks in
flight), and loopback writes with their reads, per frame at 32 frames a write and per
write of one frame.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import time
from typing import Any

from rsproto import REPLY, REQUEST, Decoder, Op, pack_body, pack_header

IN_FLIGHT = 64
PER_WRITE = 32


def show(what: str, seconds: float, count: int) -> None:
    print(f"{what:66} {seconds / count * 1e6:6.3f} us")


async def futures(count: int) -> float:
    """CPU seconds of ``count`` futures, each awaited by one of IN_FLIGHT coroutines
    and resolved by a callback that runs once a loop turn."""
    loop = asyncio.get_running_loop()
    waiting: list[asyncio.Future[None]] = []

    async def waiter() -> None:
        for _ in range(count // IN_FLIGHT):
            future = loop.create_future()
            waiting.append(future)
            await future

    def resolve() -> None:
        ready = waiting[:]
        waiting.clear()
        for future in ready:
            future.set_result(None)
        loop.call_soon(resolve)

    started = time.process_time()
    loop.call_soon(resolve)
    await asyncio.gather(*(waiter() for _ in range(IN_FLIGHT)))
    return time.process_time() - started


async def writes(frame: bytes, count: int, per_write: int) -> float:
    """CPU seconds of ``count`` frames written ``per_write`` at a time on a loopback
    socket pair and read by the other end, both in this process."""
    loop = asyncio.get_running_loop()
    ours, theirs = socket.socketpair()

    class Sink(asyncio.Protocol):
        def data_received(self, data: bytes) -> None:
            pass

    writer, _ = await loop.create_connection(asyncio.Protocol, sock=ours)
    reader, _ = await loop.create_connection(Sink, sock=theirs)
    batch = frame * per_write
    started = time.process_time()
    for _ in range(count // per_write):
        writer.write(batch)
        await asyncio.sleep(0)  # the reader reads it
    spent = time.process_time() - started
    writer.close()
    reader.close()
    return spent


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--count", type=int, default=200_000)
    count = parser.parse_args().count
    args: dict[str, Any] = {"scope": "r" * 24, "mailbox": "bench-tasks", "data": {"n": 1},
                            "key": "task-1", "slim": True}
    started = time.process_time()
    for rid in range(count):
        body = pack_body([REQUEST, rid, Op.TASK_SUBMIT, args])
        frame = pack_header(len(body)) + body
    show("a request encoded (a submit, msgpack-python) with its header",
         time.process_time() - started, count)
    reply = pack_body([REPLY, 7, {"id": "t" * 24, "state": "PENDING", "created": True}])
    chunk = (pack_header(len(reply)) + reply) * PER_WRITE
    decoder = Decoder(1 << 24, from_rsd=True)
    started = time.process_time()
    for _ in range(count // PER_WRITE):
        decoder.feed(chunk)
    show(f"a reply decoded ({PER_WRITE} to a read, rsproto's Decoder)",
         time.process_time() - started, count)
    show(f"a future awaited by a coroutine and resolved ({IN_FLIGHT} coroutines)",
         await futures(count), count // IN_FLIGHT * IN_FLIGHT)
    show(f"a frame written and read, {PER_WRITE} frames a write",
         await writes(frame, count, PER_WRITE), count)
    one_by_one = count // 10
    show("a frame written and read, one frame a write (per write)",
         await writes(frame, one_by_one, 1), one_by_one)


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
