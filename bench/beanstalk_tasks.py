"""The beanstalkd queue a user would run instead of rsd's tasks, through greenstalk.

``tasks`` starts ``PROCESSES`` client processes (greenstalk is blocking), each with one
connection looping put -> reserve -> delete on a shared tube, and returns the deleted
(finished) jobs per second over all of them, with the CPU the beanstalkd server and the
client processes spent meanwhile: the counterpart of ``bench.tasks.measure``. ``fill``
leaves N ready jobs in another tube, for the state figures.

The window opens only once every client is connected and has said so (``READY`` on its
stdout), and each client counts its jobs and its own CPU inside that window alone: a
fixed head start (the 1 s this used to give) is too short for a Python start-up on a
loaded machine, and a client that started late lost part of a window it was still
divided by. Each process is ``python -m bench.beanstalk_tasks PORT``; it reads the
window (two wall-clock times) on stdin and prints ``JOBS CPU_SECONDS``.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from multiprocessing.queues import Queue

from bench.harness import cpu_seconds, forked_clients, launched_clients

__all__ = ["PROCESSES", "SHAPE", "PeerRun", "fill", "tasks"]

TUBE = "bench-tasks"
PROCESSES = 4
SHAPE = f"put/reserve/delete in {PROCESSES} processes forked from one launcher"
"""The peer's shape, as the task rows name it."""


@dataclass
class PeerRun:
    """One window of the peer: jobs/s, jobs, and the CPU seconds its server and its
    client processes (together) spent in the window."""

    rate: float
    jobs: int
    server_cpu: float
    client_cpu: float


async def tasks(port: int, server_pid: int, seconds: float,
                processes: int = PROCESSES) -> PeerRun:
    """Finished jobs/s of ``processes`` put/reserve/delete loops over ``seconds``, once
    every loop is connected; ``server_pid`` is beanstalkd's, whose CPU is read from /proc."""
    server_before = 0.0

    def opened() -> None:
        nonlocal server_before
        server_before = cpu_seconds(server_pid)

    out = await launched_clients(
        "bench.beanstalk_tasks", [str(port), str(processes)],
        lambda start: f"{start} {start + seconds}\n", "beanstalkd", opened)
    server_cpu = cpu_seconds(server_pid) - server_before
    jobs, client_cpu = out.decode().split()
    return PeerRun(int(jobs) / seconds, int(jobs), server_cpu, float(client_cpu))


def fill(port: int, count: int) -> None:
    """Put ``count`` ready jobs on the tube ``backlog`` (nobody reserves them)."""
    import greenstalk

    with greenstalk.Client(("127.0.0.1", port), use="backlog") as client:
        for i in range(count):
            client.put(json.dumps({"n": i, "company": f"company-{i}"}))


def _loop(port: int, ready: Queue[None], window: Queue[tuple[float, float]],
          results: Queue[tuple[int, float]]) -> None:
    """One client process: connect, say so, wait for the window, loop in it, and send
    (jobs, CPU seconds in the window)."""
    import greenstalk

    done = 0
    with greenstalk.Client(("127.0.0.1", port), use=TUBE, watch=TUBE) as client:
        ready.put(None)
        start, stop = window.get()
        time.sleep(max(0.0, start - time.time()))
        cpu_before = time.process_time()
        while time.time() < stop:
            client.put(json.dumps({"n": done}))
            job = client.reserve(timeout=30)
            client.delete(job)
            done += 1
        results.put((done, time.process_time() - cpu_before))


def _launch(port: int, processes: int) -> None:
    """Fork ``processes`` client loops from this one process (greenstalk imported once,
    before the fork), print READY once all are connected, read the window on stdin, and
    print the jobs and CPU seconds of all of them in it."""
    import greenstalk  # noqa: F401  (imported once, before the fork)

    done: list[tuple[int, float]] = forked_clients(
        _loop, [(port,)] * processes, "a greenstalk loop")
    print(sum(jobs for jobs, _ in done), f"{sum(cpu for _, cpu in done):.6f}")


if __name__ == "__main__":
    _launch(int(sys.argv[1]), int(sys.argv[2]))
