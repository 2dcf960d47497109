"""A long fuzz run against a real rsd: the suite's server pass, for as long as you like.

Hostile connections (tests/support/fuzz_client.py: requests of every op with right and
wrong args, fuzzed HELLOs, wrong-shaped and damaged frames), ``--connections`` at a
time, until ``--inputs`` frames have been sent; beside them a bystander PINGs every
20 ms. Every connection must get an answer to each request or end with a documented
connection-level error frame; the bystander must always be answered. Against its own
rsd (no ``--address``) the run ends with a kill -9 and a restart, which must recover the
data directory to what was acknowledged.

Prints: inputs, answered, connections, unhandled exceptions, problems, refusals by error
code, the bystander's PING p99 and max, elapsed time. Exit status 1 if anything broke.

    .venv/bin/python -m bench.fuzz --inputs 1000000 --connections 64
    .venv/bin/python -m bench.fuzz --address 127.0.0.1:7420 --token "$RUNSTATE_TOKEN"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the harness

from support.fuzz import Tally
from support.fuzz_client import Bystander, fuzz_server
from support.raw import RawConn, raw_connect

from bench.harness import start_rsd, stop_rsd
from rsproto import PROTOCOL_VERSION, Op

STABLE = ("items", "mailboxes")  # core figures no clock moves: a restart must keep them
RSD_ARGS = ("--frame-timeout", "1", "--handshake-timeout", "1")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fuzz", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--inputs", type=int, default=100_000, help="frames to send in all")
    parser.add_argument("--connections", type=int, default=64,
                        help="hostile connections open at once (default %(default)s)")
    parser.add_argument("--frames", type=int, default=40,
                        help="frames per connection (default %(default)s)")
    parser.add_argument("--seed", type=int, default=None, help="default: from the clock")
    parser.add_argument("--address", help="fuzz this running rsd instead of a fresh one")
    parser.add_argument("--token", help="the token HELLO carries (a server with tokens)")
    parser.add_argument("--rsd-arg", action="append", default=[], metavar="ARG",
                        help="an extra argument for the rsd this run starts (repeatable)")
    args = parser.parse_args(argv)
    if args.inputs < 1 or args.connections < 1 or args.frames < 1:
        parser.error("--inputs, --connections and --frames must be at least 1")
    return args


async def hello(address: str, token: str | None, holder: str) -> RawConn:
    conn = await raw_connect(address)
    args: dict[str, Any] = {"version": PROTOCOL_VERSION, "holder": holder}
    if token is not None:
        args["token"] = token
    await conn.ok(Op.HELLO, args)
    return conn


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


async def fuzz(address: str, args: argparse.Namespace, seed: int) -> tuple[Tally, list[str],
                                                                          RawConn, Bystander]:
    """The fuzzing itself, with a progress line every ten seconds."""
    by = await hello(address, args.token, "bystander")
    await by.ok(Op.MAILBOX_ENSURE, {"name": "by"})
    await by.ok(Op.CLAIM_ACQUIRE, {"scope": "by", "key": "k", "lease_seconds": 600})
    bystander = Bystander(by)
    bystander.start()
    tally = Tally()
    began = time.monotonic()

    async def progress() -> None:
        while True:
            await asyncio.sleep(10)
            rate = tally.inputs / (time.monotonic() - began)
            print(f"  {tally.inputs} inputs, {tally.connections} connections, "
                  f"{rate:.0f} inputs/s", flush=True)

    reporter = asyncio.ensure_future(progress())
    try:
        problems = await fuzz_server(
            address, seed, tally, connections=sys.maxsize, concurrency=args.connections,
            frames=args.frames, token=args.token, enough=lambda: tally.inputs >= args.inputs,
        )
    finally:
        reporter.cancel()
        with contextlib.suppress(BaseException):
            await reporter
        await bystander.stop()
    return tally, problems, by, bystander


async def acknowledged(conn: RawConn) -> dict[str, Any]:
    """What rsd acknowledged: the stable core figures and the bystander's claim."""
    stats = await conn.ok(Op.SERVER_STATS, {})
    claim = await conn.ok(Op.CLAIM_INSPECT, {"scope": "by", "key": "k"})
    return {"core": {key: stats["core"][key] for key in STABLE}, "claim": claim}


async def recovery(data_dir: Path, before: dict[str, Any], token: str | None) -> list[str]:
    """Start rsd again on ``data_dir`` after the kill: what it acknowledged is there."""
    server = await start_rsd(data_dir, *RSD_ARGS)
    try:
        conn = await hello(server.address, token, "after")
        after = await acknowledged(conn)
        conn.close()
    finally:
        await stop_rsd(server.proc)
    problems = [f"after the restart {key} is {after['core'][key]}, was {value}"
                for key, value in before["core"].items() if after["core"][key] != value]
    was, now = before["claim"], after["claim"]
    if was["held"] and not now["held"]:
        problems.append("the bystander's claim was lost in the restart")
    if now["generation"] < was["generation"]:
        problems.append(f"the claim's generation went back: {was} -> {now}")
    return problems


async def main_async(args: argparse.Namespace) -> int:
    seed = args.seed if args.seed is not None else random.randrange(2**32)
    print(f"bench.fuzz: {args.inputs} inputs, {args.connections} connections at a time, "
          f"{args.frames} frames each, seed {seed}", flush=True)
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rsd-fuzz-") as tmp:
        server = None
        address = args.address
        if address is None:
            server = await start_rsd(Path(tmp) / "data", *RSD_ARGS, *args.rsd_arg)
            address = server.address
        try:
            tally, problems, by, bystander = await fuzz(address, args, seed)
            elapsed = time.monotonic() - began
            if bystander.problem:
                problems.append(bystander.problem)
            if server is not None:
                if server.proc.returncode is not None:
                    problems.append(f"rsd exited with {server.proc.returncode}")
                else:
                    before = await acknowledged(by)
                    if not before["claim"]["held"]:
                        # lease ids are small integers today: a fuzzer that renews one
                        # with a short length or releases it ends another client's claim
                        print("note: the bystander's claim was ended by a guessed lease id")
                    server.proc.kill()
                    await server.proc.wait()
                    problems += await recovery(Path(tmp) / "data", before, args.token)
            by.close()
        finally:
            if server is not None:
                await stop_rsd(server.proc)
    for line in tally.lines():
        print(line)
    lat = bystander.latencies
    print(f"problems: {len(problems)}")
    print(f"bystander PING: {len(lat)} answered, p99 {percentile(lat, 0.99) * 1000:.1f} ms, "
          f"max {max(lat, default=0.0) * 1000:.1f} ms")
    print(f"elapsed: {elapsed:.1f} s ({tally.inputs / elapsed:.0f} inputs/s)")
    for problem in problems[:50]:
        print(f"  PROBLEM {problem}")
    return 1 if problems or tally.unhandled else 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
