"""Fixtures for the integration tests: real rsd subprocesses, SDK clients and raw sockets.

- ``rsd``: one server per test on a free port (``--listen 127.0.0.1:0``), with a 1 s
  handshake timeout. Ready when it prints ``rsd listening on HOST:PORT``. At teardown it
  gets SIGTERM and must exit 0 within a few seconds, and its log must hold no traceback
  (unless the test is marked xfail for a known bug). The next test's server is started
  while this one runs, so a fresh server per test costs no start-up wait.
- ``rsd_factory``: start more servers (each with its own data directory) for tests that
  pause or break one without disturbing the others; torn down the same way.
- ``clients``: ``make(holder, address=None)`` builds an ``AsyncRunstate`` closed at teardown.
- ``child_env``: the environment for helper processes (repo importable, unbuffered).
- ``eventually``: ``await eventually(check)`` polls an async predicate (server state that
  no event announces, such as "a waiter is queued") until it holds.
- ``raw_connect``: ``await raw_connect(address)`` opens a ``RawConn``, a bare socket that
  speaks frames built with ``rsclient.wire`` (for what the SDK would never send).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rsclient import AsyncRunstate, wire

REPO = Path(__file__).resolve().parent.parent
HELPERS = Path(__file__).resolve().parent / "helpers"
READY_TIMEOUT = 10.0  # seconds for rsd to print its listening line
STOP_TIMEOUT = 5.0  # seconds for rsd to exit after SIGTERM
_READY = re.compile(rb"^rsd listening on (\S+):(\d+)$")


def subprocess_env() -> dict[str, str]:
    """The environment for child Python processes: the repo importable, output unbuffered."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("RUNSTATE_ADDRESS", None)
    return env


class RsdProcess:
    """A running rsd: ``.address`` ("127.0.0.1:PORT"), ``.port``, ``.proc``, ``.log_path``."""

    def __init__(self, proc: subprocess.Popen[bytes], host: str, port: int, log_path: Path):
        self.proc = proc
        self.host = host
        self.port = port
        self.log_path = log_path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def __repr__(self) -> str:
        return f"<rsd pid={self.proc.pid} at {self.address}>"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> int | None:
        """SIGTERM and wait; the exit code, or None if it had to be killed."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.resume()  # a paused server cannot handle SIGTERM
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            if self.proc.stdout is not None:
                self.proc.stdout.close()


def spawn_rsd(data_dir: Path, log_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    """Start ``python -m rsd`` on a free port, without waiting for it (see ``wait_ready``)."""
    log_file = open(log_path, "wb")  # noqa: SIM115 - the child owns it from here on
    try:
        return subprocess.Popen(
            [
                sys.executable, "-m", "rsd",
                "--listen", "127.0.0.1:0",
                "--data-dir", str(data_dir),
                "--handshake-timeout", "1",
                *extra,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log_file,
            cwd=REPO,
            env=subprocess_env(),
        )
    finally:
        log_file.close()


def wait_ready(proc: subprocess.Popen[bytes], log_path: Path) -> RsdProcess:
    """Read rsd's stdout up to its ``rsd listening on HOST:PORT`` line."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    buf = b""
    deadline = time.monotonic() + READY_TIMEOUT
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            proc.wait()
            pytest.fail(
                f"rsd did not report it was listening (exit {proc.returncode}); "
                f"stdout {buf!r}; log:\n{log_path.read_text(errors='replace')}"
            )
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                continue  # EOF: the poll above reports the exit
            buf += chunk
    line = buf.split(b"\n", 1)[0].strip()
    match = _READY.match(line)
    if match is None:
        proc.kill()
        proc.wait()
        pytest.fail(f"unexpected first line from rsd: {line!r}")
    return RsdProcess(proc, match.group(1).decode(), int(match.group(2)), log_path)


class _Spare:
    """One rsd started ahead of need, so a test gets a fresh server without waiting for
    Python to start: each test still has a server (and data directory) of its own."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self.factory = factory
        self.next: tuple[subprocess.Popen[bytes], Path] | None = None

    def _spawn(self) -> tuple[subprocess.Popen[bytes], Path]:
        where = self.factory.mktemp("rsd")
        return spawn_rsd(where / "data", where / "rsd.log"), where / "rsd.log"

    def take(self) -> RsdProcess:
        proc, log_path = self.next or self._spawn()
        self.next = self._spawn()
        return wait_ready(proc, log_path)

    def close(self) -> None:
        if self.next is not None:
            proc, _ = self.next
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
            self.next = None


@pytest.fixture(scope="session")
def _rsd_spare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Spare]:
    spare = _Spare(tmp_path_factory)
    yield spare
    spare.close()


@pytest.fixture
def rsd_factory(
    _rsd_spare: _Spare, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., RsdProcess]]:
    """``start(*extra_args)``: another rsd of this test's own, stopped at teardown."""
    started: list[RsdProcess] = []

    def start(*extra: str) -> RsdProcess:
        if extra:
            n = len(started)
            log_path = tmp_path / f"rsd{n}.log"
            server = wait_ready(spawn_rsd(tmp_path / f"data{n}", log_path, *extra), log_path)
        else:
            server = _rsd_spare.take()
        started.append(server)
        return server

    yield start

    problems = []
    for server in started:
        code = server.stop()
        if code != 0:
            problems.append(f"{server}: exit code {code} after SIGTERM (None = had to kill)")
        # A traceback in the server log is a bug, unless the test documents a known one.
        if "Traceback" in server.log() and request.node.get_closest_marker("xfail") is None:
            problems.append(f"{server} logged a traceback:\n{server.log()}")
    if problems:
        pytest.fail("\n".join(problems))


@pytest.fixture
def rsd(rsd_factory: Callable[..., RsdProcess]) -> RsdProcess:
    return rsd_factory()


@pytest.fixture
async def clients(rsd: RsdProcess) -> AsyncIterator[Callable[..., AsyncRunstate]]:
    made: list[AsyncRunstate] = []

    def make(holder: str, address: str | None = None) -> AsyncRunstate:
        client = AsyncRunstate(holder=holder, address=address or rsd.address)
        made.append(client)
        return client

    yield make
    for client in made:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 5)


async def _eventually(
    check: Callable[[], Awaitable[bool]], timeout: float = 5.0, interval: float = 0.01
) -> None:
    """Poll ``check`` until it is true: for server state that no event announces."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s")
        await asyncio.sleep(interval)


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment for helper processes (see ``subprocess_env``)."""
    return subprocess_env()


@pytest.fixture
def eventually() -> Callable[..., Awaitable[None]]:
    """``await eventually(check, timeout=5.0)``: poll an async predicate until true."""
    return _eventually


# ---- raw sockets -------------------------------------------------------------------------


class RawConn:
    """A bare connection to rsd: send any bytes or frames, read decoded messages back."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.decoder = wire.Decoder(wire.MAX_FRAME_BYTES)
        self.inbox: deque[Any] = deque()
        self.next_id = 1
        self.eof = False

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    def frame(self, op: int, args: Any, rid: int | None = None) -> tuple[int, bytes]:
        """A request frame (args may be anything msgpack can carry); returns (id, bytes)."""
        if rid is None:
            rid = self.next_id
            self.next_id += 1
        return rid, wire.encode([wire.Kind.REQUEST, rid, op, args])

    async def request(self, op: int, args: Any) -> int:
        rid, data = self.frame(op, args)
        await self.send(data)
        return rid

    async def _fill(self, timeout: float) -> None:
        try:
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            raise EOFError("rsd closed the connection")
        self.inbox.extend(self.decoder.feed(data))

    async def recv(self, timeout: float = 5.0) -> Any:
        """The next message from rsd; EOFError if it closed the connection first."""
        while not self.inbox:
            await self._fill(timeout)
        return self.inbox.popleft()

    async def call(self, op: int, args: Any, timeout: float = 5.0) -> Any:
        """Send one request and return its answer ([2, id, result] or [3, id, code, ...])."""
        rid = await self.request(op, args)
        msg = await self.recv(timeout)
        assert msg[1] == rid, f"answer to request {msg[1]}, expected {rid}: {msg!r}"
        return msg

    async def ok(self, op: int, args: Any) -> Any:
        msg = await self.call(op, args)
        assert msg[0] == wire.Kind.REPLY, f"expected a reply, got {msg!r}"
        return msg[2]

    async def error(self, op: int, args: Any) -> tuple[str, str, Any]:
        """Send a request that must be refused; return (code, message, details)."""
        msg = await self.call(op, args)
        assert msg[0] == wire.Kind.ERROR, f"expected an error, got {msg!r}"
        return msg[2], msg[3], msg[4]

    async def hello(self, holder: str = "raw") -> dict[str, Any]:
        return await self.ok(
            wire.Op.HELLO, {"version": wire.PROTOCOL_VERSION, "holder": holder}
        )

    async def closed_with(self, code: str, timeout: float = 5.0) -> tuple[list[Any], str]:
        """Read to EOF; the last message must be a connection error (id 0) with ``code``.

        Returns the messages before it and the error's message text.
        """
        msgs: list[Any] = []
        with contextlib.suppress(EOFError):
            while True:
                msgs.append(await self.recv(timeout))
        assert msgs, "rsd closed the connection without an error frame"
        last = msgs.pop()
        assert last[:3] == [wire.Kind.ERROR, 0, code], f"expected {code} error frame: {last!r}"
        return msgs, last[3]

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()


@pytest.fixture
async def raw_connect() -> AsyncIterator[Callable[[str], Awaitable[RawConn]]]:
    opened: list[RawConn] = []

    async def connect(address: str) -> RawConn:
        host, _, port = address.rpartition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        conn = RawConn(reader, writer)
        opened.append(conn)
        return conn

    yield connect
    for conn in opened:
        conn.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.writer.wait_closed(), 2)
