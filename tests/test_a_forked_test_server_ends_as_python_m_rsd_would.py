"""The suite's rsd servers are forked from a process that has imported rsd
(support/forkserver.py); a test must see them exactly as the ``python -m rsd`` processes
they stand for: the same exit codes (an option refused: 2; SIGTERM: 0; SIGKILL:
``-SIGKILL``), a pid that stays theirs until the test has seen the exit, and a start
with its own environment a plain process (rsd reads failpoints as it imports)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

from support.forkserver import ForkedProcess
from support.process import KILLED, Rsd


async def test_a_forked_server_exits_with_the_codes_of_a_plain_one(tmp_path: Path) -> None:
    server = Rsd(tmp_path / "a")
    await server.start()
    assert isinstance(server.proc, ForkedProcess)
    assert await server.stop() == 0
    await server.start()
    pid = server.proc.pid
    os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(0.2)
    assert Path(f"/proc/{pid}").exists()  # not reaped: the pid is not free for another
    assert await server.kill() == KILLED
    assert server.proc.returncode == KILLED
    assert await server.refused("--no-such-option") == 2
    assert "unrecognized arguments: --no-such-option" in server.log()


async def test_a_start_with_its_own_environment_is_a_plain_process(tmp_path: Path) -> None:
    server = Rsd(tmp_path / "a")
    await server.start(env={"RSD_FAILPOINTS": ""})
    assert isinstance(server.proc, subprocess.Popen)
    assert await server.stop() == 0
