"""The TypeScript tests' fork server (support/nodeforkserver.py, which `npm test` runs the
Node test runner under) driven as test/forks.ts drives it, by a client of its own put in
the runner's place: a start answered with a pid whose process is rsd (it prints its
ready line to the file named, and its log to the other); its exit on SIGTERM reported
as 0 and on SIGKILL as -9, the pid kept (a zombie, not reaped) until the client says
``reap``, and reaped then; a start whose environment differs from the server's in
anything but rsd's own variables (read when rsd starts) and the runner's answered
``plain``, naming it, as are a line that is no request and a start whose output files
cannot be made; a client that goes with a report unread (a reset) leaves the server
serving, its child killed; a child
still running when its client's connection closes killed; and the server's exit code
its command's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.process import REPO, subprocess_env

SERVER = REPO / "tests" / "support" / "nodeforkserver.py"

# The client, in the test runner's place (it exits 7: the server must exit 7 too).
_CLIENT = r"""
import json, os, signal, socket, sys, time

sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.connect(os.environ["RSD_TEST_FORK_SERVER"])
lines = sock.makefile("r")
folder = sys.argv[1]


def ask(message):
    sock.sendall(json.dumps(message).encode() + b"\n")


def start(name, extra_env=None, *args, on=None):
    env = dict(os.environ, NODE_TEST_CONTEXT="child-v8", FORCE_COLOR="1", RSD_FAILPOINTS="",
               **(extra_env or {}))
    request = {"args": ["--listen", "127.0.0.1:0", "--data-dir", f"{folder}/{name}", *args],
               "cwd": folder, "env": env, "stdout": f"{folder}/{name}.out",
               "stderr": f"{folder}/{name}.err"}
    if on is None:
        ask(request)
        return json.loads(lines.readline())
    on.sendall(json.dumps(request).encode() + b"\n")
    return json.loads(on.recv(4096).split(b"\n")[0])


def gone(pid):
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{pid}") and time.monotonic() < deadline:
        time.sleep(0.02)
    return not os.path.exists(f"/proc/{pid}")


def ready(name):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with open(f"{folder}/{name}.out") as out:
            line = out.readline()
        if line.endswith("\n"):
            return line.strip()
        time.sleep(0.02)
    raise AssertionError(f"{name} never listened")


def state(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


a = start("a")["pid"]
print("a", ready("a").split()[:3], flush=True)
os.kill(a, signal.SIGTERM)
print("a ended", json.loads(lines.readline()), flush=True)
print("a kept", state(a), flush=True)  # Z: ended, not reaped
ask({"reap": a})
print("a reaped", gone(a), flush=True)
b = start("b")["pid"]
ready("b")
os.kill(b, signal.SIGKILL)
print("b ended", json.loads(lines.readline()), flush=True)
ask({"reap": b})
print("plain", start("c", {"PYTHONHASHSEED": "5"}), flush=True)
print("refused", start("d", None, "--no-such-flag"), json.loads(lines.readline()), flush=True)
# Another client goes with the report of its child's end unread (its close is a reset):
# the server goes on.
other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
other.connect(os.environ["RSD_TEST_FORK_SERVER"])
brief = start("r", on=other)["pid"]
os.kill(brief, signal.SIGKILL)
time.sleep(0.3)
other.close()
print("reset", gone(brief), flush=True)
sock.sendall(b"not a request\n")
print("garbled", sorted(json.loads(lines.readline())), flush=True)
print("nowhere", sorted(start("no/such/folder/f")), flush=True)
left = start("e")["pid"]
ready("e")
print("left", left, flush=True)
lines.close()  # (its file holds the socket open too)
sock.close()
print("left gone", gone(left), flush=True)
sys.exit(7)
"""


def test_the_fork_server_starts_reports_and_ends_rsd_as_its_client_asks(tmp_path: Path) -> None:
    server = subprocess.Popen(
        [sys.executable, str(SERVER), sys.executable, "-c", _CLIENT, str(tmp_path)],
        cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        out, err = server.communicate(timeout=120)
    finally:
        if server.poll() is None:  # (SIGTERM goes on to the client; its end ends it all)
            server.terminate()
            try:
                server.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.communicate()
    said = out.splitlines()
    assert server.returncode == 7, (server.returncode, out, err)
    assert said[0] == "a ['rsd', 'listening', 'on']", said
    pid_a = int(said[1].split("'exit': ")[1].split(",")[0])
    assert said[1] == f"a ended {{'exit': {pid_a}, 'code': 0}}", said
    assert said[2:4] == ["a kept Z", "a reaped True"], said
    assert said[4].startswith("b ended {'exit': ") and said[4].endswith("'code': -9}"), said
    assert said[5] == ("plain {'plain': \"its environment differs from the fork server's "
                       "in PYTHONHASHSEED\"}"), said
    refused_pid = int(said[6].split("{'pid': ")[1].split("}")[0])
    assert said[6].endswith(f"{{'exit': {refused_pid}, 'code': 2}}"), said
    assert said[7] == "reset True", said
    assert said[8:10] == ["garbled ['plain']", "nowhere ['plain']"], said  # and it goes on:
    assert said[10].startswith("left ") and said[11] == "left gone True", said
    assert "rsd stopping" in (tmp_path / "a.err").read_text()  # its log, in the file named
    assert "unrecognized arguments: --no-such-flag" in (tmp_path / "d.err").read_text()
