"""A start right after rsd was killed waits for the lock while its holder is dead.

rsd's forked writers (a snapshot's, a standby copy's) hold the data directory's lock
too, inherited with its descriptor, and die of their parent's death a moment after it
(PR_SET_PDEATHSIG), or only once the write they are in ends. A start in that moment
found the directory locked "by another rsd" naming the dead one, and exited 1: seen as a
kill -9 test's restart that failed when the restart was quick (tests/test_durability.py's
burst of large submits, a snapshot's writer running at the kill). Now a start waits
while the pid LOCK names has exited (datadir.py, ``DEAD_OWNER_WAIT_SECONDS``); one whose
owner lives is still refused at once (tests/test_the_data_directory_lock_outlives_its_
lock_file.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.process import subprocess_env

from rsd.disk.datadir import DataDir

# An "rsd" that locks the directory, forks a writer that keeps the lock a moment (as a
# snapshot's writer does, killed by its parent's death), and dies at once. It prints
# the writer's pid.
_KILLED_WITH_A_WRITER = """
import os, sys, time
from rsd.disk.datadir import DataDir
DataDir(sys.argv[1]).open()
read, write = os.pipe()
writer = os.fork()
if writer == 0:
    os.close(read)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)  # (the test reads the output to its end)
    os.dup2(null, 2)
    os.close(write)  # (the test now knows the writer holds the lock)
    time.sleep(0.5)
    os._exit(0)
os.close(write)
os.read(read, 1)
print(writer, flush=True)
os._exit(0)
"""


def test_a_start_waits_for_the_lock_a_dead_rsds_writer_still_holds(tmp_path: Path) -> None:
    data = tmp_path / "data"
    killed = subprocess.run([sys.executable, "-c", _KILLED_WITH_A_WRITER, str(data)],
                            env=subprocess_env(), capture_output=True, check=True)
    writer = int(killed.stdout)
    assert Path(f"/proc/{writer}").exists(), "the writer ended before the start: no test"
    started = DataDir(data)
    started.open()  # waits for the writer, instead of DataDirLocked naming the dead rsd
    stat = Path(f"/proc/{writer}/stat")
    assert not stat.exists() or b") Z" in stat.read_bytes()  # it had ended first
    started.close()
