"""``make run-cluster SHARDS=2`` (``python -m rsd.localcluster``): one local etcd member
and two shards of one node each come up with the slots spread evenly (``rsctl slots``:
two shards, 512 slots each, each with its primary), and Ctrl-C stops everything it
started: it exits 0 and no process of it is left (rsd/localcluster.py). A shard of one
node acknowledges what it is asked (``--fsync everysec``: under ``always`` a cluster's
primary waits for a standby that does not exist)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import signal
import subprocess
import sys
from pathlib import Path

from support.etcd import etcd_binary
from support.process import REPO, subprocess_env

from rsclient import AsyncRunstate
from rsctl.main import main as rsctl_main

START_SECONDS = 120.0  # etcd, two nodes, their elections and a balance, on a loaded machine
STOP_SECONDS = 60.0
_PID = re.compile(r"\(pid (\d+)\)")


async def _a_run_is_made(address: str) -> str:
    async with AsyncRunstate(holder="t", address=address) as rs:
        return (await rs.scopes.create()).id


def test_two_local_shards_share_the_slots_and_ctrl_c_stops_everything(tmp_path: Path) -> None:
    etcd_binary()  # installed, or the test fails saying how
    proc = subprocess.Popen(
        [sys.executable, "-m", "rsd.localcluster", "--shards", "2", "--port", "0",
         "--dir", str(tmp_path / "cluster")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        env=subprocess_env())
    assert proc.stdout is not None
    said: list[str] = []
    try:
        for line in proc.stdout:  # (the process ends on its own if it cannot start)
            said.append(line)
            if line.startswith("Ctrl-C stops"):
                break
        assert said and said[-1].startswith("Ctrl-C stops"), "".join(said)
        pids = [int(pid) for line in said for pid in _PID.findall(line)]
        assert len(pids) == 3, said  # etcd and two nodes
        address = next(re.search(r"listening on (\S+)", line).group(1)  # type: ignore[union-attr]
                       for line in said if line.startswith("shard s1"))
        # rsctl in this process (its own tests run it as a command): what it shows is
        # the cluster's, not rsctl's, to check.
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown):
            assert rsctl_main(["--address", address, "slots", "--json"]) == 0
        listed = json.loads(shown.getvalue())
        assert [(s["shard"], s["count"]) for s in listed["shards"]] == [("s1", 512), ("s2", 512)]
        assert all(s["primary"] for s in listed["shards"]), listed
        assert asyncio.run(_a_run_is_made(address))  # acknowledged by a shard of one node

        proc.send_signal(signal.SIGINT)  # Ctrl-C
        rest, _ = proc.communicate(timeout=STOP_SECONDS)
        assert proc.returncode == 0, "".join(said) + rest
        for pid in pids:  # every child was waited for: none is left, not even a zombie
            assert not Path(f"/proc/{pid}").exists(), (pid, rest)
    finally:
        if proc.poll() is None:
            proc.kill()  # (its children die with it: PR_SET_PDEATHSIG)
            proc.wait()
