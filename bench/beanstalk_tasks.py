"""The beanstalkd queue a user would run instead of rsd's tasks, through greenstalk.

``tasks`` starts P processes (greenstalk is blocking), each with one connection looping
put -> reserve -> delete on a shared tube for the same wall-clock window, and returns
the deleted (finished) jobs per second over all of them: the counterpart of
``bench.tasks.measure``. ``fill`` leaves N ready jobs in another tube, for the state
figures. Each process is ``python -m bench.beanstalk_tasks PORT START STOP`` and prints
its count.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

__all__ = ["fill", "tasks"]

TUBE = "bench-tasks"


async def tasks(port: int, processes: int, seconds: float) -> float:
    """Finished jobs/s of ``processes`` put/reserve/delete loops over ``seconds``."""
    start = time.time() + 1.0  # every process connected and waiting by then
    stop = start + seconds
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.beanstalk_tasks", str(port), str(start), str(stop),
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(processes)
    ]
    total = 0
    for proc in procs:
        out, _ = await proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"a beanstalkd bench process exited with {proc.returncode}")
        total += int(out.decode().split()[0])
    return total / seconds


def fill(port: int, count: int) -> None:
    """Put ``count`` ready jobs on the tube ``backlog`` (nobody reserves them)."""
    import greenstalk

    with greenstalk.Client(("127.0.0.1", port), use="backlog") as client:
        for i in range(count):
            client.put(json.dumps({"company": f"company-{i}", "n": i}))


def _loop(port: int, start: float, stop: float) -> int:
    import greenstalk

    done = 0
    with greenstalk.Client(("127.0.0.1", port), use=TUBE, watch=TUBE) as client:
        time.sleep(max(0.0, start - time.time()))
        while time.time() < stop:
            client.put(json.dumps({"n": done}))
            job = client.reserve(timeout=30)
            client.delete(job)
            done += 1
    return done


if __name__ == "__main__":
    port, start, stop = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    print(_loop(port, start, stop))
