"""A tenant out of payload room skips its schedules' fires, every fire time of every
schedule, for as long as it stays full: the log gets one line at once and one summary
per interval (logs.py's ``NoteLog``, logsummary.py: the mechanism failed HELLOs use),
not a line per skipped fire (3,840 lines in 8 s, without end, before). Each skip is
still counted (``rsd_events_total``).

On the core's fake clock, the notes drained as the shell drains them after a tick, and
the log's timer on a fake loop moved in step.
"""

from __future__ import annotations

import logging

import pytest

from rsd.core.ground.effects import MAX_NOTES
from rsd.logs import NoteLog
from rsd.policy import Policy
from rsproto import Limits, Op
from tests.support.core import CoreDriver
from tests.support.fakeloop import FakeLoop

SKIPPED = "schedule fire skipped"


def _full_tenant() -> CoreDriver:
    """Five schedules firing every second whose data leaves no room for their fires."""
    core = CoreDriver(recovered=True)
    core.tenants.set_byte_limits(Limits.MAX_PAYLOAD_BYTES, {})  # 256 KiB, the least
    for n in range(5):
        core.call(Op.SCHEDULE_ENSURE, {"scope": "s", "name": f"tick-{n}", "mailbox": "jobs",
                                       "every_seconds": 1, "data": "x" * 50_000})
    core.drain()
    return core


def test_skips_make_one_line_at_once_and_one_summary_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core, loop = _full_tenant(), FakeLoop()
    notes = NoteLog(loop)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="rsd.events"):
        for _ in range(130):  # two intervals and a bit
            core.advance(1.0)
            core.drain()
            notes.log(*core.effects.take_notes())
            loop.advance(1.0)
    skipped = core.effects.counts[SKIPPED]
    assert skipped >= 5 * 129  # every fire time of every schedule, each counted
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 5, lines  # first, summary; first, summary; first (interval 3)
    assert lines[0] == f"{SKIPPED} (more in the next 60 s are summed up in one line)"
    assert caplog.records[0].__dict__["schedule"] == "tick-0"  # its ids, as any note's
    assert lines[1].startswith(f"{5 * 60} schedule fires skipped in the last 60 s, "
                               "from 5 tenant/scope/schedule; most: default/s/tick-")
    assert lines[2] == lines[0] and lines[4] == lines[0]
    with caplog.at_level(logging.INFO, logger="rsd.events"):
        notes.stop()  # the server stops: the open interval's line now
    summaries = [record.getMessage() for record in caplog.records][1::2]
    assert len(summaries) == 3 and all("schedule fires skipped" in line for line in summaries)
    assert sum(int(line.split()[0]) for line in summaries) == skipped  # each one counted


def test_more_skips_in_one_turn_than_notes_kept_are_summed_up_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """300 schedules due at one instant: a turn keeps MAX_NOTES notes and only counts the
    rest; that count is summed up per interval as well, not one line a turn."""
    core, loop = CoreDriver(recovered=True), FakeLoop()
    notes = NoteLog(loop)  # type: ignore[arg-type]
    for run in range(3):
        core.create_runs(f"r{run}")
        for n in range(100):
            core.call(Op.SCHEDULE_ENSURE, {"scope": f"r{run}", "name": f"t{n}",
                                           "mailbox": "jobs", "every_seconds": 1, "data": 1})
    core.drain()
    core.tenants.set_byte_limits(core.tenants.usage["default"].bytes, {})  # full now
    assert MAX_NOTES < 300 <= Policy.MAX_FIRED_PER_TICK
    with caplog.at_level(logging.INFO, logger="rsd.events"):
        for _ in range(61):
            core.advance(1.0)
            core.drain()
            notes.log(*core.effects.take_notes())
            loop.advance(1.0)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 6, lines  # skips: first, summary, first; dropped: the same
    dropped = [line for line in lines if "not logged" in line]
    assert dropped[0] == (f"{300 - MAX_NOTES} more events in the same turn were not logged "
                          "(more in the next 60 s are summed up in one line)")
    assert dropped[1].startswith(f"{60 * (300 - MAX_NOTES)} more events were not logged in "
                                 "the last 60 s")
    assert core.effects.counts[SKIPPED] == 61 * 300


def test_other_notes_are_still_logged_one_line_each(caplog: pytest.LogCaptureFixture) -> None:
    core, loop = CoreDriver(recovered=True), FakeLoop()
    notes = NoteLog(loop)  # type: ignore[arg-type]
    core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 5})
    core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "j", "lease_seconds": 5})
    core.advance(6)
    with caplog.at_level(logging.INFO, logger="rsd.events"):
        notes.log(*core.effects.take_notes())
    assert [r.getMessage() for r in caplog.records] == ["claim lease expired"] * 2
    assert loop.live() == []  # nothing summed up: no timer
