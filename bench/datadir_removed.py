"""Submits acknowledged after the data directory was removed under a running rsd.

A fresh rsd (``--fsync always``) takes submits from ``--submitters`` concurrent callers
(one in flight each, unique keys); once ``--warmup`` were acknowledged the data directory
is removed (``rm -rf``, repeated until it is gone). For ``--watch`` seconds after that the
submits go on; the row says how many were acknowledged after the removal was complete,
the most by one submitter, and how rsd ended (issue 19: it went on acknowledging, 300 more
then lost; now at most the one each submitter had in flight, then exit 74).

    .venv/bin/python -m bench.datadir_removed [--submitters 8] [--warmup 500] [--watch 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import tempfile
import time
from pathlib import Path

from bench.harness import start_rsd, stop_rsd
from rsclient import AsyncRunstate, RunstateError


def _remove(path: Path) -> float:
    while path.exists():
        shutil.rmtree(path, ignore_errors=True)
    return time.monotonic()


async def measure(submitters: int, warmup: int, watch: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as root:
        data = Path(root) / "data"
        server = await start_rsd(data, "--fsync", "always")
        acks: list[tuple[int, float]] = []
        stop = asyncio.Event()
        try:
            async with AsyncRunstate(holder="bench", address=server.address,
                                     connect_timeout=1.0) as rs:
                await rs.scopes.create(id="s")
                await rs.mailboxes.ensure("jobs")
                box = rs.scope("s").mailbox("jobs")

                async def submitter(n: int) -> None:
                    i = 0
                    while not stop.is_set():
                        i += 1
                        try:
                            await asyncio.wait_for(box.submit({"n": i}, key=f"{n}-{i}"), 2.0)
                        except (RunstateError, TimeoutError):
                            await asyncio.sleep(0.05)  # keep trying: it may come back
                            continue
                        acks.append((n, time.monotonic()))

                tasks = [asyncio.create_task(submitter(n)) for n in range(submitters)]
                while len(acks) < warmup:
                    await asyncio.sleep(0.01)
                before = len(acks)
                gone = await asyncio.to_thread(_remove, data)
                await asyncio.sleep(watch)
                code = server.proc.returncode
                stop.set()
                for task in tasks:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(task, 5.0)
        finally:
            final = await stop_rsd(server.proc)
    late: dict[int, int] = {}
    for n, when in acks:
        if when > gone:
            late[n] = late.get(n, 0) + 1
    return {
        "acknowledged_before_removal": before,
        "acknowledged_after_removal": sum(late.values()),
        "most_by_one_submitter": max(late.values(), default=0),
        "rsd_exit_code": code if code is not None else f"still running (then {final})",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submitters", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--watch", type=float, default=3.0)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.submitters, args.warmup, args.watch))))


if __name__ == "__main__":
    main()
