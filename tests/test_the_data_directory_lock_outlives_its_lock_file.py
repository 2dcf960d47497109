"""The data directory's lock is an OS lock on the directory itself, held on an open
descriptor: deleting ``LOCK`` cannot lift it. A second rsd on the same directory is
refused even after ``LOCK`` was deleted (before, it started and both served the same
directory); the running rsd writes ``LOCK`` again, and stops (exit 74) if ``LOCK`` is
replaced by another file or the directory is removed or replaced.

Unit checks of ``DataDir`` in-process (two opens in one process conflict as two
processes do: ``flock`` is per open file), then one real second rsd."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from support.process import Rsd

from rsd.disk.datadir import DataDir, DataDirLocked
from rsd.disk.journal import EXIT_IO_ERROR


def test_a_deleted_lock_file_does_not_unlock_the_directory(tmp_path: Path) -> None:
    first = DataDir(tmp_path / "data")
    first.open()
    os.unlink(tmp_path / "data" / "LOCK")
    with pytest.raises(DataDirLocked, match="is locked by another rsd"):
        DataDir(tmp_path / "data").open()
    assert first.problem() is None  # LOCK is written again, with the owner's pid
    assert (tmp_path / "data" / "LOCK").read_text() == f"{os.getpid()}\n"
    with pytest.raises(DataDirLocked, match=rf"pid {os.getpid()}\)"):
        DataDir(tmp_path / "data").open()
    first.close()
    second = DataDir(tmp_path / "data")
    second.open()  # free once its owner closed it
    second.close()


def test_a_removed_or_replaced_directory_or_lock_file_is_a_problem(tmp_path: Path) -> None:
    data = tmp_path / "data"
    locked = DataDir(data)
    locked.open()
    (data / "LOCK").rename(tmp_path / "old-lock")
    (data / "LOCK").write_text("123\n")
    assert "LOCK was replaced by another file" in (locked.problem() or "")
    data.rename(tmp_path / "moved")
    data.mkdir()
    assert "was replaced by another directory" in (locked.problem() or "")
    shutil.rmtree(data)
    assert "is gone" in (locked.problem() or "")
    locked.close()


async def test_a_second_rsd_is_refused_after_lock_was_deleted(
    rsds: Callable[..., Rsd],
) -> None:
    first = rsds("first")
    await first.start()
    (first.data / "LOCK").unlink()
    second = rsds("second")
    second.data = first.data
    assert await second.refused() == 1
    assert f"data directory {first.data} is locked by another rsd" in second.log()
    assert first.alive
    assert await first.stop() == 0


async def test_a_running_rsd_stops_when_lock_is_replaced(rsds: Callable[..., Rsd]) -> None:
    server = rsds()
    await server.start()
    (server.data / "LOCK").rename(server.root / "old-lock")
    (server.data / "LOCK").write_text("123\n")  # what an older rsd would have done
    assert await server.exited(10) == EXIT_IO_ERROR
    assert "LOCK was replaced by another file" in server.log()
