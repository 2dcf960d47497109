"""Every format version rsd ever wrote (2 up to today's; 1, before salts, has a reader
of its own: logfile_v1.py) is read: a file of each is scanned, its records returned.
Version 8 was left out of the versions read when version 9 came, so a data directory
written by that rsd would have been refused at start."""

from __future__ import annotations

from pathlib import Path

import pytest

from rsd.core.records import FORMAT_VERSION, Rec
from rsd.disk.logfile import SNAPSHOT_MAGIC, encode_batch, file_header, new_salt, scan


@pytest.mark.parametrize("version", range(2, FORMAT_VERSION + 1))
def test_a_file_of_every_version_rsd_wrote_is_read(tmp_path: Path, version: int) -> None:
    salt = new_salt()
    path = tmp_path / "file"
    path.write_bytes(file_header(SNAPSHOT_MAGIC, 1, salt, version=version)
                     + encode_batch([[Rec.SNAPSHOT_END, 0]], salt))
    result = scan(path, SNAPSHOT_MAGIC)
    assert result.version == version
    assert [list(r) for r in result.records] == [[Rec.SNAPSHOT_END, 0]]
