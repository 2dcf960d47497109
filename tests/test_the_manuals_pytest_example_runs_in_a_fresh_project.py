"""The manual's pytest example ("Testing your code against a real rsd") passes when
copied into a project of its own, as it is.

A fresh project has no configuration of ours: no ``asyncio_mode = auto``, no conftest,
only pytest, pytest-asyncio and rsd installed. So the block is written alone into an
empty folder outside this checkout and run by pytest there; its async tests must run
(marked for pytest-asyncio by the block itself) against the plugin's real rsd, not be
skipped or failed as "async def functions are not natively supported".
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from support.manual import python_blocks
from support.process import REPO, subprocess_env


def pytest_block() -> str:
    blocks = [b for b in python_blocks() if re.search(r"^(async )?def test_", b, re.M)]
    assert len(blocks) == 1, "the manual has one block of pytest tests"
    return blocks[0]


def test_the_manuals_pytest_example_passes_in_a_project_without_our_configuration(
    tmp_path: Path,
) -> None:
    assert not tmp_path.resolve().is_relative_to(REPO), "pytest would find our pyproject"
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_claims.py").write_text(pytest_block())
    env = {k: v for k, v in subprocess_env().items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert re.search(r"\b1 passed\b", out) and "skipped" not in out, out
