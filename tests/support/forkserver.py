"""rsd servers forked from one process that has already imported rsd: a start costs a fork.

Why: ``python -m rsd`` spends most of a start's CPU importing the server's modules
(0.15 s of the 0.19 s a start costs until it listens, on the compiled build), and the
Python tests start rsd several hundred times a run: a third of the suite's CPU on two
cores. A fork server (as ``multiprocessing``'s "forkserver" start method) imports them
once, as ``rsd/__main__.py`` does (the collector off while they load, then frozen), with
what a start would import after them (``PRELOADED``: a cluster node's gRPC, the event
loop), and forks a child for each start, which runs ``rsd.cli.main`` with the start's
arguments exactly as ``python -m rsd`` would: the same working directory, environment,
``sys.path[0]`` and standard streams (the test's pipe as stdout, its log file as stderr,
``/dev/null`` as stdin), and the same exit: the child leaves by the interpreter's own
exit path, less the heap's teardown (``_leave``), its code or ``-signal`` reported as
``Popen.returncode`` reports them.

What always holds:
- a ``ForkedProcess`` behaves as the ``subprocess.Popen`` it replaces for what the tests
  use (``pid``, ``args``, ``stdout``, ``poll``, ``wait``, ``send_signal``, ``kill``,
  ``returncode``);
- a child's pid stays its own until its test has seen its exit: the server learns of an
  exit without reaping (``waitid`` with ``WNOWAIT``), reports it, and reaps only when
  the test has read the report, so a signal sent by pid can never reach a reused pid;
- only a start the server can make as ``python -m rsd`` would is forked: its environment
  differs from the server's only in variables read when rsd starts, never as anything
  the server imported loads (``READ_AT_START``: rsd's own, such as the failpoints a
  crash test arms, and systemd's notify socket), which the child sets before it runs
  rsd's main (tests/test_a_forked_test_server_ends_as_python_m_rsd_would.py holds
  that rsd reads none of them as it imports). Any other difference (``PYTHON*``, read
  by the interpreter as it starts; a library's switch read at import) makes the start
  a plain process;
- a start in a network namespace (a partition test's host) joins it in the child before
  rsd's main, with setns(2), as ``ip netns exec`` does: what ``ip netns exec`` does
  besides (a mount namespace with the namespace's own /sys and /etc/netns files) is
  nothing rsd reads (no /sys, no /etc/netns of ours);
- when the test's process ends, the server kills what is left of its children and exits
  (a ``Popen`` child would be left running).

The server half runs as a script (``python forkserver.py FD``): it imports nothing of
the tests. The client half is ``fork_server()`` (one per test process).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, NoReturn

MAX_MESSAGE = 1 << 20  # bytes of one request or report
CLONE_NEWNET = 0x40000000  # <sched.h>: setns(2)'s type of a network namespace


def _send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


# ---- the server (a process of its own) ----------------------------------------------------


def exit_code(pid: int) -> int | None:
    """The exit code of child ``pid`` if it has ended (as Popen's: ``-signal`` if a
    signal ended it), without reaping it; None while it runs."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    if info is None or info.si_pid == 0:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def _serve(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """Answer requests until one is a start: returns it in the forked child only. In the
    server, returns never: at the end of its requests it kills its children and exits."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    live: set[int] = set()
    while True:
        readable, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
        for pid in sorted(live):
            code = exit_code(pid)
            if code is not None:
                live.discard(pid)
                _send(sock, {"exit": pid, "code": code})
        if sock not in readable:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
        except OSError:  # (reset: the test's process ended with a report of ours unread)
            data, fds = b"", []
        if not data:  # the test's process has ended
            for pid in live:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(0)
        request = json.loads(data)
        if "reap" in request:
            os.waitpid(request["reap"], 0)
            continue
        pid = os.fork()
        if pid == 0:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os.close(wake_r)
            os.close(wake_w)
            sock.close()
            return request, fds
        for fd in fds:
            os.close(fd)
        live.add(pid)
        _send(sock, {"pid": pid})


def _join_network_namespace(path: str) -> None:
    """Move this process into the network namespace ``path`` (``/run/netns/NAME``), as
    ``ip netns exec NAME`` does (Python 3.11 has no ``os.setns``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns: {os.strerror(code)}", path)
    finally:
        os.close(fd)


def run_child(request: dict[str, Any], fds: list[int]) -> NoReturn:
    """Become ``python -m rsd ARGS`` (in the forked child): its streams, directory,
    network namespace and arguments, then rsd's main, leaving with its code
    (``_leave``)."""
    stdout_fd, stderr_fd = fds
    devnull = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((devnull, 0), (stdout_fd, 1), (stderr_fd, 2)):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    if request.get("netns"):
        _join_network_namespace(request["netns"])
    os.environ.clear()
    os.environ.update(request["env"])
    import rsd
    from rsd.cli import main

    sys.argv = [os.path.join(os.path.dirname(rsd.__file__), "__main__.py"), *request["args"]]
    try:
        code = main()
    except SystemExit as exc:
        _leave(exc.code)
    _leave(code)


def _leave(code: object) -> NoReturn:
    """Leave as the interpreter's exit path would with ``sys.exit(code)``, up to where it
    would tear down the heap object by object: the non-daemon threads joined, the exit
    handlers run (the log's flush among them), the standard streams flushed, the same
    code (a code that is not a number printed, and 1). The teardown itself is left out:
    in a forked child each object it touches copies the page it shares with the fork
    server, and it took 0.04 s of CPU of each start (4,700 pages), a tenth of a forked
    rsd's CPU in the suite. What escapes ``main`` other than ``SystemExit`` leaves by the
    interpreter's own path (its traceback, its code)."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    threading._shutdown()  # type: ignore[attr-defined]  # (what Py_Finalize calls first)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status & 0xFF)


# What the server imports before it forks: rsd's server, as rsd/__main__.py loads it, and
# what a start imports after that, each time, unless it is here: the event loop
# (``rsd.cli.main``), a cluster node's modules with gRPC and the etcd client
# (``rsd.cli._mode``: 0.3 s of CPU at each node's start, a tenth of the suite's forked
# servers' CPU) and the IDNA codec a listener's host name is encoded with. Only imported:
# no channel, loop or thread exists before a fork. A library's switch read at import is
# read here, from the server's environment, and a start whose environment differs from it
# in any such variable is a plain process (``as_imported``).
PRELOADED = ("rsd.cli", "rsd.clustermode", "uvloop", "encodings.idna")


def preload() -> None:
    """Import ``PRELOADED`` as rsd/__main__.py loads the server (see there), without
    running it: the collector off meanwhile, what they made frozen after."""
    import gc
    import importlib

    gc.disable()
    for module in PRELOADED:
        importlib.import_module(module)
    gc.freeze()
    gc.enable()


def _server_main(fd: int) -> None:
    sys.path[0] = os.getcwd()  # as ``python -m`` sets it, not this script's folder
    preload()
    sock = socket.socket(fileno=fd)
    request, fds = _serve(sock)
    run_child(request, fds)


# ---- the client (in the test's process) -------------------------------------------------


class ForkedProcess:
    """A child of the fork server, used as the ``subprocess.Popen`` it replaces."""

    def __init__(self, server: ForkServer, pid: int, args: list[str], stdout: IO[bytes]) -> None:
        self.server = server
        self.pid = pid
        self.args = args
        self.stdout: IO[bytes] | None = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.server.pump(left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """The test process's side of one fork server, started with environment ``env``."""

    def __init__(self, python: str, cwd: str, env: dict[str, str]) -> None:
        self.python = python
        self.cwd = cwd
        self.env = env
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours
        self.proc = subprocess.Popen(
            [python, __file__, str(theirs.fileno())],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, cwd=cwd, env=env,
            pass_fds=[theirs.fileno()],
        )
        theirs.close()
        self.children: dict[int, ForkedProcess] = {}
        self.lock = threading.RLock()
        atexit.register(self.close)

    def spawn(self, args: Sequence[str], env: dict[str, str], stderr: IO[bytes],
              netns: str | None = None) -> ForkedProcess:
        """Start ``python -m rsd ARGS`` (``args`` without the interpreter and ``-m rsd``)
        with environment ``env``, its stdout a pipe (``.stdout``) and its stderr the file
        ``stderr``; in the network namespace at path ``netns`` if given."""
        read_fd, write_fd = os.pipe()
        with self.lock:
            try:
                _send(self.sock, {"args": list(args), "cwd": self.cwd, "env": env,
                                  "netns": netns}, [write_fd, stderr.fileno()])
            finally:
                os.close(write_fd)
            pid = self._until_started()
            process = ForkedProcess(
                self, pid, [self.python, "-m", "rsd", *args], os.fdopen(read_fd, "rb", buffering=0)
            )
            self.children[pid] = process
        return process

    def _until_started(self) -> int:
        """Read reports until the server says which pid the start has (a report of an
        exit before it is an earlier child's: the server answers a start at once)."""
        while True:
            message = self._receive(None)
            if "pid" in message:
                return int(message["pid"])
            if message:
                self._ended(message)

    def _receive(self, timeout: float | None) -> dict[str, Any]:
        readable, _, _ = select.select([self.sock], [], [], timeout)
        if not readable:
            return {}
        data = self.sock.recv(MAX_MESSAGE)
        if not data:
            raise RuntimeError(f"the fork server ended (exit {self.proc.poll()})")
        message: dict[str, Any] = json.loads(data)
        return message

    def pump(self, timeout: float | None) -> None:
        """Take the server's reports of ended children, waiting up to ``timeout`` for
        the first one."""
        with self.lock:
            message = self._receive(timeout)
            while message:
                self._ended(message)
                message = self._receive(0)

    def _ended(self, message: dict[str, Any]) -> None:
        pid = int(message["exit"])
        child = self.children.pop(pid, None)
        if child is not None:
            child.returncode = int(message["code"])
        _send(self.sock, {"reap": pid})

    def close(self) -> None:
        """End the server (it kills children still running) and wait for it."""
        with contextlib.suppress(OSError):
            self.sock.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


_servers: dict[int, ForkServer] = {}
# What pytest changes in its environment from test to test, read by nothing rsd imports.
_PER_TEST = frozenset({"PYTEST_CURRENT_TEST"})
# The variables a forked start may set: read when rsd starts (rsd's own, RSD_FAILPOINTS
# by rsd.disk.failpoints.arm; systemd's by rsd/notify.py), never as rsd imports.
READ_AT_START = ("RSD_", "NOTIFY_SOCKET", "WATCHDOG_")


def as_imported(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` as what the server imported saw of it: without what a start may set."""
    return {name: value for name, value in env.items()
            if name not in _PER_TEST and not name.startswith(READ_AT_START)}


def fork_server(
    python: str, cwd: str, common: dict[str, str], env: dict[str, str]
) -> ForkServer | None:
    """This process's fork server (started at the first call, with the environment
    ``common`` to the starts, less ``READ_AT_START``) for a start with environment
    ``env``, or None if ``env`` differs from the server's in another variable (the start
    must be a plain process: Python or a library may read it before rsd's main runs)."""
    server = _servers.get(os.getpid())
    if server is None:
        server = _servers[os.getpid()] = ForkServer(python, cwd, as_imported(common))
    if (server.python, server.cwd) != (python, cwd):
        return None
    if as_imported(server.env) != as_imported(env):
        return None
    return server


if __name__ == "__main__":
    _server_main(int(sys.argv[1]))
