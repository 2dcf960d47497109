"""The TypeScript SDK beside the Python SDK: acquire+release pairs/s and tasks/s.

Same shapes as bench/claims.py (one client, C concurrent loops of acquire + release on
their own keys) and bench/tasks.py (a planner keeping N tasks in flight, submit ->
result, and a worker process consuming them), each SDK against the same throwaway rsd,
one after the other. The TypeScript side is sdk/typescript/dist/bench/bench.js (build it
first: `make bench-ts` does).

Under each tasks rate it prints what explains it, read from rsd itself (SERVER_STATS and
/proc) around each run: requests per task (round trips the SDK makes), tasks per fsync
(how well the SDK's writes batch into one journal group commit, what bounds tasks/s under
--fsync always), rsd's CPU per task, and the SDK's own CPU per task (planner and worker
processes together: this process and its reaped children, from getrusage), and each
client process's CPU per task (planner, worker: each measured by itself over the run).

    .venv/bin/python -m bench.typescript [--seconds 5] [--concurrency 64] [--inflight 64]
                                         [--fsync always|everysec|no]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shutil
from pathlib import Path

from bench import claims as py_claims
from bench import tasks as py_tasks
from bench.harness import RsdProcess, rsd_process
from rsclient import AsyncRunstate

BENCH_JS = Path(__file__).resolve().parent.parent / "sdk/typescript/dist/bench/bench.js"


async def node(*args: str) -> dict[str, float]:
    proc = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node", str(BENCH_JS), *args, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bench.js {args[0]} failed ({proc.returncode})")
    figures: dict[str, float] = json.loads(out.decode().strip().splitlines()[-1])
    return figures


async def python_tasks(address: str, seconds: float, inflight: int,
                       concurrency: int) -> tuple[float, list[float]]:
    """bench.tasks' planner: its rate, and the planner's and the worker's CPU seconds."""
    cpu: list[float] = []
    rate, _ = await py_tasks.measure(address, seconds, inflight, concurrency, client_cpu=cpu)
    return rate, cpu


def per_process(rate: float, seconds: float, cpu: list[float]) -> str:
    """CPU per task of the planner and of the worker process, in microseconds."""
    tasks = max(1.0, rate * seconds)
    return f"planner {cpu[0] / tasks * 1e6:.1f} us, worker {cpu[1] / tasks * 1e6:.1f} us"


def client_cpu() -> float:
    """CPU seconds of this process and of its children that have been waited for (the
    worker processes, and a node process with the worker it reaped)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Costs:
    """What one run cost: requests rsd answered, journal fsyncs, rsd's CPU seconds and
    the clients' CPU seconds."""

    def __init__(self, server: RsdProcess) -> None:
        self.server = server
        self.before: tuple[int, int, float] = (0, 0, 0.0)
        self.client_before = 0.0

    async def _read(self) -> tuple[int, int, float]:
        async with AsyncRunstate(holder="bench-stats", address=self.server.address) as rs:
            stats = await rs.server_stats()
        journal = stats.get("journal") or {}
        return int(stats["ops_total"]), int(journal.get("fsyncs", 0)), self.server.cpu_seconds()

    async def start(self) -> None:
        self.before = await self._read()
        self.client_before = client_cpu()

    async def stop(self, tasks_per_s: float, seconds: float) -> str:
        client = client_cpu() - self.client_before
        ops, fsyncs, cpu = await self._read()
        tasks = max(1.0, tasks_per_s * seconds)
        d_ops, d_fsyncs, d_cpu = (ops - self.before[0], fsyncs - self.before[1],
                                  cpu - self.before[2])
        per_fsync = f"{tasks / d_fsyncs:,.1f}" if d_fsyncs else "-"
        return (f"{d_ops / tasks:.2f} requests/task, {per_fsync} tasks/fsync, "
                f"CPU/task: rsd {d_cpu / tasks * 1e6:.0f} us, SDK {client / tasks * 1e6:.0f} us")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--fsync", default="always", choices=["always", "everysec", "no"])
    args = parser.parse_args()
    if not BENCH_JS.is_file():
        raise SystemExit(f"{BENCH_JS} is missing: run `make bench-ts` (npm ci && npm run build)")
    async with rsd_process("--fsync", args.fsync) as server:
        address = server.address
        c, s, n = args.concurrency, args.seconds, args.inflight
        py_pairs = await py_claims.throughput(address, c, s)
        ts_pairs = (await node("claims", address, str(c), str(s)))["pairs_per_s"]
        costs = Costs(server)
        await costs.start()
        py_tasks_rate, py_cpu = await python_tasks(address, s, n, c)
        py_costs = await costs.stop(py_tasks_rate, s)
        await costs.start()
        ts_figures = await node("tasks", address, str(s), str(n), str(c))
        ts_tasks = ts_figures["tasks_per_s"]
        ts_costs = await costs.stop(ts_tasks, s)
        ts_cpu = [ts_figures["planner_cpu_s"], ts_figures["worker_cpu_s"]]
    print(f"rsd --fsync {args.fsync}; {c} concurrent loops, {n} tasks in flight, {s:g} s each")
    print(f"{'':34}{'Python':>12}{'TypeScript':>12}{'TS/Py':>8}")
    print(f"{'claims acquire+release, pairs/s':34}{py_pairs:>12,.0f}{ts_pairs:>12,.0f}"
          f"{ts_pairs / py_pairs:>8.2f}")
    print(f"{'tasks submit->complete->result/s':34}{py_tasks_rate:>12,.0f}{ts_tasks:>12,.0f}"
          f"{ts_tasks / py_tasks_rate:>8.2f}")
    print(f"  Python tasks:     {py_costs}")
    print(f"  TypeScript tasks: {ts_costs}")
    print(f"  CPU/task per process: Python {per_process(py_tasks_rate, s, py_cpu)}; "
          f"TypeScript {per_process(ts_tasks, s, ts_cpu)}")


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
