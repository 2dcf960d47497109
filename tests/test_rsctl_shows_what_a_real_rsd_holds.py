"""rsctl against one real rsd with known contents: every command, as a table and as JSON;
a client token refused; a list longer than a page shown whole; then, offline, a data
directory with a torn tail verified and dumped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.process import Rsd, subprocess_env

from rsclient import AsyncRunstate
from rsctl.main import run
from rsd.security.tokens import hash_token, new_token

OPS, ACME = new_token(), new_token()
RUNS = 130  # more than one page of ADMIN_SCOPES (100 by default)


class Ctl:
    """rsctl in the test's event loop, its output captured."""

    def __init__(self, address: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.address = address
        self.capsys = capsys

    async def __call__(self, *argv: str, token: str = OPS, status: int = 0) -> str:
        self.capsys.readouterr()
        got = await run(["--address", self.address, "--token", token, *argv])
        out, err = self.capsys.readouterr()
        assert got == status, (argv, out, err)
        return out or err  # a refusal says why on stderr

    async def json(self, *argv: str, status: int = 0) -> Any:
        self.capsys.readouterr()
        got = await run(["--address", self.address, "--token", OPS, *argv, "--json"])
        out, err = self.capsys.readouterr()
        assert got == status, (argv, out, err)
        return json.loads(out)


def rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines()[1:]]


async def test_every_rsctl_command_against_a_real_rsd(
    rsds: Callable[..., Rsd], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    server = rsds()
    tokens = server.write_tokens(f"{hash_token(OPS)} ops admin", f"{hash_token(ACME)} acme client")
    await server.start("--tokens-file", str(tokens))
    ctl = Ctl(server.address, capsys)
    async with (
        AsyncRunstate("ops-1", server.address, token=OPS) as ops,
        AsyncRunstate("acme-1", server.address, token=ACME) as acme,
    ):
        run_ = await ops.scopes.create()
        others = [(await ops.scopes.create()).id for _ in range(RUNS - 1)]
        for key in ("a", "b", "c"):
            assert (await run_.claim(key).try_acquire())["kind"] == "acquired"
        await ops.mailboxes.ensure("jobs", mode="WORK", max_attempts=1)
        box = run_.mailbox("jobs")
        for n in range(4):
            await box.submit({"n": n}, key=f"job-{n}")
        for _ in range(2):
            delivery = await box.receive()
            await delivery.reject("bad input")
        await ops.pools.ensure("gpu", size=2)
        acme_run = await acme.scopes.create()

        # A client token: every admin command is PERMISSION_DENIED.
        for argv in (["scopes"], ["stats"], ["snapshot"], ["pools"], ["claims", run_.id]):
            err = await ctl(*argv, token=ACME, status=1)
            assert "PERMISSION_DENIED" in err

        # Runs: more than one page, each shown once.
        table = await ctl("scopes")
        assert table.splitlines()[0].split()[:3] == ["SCOPE", "CREATED_AT", "CANCELLED"]
        listed = [row[0] for row in rows(table)]
        assert listed == [run_.id, *others]
        assert [s["scope"] for s in (await ctl.json("scopes"))["scopes"]] == listed
        theirs = await ctl.json("scopes", "--tenant", "acme")
        assert [s["scope"] for s in theirs["scopes"]] == [acme_run.id]

        claims = await ctl.json("claims", run_.id)
        assert [(c["key"], c["holder"], c["held"]) for c in claims["claims"]] == [
            ("a", "ops-1", True), ("b", "ops-1", True), ("c", "ops-1", True)]
        assert [row[0] for row in rows(await ctl("claims", run_.id))] == ["a", "b", "c"]

        failed = await ctl.json("tasks", run_.id, "--state", "FAILED")
        assert [t["key"] for t in failed["tasks"]] == ["job-0", "job-1"]
        pending = rows(await ctl("tasks", run_.id, "--state", "PENDING", "--mailbox", "jobs"))
        assert [row[3] for row in pending] == ["job-2", "job-3"]
        one = await ctl.json("task", run_.id, failed["tasks"][0]["id"])
        assert one["data"] == {"n": 0} and one["reason"] == "rejected: bad input"
        assert "data.n" in await ctl("task", run_.id, failed["tasks"][0]["id"])
        # a task's parents and children (ADMIN_TASK's links), as JSON and as lines
        after = await box.submit({"n": 9}, after=[failed["tasks"][0]["id"]],
                                 on_parent_failure="run", parent=failed["tasks"][1]["id"])
        linked = await ctl.json("task", run_.id, after.id)
        assert linked["links"]["parent"] == {"id": failed["tasks"][1]["id"], "state": "FAILED"}
        shown = await ctl("task", run_.id, after.id)
        assert f"links.after              {failed['tasks'][0]['id']} (FAILED)" in shown
        parent = await ctl.json("task", run_.id, failed["tasks"][1]["id"])
        assert parent["links"]["children"] == [{"id": after.id, "state": "PENDING"}]
        await after.cancel()  # (the listings below count the four jobs alone)

        dead = await ctl.json("dead-letters", run_.id, "jobs")
        assert [d["key"] for d in dead["items"]] == ["job-0", "job-1"]
        assert "job-0" in await ctl("dead-letters", run_.id, "jobs")
        first = dead["items"][0]["id"]
        requeued = await ctl.json("dead-letters", run_.id, "jobs", "--requeue", first)
        assert requeued["left"] == 1 and requeued["requeued"][0]["id"] == first
        assert "1 requeued, 0 dead letters left" in await ctl(
            "dead-letters", run_.id, "jobs", "--all")
        again = await ctl.json("tasks", run_.id, "--state", "PENDING")
        assert sorted(t["key"] for t in again["tasks"]) == ["job-0", "job-1", "job-2", "job-3"]

        pools = await ctl.json("pools")
        assert pools["pools"] == [
            {"name": "gpu", "size": 2, "held": 0, "waiters": 0, "generation": 0}]
        assert rows(await ctl("pools"))[0][:2] == ["gpu", "2"]

        await run_.mailbox("jobs").submit({"n": 99}, key="later", delay_seconds=3600)
        counts = await ctl.json("mailbox", run_.id, "jobs")
        assert counts["delayed"] == 1 and counts["ready"] == 4 and counts["dead_letters"] == 0
        assert rows(await ctl("mailbox", run_.id, "jobs"))[0][2] == "1"  # delayed
        # pause|resume: in every run of the token's tenant, or in one run (--run)
        assert (await ctl("mailbox", "pause", "jobs")).strip() == (
            "mailbox jobs paused in every run")
        assert (await ctl.json("mailbox", run_.id, "jobs"))["paused"] is True
        assert (await ctl.json("mailbox", "resume", "jobs"))["paused"] is False
        assert (await ctl.json("mailbox", "pause", "jobs", "--run", run_.id))["paused"] is True
        assert rows(await ctl("mailbox", run_.id, "jobs"))[0][6] == "yes"  # paused
        assert f"resumed in run {run_.id}" in await ctl("mailbox", "resume", "jobs", "--run",
                                                        run_.id)
        assert "does not exist" in await ctl("mailbox", "pause", "nope", status=1)
        # signal: a task suspended waiting for "approval" is woken, with the data given.
        waits = ops.scope(others[0]).mailbox("jobs")
        ticket = await waits.submit({"draft": 1})
        held = await waits.receive()
        await held.suspend("approval")
        assert rows(await ctl("mailbox", others[0], "jobs"))[0][3] == "1"  # waiting
        assert "JSON" in await ctl("signal", others[0], ticket.id, "approval", "--data", "{",
                                   status=2)
        assert "waits for the signal 'approval'" in await ctl(
            "signal", others[0], ticket.id, "payment", status=1)
        assert (await ctl("signal", others[0], ticket.id, "approval", "--data",
                          '{"ok": true}')).strip() == (
            f"task {ticket.id} woken by 'approval': PENDING")
        woken = await waits.receive()
        assert woken.signal == {"name": "approval", "data": {"ok": True}}
        await woken.complete()
        assert "has ended (SUCCEEDED)" in await ctl("signal", others[0], ticket.id, "approval",
                                                    status=1)

        await run_.schedules.ensure("nightly", mailbox="jobs", cron="0 3 * * *",
                                    timezone="Europe/Berlin")
        listed_schedules = (await ctl.json("schedules", run_.id))["schedules"]
        assert [(s["name"], s["cron"], s["paused"]) for s in listed_schedules] == [
            ("nightly", "0 3 * * *", False)]
        row = rows(await ctl("schedules", run_.id))[0]
        assert row[0] == "nightly" and row[1] == "jobs"

        # A dead letter deleted: off the list for good (checked through the SDK).
        await (await box.receive()).reject("bad again")
        (dead_id,) = [d["id"] for d in (await ctl.json("dead-letters", run_.id, "jobs"))["items"]]
        deleted = await ctl.json("dead-letters", run_.id, "jobs", "--delete", dead_id)
        assert deleted == {"deleted": dead_id, "left": 0}
        assert (await box.inspect())["dead_letters"] == 0
        assert "NOT_FOUND" in await ctl("dead-letters", run_.id, "jobs", "--delete", dead_id,
                                        status=1)

        # Quotas, mailboxes and a run's groups.
        await ops.quotas.ensure("api", limit=10, per_seconds=60)
        quotas = await ctl.json("quotas")
        assert [(q["name"], q["limit"], q["waiters"]) for q in quotas["quotas"]] == [
            ("api", 10, 0)]
        assert rows(await ctl("quotas"))[0][:2] == ["api", "10"]
        boxes = await ctl.json("mailboxes")
        assert [(m["name"], m["ready"]) for m in boxes["mailboxes"]] == [("jobs", 3)]
        await box.submit({"n": 7}, key="grouped", group="batch")
        groups = await ctl.json("groups", run_.id)
        assert [(g["group"], g["tasks"]) for g in groups["groups"]] == [("batch", 1)]
        assert rows(await ctl("groups", run_.id))[0][:2] == ["batch", "1"]

        stats = await ctl.json("stats", "--interval", "0.1")
        assert stats["core"]["scopes"] == RUNS + 1 and stats["connections"] >= 2
        assert "core.claims" in await ctl("stats", "--interval", "0.1")
        lines = (await ctl("top", "--iterations", "2", "--interval", "0.1", "--json")).splitlines()
        assert len(lines) == 2 and json.loads(lines[1])["scopes"][0]["scope"] == run_.id
        assert run_.id in await ctl("top", "--iterations", "1")

        snap = await ctl.json("snapshot")
        assert (server.data / snap["snapshot"]).exists()
        assert "written" in await ctl("snapshot")

        cancelled = await ctl.json("cancel", others[0], "done with it")
        assert cancelled["cancelled"] is True
        assert "cancelled" in await ctl("cancel", acme_run.id, "stop", "--tenant", "acme")
        assert (await ctl.json("scopes", "--tenant", "acme"))["scopes"][0]["cancelled"] == "stop"

    await server.stop()
    # Offline: a copy of the data directory whose last segment lost half its last write.
    copy = tmp_path / "copy"
    shutil.copytree(server.data, copy, ignore=shutil.ignore_patterns("LOCK"))
    last = sorted(copy.glob("journal-*.log"))[-1]
    whole = last.read_bytes()
    last.write_bytes(whole + b"\x00" * 4096)  # zeros: what rsd writes ahead of its records
    preallocated = await ctl.json("journal", "verify", str(copy), status=0)
    assert [f["status"] for f in preallocated["files"]].count("ok") == len(preallocated["files"])
    last.write_bytes(whole + b"\x5a" * 7)  # not zeros: a write the crash cut short
    verify = subprocess.run(
        [sys.executable, "-m", "rsctl", "journal", "verify", str(copy)],
        capture_output=True, text=True, env=subprocess_env(), timeout=60,
    )
    assert verify.returncode == 1, verify
    assert "torn tail" in verify.stdout and last.name in verify.stdout
    report = await ctl.json("journal", "verify", str(copy), status=1)
    assert report["exit"] == 1
    assert [f["status"] for f in report["files"]].count("torn tail") == 1
    dumped = (await ctl("journal", "dump", str(copy), status=1)).splitlines()
    assert any(line.startswith("SCOPE_CANCELLED") for line in dumped)
    records = [json.loads(line) for line in
               (await ctl("journal", "dump", str(copy), "--json", status=1)).splitlines()]
    assert any(rec[1] == "SNAP_SCOPE" and rec[2] == run_.id for rec in records)
    # Damage with whole frames after it: rsd would refuse to start; verify says 2.
    data = bytearray(last.read_bytes()[:-7])
    data[40] ^= 0xFF  # inside the first frame: the frames after it are whole
    last.write_bytes(bytes(data))
    damaged = await ctl.json("journal", "verify", str(copy), status=2)
    assert [f["status"] for f in damaged["files"]].count("damaged") == 1
