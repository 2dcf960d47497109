"""The fork server of the TypeScript SDK's tests: their rsd servers forked from one process
that has imported rsd, as support/forkserver.py forks the Python tests' own.

Why: each of the TypeScript tests' rsd starts cost about 0.4 s of CPU, most of it the
imports of the console script; a run starts 42, while the Python suite's forked starts
cost a tenth of that (a whole `npm test`: 47 and 48 s of CPU forked, 65 and 61 s
spawned, on two cores). Node cannot speak support/forkserver.py's protocol (a
SEQPACKET pair, the child's streams passed as descriptors), and each test file runs in a
Node process of its own, so this server is one for all of them:

    python nodeforkserver.py COMMAND...

imports what support/forkserver.py's server imports (``PRELOADED``), listens on a Unix
socket (its path in ``$RSD_TEST_FORK_SERVER``), runs COMMAND (the Node test runner) with
that variable set, and exits with COMMAND's code once it ends, killing whatever children
are left. Its clients (test/support.ts, one connection per test process) speak JSON, one
message a line:

- ``{"args": [...], "cwd": DIR, "env": {...}, "stdout": PATH, "stderr": PATH}``: start
  ``rsd ARGS``, its standard output and error written to the two files. Answered
  ``{"pid": PID}``, or ``{"plain": WHY}`` where the start must be a plain process (below);
- later, ``{"exit": PID, "code": CODE}`` (``-signal`` if a signal ended it), to which the
  client answers ``{"reap": PID}``.

What always holds, as for support/forkserver.py's children:
- a child runs rsd's main exactly as the console script would, in its own directory,
  environment and streams, and leaves as support/forkserver.py's do (``_leave``);
- a child's pid stays its own until its client has seen its exit (reaped only on
  ``reap``), so a signal its client sends by pid can never reach a reused pid;
- only a start whose environment differs from this server's in variables read when rsd
  starts (``READ_AT_START``) or set by Node's test runner in each test process
  (``NODE_TEST_CONTEXT``, read by nothing Python loads) is forked; any other difference
  is answered ``plain``, and the client starts rsd as a process of its own;
- when a client's connection closes (its test process ended), its children still running
  are killed;
- a request the server cannot use (not JSON, a folder for the output that is not there)
  is answered ``plain`` if it was a start, and the server goes on;
- SIGINT, SIGTERM and SIGHUP sent to the server go to COMMAND, whose end ends it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any, NoReturn

from forkserver import as_imported, exit_code, preload, run_child

ADDRESS_VARIABLE = "RSD_TEST_FORK_SERVER"
# What Node's test runner sets in each test file's process (FORCE_COLOR where its output
# is a colour terminal; the others in newer versions, watch mode and coverage), read by
# nothing Python 3.11 loads.
_SET_BY_THE_RUNNER = frozenset({"NODE_TEST_CONTEXT", "FORCE_COLOR", "NODE_TEST_WORKER_ID",
                                "WATCH_REPORT_DEPENDENCIES", "NODE_V8_COVERAGE"})
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class _Client:
    """One test process's connection: what it has sent of a line, and its children."""

    sock: socket.socket
    pending: bytes = b""
    live: set[int] = field(default_factory=set)  # started, their exit not yet reported
    ended: set[int] = field(default_factory=set)  # reported, not yet reaped

    def send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):  # (a client that has gone: its close is seen next)
            self.sock.sendall(json.dumps(message).encode() + b"\n")


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in as_imported(env).items()
            if name not in _SET_BY_THE_RUNNER and name != ADDRESS_VARIABLE}


class _Server:
    """The listener, the clients, the command, and the children nobody will reap."""

    def __init__(self, listener: socket.socket, folder: str) -> None:
        """Ready to hear of ended children before the command is started (``run``): an
        exit before the handler was there would never wake the loop."""
        self.listener = listener
        self.folder = folder  # the socket's, removed at the end
        self.command: subprocess.Popen[bytes] | None = None
        self.env = _comparable(dict(os.environ))
        self.clients: dict[int, _Client] = {}  # by their socket's descriptor
        self.orphans: set[int] = set()  # of clients that have gone: killed, reaped here
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)
        for forwarded in _FORWARDED:
            # (to the command, which ends, and so does the server, its children killed)
            signal.signal(forwarded, self._forward)

    def _forward(self, signum: int, frame: object) -> None:
        if self.command is not None:
            self.command.send_signal(signum)

    def run(self, command: list[str]) -> tuple[dict[str, Any], list[int]]:
        """Start ``command``, its environment naming this server, and answer until it
        ends (then exit with its code). Returns only in a forked child: its start and
        its two stream descriptors."""
        env = {**os.environ, ADDRESS_VARIABLE: self.listener.getsockname()}
        self.command = subprocess.Popen(command, env=env)
        while True:
            self._report_ends()  # (before waiting: what ended since the last wake)
            code = self.command.poll()
            if code is not None:
                self._end(code)
            readable, _, _ = select.select(
                [self.listener.fileno(), self.wake_r, *self.clients], [], [])
            with contextlib.suppress(BlockingIOError):
                os.read(self.wake_r, 4096)
            if self.listener.fileno() in readable:
                sock, _ = self.listener.accept()
                self.clients[sock.fileno()] = _Client(sock)
            for fd in readable:
                client = self.clients.get(fd)
                if client is None:
                    continue
                try:
                    data = client.sock.recv(1 << 16)
                except OSError:  # (reset: it closed with a report of ours unread)
                    data = b""
                if not data:
                    self._drop(client)
                    continue
                client.pending += data
                while b"\n" in client.pending:
                    line, client.pending = client.pending.split(b"\n", 1)
                    started = self._answer_line(client, line)
                    if started is not None:
                        return started

    def _answer_line(self, client: _Client, line: bytes
                     ) -> tuple[dict[str, Any], list[int]] | None:
        """A request the server cannot use (a client's bug, a folder gone) is answered
        ``plain`` if it was a start (only starts are answered), and the server goes on."""
        request: dict[str, Any] = {}
        try:
            request = json.loads(line)
            return self._answer(client, request)
        except (ValueError, KeyError, TypeError, OSError) as exc:
            if "reap" not in request:
                client.send({"plain": f"the fork server could not use {line!r}: {exc!r}"})
            return None

    def _answer(self, client: _Client, request: dict[str, Any]
                ) -> tuple[dict[str, Any], list[int]] | None:
        if "reap" in request:
            pid = int(request["reap"])
            if pid in client.ended:  # (only its own, and only once seen)
                client.ended.discard(pid)
                os.waitpid(pid, 0)
            return None
        differs = sorted(set(self.env.items()) ^ set(_comparable(request["env"]).items()))
        if differs:
            client.send({"plain": "its environment differs from the fork server's in "
                                  + ", ".join(sorted({name for name, _ in differs}))})
            return None
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fds = [os.open(request["stdout"], flags, 0o644)]
        try:
            fds.append(os.open(request["stderr"], flags, 0o644))
        except OSError:
            os.close(fds[0])
            raise
        # The forwarded signals wait while the child is made: one that came before the
        # child had reset its handlers would run the server's handler in the child.
        signal.pthread_sigmask(signal.SIG_BLOCK, _FORWARDED)
        pid = os.fork()
        if pid == 0:
            try:
                self._become_child()
            except BaseException:
                os._exit(70)  # (whatever failed, never a second server)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
            return request, fds
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARDED)
        for fd in fds:
            os.close(fd)
        client.live.add(pid)
        client.send({"pid": pid})
        return None

    def _become_child(self) -> None:
        signal.set_wakeup_fd(-1)
        for handled in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(handled, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)  # (as Python starts)
        os.close(self.wake_r)
        os.close(self.wake_w)
        self.listener.close()
        for client in self.clients.values():
            client.sock.close()

    def _report_ends(self) -> None:
        for client in self.clients.values():
            for pid in sorted(client.live):
                code = exit_code(pid)
                if code is not None:
                    client.live.discard(pid)
                    client.ended.add(pid)
                    client.send({"exit": pid, "code": code})
        for pid in sorted(self.orphans):
            if exit_code(pid) is not None:
                os.waitpid(pid, 0)
                self.orphans.discard(pid)

    def _drop(self, client: _Client) -> None:
        """A client gone: its children killed, and reaped here once they have ended."""
        del self.clients[client.sock.fileno()]
        client.sock.close()
        for pid in client.live | client.ended:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            self.orphans.add(pid)

    def _end(self, code: int) -> NoReturn:
        for client in list(self.clients.values()):
            self._drop(client)
        for pid in self.orphans:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        shutil.rmtree(self.folder, ignore_errors=True)
        os._exit(code if code >= 0 else 128 - code)


def main(command: list[str]) -> NoReturn:
    sys.path[0] = os.path.dirname(os.path.abspath(sys.executable))  # as rsd's script has it
    preload()
    folder = tempfile.mkdtemp(prefix="rsd-ts-forks-")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(folder, "socket"))
    listener.listen(64)
    try:
        request, fds = _Server(listener, folder).run(command)
    except BaseException:  # (a bug of the server's: its socket's folder is not left behind)
        shutil.rmtree(folder, ignore_errors=True)
        raise
    run_child(request, fds)  # (a forked child: it returned, and the folder is the server's)


if __name__ == "__main__":
    main(sys.argv[1:])
