"""A real rsd for your own tests: ``RsdServer`` starts one as a subprocess.

    from rsclient.testing import RsdServer

    with RsdServer() as server:          # a port of its own, a temporary data directory
        rs = AsyncRunstate(address=server.address)

What always holds:
- the server is the real rsd (the ``rsd`` script next to ``sys.executable``, else
  ``python -m rsd``), started on 127.0.0.1, on the port given, else on port 0: rsd binds
  a free one and the port is read from its listening line (a port picked here and bound
  by rsd later could be taken in between by another process), and kept for every
  restart; with a temporary data directory unless one is given, and short retention
  (``retention_seconds``, default 60 s): tests do not keep results for a week;
- ``start()`` returns only once rsd has printed its listening line (or raises
  RuntimeError with its log); ``address`` is then where it listens;
- ``restart()`` starts it again on the same port and data directory (after ``stop()`` or
  ``kill()``), so connected clients find it again, as after a real crash;
- ``stop()`` ends it (SIGTERM, then SIGKILL after ``stop_timeout``) and removes the
  temporary data directory it made; it is safe to call twice.

The pytest fixtures built on it are in ``rsclient.pytest_plugin``.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

__all__ = ["RsdServer", "free_port", "rsd_command"]

READY_TIMEOUT = 20.0  # seconds for rsd to print its listening line
_READY = re.compile(rb"^rsd listening on (\S+):(\d+)$")


def rsd_command() -> list[str]:
    """How to run rsd from this interpreter: its ``rsd`` script, else ``python -m rsd``."""
    script = Path(sys.executable).with_name("rsd")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "rsd"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now (another process may
    bind it before you do: ``RsdServer`` no longer uses it, it lets rsd bind port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class RsdServer:
    """One rsd process on one data directory, started, killed and restarted at will."""

    def __init__(
        self,
        *,
        port: int = 0,
        data_dir: str | os.PathLike[str] | None = None,
        retention_seconds: float = 60,
        extra_args: tuple[str, ...] = (),
        stop_timeout: float = 5.0,
    ) -> None:
        self.port = port  # 0 until the first start reports its port; restarts keep it
        self.host = "127.0.0.1"
        self._root = Path(tempfile.mkdtemp(prefix="rsd-test-"))  # the log, maybe the data
        self.data_dir = Path(data_dir) if data_dir is not None else self._root / "data"
        self.retention_seconds = retention_seconds
        self.extra_args = tuple(extra_args)
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self._root / "rsd.log"

    @property
    def address(self) -> str:
        """``HOST:PORT``, what ``AsyncRunstate(address=...)`` takes."""
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        pid = self.proc.pid if self.proc is not None else None
        return f"<RsdServer pid={pid} at {self.address} data={self.data_dir}>"

    def __enter__(self) -> RsdServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        """Whether the process runs."""
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> str:
        """Start rsd and wait until it listens; its address."""
        if self.alive:
            return self.address
        args = [
            *rsd_command(),
            "--listen", f"127.0.0.1:{self.port}",
            "--data-dir", str(self.data_dir),
            "--retention-seconds", f"{self.retention_seconds:g}",
            *self.extra_args,
        ]
        with open(self.log_path, "ab") as log:  # the child keeps its own copy
            self.proc = subprocess.Popen(
                args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log
            )
        line = self._first_line()
        match = _READY.match(line.strip())
        if match is None:
            self._kill()
            raise RuntimeError(
                f"rsd did not start (said {line!r}); its log {self.log_path}:\n{self.log()}"
            )
        self.host, self.port = match.group(1).decode(), int(match.group(2))
        return self.address

    def _first_line(self) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        out = b""
        deadline = time.monotonic() + READY_TIMEOUT
        while b"\n" not in out and (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                break
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            out += chunk
        return out.split(b"\n", 1)[0]

    def log(self) -> str:
        """What rsd wrote to stderr so far (all starts)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL, as a crash: nothing is flushed beyond what rsd had acknowledged."""
        self._kill()

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self._close_pipe()

    def _close_pipe(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

    def restart(self) -> str:
        """Start again on the same port and data directory (stopping it first if it
        runs); the address, unchanged."""
        if self.alive:
            self.terminate()
        return self.start()

    def terminate(self) -> int | None:
        """SIGTERM and wait (SIGKILL after ``stop_timeout``); the exit code, None if
        it had to be killed. The data directory stays."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                self._kill()
                return None
        self._close_pipe()
        return self.proc.returncode

    def stop(self) -> int | None:
        """``terminate()``, then remove the temporary directory this object made (its
        log, and its data unless a ``data_dir`` was given)."""
        code = self.terminate()
        shutil.rmtree(self._root, ignore_errors=True)
        return code
