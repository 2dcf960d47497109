"""``rsctl backup DIR`` from a running rsd while clients keep changing it: rsd started on
the copy holds every change acknowledged before the backup began (the history's rule
``acknowledged changes present``, on the ops completed before that moment).

Beside it, the rules of who may take one and where it may go: a client-role token is
refused (a backup holds every tenant's data: PERMISSION_DENIED, whatever its tenant),
and a directory that is not empty, or that cannot be written, is refused before the
server is asked anything. One rsd (a real one: the backup is read over the wire while
the loop serves the workload), a second one started on the copy.

Why real time and not the core on a fake clock: the rule is about files (what is pinned
while the journal is appended to and a snapshot deletes what it covers) and about the
loop serving other connections between two reads of the copy.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
from support.history import History, check_acknowledged_changes_present
from support.process import Rsd
from support.workload import CLAIM_LEASE, Workload, done

from rsclient import AsyncRunstate, PermissionDeniedError
from rsctl.backup import STAGING
from rsctl.main import run
from rsd.security.tokens import hash_token, new_token
from rsproto import Op

OPS, ACME = new_token(), new_token()


async def _rsctl(capsys: pytest.CaptureFixture[str], address: str, token: str,
                 *argv: str) -> tuple[int, str, str]:
    """rsctl in the test's event loop (the workload's clients go on meanwhile)."""
    capsys.readouterr()
    status = await run(["--address", address, "--token", token, *argv])
    out, err = capsys.readouterr()
    return status, out, err


async def test_a_backup_under_load_restores_every_change_acknowledged_before_it(
    rsds: Callable[..., Rsd], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = rsds("source")
    tokens = server.write_tokens(f"{hash_token(OPS)} ops admin",
                                 f"{hash_token(ACME)} acme client")
    # Small snapshots: the journal rotates (and a snapshot deletes segments) while the
    # backup is read, so the pinned files outlive their names.
    await server.start("--tokens-file", str(tokens), "--snapshot-bytes", "65536")
    monkeypatch.setenv("RUNSTATE_TOKEN", OPS)  # the workload's clients
    history = History(float(CLAIM_LEASE))
    workload = Workload(history, server.address, random.Random(36))
    target = tmp_path / "backup"
    try:
        await workload.start()
        run_id = workload.run_id
        began = history.now()
        await workload.until(began, 0.5, "submit", "complete", "acquire", at_most=30.0)
        began = history.now()
        # --no-snapshot: the copy is the snapshot written last by size and the journal
        # after it, so the changes acknowledged just before are in the segment being
        # written, copied up to its last whole batch at the moment of the pin.
        status, out, err = await _rsctl(capsys, server.address, OPS, "backup", str(target),
                                        "--no-snapshot")
        assert status == 0, (out, err)
        assert "checked" in out and str(target) in out
        ended = history.now()
        await workload.until(ended, 0.2, "submit")
        crashed = await workload.stop()
        assert not crashed, crashed
    finally:
        await workload.close()
    assert sorted(p.name for p in target.iterdir() if p.name.startswith(".")) == []
    assert any(p.name.startswith("journal-") for p in target.iterdir())
    acked = done(history, 0.0, "submit", "complete", "acquire", until=began)
    assert all(acked.values()), f"the workload acknowledged too little to check: {acked}"
    during = done(history, began, "submit", until=ended)["submit"]
    # Only what was acknowledged before the backup began must be in it.
    history.ops = [op for op in history.ops if op.completed is not None and op.completed < began]
    copy = rsds("copy")
    copy.data = target
    await copy.start("--tokens-file", str(tokens))
    workload = Workload(history, copy.address, random.Random(0))
    workload.run_id = run_id
    try:
        await workload.final_reads()
    finally:
        await workload.close()
    violations = check_acknowledged_changes_present(history)
    assert not violations, "\n".join(map(str, violations))
    print(f"acknowledged before the backup: {acked}; submits acknowledged while it ran: "
          f"{during}")


async def test_a_backup_is_refused_to_a_client_token_and_to_an_unusable_directory(
    rsds: Callable[..., Rsd], tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    server = rsds()
    tokens = server.write_tokens(f"{hash_token(OPS)} ops admin",
                                 f"{hash_token(ACME)} acme client")
    await server.start("--tokens-file", str(tokens))
    address = server.address
    # A client-role token: refused, whichever op; nothing is pinned, nothing written.
    status, _, err = await _rsctl(capsys, address, ACME, "backup", str(tmp_path / "b1"),
                                  "--no-snapshot")
    assert status == 1 and "PERMISSION_DENIED" in err and "admin" in err, err
    assert not any((tmp_path / "b1").iterdir())
    async with AsyncRunstate("acme", address, token=ACME) as acme:
        for op, args in ((Op.BACKUP_BEGIN, {}), (Op.BACKUP_READ, {"file": "x", "offset": 0}),
                         (Op.BACKUP_END, {})):
            with pytest.raises(PermissionDeniedError):
                await acme.admin.request(op, **args)
    # A directory that is not empty.
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    status, _, err = await _rsctl(capsys, address, OPS, "backup", str(full))
    assert status == 2 and f"{full} is not empty" in err, err
    assert sorted(p.name for p in full.iterdir()) == ["notes.txt"]
    # A directory that cannot be made (its parent is a file: refused even to root).
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    status, _, err = await _rsctl(capsys, address, OPS, "backup", str(blocked / "backup"))
    assert status == 2 and f"cannot write to {blocked / 'backup'}" in err, err
    # A file in the directory's place.
    status, _, err = await _rsctl(capsys, address, OPS, "backup", str(blocked))
    assert status == 2 and "is not a directory" in err, err
    # The admin token, to the same kind of place: done, and nothing left of the staging.
    status, _, err = await _rsctl(capsys, address, OPS, "backup", str(tmp_path / "b1"))
    assert status == 0, err
    assert not (tmp_path / "b1" / STAGING).exists()
    assert any(p.name.startswith("snapshot-") for p in (tmp_path / "b1").iterdir())
