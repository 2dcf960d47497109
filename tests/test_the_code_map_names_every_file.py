"""The manual's code map names every source file: a file added without its line fails here.

The map (docs/code-map.md) is a list of folders, each a bold header naming its path
in backticks (``**`rsd/core/work/`, ...**``), and under it one line per file, naming it
in backticks, by name or by its path below the folder (``sync/_portal.py``). A file is
looked for under the deepest header that holds it. A package's ``__init__.py`` is named
by its folder: a header of its own, or the folder in backticks (``sync/``) under the
header above it. Source files are the Python modules of rsproto, rsd, rsclient and
rsctl, and the TypeScript SDK's ``src/``.
"""

from __future__ import annotations

import re
from pathlib import Path

from support.manual import page

ROOT = Path(__file__).resolve().parents[1]
SOURCES = [*(f"{package}/**/*.py" for package in ("rsproto", "rsd", "rsclient", "rsctl")),
           "sdk/typescript/src/*.ts"]
HEADER = re.compile(r"^\*\*`([^`]+/)`")
NAMED = re.compile(r"`([^`\s]+)`")


def _sections() -> dict[str, set[str]]:
    """Folder (``rsd/core/work/``) -> the names in backticks under its header."""
    sections: dict[str, set[str]] = {}
    folder = ""
    for line in page("code-map.md").splitlines():
        header = HEADER.match(line)
        if header:
            folder = header.group(1)
            sections.setdefault(folder, set())
        if folder:
            sections[folder] |= set(NAMED.findall(line))
    return sections


def _files() -> list[str]:
    return sorted(
        path.relative_to(ROOT).as_posix()
        for pattern in SOURCES for path in ROOT.glob(pattern)
        if "__pycache__" not in path.parts
    )


def _unnamed(sections: dict[str, set[str]], files: list[str]) -> list[str]:
    unnamed = []
    for file in files:
        if file.endswith("/__init__.py"):
            folder = file.removesuffix("__init__.py")
            if folder in sections:
                continue
            file = folder.rstrip("/")  # named as ``sub/`` under the header above
        holders = [f for f in sections if file.startswith(f)]
        if not holders:
            unnamed.append(file)
            continue
        folder = max(holders, key=len)
        below = file.removeprefix(folder)
        names = {below, below.rpartition("/")[2], below + "/"}
        if not names & sections[folder]:
            unnamed.append(file)
    return unnamed


def test_the_map_is_read() -> None:
    sections = _sections()
    assert "machine.py" in sections["rsd/core/"]
    assert "_portal.py" in sections["rsclient/"]
    assert len(_files()) > 150


def test_a_file_without_a_line_is_found() -> None:
    sections = _sections()
    assert _unnamed(sections, ["rsd/core/work/not_in_the_map.py"]) == [
        "rsd/core/work/not_in_the_map.py"
    ]
    assert _unnamed(sections, ["rsd/nowhere/__init__.py"]) == ["rsd/nowhere"]


def test_the_code_map_names_every_file() -> None:
    unnamed = _unnamed(_sections(), _files())
    assert not unnamed, f"files the code map does not name: {unnamed}"
