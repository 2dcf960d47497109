"""Recovery hands each frame's records to the caller as soon as that frame is decoded
(recovery.py): the decoded records of a whole snapshot or segment never exist at once,
so recovery's peak memory is the rebuilt state plus one frame, not plus the file."""

from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from rsd.core import Rec
from rsd.disk.datadir import snapshot_name
from rsd.disk.logfile import SNAPSHOT_MAGIC, encode_batch, file_header, new_salt
from rsd.disk.recovery import Recovery, RecoveryError

FRAMES = 40
PER_FRAME = 2000
FILLER = "x" * 60


def frame_records(frame: int) -> list[list[Any]]:
    # (a SNAP_CLAIM of a free key: recovery itself never looks inside a record)
    return [
        [Rec.SNAP_CLAIM, "run", f"{FILLER}-{frame}-{n}", n, None, "h", 30.0, "default"]
        for n in range(PER_FRAME)
    ]


def write_snapshot_file(directory: Path, damage_frame: int | None = None) -> Path:
    salt = new_salt()
    path = directory / snapshot_name(1)
    with open(path, "wb") as f:
        f.write(file_header(SNAPSHOT_MAGIC, 1, salt))
        for frame in range(FRAMES):
            data = encode_batch(frame_records(frame), salt)
            if frame == damage_frame:
                data = data[:40] + bytes([data[40] ^ 0xFF]) + data[41:]  # CRC mismatch
            f.write(data)
        f.write(encode_batch([[Rec.SNAPSHOT_END, FRAMES * PER_FRAME]], salt))
    return path


def test_a_snapshots_first_frames_are_handed_out_before_later_ones_are_read(
    tmp_path: Path,
) -> None:
    write_snapshot_file(tmp_path, damage_frame=FRAMES - 1)
    seen = 0
    with pytest.raises(RecoveryError, match="damaged snapshot"):
        for _ in Recovery(tmp_path).records():
            seen += 1
    # Every frame before the damage was handed out (to a core that is then thrown away),
    # but for the last record read: held back in case it is the end record.
    assert seen == (FRAMES - 1) * PER_FRAME - 1


def test_a_whole_snapshot_is_handed_out_without_its_end_record(tmp_path: Path) -> None:
    write_snapshot_file(tmp_path)
    recovery = Recovery(tmp_path)
    kinds = {rec[0] for rec in recovery.records()}
    assert kinds == {Rec.SNAP_CLAIM}
    assert recovery.report.snapshot_records == FRAMES * PER_FRAME
    assert not recovery.report.repaired


def test_peak_memory_is_about_one_frame_not_the_whole_file(tmp_path: Path) -> None:
    path = write_snapshot_file(tmp_path)
    file_bytes = path.stat().st_size
    tracemalloc.start()
    try:
        everything = [rec for frame in range(FRAMES) for rec in frame_records(frame)]
        decoded_all, _ = tracemalloc.get_traced_memory()
        del everything
        tracemalloc.reset_peak()
        base, _ = tracemalloc.get_traced_memory()
        count = sum(1 for _ in Recovery(tmp_path).records())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == FRAMES * PER_FRAME
    # The file's bytes are read whole; of the decoded records, only a frame or two live.
    assert peak - base < file_bytes + decoded_all / 8
