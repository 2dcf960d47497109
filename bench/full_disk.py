"""A disk that fills while rsd runs: how many acknowledged tasks survive the restart.

    sudo .venv/bin/python -m bench.full_disk [--runs 5] [--disk-mib 40] [--tree PATH]

Each run makes a fresh ext4 file system of --disk-mib on a loop device (needs root),
puts an 8 MiB ballast file on it, and starts rsd there with ``--snapshot-bytes 1 MiB``
(and the default ``--fsync always``). Clients submit 2 KB tasks, 8 at a time, until rsd
stops (exit 74 once a journal write finds the disk full); every task whose submit was
answered is acknowledged. Then the ballast is removed (space freed) and rsd restarted:
if it refuses, once more with ``--repair``. Reported per run: the tasks acknowledged,
those found after the restart, whether the plain restart refused, the ``.snap.tmp``
files left on the full disk, and the snapshot failures rsd logged before it stopped.

``--tree`` runs the rsd of another checkout (``--tree /work/main`` for the figures
before a change); the client and this script are this checkout's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rsclient import AsyncRunstate, NotFoundError, RunstateError

HERE = Path(__file__).resolve().parent.parent
_READY = re.compile(r"^rsd listening on (\S+):(\d+)$")
PAD = 2000  # bytes of data per task
BALLAST = 8 << 20


@dataclass
class Run:
    acknowledged: int = 0
    found: int = 0
    exit_code: int | None = None
    refused: str | None = None  # the plain restart's refusal, if any
    tmp_left: int = 0  # .snap.tmp files on the full disk after rsd stopped
    snapshot_failures_logged: int = 0
    seconds: float = 0.0


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=60)


def _start(tree: Path, data: Path, log: Path, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """Start rsd from ``tree``; the process and its address ("" if it refused to start)."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
    with open(log, "a") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rsd", "--listen", "127.0.0.1:0", "--data-dir", str(data),
             *extra],
            stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True,
            cwd=tree, env=env,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    match = _READY.match(line)
    if match is None:
        proc.wait(60)
        return proc, ""
    return proc, f"{match.group(1)}:{match.group(2)}"


async def _fill(address: str) -> list[str]:
    """Submit 2 KB tasks, 8 at a time, until rsd goes away; the acknowledged ids."""
    acked: list[str] = []
    pad = "x" * PAD
    try:
        async with AsyncRunstate(holder="filler", address=address, connect_timeout=2.0) as rs:
            await rs.scopes.create(id="s")
            await rs.mailboxes.ensure("jobs")
            box = rs.scope("s").mailbox("jobs")
            for round_no in range(1_000_000):
                keys = [f"t{round_no}-{i}" for i in range(8)]
                answers = await asyncio.gather(
                    *(box.submit({"pad": pad}, key=key) for key in keys),
                    return_exceptions=True,
                )
                ok = [a.id for a in answers if not isinstance(a, BaseException)]
                acked += ok
                if len(ok) < len(keys):
                    break
    except (RunstateError, OSError):
        pass
    return acked


async def _found(address: str, ids: list[str]) -> int:
    async with AsyncRunstate(holder="reader", address=address) as rs:
        await rs.scopes.create(id="s")
        found = 0
        for task_id in ids:
            with contextlib.suppress(NotFoundError):
                await rs.scope("s").task(task_id).status()
                found += 1
        return found


def one_run(tree: Path, disk_mib: int) -> Run:
    run = Run()
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="rsd-full-disk-") as where:
        root = Path(where)
        image, mount, log = root / "disk.img", root / "mnt", root / "rsd.log"
        mount.mkdir()
        with open(image, "wb") as f:
            f.truncate(disk_mib << 20)
        _sh("mkfs.ext4", "-q", "-F", str(image))
        _sh("mount", "-o", "loop", str(image), str(mount))
        try:
            with open(mount / "ballast", "wb") as f:
                os.posix_fallocate(f.fileno(), 0, BALLAST)
            data = mount / "data"
            proc, address = _start(tree, data, log, "--snapshot-bytes", str(1 << 20))
            assert address, log.read_text()
            acked = asyncio.run(_fill(address))
            run.acknowledged = len(acked)
            run.exit_code = proc.wait(60)
            run.tmp_left = sum(1 for n in os.listdir(data) if n.endswith(".tmp"))
            run.snapshot_failures_logged = log.read_text().count("snapshot writer failed")
            (mount / "ballast").unlink()
            proc, address = _start(tree, data, log)
            if not address:
                lines = log.read_text().strip().splitlines()
                run.refused = lines[-1][:300] if lines else f"exit {proc.returncode}"
                proc, address = _start(tree, data, log, "--repair")
            if address:
                run.found = asyncio.run(_found(address, acked))
                proc.terminate()
                proc.wait(60)
            else:  # even --repair refused: nothing found
                run.refused = f"{run.refused}; --repair: exit {proc.returncode}"
        finally:
            _sh("umount", str(mount))
    run.seconds = round(time.monotonic() - began, 1)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--disk-mib", type=int, default=40)
    parser.add_argument("--tree", type=Path, default=HERE,
                        help="the checkout whose rsd runs (default: this one)")
    parser.add_argument("--json", type=Path, help="also write the runs here")
    args = parser.parse_args()
    runs = []
    for n in range(args.runs):
        run = one_run(args.tree.resolve(), args.disk_mib)
        runs.append(run)
        lost = run.acknowledged - run.found
        print(f"run {n + 1}: {run.acknowledged} acknowledged, {run.found} found after "
              f"restart ({lost} lost); exit {run.exit_code}; plain restart "
              f"{'refused: ' + run.refused if run.refused else 'ok'}; "
              f".snap.tmp left {run.tmp_left}; snapshot failures logged "
              f"{run.snapshot_failures_logged}; {run.seconds} s", flush=True)
    total_lost = sum(r.acknowledged - r.found for r in runs)
    print(f"{len(runs)} runs, tree {args.tree}: {total_lost} acknowledged tasks lost in all; "
          f"{sum(1 for r in runs if r.refused)} plain restarts refused")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in runs], indent=2))


if __name__ == "__main__":
    main()
