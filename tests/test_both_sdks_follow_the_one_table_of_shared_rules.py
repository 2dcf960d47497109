"""Both SDKs follow the one table of the rules they share, ``rsproto.sdkrules``.

Which requests are sent again after a lost connection, when a lease is renewed and given
up, which class each error code becomes, and what comes before a request answered MOVED
goes again: the Python SDK imports the table, the TypeScript SDK gets a copy generated
from it, and both are run on the same cases generated from it (the TypeScript half is
``sdk/typescript/test/both_sdks_follow_the_one_table_of_shared_rules.test.ts``, run by
``make test-ts``). Here: the generated files are what the table generates, the Python SDK
answers every case as the table does, and protocol.md's "Rules every SDK shares" lists
exactly the table.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from rsclient import shards as shards_module
from rsclient.connection import LostConnection, Moved, NotExecuted
from rsclient.errors import RunstateError, error_for
from rsclient.failover import may_send_again
from rsclient.leases import Lease, confirm_renewal, loss_margin
from rsclient.shards import Shards
from rsproto import ErrorCode, Op, sdkrules
from rsproto.sdkrules import ERROR_CLASSES, RESEND, Resend

ROOT = Path(__file__).resolve().parent.parent
CASES = sdkrules.cases()


@pytest.mark.parametrize(
    ("path", "generate"),
    [(sdkrules.TYPESCRIPT_MODULE, sdkrules.typescript_module),
     (sdkrules.TYPESCRIPT_CASES, sdkrules.typescript_cases)],
    ids=["module", "cases"],
)
def test_the_typescript_sdk_has_the_table_as_generated(path: Path, generate: Any) -> None:
    committed = (ROOT / path).read_text(encoding="utf-8")
    assert committed == generate(), (
        f"{path} is not what rsproto/sdkrules.py generates: run `python -m rsproto.sdkrules`"
    )


def test_the_table_has_a_row_for_every_op_and_every_error_code() -> None:
    assert set(RESEND) == set(Op)
    assert set(ERROR_CLASSES) == set(ErrorCode)
    keyed = {op for op, rule in RESEND.items() if rule.keyed_by is not None}
    assert keyed == {op for op, rule in RESEND.items() if rule.resend is Resend.KEYED}


def _connection(*, cluster: bool, closed: bool = False) -> Any:
    return SimpleNamespace(cluster=cluster, closed=closed)


@pytest.mark.parametrize(("op", "args", "expected"), CASES["sent_again"])
def test_the_python_sdk_sends_again_after_a_lost_connection_what_the_table_says(
    op: int, args: dict[str, Any], expected: bool
) -> None:
    lost = LostConnection("connection lost")
    assert may_send_again(_connection(cluster=True), lost, op, args) is expected
    assert may_send_again(_connection(cluster=False), lost, op, args) is False  # a lone rsd
    not_executed = NotExecuted("not the primary", ErrorCode.NOT_PRIMARY, {"epoch": 1})
    assert may_send_again(_connection(cluster=True), not_executed, op, args) is True
    assert may_send_again(_connection(cluster=True, closed=True), not_executed, op, args) is False


def test_the_python_sdk_gives_leases_up_and_renews_them_when_the_table_says() -> None:
    for seconds, margin in CASES["loss_margin"]:
        assert loss_margin(seconds) == margin, seconds
    for seconds, sent_at, renew_at, lost_at in CASES["renewal"]:
        lease = SimpleNamespace(lease_seconds=seconds, renew_at=0.0, lost_at=0.0)
        confirm_renewal(cast(Lease, lease), sent_at)
        assert (lease.renew_at, lease.lost_at) == (renew_at, lost_at), seconds


@pytest.mark.parametrize(("known", "told", "moved", "pause"), CASES["moved_pause"])
async def test_the_python_sdk_follows_a_moved_answer_as_the_table_says(
    known: int | None, told: object, moved: int, pause: float | None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shards = object.__new__(Shards)  # the map and the refresh, as ``follow`` reads them
    shards.map = None if known is None else cast(Any, SimpleNamespace(epoch=known))
    asked: list[str] = []
    slept: list[float] = []

    async def refresh(**_: Any) -> bool:
        asked.append("the map")
        return True

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    shards.refresh = refresh  # type: ignore[method-assign]
    monkeypatch.setattr(shards_module.asyncio, "sleep", sleep)
    answer = Moved("MOVED: slot 7 is served by shard b", {"map_epoch": told}, cast(Any, None))
    await shards.follow(answer, moved)
    if pause is None:
        assert (asked, slept) == (["the map"], [])
    else:
        assert (asked, slept) == ([], [pause] if pause > 0 else [])


@pytest.mark.parametrize(("code", "name"), CASES["error_class"])
def test_the_python_sdk_raises_the_class_the_table_names(code: str, name: str) -> None:
    error = error_for(code, "message")
    assert isinstance(error, RunstateError)
    assert (type(error).__name__, error.code) == (name, code)


# ---- protocol.md ---------------------------------------------------------------------

DOC = ROOT / "protocol.md"


def _table(heading: str) -> list[list[str]]:
    """The body rows of the first table under ``heading`` (a unique line of protocol.md)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip() == heading]
    assert len(hits) == 1, f"protocol.md must have exactly one heading {heading!r}"
    rows: list[list[str]] = []
    for line in lines[hits[0] + 1 :]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) > 2, f"no table under {heading!r}"
    return rows[2:]


def _names(cell: str) -> list[str]:
    return [name.strip() for name in cell.split(",")]


def test_protocol_md_lists_what_is_sent_again_as_the_table_does() -> None:
    doc: dict[str, tuple[str, str | None]] = {}
    for resend, _meaning, ops in _table("### Sent again after a lost connection"):
        for entry in _names(ops):
            match = re.fullmatch(r"([A-Z_]+)(?: \(`([^`]+)`\))?", entry)
            assert match, f"{entry!r}: an op name, optionally with its key field in (``)"
            assert match[1] not in doc, f"protocol.md lists {match[1]} twice"
            doc[match[1]] = (resend, match[2])
    table = {op.name: (rule.resend.value, rule.keyed_by) for op, rule in RESEND.items()}
    assert doc == table


@pytest.mark.parametrize(
    ("heading", "names"),
    [("### Renewal, loss margin and sends", sdkrules.LEASE_RULES),
     ("### Connections", sdkrules.CONNECTION_RULES)],
    ids=["leases", "connections"],
)
def test_protocol_md_states_the_numbers_as_the_table_does(
    heading: str, names: tuple[str, ...]
) -> None:
    doc = [(name, value) for name, value, _ in _table(heading)]
    assert doc == [(name, str(getattr(sdkrules, name))) for name in names]


def test_the_python_sdk_connects_with_the_tables_numbers() -> None:
    from rsclient import connection, nodes

    assert (connection.DEFAULT_CONNECT_TIMEOUT, connection.MAX_SLOWED_PAUSE,
            connection.MIN_ATTEMPT, connection.NODE_ANSWER_SECONDS,
            connection.DEFAULT_CLUSTER_LEASE, connection.FAILOVER_PAUSE,
            connection.SILENCE_SECONDS, connection.WRITE_AT_FRAMES, nodes.MAX_REDIRECTS) == (
        sdkrules.CONNECT_TIMEOUT_SECONDS, sdkrules.MAX_SLOWED_PAUSE_SECONDS,
        sdkrules.MIN_ATTEMPT_SECONDS, sdkrules.NODE_ANSWER_SECONDS,
        sdkrules.DEFAULT_CLUSTER_LEASE_SECONDS, sdkrules.FAILOVER_PAUSE_SECONDS,
        sdkrules.SILENCE_SECONDS, sdkrules.WRITE_AT_FRAMES, sdkrules.MAX_REDIRECTS)


def test_protocol_md_names_the_class_of_every_error_code_as_the_table_does() -> None:
    doc: dict[str, str] = {}
    for name, codes in _table("### Error classes"):
        for code in _names(codes):
            assert code not in doc, f"protocol.md lists {code} twice"
            doc[code] = name
    assert doc == {str(code): name for code, name in ERROR_CLASSES.items()}


def test_protocol_md_states_the_view_of_many_shards_as_the_table_does() -> None:
    assert [(name, value) for name, value, _ in _table("### One view of many shards")] == [
        ("PAGE_DEFAULT", str(sdkrules.PAGE_DEFAULT)),
        ("PAGE_MAX", str(sdkrules.PAGE_MAX)),
        ("FANNED_OUT", ", ".join(op.name for op in sdkrules.FANNED_OUT)),
        ("STATS_SUMMED", ", ".join(sdkrules.STATS_SUMMED)),
    ]
