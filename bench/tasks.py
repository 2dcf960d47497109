"""Shared tasks end to end: submit -> consume -> complete, one planner and one worker process.

Starts its own rsd (or uses --address), a worker process running ``consume()`` with
--concurrency handlers, and a planner (this process) that keeps --inflight tasks
submitted and waits for each result (asking for its outcome only: ``outcome_only``).
Prints tasks/s over --seconds, and the completion -> result latency: the worker stamps
``time.monotonic()`` (system-wide on Linux, so comparable across processes) into the
payload just before ``complete()``; the planner subtracts it from the moment
``result()`` returns.

    .venv/bin/python -m bench.tasks [--seconds 5] [--inflight 64] [--concurrency 64]
                                    [--fsync always|everysec|no]
                                    [--planner ticket|together]

BENCH_PROFILE_WORKER=FILE / BENCH_PROFILE_PLANNER=FILE: write that process's cProfile
stats (pstats) to FILE.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

from bench.harness import rsd_process, throwaway_tls
from rsclient import AsyncRunstate, Delivery

MAILBOX = "bench-tasks"
TARGET_SERVER_US_PER_TASK = 20.0  # issue 12: server CPU per task cycle at 64 clients


async def worker(address: str, scope: str, concurrency: int) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    async with AsyncRunstate(holder="bench-worker", address=address) as rs:
        async def handle(data: dict[str, Any], delivery: Delivery) -> None:
            await delivery.complete(result={"payload": {"n": data["n"], "t": time.monotonic()}})

        profile_to = os.environ.get("BENCH_PROFILE_WORKER")
        profiler = None
        if profile_to:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        print("READY", flush=True)
        cpu_before = time.process_time()
        await rs.scope(scope).mailbox(MAILBOX).consume(
            handle, concurrency=concurrency, lease_seconds=30, stop_event=stop
        )
        print(f"CPU {time.process_time() - cpu_before:.6f}", flush=True)
        if profiler is not None and profile_to:  # profiling: set together
            profiler.disable()
            profiler.dump_stats(profile_to)


async def measure(
    address: str, seconds: float, inflight: int, concurrency: int,
    server_cpu: Callable[[], float] | None = None, cpu_used: list[float] | None = None,
    client_cpu: list[float] | None = None, together: bool = False,
    placement: str | None = None, start_at: float | None = None,
) -> tuple[float, list[float]]:
    """Tasks/s, and the sorted complete -> result latencies (s), of one planner keeping
    ``inflight`` tasks submitted and one worker process consuming them. Given
    ``server_cpu`` (the rsd process's CPU seconds so far), the CPU seconds rsd used
    meanwhile are appended to ``cpu_used``; given ``client_cpu``, the CPU seconds the
    planner and then the worker used (from READY to the worker's stop). ``together``:
    the planner uses ``submit_and_wait`` (the submit and the wait for its result in one
    write) instead of ``submit`` then ``ticket.result()``. ``placement``: the run is
    placed there (a sharded cluster); ``start_at``: the measurement starts at that
    wall-clock time (several planners at one instant)."""
    async with AsyncRunstate(holder="bench-planner", address=address) as rs:
        await rs.mailboxes.ensure(MAILBOX, mode="WORK")
        run = await (rs.scopes.create() if placement is None
                     else rs.scopes.create(placement=placement))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.tasks", "--role", "worker", "--address", address,
            "--scope", run.id, "--concurrency", str(concurrency),
            stdout=asyncio.subprocess.PIPE,
        )
        assert proc.stdout is not None
        await proc.stdout.readline()
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        mailbox = run.mailbox(MAILBOX)
        latencies: list[float] = []
        done = 0
        counter = 0
        stop_at = time.perf_counter() + seconds

        async def one_at_a_time() -> None:
            nonlocal done, counter
            while time.perf_counter() < stop_at:
                counter += 1
                if together:
                    outcome = await mailbox.submit_and_wait(
                        {"n": counter}, key=f"task-{counter}", timeout_ms=30_000,
                        outcome_only=True,
                    )
                else:
                    ticket = await mailbox.submit({"n": counter}, key=f"task-{counter}",
                                                  slim=True)
                    outcome = await ticket.result(timeout_ms=30_000, outcome_only=True)
                latencies.append(time.monotonic() - outcome["outcome"]["t"])
                done += 1

        profile_to = os.environ.get("BENCH_PROFILE_PLANNER")
        profiler = None
        if profile_to:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        started = time.perf_counter()
        cpu_before = server_cpu() if server_cpu is not None else 0.0
        planner_before = time.process_time()
        try:
            await asyncio.gather(*(one_at_a_time() for _ in range(inflight)))
        except BaseException:  # a failed measurement leaves no worker behind
            proc.kill()
            await proc.wait()
            raise
        elapsed = time.perf_counter() - started
        planner_cpu = time.process_time() - planner_before
        if profiler is not None and profile_to:  # profiling: set together
            profiler.disable()
            profiler.dump_stats(profile_to)
        if server_cpu is not None and cpu_used is not None:
            cpu_used.append(server_cpu() - cpu_before)
        proc.send_signal(signal.SIGTERM)
        worker_said = await proc.stdout.read()
        await proc.wait()
        if client_cpu is not None:
            client_cpu.append(planner_cpu)
            for line in worker_said.decode().splitlines():
                if line.startswith("CPU "):
                    client_cpu.append(float(line[4:]))
        latencies.sort()
        return done / elapsed, latencies


async def manual(
    address: str, seconds: float, coroutines: int,
    server_cpu: Callable[[], float] | None = None, cpu_used: list[float] | None = None,
    client_cpu: list[float] | None = None,
) -> float:
    """Tasks/s of the guide's manual loop: ``coroutines`` coroutines of one client, each
    looping ``submit`` -> ``receive`` -> ``complete`` on one queue (the counterpart of
    greenstalk's put -> reserve -> delete). Given ``server_cpu``, the CPU seconds rsd
    used meanwhile are appended to ``cpu_used``; given ``client_cpu``, the CPU seconds
    this process (the one client) used meanwhile."""
    async with AsyncRunstate(holder="bench-manual", address=address) as rs:
        await rs.mailboxes.ensure(MAILBOX, mode="WORK")
        run = await rs.scopes.create()
        mailbox = run.mailbox(MAILBOX)
        done = 0
        counter = 0
        stop_at = time.perf_counter() + seconds

        async def loop() -> None:
            nonlocal done, counter
            while time.perf_counter() < stop_at:
                counter += 1
                await mailbox.submit({"n": counter}, key=f"task-{counter}", slim=True)
                delivery = await mailbox.receive()
                if delivery is not None:
                    await delivery.complete(result={"payload": {"n": delivery.data["n"]}})
                    done += 1

        started = time.perf_counter()
        cpu_before = server_cpu() if server_cpu is not None else 0.0
        client_before = time.process_time()
        await asyncio.gather(*(loop() for _ in range(coroutines)))
        elapsed = time.perf_counter() - started
        if client_cpu is not None:
            client_cpu.append(time.process_time() - client_before)
        if server_cpu is not None and cpu_used is not None:
            cpu_used.append(server_cpu() - cpu_before)
        return done / elapsed


async def planner(
    address: str, seconds: float, inflight: int, concurrency: int,
    server_cpu: Callable[[], float] | None = None, together: bool = False,
) -> None:
    """Print tasks/s and latencies (and rsd's CPU per task given ``server_cpu``)."""
    cpu: list[float] = []
    clients: list[float] = []
    rate, latencies = await measure(
        address, seconds, inflight, concurrency, server_cpu, cpu, clients, together
    )
    done = len(latencies)

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(len(latencies) * p))] * 1000

    print(f"tasks submit->consume->complete->result, {inflight} in flight, worker "
          f"concurrency {concurrency}: {rate:,.0f} tasks/s ({done} tasks)")
    print(f"complete -> result latency: p50 {pct(0.5):.3f} ms, p99 {pct(0.99):.3f} ms, "
          f"max {latencies[-1] * 1000:.3f} ms")
    if cpu and done:
        print(f"rsd CPU per task (submit, result wait, receive, complete): "
              f"{cpu[0] / done * 1e6:.1f} us (target <= {TARGET_SERVER_US_PER_TASK:.0f} us)")
    if len(clients) == 2 and done:
        print(f"client CPU per task: planner {clients[0] / done * 1e6:.1f} us, "
              f"worker {clients[1] / done * 1e6:.1f} us")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--role", choices=["planner", "worker"], default="planner")
    parser.add_argument("--address")
    parser.add_argument("--scope")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--inflight", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--fsync", default="always", choices=["always", "everysec", "no"])
    parser.add_argument("--shape", choices=["consume", "manual"], default="consume",
                        help="consume: a planner and a worker process running consume(); "
                        "manual: the guide's submit/receive/complete loop from --inflight "
                        "coroutines of one client")
    parser.add_argument("--planner", choices=["ticket", "together"], default="ticket",
                        help="ticket: submit() then ticket.result(); together: "
                        "submit_and_wait() (one write for both)")
    parser.add_argument("--tls", action="store_true",
                        help="serve and connect over TLS (a throwaway certificate)")
    args = parser.parse_args()
    if args.role == "worker":
        await worker(args.address, args.scope, args.concurrency)
        return
    secure: contextlib.AbstractContextManager[list[str]] = (
        throwaway_tls() if args.tls else contextlib.nullcontext([])
    )
    with secure as tls_flags:
        if args.address:
            await planner(args.address, args.seconds, args.inflight, args.concurrency,
                          together=args.planner == "together")
            return
        async with rsd_process("--fsync", args.fsync, *tls_flags) as server:
            address = server.address
            if args.tls:
                address = f"tls://{address}"
                print("over TLS (a throwaway certificate)")
            print(f"rsd --fsync {args.fsync}")
            if args.shape == "manual":
                cpu: list[float] = []
                rate = await manual(address, args.seconds, args.inflight, server.cpu_seconds,
                                    cpu)
                client = time.process_time()
                print(f"manual loop (submit, receive, complete), {args.inflight} coroutines: "
                      f"{rate:,.0f} tasks/s")
                print(f"rsd CPU per task: {cpu[0] / (rate * args.seconds) * 1e6:.1f} us; "
                      f"client CPU (whole run) {client:.2f} s")
                return
            await planner(address, args.seconds, args.inflight, args.concurrency,
                          server.cpu_seconds, together=args.planner == "together")

if __name__ == "__main__":
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
