"""The TypeScript SDK beside the Python SDK: acquire+release pairs/s and tasks/s.

Same shapes as bench/claims.py (one client, C concurrent loops of acquire + release on
their own keys) and bench/tasks.py (a planner keeping N tasks in flight, submit ->
result, and a worker process consuming them), each SDK against the same throwaway rsd,
one after the other. The TypeScript side is sdk/typescript/dist/bench/bench.js (build it
first: `make bench-ts` does).

    .venv/bin/python -m bench.typescript [--seconds 5] [--concurrency 64] [--inflight 64]
                                         [--fsync always|everysec|no]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import shutil
from pathlib import Path

from bench import claims as py_claims
from bench import tasks as py_tasks
from bench.harness import rsd_server

BENCH_JS = Path(__file__).resolve().parent.parent / "sdk/typescript/dist/bench/bench.js"


async def node(*args: str) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node", str(BENCH_JS), *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bench.js {args[0]} failed ({proc.returncode})")
    return json.loads(out.decode().strip().splitlines()[-1])


async def python_tasks(address: str, seconds: float, inflight: int, concurrency: int) -> float:
    """bench.tasks' planner, its printed rate read back."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text):
        await py_tasks.planner(address, seconds, inflight, concurrency)
    line = text.getvalue().splitlines()[0]
    return float(line.split(": ")[1].split(" tasks/s")[0].replace(",", ""))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--fsync", default="always", choices=["always", "everysec", "no"])
    args = parser.parse_args()
    if not BENCH_JS.is_file():
        raise SystemExit(f"{BENCH_JS} is missing: run `make bench-ts` (npm ci && npm run build)")
    async with rsd_server(None, "--fsync", args.fsync) as address:
        c, s, n = args.concurrency, args.seconds, args.inflight
        py_pairs = await py_claims.throughput(address, c, s)
        ts_pairs = (await node("claims", address, str(c), str(s)))["pairs_per_s"]
        py_tasks_rate = await python_tasks(address, s, n, c)
        ts_tasks = (await node("tasks", address, str(s), str(n), str(c)))["tasks_per_s"]
    print(f"rsd --fsync {args.fsync}; {c} concurrent loops, {n} tasks in flight, {s:g} s each")
    print(f"{'':34}{'Python':>12}{'TypeScript':>12}{'TS/Py':>8}")
    print(f"{'claims acquire+release, pairs/s':34}{py_pairs:>12,.0f}{ts_pairs:>12,.0f}"
          f"{ts_pairs / py_pairs:>8.2f}")
    print(f"{'tasks submit->complete->result/s':34}{py_tasks_rate:>12,.0f}{ts_tasks:>12,.0f}"
          f"{ts_tasks / py_tasks_rate:>8.2f}")


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
