"""A snapshot written whole stands even when the segments it covers cannot be deleted
(EACCES, EIO): the requests waiting for it (SNAPSHOT_NOW) are answered, the failure is
logged, and the next snapshot deletes what this one left (every covered file)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pytest

from rsd.core import Core
from rsd.disk import snapshots as snapshots_module
from rsd.disk.journal import Journal
from rsd.disk.snapshots import Snapshots
from rsproto import Kind


def test_snapshot_now_is_answered_when_covered_segments_cannot_be_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    core = Core(lambda: "s")
    journal = Journal(tmp_path, 1)
    snapshots = Snapshots(journal, core, snapshot_bytes=1 << 30)
    snapshots.wake = lambda: None
    snapshots.ask(1, 10)
    pid = snapshots.start()
    _, status = os.waitpid(pid, 0)

    def refused(*args: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(snapshots_module, "delete_covered", refused)
    with caplog.at_level(logging.ERROR, logger="rsd"):
        snapshots.finished(status)  # raised PermissionError before
    answered = core.effects.take_messages()
    journal.close()
    assert [msg[1][:2] for msg in answered] == [[Kind.REPLY, 10]]
    assert "were not all deleted" in caplog.text
    assert snapshots.stats["snapshot_failures"] == 0
