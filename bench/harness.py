"""Shared benchmark plumbing: start a throwaway rsd on a free port, stop it after."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator

__all__ = ["rsd_server"]


@contextlib.asynccontextmanager
async def rsd_server(
    address: str | None = None, *extra: str, ready_timeout: float = 300.0
) -> AsyncIterator[str]:
    """Yield the address of a running rsd: ``address`` as given, or a fresh one.

    ``ready_timeout`` covers recovery of a large data directory given in ``extra``.
    """
    if address:
        yield address
        return
    with tempfile.TemporaryDirectory(prefix="rsd-bench-") as data:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rsd", "--listen", "127.0.0.1:0", "--data-dir", data,
            "--log-level", "WARNING", *extra,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        assert proc.stdout is not None
        try:
            line = (await asyncio.wait_for(proc.stdout.readline(), ready_timeout)).decode()
            if not line.startswith("rsd listening on "):
                raise RuntimeError(f"rsd did not start: {line!r}")
            yield line.strip().removeprefix("rsd listening on ")
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(proc.wait(), 30)
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
