"""Start from a data directory: rebuild the core from it, and open the journal that
continues it.

The one place where disk and core meet at start: recovery.py reads the records,
this module applies them and acts on what recovery found.

What always holds:
- every record reaches the core through ``Core.apply``, the path live changes take, but
  for queued items, which ``core.restore`` places in bulk into exactly the same state;
- after a repair the ids jump past any that could ever have been issued (what was
  dropped may have handed out any), and the repaired state is written as a complete
  snapshot before anything else, so the next start needs no ``--repair``;
- segments are deleted only once a snapshot covering them is in place;
- ``core.recovered`` is called once, last, with whether the last stop was clean
  (``recover``); ``replay`` stops before it, leaving the state exactly as its records
  say: a cluster node's directory, which is either a standby's copy of its primary's
  state, to be followed on, or a primary's own, to be recovered only if it leads again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from .collector import frozen_when_done
from .core import Core
from .core.restore import Restore
from .disk.datadir import snapshot_name
from .disk.journal import POLICIES, Journal
from .disk.recovery import Recovery, RecoveryReport
from .disk.snapshotfile import delete_covered, write_snapshot
from .policy import Policy

__all__ = ["recover", "replay"]


def recover(
    directory: Path, core: Core, now: float, *, policy: str = Policy.FSYNC, repair: bool = False
) -> tuple[Journal, RecoveryReport]:
    """Rebuild ``core`` from ``directory`` and open a new segment to append to.

    Raises RecoveryError when the files cannot be used (see recovery.py). The cyclic
    garbage collector is off meanwhile (millions of new objects would make it rescan
    the heap over and over) and the rebuilt state is frozen out of its reach afterwards:
    state is freed by reference counting, not by the GC (collector.py).
    """
    journal, report = replay(directory, core, now, policy=policy, repair=repair)
    core.recovered(now, report.clean)
    return journal, report


def replay(
    directory: Path, core: Core, now: float, *, policy: str = Policy.FSYNC, repair: bool = False
) -> tuple[Journal, RecoveryReport]:
    """``recover`` but for its last step: the state as the records left it (see the
    module docstring), and a new segment to append to."""
    if policy not in POLICIES:
        raise ValueError(f"fsync policy must be one of {POLICIES}")
    with frozen_when_done():
        return _replay(Path(directory), core, now, policy, repair)


def _replay(
    directory: Path, core: Core, now: float, policy: str, repair: bool
) -> tuple[Journal, RecoveryReport]:
    started = time.perf_counter()
    recovery = Recovery(directory, repair)
    apply = Restore(core).apply
    for batch in recovery.batches():  # a frame at a time, applied as it is read
        apply(batch, now)
    recovery.mend()
    report = recovery.report
    covers = report.covers
    if report.repaired:
        core.reserve_ids_from(time.time_ns() // 1000)  # no counter outgrows µs since 1970
        covers = report.next_seq - 1
        write_snapshot(directory, core, covers, os.getpid())
        report.snapshot = snapshot_name(covers)
    delete_covered(directory, covers, report.snapshot)
    journal = Journal(directory, report.next_seq, policy)
    report.seconds = time.perf_counter() - started
    return journal, report
