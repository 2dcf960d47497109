"""The suite's rsd servers are forked from a process that has imported rsd
(support/forkserver.py); a test must see them exactly as the ``python -m rsd`` processes
they stand for: the same exit codes (an option refused: 2; SIGTERM: 0; SIGKILL:
``-SIGKILL``) and the same end (its threads joined, its exit handlers run, its output
flushed: what the interpreter's exit does before the heap's teardown, which a forked
child skips), a pid that stays theirs until the test has seen the exit, and the
environment of their own start: a crash test's failpoints are forked too (rsd reads them
when it starts, and reads none of the variables a forked start may set as it imports),
while a start that sets what Python reads as it starts is a plain process; and the
network namespace of a partition test's host, which a forked start joins."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from support import netns
from support.forkserver import PRELOADED, READ_AT_START, ForkedProcess
from support.netns import Network
from support.process import KILLED, NETNS_RUN_DIR, READY_TIMEOUT, REPO, Rsd, subprocess_env

# Imports what the fork server does (support/forkserver.py's PRELOADED), printing every
# variable read from os.environ meanwhile.
_IMPORT_WATCHING_THE_ENVIRONMENT = """
import importlib
import os

read = set()


class Watched(type(os.environ)):
    def __getitem__(self, name):
        read.add(name)
        return super().__getitem__(name)


watched = Watched.__new__(Watched)
vars(watched).update(vars(os.environ))
os.environ = watched
for module in PRELOADED:
    importlib.import_module(module)

print("\\n".join(sorted(read)))
"""


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


# A child that leaves as support/forkserver.py's children do, with output still in the
# buffer of its stdout, an exit handler, a thread that must be joined, and a code.
_LEAVING = """
import atexit, sys, threading, time
sys.path.insert(0, "tests")
from support.forkserver import _leave

atexit.register(lambda: print("exit handler ran"))
threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
sys.stdout.write("buffered, not flushed")
_leave(eval(sys.argv[1]))
"""


def test_a_forked_child_leaves_with_the_code_and_output_of_the_interpreters_exit() -> None:
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    for code, status in (("None", 0), ("3", 3), ("256 + 7", 7), ("'no such thing'", 1)):
        plain = subprocess.run([sys.executable, "-c", _LEAVING.replace("_leave(", "sys.exit("),
                                code], cwd=REPO, env=env, capture_output=True, text=True)
        left = subprocess.run([sys.executable, "-c", _LEAVING, code],
                              cwd=REPO, env=env, capture_output=True, text=True)
        assert (left.returncode, left.stdout, left.stderr) == (
            plain.returncode, plain.stdout, plain.stderr) == (
            status, "buffered, not flushedthread joined\nexit handler ran\n",
            "no such thing\n" if status == 1 else ""), code


def test_rsd_reads_no_variable_a_forked_start_sets_as_it_imports() -> None:
    env = subprocess_env()
    env.update(RSD_FAILPOINTS="journal.before_write.kill", NOTIFY_SOCKET="/nowhere",
               WATCHDOG_USEC="1000000")
    script = f"PRELOADED = {PRELOADED!r}\n{_IMPORT_WATCHING_THE_ENVIRONMENT}"
    done = subprocess.run([sys.executable, "-c", script],
                          cwd=REPO, env=env, capture_output=True, text=True, check=True)
    read = done.stdout.split()
    assert [name for name in read if name.startswith(READ_AT_START)] == []


async def test_a_forked_start_arms_the_failpoints_of_its_own_environment(
    tmp_path: Path,
) -> None:
    server = Rsd(tmp_path / "a")
    server.spawn(failpoints="journal.before_write.kill")  # the start's own first write
    assert isinstance(server.proc, ForkedProcess)
    assert await server.exited(READY_TIMEOUT) == KILLED
    await server.start()  # the next start, from the same fork server, is not armed
    assert isinstance(server.proc, ForkedProcess)
    assert await server.stop() == 0


async def test_a_start_that_sets_what_python_reads_as_it_starts_is_a_plain_process(
    tmp_path: Path,
) -> None:
    server = Rsd(tmp_path / "a")
    await server.start(env={"PYTHONHASHSEED": "7"})
    assert isinstance(server.proc, subprocess.Popen)
    assert await server.stop() == 0


async def test_a_start_in_a_network_namespace_is_forked_into_it(tmp_path: Path) -> None:
    netns.require()
    with Network(["h"]) as net:
        host = net["h"]
        server = Rsd(tmp_path / "h", listen_host=host.address, netns=host.netns)
        await server.start("--insecure")  # (a network of the test's own)
        assert isinstance(server.proc, ForkedProcess)
        joined = os.stat(f"/proc/{server.proc.pid}/ns/net").st_ino
        assert joined == os.stat(NETNS_RUN_DIR / host.netns).st_ino
        # Reached across the bridge, as a partition test's clients reach their nodes.
        _, writer = await asyncio.open_connection(host.address, server.port)
        writer.close()
        await writer.wait_closed()
        assert await server.stop() == 0
