"""Fairness across connections: what a flood on some connections costs a polite one.

Against a fresh rsd (``--fsync no`` unless told otherwise, so the loop, not the disk, is
what is measured), 1 to 4 adversary connections each send one costly shape as fast as
rsd takes it, pipelined, reading (and only counting) the replies:

- ``submit``: TASK_SUBMIT_MANY of 256 tiny tasks (a key, no data), each adversary in its
  own run, frame after frame;
- ``renew``: LEASE_RENEW of 10,000 live leases (the most one request may name), the
  adversary having acquired them first;
- ``ping``: PINGs, 4,096 frames a write.

Meanwhile a bystander, in a process of its own (so the adversaries' client CPU cannot
slow it), sends a PING, then a LEASE_RENEW of its one lease, alternately, one at a time,
every 5 ms, and times each round trip. A row per (shape, adversaries):

    shape | adversaries | bystander renewal p50 / p99 / max ms | ping p50 / p99 / max ms
          | round trips | adversary items/s | rsd CPU

``items/s`` counts tasks submitted, leases renewed or PINGs answered, all adversaries
together; ``rsd CPU`` is the share of one core rsd used meanwhile (on a shared host, well
under 100% means rsd was waiting for a core, and every latency stretches with it).

    .venv/bin/python -m bench.fairness [--seconds 3] [--shapes submit,renew,ping]
                                       [--adversaries 1,4,16] [--fsync no|always]

Issue 19's figure (16 flooders of TASK_SUBMIT_MANY, the bystander's renewals), under the
default policy and without fsyncs:

    .venv/bin/python -m bench.fairness --shapes submit --adversaries 1,4,16 --fsync always
    .venv/bin/python -m bench.fairness --shapes submit --adversaries 1,4,16 --fsync no
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import struct
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from bench.harness import rsd_process
from bench.hostile_clients import Raw, percentile
from rsproto import Op

BYSTANDER_EVERY = 0.005  # seconds between the end of one bystander round trip and the next
SUBMIT_ITEMS = 256  # Limits.MAX_SUBMIT_BATCH
RENEW_ITEMS = 10_000  # Limits.MAX_RENEW_BATCH
PINGS_PER_WRITE = 4096
IN_FLIGHT_BYTES = 4 << 20  # an adversary keeps about this much sent and unanswered
_HEADER = struct.Struct(">I")


# ---- the bystander process -------------------------------------------------------------


async def _bystand(address: str, seconds: float) -> dict[str, Any]:
    conn = await Raw.open(address)
    scope = (await conn.ok(Op.SCOPE_CREATE, {}))["scope"]
    lease = (await conn.ok(Op.CLAIM_ACQUIRE, {"scope": scope, "key": "b",
                                              "lease_seconds": 600}))["lease"]
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    samples: dict[str, list[float]] = {"renew": [], "ping": []}
    errors = 0
    ends = time.monotonic() + seconds
    renew = False
    while time.monotonic() < ends:
        started = time.monotonic()
        if renew:
            msg = await conn.call(Op.LEASE_RENEW, {"leases": [lease]}, 60)
            errors += msg[0] != 2 or msg[2]["results"] != [None]
        else:
            msg = await conn.call(Op.PING, {}, 60)
            errors += msg[0] != 2
        samples["renew" if renew else "ping"].append(time.monotonic() - started)
        renew = not renew
        await asyncio.sleep(BYSTANDER_EVERY)
    conn.close()
    return {"samples": samples, "errors": errors}


def bystander_main(address: str, seconds: float) -> None:
    import uvloop

    print(json.dumps(uvloop.run(_bystand(address, seconds))), flush=True)


# ---- adversaries -----------------------------------------------------------------------


class Adversary:
    """One connection sending ``frames`` (pre-encoded, each worth ``items``) round and
    round, at most ``IN_FLIGHT_BYTES`` unanswered, counting the replies it reads."""

    def __init__(self, conn: Raw, frames: list[bytes], items: int, per_write: int = 1) -> None:
        self.conn = conn
        self.frames = frames  # each ``per_write`` request frames, sent in one write
        self.items = items  # what one answered request frame is worth
        self.per_write = per_write
        self.answered = 0
        self.errors = 0
        self.window = asyncio.Semaphore(
            max(1, IN_FLIGHT_BYTES // max(map(len, frames))) * per_write
        )

    async def send(self) -> None:
        frames, writer, per_write = self.frames, self.conn.writer, self.per_write
        index = 0
        while True:
            for _ in range(per_write):
                await self.window.acquire()
            writer.write(frames[index % len(frames)])
            index += 1
            await writer.drain()

    async def read(self) -> None:
        """Count frames by their headers (no msgpack decoding: the client stays cheap);
        an error frame (kind 3) is counted apart."""
        reader = self.conn.reader
        buffer = bytearray()
        while True:
            data = await reader.read(1 << 20)
            if not data:
                return
            buffer += data
            at = 0
            while len(buffer) - at >= 4:
                size = _HEADER.unpack_from(buffer, at)[0]
                if len(buffer) - at - 4 < size:
                    break
                kind = buffer[at + 5] if size > 1 else 0  # fixarray byte, then the kind
                self.errors += kind == 3
                self.answered += 1
                self.window.release()
                at += 4 + size
            del buffer[:at]


async def _submit_frames(conn: Raw, tag: int) -> tuple[list[bytes], int, int]:
    await conn.ok(Op.MAILBOX_ENSURE, {"name": "jobs"})
    scope = (await conn.ok(Op.SCOPE_CREATE, {}))["scope"]
    frames = []
    for f in range(400):  # distinct keys: every item creates a task (until the frames repeat)
        items = [{"key": f"a{tag}-{f}-{i}", "data": None} for i in range(SUBMIT_ITEMS)]
        frames.append(conn.frame(Op.TASK_SUBMIT_MANY, {"scope": scope, "mailbox": "jobs",
                                                      "items": items, "slim": True}))
    return frames, SUBMIT_ITEMS, 1


async def _renew_frames(conn: Raw, tag: int) -> tuple[list[bytes], int, int]:
    scope = (await conn.ok(Op.SCOPE_CREATE, {}))["scope"]
    leases: list[bytes] = []
    while len(leases) < RENEW_ITEMS:
        frames = [conn.frame(Op.CLAIM_ACQUIRE, {"scope": scope, "key": f"k{len(leases) + i}",
                                                "lease_seconds": 600}) for i in range(1000)]
        got = await conn.roundtrip(frames, timeout=60)
        leases += [msg[2]["lease"] for msg in got if msg[0] == 2]
    return [conn.frame(Op.LEASE_RENEW, {"leases": leases[:RENEW_ITEMS]})], RENEW_ITEMS, 1


async def _ping_frames(conn: Raw, tag: int) -> tuple[list[bytes], int, int]:
    return [b"".join(conn.frame(Op.PING, {}) for _ in range(PINGS_PER_WRITE))], 1, PINGS_PER_WRITE


SHAPES = {"submit": _submit_frames, "renew": _renew_frames, "ping": _ping_frames}


async def _adversaries(address: str, shape: str, count: int) -> list[Adversary]:
    out = []
    for tag in range(count):
        conn = await Raw.open(address)
        frames, items, per_write = await SHAPES[shape](conn, tag)
        out.append(Adversary(conn, frames, items, per_write))
    return out


@contextlib.asynccontextmanager
async def _rsd(address: str | None, fsync: str) -> AsyncIterator[tuple[str, Callable[[], float]]]:
    """The address, and a reader of rsd's CPU seconds so far (nan for a given address)."""
    if address:  # a running rsd (e.g. one under a profiler): fresh runs keep rows apart
        yield address, lambda: float("nan")
        return
    async with rsd_process("--fsync", fsync) as server:
        yield server.address, server.cpu_seconds


async def measure(
    shape: str, count: int, seconds: float, fsync: str, address: str | None = None
) -> dict[str, Any]:
    async with _rsd(address, fsync) as (address, cpu):
        bystander = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.fairness", "--bystander", address,
            "--seconds", str(seconds),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        assert bystander.stdin is not None and bystander.stdout is not None
        if (await bystander.stdout.readline()).strip() != b"ready":
            raise RuntimeError("the bystander did not start")
        adversaries = await _adversaries(address, shape, count)
        tasks = [asyncio.ensure_future(job()) for a in adversaries for job in (a.send, a.read)]
        await asyncio.sleep(0.2)  # the flood is under way
        before = sum(a.answered for a in adversaries)
        started, cpu_before = time.monotonic(), cpu()
        bystander.stdin.write(b"go\n")
        report = json.loads(await asyncio.wait_for(bystander.stdout.readline(), seconds + 120))
        took = time.monotonic() - started
        cpu_used = cpu() - cpu_before
        answered = sum(a.answered for a in adversaries) - before
        for task in tasks:
            task.cancel()
        for a in adversaries:
            a.conn.close()
        with contextlib.suppress(Exception):
            bystander.stdin.close()
        await bystander.wait()
    row: dict[str, Any] = {"shape": shape, "adversaries": count, "fsync": fsync}
    for op, samples in report["samples"].items():
        row[op] = {
            "p50_ms": 1000 * percentile(samples, 0.5),
            "p99_ms": 1000 * percentile(samples, 0.99),
            "max_ms": 1000 * max(samples, default=float("nan")),
        }
    return {
        **row,
        "round_trips": sum(map(len, report["samples"].values())),
        "bystander_errors": report["errors"],
        "items_per_s": answered * adversaries[0].items / took,
        "adversary_errors": sum(a.errors for a in adversaries),
        "rsd_cpu": cpu_used / took,  # the share of one core rsd got: < 1 on a loaded host
    }


def _print(row: dict[str, Any]) -> None:
    times = " | ".join(
        f"{row[op]['p50_ms']:6.2f} / {row[op]['p99_ms']:7.2f} / {row[op]['max_ms']:7.2f}"
        for op in ("renew", "ping")
    )
    print(f"{row['shape']:>6} | {row['adversaries']:3d} | {row['fsync']:>6} | {times} ms | "
          f"{row['round_trips']:5d} trips ({row['bystander_errors']} bad) | "
          f"{row['items_per_s']:>11,.0f} items/s ({row['adversary_errors']} error frames) | "
          f"rsd CPU {100 * row['rsd_cpu']:3.0f}%",
          flush=True)


async def main(args: argparse.Namespace) -> None:
    print("shape  | adv |  fsync | renewal p50 / p99 / max | ping p50 / p99 / max | "
          "round trips | adversary throughput | rsd CPU (of one core)")
    rows = []
    for shape in args.shapes.split(","):
        for count in (int(n) for n in args.adversaries.split(",")):
            row = await measure(shape, count, args.seconds, args.fsync, args.address)
            _print(row)
            rows.append(row)
    if args.json:
        print(json.dumps(rows))


def cli() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fairness", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--shapes", default="submit,renew,ping")
    parser.add_argument("--adversaries", default="1,4,16")
    parser.add_argument("--fsync", default="no", choices=["always", "everysec", "no"])
    parser.add_argument("--address", help="measure this running rsd instead of a fresh one")
    parser.add_argument("--json", action="store_true", help="also print the rows as JSON")
    parser.add_argument("--bystander", metavar="ADDRESS", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bystander:
        bystander_main(args.bystander, args.seconds)
        return
    try:
        import uvloop

        uvloop.run(main(args))
    except ImportError:
        asyncio.run(main(args))


if __name__ == "__main__":
    cli()
