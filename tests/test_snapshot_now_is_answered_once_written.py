"""SNAPSHOT_NOW in the shell: a request is answered once a snapshot started after it is
written; requests arriving while one is written wait for the next; at most
``Policy.MAX_SNAPSHOT_WAITERS`` wait."""

from __future__ import annotations

import os
from pathlib import Path

from rsd.core import Core
from rsd.disk.journal import Journal
from rsd.disk.snapshots import Snapshots
from rsd.policy import Policy
from rsproto import ErrorCode, Kind


def _shell(tmp_path: Path) -> tuple[Core, Snapshots, list[int]]:
    core = Core(lambda: "s")
    journal = Journal(tmp_path, 1)
    snapshots = Snapshots(journal, core, snapshot_bytes=1 << 30)
    woken: list[int] = []
    snapshots.wake = lambda: woken.append(1)
    return core, snapshots, woken


def _finish(snapshots: Snapshots, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    snapshots.finished(status)


def test_a_request_waits_for_a_snapshot_started_after_it(tmp_path: Path) -> None:
    core, snapshots, woken = _shell(tmp_path)
    assert not snapshots.due()
    snapshots.ask(1, 10)
    assert snapshots.due() and core.effects.take_messages() == []
    pid = snapshots.start()
    snapshots.ask(2, 20)  # while that one is written: it covers less than asked for
    assert not snapshots.due()  # one at a time
    _finish(snapshots, pid)
    answered = core.effects.take_messages()
    assert answered == [(1, [Kind.REPLY, 10, {"snapshot": "snapshot-0000000000000001.snap",
                                                "covers": 1}])]
    assert (tmp_path / "snapshot-0000000000000001.snap").exists() and woken
    assert snapshots.due()  # the second request starts the next one
    pid = snapshots.start()
    _finish(snapshots, pid)
    assert [msg[1][1] for msg in core.effects.take_messages()] == [20]
    assert not snapshots.due()
    snapshots.journal.close()


def test_at_most_max_snapshot_waiters_wait(tmp_path: Path) -> None:
    core, snapshots, _ = _shell(tmp_path)
    for rid in range(1, Policy.MAX_SNAPSHOT_WAITERS + 1):
        snapshots.ask(1, rid)
    assert core.effects.take_messages() == []
    snapshots.ask(1, 999)
    [(conn, frame)] = core.effects.take_messages()
    assert conn == 1 and frame[:3] == [Kind.ERROR, 999, ErrorCode.RESOURCE_EXHAUSTED]
    assert "max_snapshot_waiters" in frame[3]
    assert len(snapshots.asks) == Policy.MAX_SNAPSHOT_WAITERS
    snapshots.journal.close()
