"""Failpoints: named places where a test can make rsd die or fail, to prove recovery.

Only the crash tests set ``RSD_FAILPOINTS``; without it every ``hit`` is one dict lookup
that finds nothing. rsd reads it when a server starts (``arm``, from rsd.cli.main), not
as it imports: a server forked from a process that had imported rsd (the tests' fork
server, tests/support/forkserver.py) reads the variable of its own start, as a new
``python -m rsd`` would. The variable is a comma-separated list of ``NAME`` or ``NAME:N``
(trigger on the N-th time the point is reached, default the first). What a point does
is fixed by its name's suffix:

- ``...kill``: the process sends itself SIGKILL (no cleanup, no flush: a crash);
- ``...enospc`` / ``...eio``: the operation raises OSError(ENOSPC) / OSError(EIO);
- ``...hold``: at every visit from the N-th on, the calling thread waits while the file
  named by ``RSD_FAILPOINTS_HOLD_FILE`` exists (looking every 10 ms, at most
  ``HOLD_LIMIT_SECONDS``; a visit that waits creates ``<that file>.reached`` first): a
  test holds an fsync by creating the file, releases it by removing it, and sees what
  is answered meanwhile, with no timing involved.

Counts are per process: a forked snapshot writer starts from the parent's counts as
they were at the fork. The points: ``journal.before_write.kill``, ``journal.before_fsync.kill``,
``journal.after_fsync.kill`` (synced, replies not yet sent), ``journal.write.enospc``,
``journal.fsync.eio``, ``journal.fsync.hold`` (on the fsync thread, before the
fdatasync), ``snapshot.mid.kill`` (the snapshot writer and rsd both die halfway through
the file), ``snapshot.write.enospc`` (the snapshot writer's last write finds the disk
full), ``snapshot.after_rename.kill`` (snapshot in place, covered
segments not yet deleted), ``slots.after_switch.kill`` (a move of slots switched the map
in etcd; the source has not yet adopted it nor dropped the runs: wire/slotmoves.py), and
the seams of the slot-move fault tests, on the event loop's thread: ``slots.send_part.hold``
(the source, before it sends each part of a move's runs), ``slots.before_switch.hold``
(the source, every part sent, before its compare-and-swap of the map) and
``slots.import_part.hold`` (the target, before it imports each part: wire/slotimport.py).
"""

from __future__ import annotations

import errno
import os
import signal
import time

__all__ = ["HOLD_LIMIT_SECONDS", "arm", "hit"]

HOLD_LIMIT_SECONDS = 60.0  # a held point goes on after this long: a test cannot hang rsd


def _parse(spec: str) -> dict[str, int]:
    points: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, count = part.partition(":")
        points[name] = int(count) if count else 1
    return points


_armed: dict[str, int] = {}  # point -> the visit that triggers it (none until ``arm``)
_seen: dict[str, int] = {}  # point -> visits so far


def arm() -> None:
    """Arm the points ``RSD_FAILPOINTS`` names, every count from zero: called once where a
    server starts, before anything can reach a point."""
    _armed.clear()
    _armed.update(_parse(os.environ.get("RSD_FAILPOINTS", "")))
    _seen.clear()


def hit(name: str, pid_to_kill: int | None = None) -> None:
    """Reached failpoint ``name``: trigger it if a test armed it for this visit."""
    if not _armed or name not in _armed:
        return
    _seen[name] = _seen.get(name, 0) + 1
    if name.endswith(".hold"):
        if _seen[name] >= _armed[name]:
            _hold(os.environ.get("RSD_FAILPOINTS_HOLD_FILE", ""))
        return
    if _seen[name] != _armed[name]:
        return
    if name.endswith(".kill"):
        if pid_to_kill is not None:
            os.kill(pid_to_kill, signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)
    elif name.endswith(".enospc"):
        raise OSError(errno.ENOSPC, f"No space left on device (failpoint {name})")
    elif name.endswith(".eio"):
        raise OSError(errno.EIO, f"Input/output error (failpoint {name})")


def _hold(path: str) -> None:
    """Wait while ``path`` exists (at most ``HOLD_LIMIT_SECONDS``); a hold that waits
    first creates ``path + ".reached"``, so the test knows the point was reached."""
    if not path or not os.path.exists(path):
        return
    with open(path + ".reached", "w"):
        pass
    ends = time.monotonic() + HOLD_LIMIT_SECONDS
    while os.path.exists(path) and time.monotonic() < ends:
        time.sleep(0.01)
