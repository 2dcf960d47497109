"""The Python blocks of the README and of the manual's pages (docs/) run top to bottom
as pasted, against a real rsd.

Each ```python block is a program of its own, run with ``$RUNSTATE_ADDRESS`` pointing at
the test's server; a block of pytest tests (one that defines ``test_`` functions) is run
by pytest with the installed plugin. Every block must end with exit code 0, in time,
and a block named in ``SAYS`` must print what its page says it does.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from support.manual import python_blocks
from support.process import subprocess_env

# A line that marks a block -> what its output must hold. The consume() handler of
# "Tasks that need capacity" records its result with complete(): a handler that only
# returns completes with no payload (the guide's rule), and the outcomes would be None.
SAYS = {
    "async def render(data, delivery):": ["{'rendered': 'thumbnail'}", "{'rendered': 0}"],
    'await delivery.suspend("approval", timeout_seconds=86_400)': ["{'sent': True}"],
    'debounce_key="doc:7"': ["False\nTrue\nTrue\nreindex hello"],
    "after=searches)": ["BLOCKED\n['PENDING', 'PENDING']\n['notes on hiring', 'notes on pricing']"],
    'concurrency_key="user:42"': ["SUCCEEDED\nTrue"],
    'holder="tour"': ["holding company:acme as generation", "SUCCEEDED acme makes anvils"],
    "trace.set_tracer_provider(provider)": ["report of 2026-11\nTrue"],
}


def test_the_manual_has_its_python_blocks() -> None:
    assert len(python_blocks()) >= 4


def test_every_python_block_of_the_manual_runs_as_pasted(rsd: Any, tmp_path: Path) -> None:
    env = {**subprocess_env(), "RUNSTATE_ADDRESS": rsd.address}
    procs = []
    blocks = python_blocks()
    for marker in SAYS:
        assert any(marker in block for block in blocks), f"no block of the manual has {marker!r}"
    for n, block in enumerate(blocks):
        if re.search(r"^(async )?def test_", block, re.M):
            folder = tmp_path / f"block{n}"
            folder.mkdir()
            (folder / "test_manual.py").write_text(block)
            (folder / "pytest.ini").write_text("[pytest]\nasyncio_mode = auto\n")
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
            cwd = folder
        else:
            path = tmp_path / f"block{n}.py"
            path.write_text(block)
            command, cwd = [sys.executable, str(path)], tmp_path
        says = [line for marker, lines in SAYS.items() if marker in block for line in lines]
        procs.append((n, says, subprocess.Popen(
            command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True,
        )))
    failures = []
    for n, says, proc in procs:
        try:
            out, _ = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        missing = [line for line in says if line not in out]
        if proc.returncode != 0 or missing:
            failures.append(f"block {n}: exit {proc.returncode}, missing {missing}:\n{out}")
    assert not failures, "\n\n".join(failures)
