"""The dashboard works offline: every file its page loads is one rsd serves itself (no
CDN, no other origin), and every file rsd serves for it is package data, so an installed
wheel serves it too (pyproject.toml's [tool.setuptools.package-data])."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path, PurePosixPath

from rsd.http import dashboard

ROOT = Path(__file__).resolve().parent.parent


def test_the_page_loads_only_what_rsd_serves_and_rsd_serves_only_package_data() -> None:
    page = (ROOT / "rsd" / "static" / "index.html").read_text()
    loaded = re.findall(r'(?:src|href)="([^"#]+)"', page)
    assert "/static/vendor/uPlot.iife.min.js" in loaded
    for url in loaded:
        assert url == "data:," or url in dashboard._FILES, url  # its own, or inline
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "tool"]["setuptools"]["package-data"]["rsd"]
    for name, _kind in dashboard._FILES.values():
        shipped = f"static/{name}"
        assert (ROOT / "rsd" / shipped).is_file(), shipped
        assert any(_matches(shipped, glob) for glob in globs), shipped
    assert (ROOT / "rsd" / "static" / "vendor" / "uPlot.LICENSE").is_file()


def _matches(path: str, glob: str) -> bool:
    """setuptools' rule: a glob's ``*`` stays within one folder."""
    return len(PurePosixPath(path).parts) == len(PurePosixPath(glob).parts) and (
        PurePosixPath(path).match(glob))
