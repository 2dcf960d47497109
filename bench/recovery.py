"""Recovery of many live tasks: seconds to rebuild the core, and its peak memory.

Builds a data directory holding one snapshot of ``--tasks`` queued tasks (submitted
through the core exactly as live requests are, then written by the snapshot writer rsd
uses), and recovers it in a fresh process through ``rsd.startup.recover``, the path
``rsd`` takes at start. Prints the seconds recovery took, the memory of the rebuilt live
state (resident memory after recovery minus that before it) and the peak over the
recovery (VmHWM minus the same baseline), and the memory the same state took when it
was built live by requests, beside the targets: at most 3 s for 1M live
tasks, a peak under twice the live state.

``--journal N`` instead builds a journal of N records and no snapshot (claim grants and
releases, as ``bench.durability recover-journal`` writes them: a crash's journal, no
clean stop) and recovers it the same way, against the same 3 s per million; it also
times the read side alone (reading, checking and decoding the frames, nothing applied)
so the split between the journal's part and the core's is plain.

    .venv/bin/python -m bench.recovery [--tasks 1000000] [--quick]
    .venv/bin/python -m bench.recovery --journal 1000000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_SECONDS_PER_MILLION = 3.0
TARGET_PEAK_RATIO = 2.0


def _status(field: str) -> int:
    """A ``/proc/self/status`` figure in bytes (VmRSS, VmHWM)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def build(directory: Path, tasks: int) -> int:
    """A data directory whose one snapshot holds ``tasks`` queued tasks of one run; the
    memory that state took when it was built live (resident bytes it added)."""
    from rsd.core import Core
    from rsd.disk.snapshotfile import write_snapshot
    from rsproto import Op

    core = Core(lambda: "bench-run", random_bytes=os.urandom)
    core.connected(1, "bench", tenant="default", admin=True)
    core.handle(0.0, 1, 1, Op.MAILBOX_ENSURE, {"name": "jobs"})
    scope = core.handle(0.0, 1, 2, Op.SCOPE_CREATE, {})["scope"]
    effects = core.effects
    base = _status("VmRSS")
    for n in range(tasks):
        core.handle(0.0, 1, n + 3, Op.TASK_SUBMIT, {
            "scope": scope, "mailbox": "jobs", "key": f"task-{n}", "data": {"n": n},
        })
        if n % 4096 == 0:
            effects.take_records()
            effects.take_messages()
            effects.take_sync()
    effects.take_records()
    live = _status("VmRSS") - base
    write_snapshot(directory, core, 0, os.getpid())
    return live


def recover_here(directory: Path) -> dict[str, float]:
    """Recover ``directory`` in this process: seconds, live and peak bytes over baseline."""
    import gc

    from rsd.core import Core
    from rsd.startup import recover

    gc.collect()
    base = _status("VmRSS")
    core = Core(lambda: "unused", random_bytes=os.urandom)
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_SELF)
    journal, report = recover(directory, core, 0.0, policy="no")
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    journal.close()
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    return {
        "seconds": seconds,
        "cpu_seconds": user + system,  # what a busy machine inflates less than the wall
        "user_seconds": user,
        "system_seconds": system,  # mostly the kernel's page faults of the new state
        "page_faults": after.ru_minflt - before.ru_minflt,
        "live_bytes": _status("VmRSS") - base,
        "peak_bytes": _status("VmHWM") - base,
        "records": report.snapshot_records + report.records,
    }


def read_side(directory: Path) -> float:
    """Seconds to read, check and decode every frame of ``directory``, applying none."""
    from rsd.disk.recovery import Recovery

    started = time.perf_counter()
    for _ in Recovery(directory).batches():
        pass
    return time.perf_counter() - started


def journal_main(records: int) -> None:
    """Recovery of a journal of ``records`` records and no snapshot, in a fresh process."""
    from bench.durability import build_journal

    with tempfile.TemporaryDirectory(prefix="rsd-bench-recovery-") as data:
        started = time.perf_counter()
        build_journal(Path(data), records)
        size = sum(f.stat().st_size for f in Path(data).iterdir())
        print(f"built a journal of {records:,} records ({size / 2**20:.0f} MiB), no "
              f"snapshot, in {time.perf_counter() - started:.1f} s")
        out = subprocess.run(
            [sys.executable, "-m", "bench.recovery", "--recover", data, "--read-side"],
            check=True, capture_output=True, text=True,
        ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    target = TARGET_SECONDS_PER_MILLION * got["records"] / 1_000_000
    print(f"recovery of {got['records']:,} journal records: {got['seconds']:.2f} s, "
          f"{got['cpu_seconds']:.2f} s of CPU (target <= {target:.2f} s); the read side "
          f"alone (read, check, decode) {got['read_seconds']:.2f} s; load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 tasks")
    parser.add_argument("--journal", type=int, metavar="RECORDS",
                        help="recover a journal of this many records and no snapshot")
    parser.add_argument("--recover", help=argparse.SUPPRESS)  # the child's data directory
    parser.add_argument("--read-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.recover:
        read = read_side(Path(args.recover)) if args.read_side else None
        got = recover_here(Path(args.recover))
        if read is not None:
            got["read_seconds"] = read
        print(json.dumps(got))
        return
    if args.journal:
        journal_main(args.journal)
        return
    tasks = 100_000 if args.quick else args.tasks
    with tempfile.TemporaryDirectory(prefix="rsd-bench-recovery-") as data:
        started = time.perf_counter()
        built_live = build(Path(data), tasks)
        size = sum(f.stat().st_size for f in Path(data).iterdir())
        print(f"built a snapshot of {tasks:,} live tasks ({size / 2**20:.0f} MiB) in "
              f"{time.perf_counter() - started:.1f} s")
        out = subprocess.run(
            [sys.executable, "-m", "bench.recovery", "--recover", data],
            check=True, capture_output=True, text=True,
        ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    target = TARGET_SECONDS_PER_MILLION * tasks / 1_000_000
    ratio = got["peak_bytes"] / max(built_live, 1)
    mib = 2**20
    print(f"recovery of {tasks:,} live tasks: {got['seconds']:.2f} s, {got['cpu_seconds']:.2f} s "
          f"of CPU (target <= {target:.2f} s; {got['user_seconds']:.2f} s user, "
          f"{got['system_seconds']:.2f} s system for {got['page_faults']:,} page faults; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    print(f"the state built live: {built_live / mib:.0f} MiB; recovered: "
          f"{got['live_bytes'] / mib:.0f} MiB, peak {got['peak_bytes'] / mib:.0f} MiB over the "
          f"process's baseline: {ratio:.2f}x the live state (target < {TARGET_PEAK_RATIO:.0f}x)")


if __name__ == "__main__":
    main()
