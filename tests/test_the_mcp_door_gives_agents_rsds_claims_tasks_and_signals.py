"""``rsd mcp`` (rsctl/mcpdoor.py), driven by the official MCP package's own client against a
real rsd: over stdio (the client spawns ``rsd mcp``, the address from
``$RUNSTATE_ADDRESS`` as rsctl takes it) an agent claims and releases a key (its fencing
token and generation), submits a task and awaits its result while another call takes
and completes it as a worker, pages a run's tasks, and gets rsd's refusals as tool
errors with rsd's code; over streamable HTTP (``--http 127.0.0.1:0``) the same tools
answer; and, with issue 34's progress and signals (contract34.md), the events of an
awaited task come as MCP progress notifications and a task suspended through the door
is woken by a signal sent through it.

Real processes: what this shows beyond the SDK's own tests is the door's mapping onto
MCP as a real MCP client sees it (schemas, structured answers, errors, notifications,
both transports). One rsd for the module; each test's door is its own process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
from collections.abc import AsyncIterator, Awaitable
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar

import pytest
from support.process import Rsd, subprocess_env

if TYPE_CHECKING:
    from mcp import Client, StdioServerParameters

pytestmark = pytest.mark.rsd_per_module
_T = TypeVar("_T")

TOOLS = {"create_run", "claim_key", "release_key", "submit_task", "await_task",
         "receive_task", "complete_task", "fail_task", "report_progress", "suspend_task",
         "signal_task", "list_tasks"}


def _mcp() -> ModuleType:
    """The MCP package, imported by the first test that drives it rather than as the
    module is collected: its import costs about 1 s of CPU, which every pytest-xdist
    worker's collection paid. Where it is not installed, the test is skipped."""
    mcp: ModuleType = pytest.importorskip("mcp")
    return mcp


def _client(target: StdioServerParameters | str) -> Client:
    """The MCP package's own client of the door ``target`` (stdio, or an HTTP URL)."""
    client: Client = _mcp().Client(target)
    return client


def _door(rsd: Rsd, *flags: str) -> StdioServerParameters:
    env = subprocess_env()
    env["RUNSTATE_ADDRESS"] = rsd.address  # as rsctl takes it
    door: StdioServerParameters = _mcp().StdioServerParameters(
        command=sys.executable, args=["-m", "rsd", "mcp", *flags], env=env)
    return door


async def _call(client: Client, tool: str, **args: Any) -> Any:
    """The tool's structured answer (a tool error fails the test, with its text)."""
    result = await client.call_tool(tool, args)
    assert not result.is_error, (tool, result.content)
    return result.structured_content


async def _refusal(client: Client, tool: str, **args: Any) -> str:
    """What the tool error ``tool`` answers says, after the MCP package's own prefix
    (``Error executing tool NAME: ``): rsd's ``CODE: message``."""
    result = await client.call_tool(tool, args)
    assert result.is_error, (tool, result.structured_content)
    text = str(result.content[0].text)  # type: ignore[union-attr]
    prefix = f"Error executing tool {tool}: "
    assert text.startswith(prefix), text
    return text.removeprefix(prefix)


@contextlib.asynccontextmanager
async def _beside(call: Awaitable[_T]) -> AsyncIterator[asyncio.Future[_T]]:
    """``call`` running beside the block; if the block fails first, cancelled and read
    (a failure of it left unread is logged when the task is collected, maybe inside
    another test's ``ast.parse``, which the log's traceback then re-enters: CPython
    3.11 raises SystemError there)."""
    future = asyncio.ensure_future(call)
    try:
        yield future
    finally:
        future.cancel()
        await asyncio.gather(future, return_exceptions=True)


async def _ensured(rsd: Rsd, name: str) -> None:
    from rsclient import AsyncRunstate

    async with AsyncRunstate(holder="operator", address=rsd.address) as rs:
        await rs.mailboxes.ensure(name, mode="WORK", max_attempts=3)


async def test_an_agent_claims_submits_works_and_pages_over_stdio(rsd: Rsd) -> None:
    await _ensured(rsd, "research")
    async with _client(_door(rsd)) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
        run = (await _call(client, "create_run"))["run"]
        # A claim: its fencing token and generation; busy while held; released.
        held = await _call(client, "claim_key", run=run, key="company:acme")
        assert held["acquired"] and held["token"] and held["generation"] >= 1
        assert (await _call(client, "claim_key", run=run, key="company:acme")) == {
            "acquired": False, "holder": "mcp"}
        assert (await _call(client, "release_key", token=held["token"]))["released"]
        again = await _call(client, "claim_key", run=run, key="company:acme")
        assert again["generation"] > held["generation"]
        assert (await _refusal(client, "release_key", token=held["token"])).startswith(
            "NOT_FOUND: ")
        # A task submitted and awaited by one call, taken and completed by others.
        async with _beside(_call(client, "submit_task", run=run, mailbox="research",
                                 data={"company": "acme"}, key="research:acme",
                                 wait_seconds=60)) as waiting:
            got = await _call(client, "receive_task", run=run, mailbox="research",
                              wait_seconds=30)
            assert got["data"] == {"company": "acme"} and got["attempt"] == 1
            assert got["signal"] is None
            done = await _call(client, "complete_task", delivery=got["delivery"],
                               result={"report": "fine"})
            assert done["state"] == "SUCCEEDED"
            outcome = await asyncio.wait_for(waiting, 30)
        assert outcome == {"task_id": got["task_id"], "run": run, "finished": True,
                           "state": "SUCCEEDED", "outcome": {"report": "fine"},
                           "reason": None}
        # Settled: the token is no longer held; a second task is failed for good.
        assert "NOT_FOUND" in await _refusal(client, "complete_task",
                                             delivery=got["delivery"])
        await _call(client, "submit_task", run=run, mailbox="research", data={"n": 2},
                    key="second", wait_seconds=0)
        second = await _call(client, "receive_task", run=run, mailbox="research")
        failed = await _call(client, "fail_task", delivery=second["delivery"],
                             reason="no such company", retry=False)
        assert failed["state"] == "FAILED"
        # A run's tasks, a page at a time.
        page = await _call(client, "list_tasks", run=run, limit=1)
        assert [task["id"] for task in page["tasks"]] == [got["task_id"]]
        rest = await _call(client, "list_tasks", run=run, cursor=page["next"], limit=10)
        assert [task["state"] for task in rest["tasks"]] == ["FAILED"] and rest["next"] is None
        # rsd's refusals: its code and message.
        assert (await _refusal(client, "submit_task", run=run, mailbox="nope", data=1)
                ).startswith("NOT_FOUND: ")
        assert (await _refusal(client, "list_tasks", run="no-such-run")).startswith(
            "NOT_FOUND: ")
        assert (await _call(client, "receive_task", run=run, mailbox="research")) == {
            "delivery": None}


@pytest.fixture
async def http_door(rsd: Rsd) -> AsyncIterator[str]:
    """``rsd mcp --http 127.0.0.1:0``: its MCP URL (from the line it prints)."""
    door = _door(rsd, "--http", "127.0.0.1:0")
    proc = await asyncio.create_subprocess_exec(
        door.command, *door.args, env=door.env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert proc.stderr is not None
    try:
        line = (await asyncio.wait_for(proc.stderr.readline(), 30)).decode()
        found = re.search(r"listening on (http://\S+)", line)
        assert found, line
        yield found[1]
    finally:
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 30) == 0


async def test_the_same_tools_answer_over_streamable_http(http_door: str) -> None:
    async with _client(http_door) as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
        run = (await _call(client, "create_run", run_id="over-http"))["run"]
        assert run == "over-http"
        held = await _call(client, "claim_key", run=run, key="k", lease_seconds=5)
        assert held["acquired"] and held["token"]
        await _call(client, "release_key", token=held["token"])
        assert (await _refusal(client, "await_task", run=run, task_id="t-none",
                               wait_seconds=0)).startswith("NOT_FOUND: ")


async def test_an_awaited_task_streams_its_events_and_a_signal_wakes_a_suspended_one(
    rsd: Rsd,
) -> None:
    """Issue 34's items 1 and 2 through the door: fails until they are merged."""
    await _ensured(rsd, "approvals")
    notes: list[tuple[float, str | None]] = []

    async def heard(progress: float, total: float | None, message: str | None) -> None:
        notes.append((progress, message))

    async with _client(_door(rsd)) as client:
        run = (await _call(client, "create_run"))["run"]
        async with _beside(client.call_tool(
            "submit_task", {"run": run, "mailbox": "approvals", "data": {"doc": 7},
                            "wait_seconds": 60}, progress_callback=heard)) as waiting:
            got = await _call(client, "receive_task", run=run, mailbox="approvals",
                              wait_seconds=30)
            await _call(client, "report_progress", delivery=got["delivery"],
                        data={"step": "read"})
            suspended = await _call(client, "suspend_task", delivery=got["delivery"],
                                    name="approval", timeout_seconds=600)
            assert suspended["state"] == "WAITING"
            await _call(client, "signal_task", run=run, task_id=got["task_id"],
                        name="approval", data={"by": "ada"})
            woken = await _call(client, "receive_task", run=run, mailbox="approvals",
                                wait_seconds=30)
            assert woken["signal"] == {"name": "approval", "data": {"by": "ada"}}
            await _call(client, "complete_task", delivery=woken["delivery"],
                        result="approved")
            result = await asyncio.wait_for(waiting, 30)
        assert not result.is_error and result.structured_content["outcome"] == "approved"
        # A signal to a finished task: rsd's refusal, its code and message.
        refused = await _refusal(client, "signal_task", run=run, task_id=got["task_id"],
                                 name="approval")
        assert re.match(r"[A-Z_]+: \S", refused), refused
    events = [json.loads(message or "{}") for _, message in notes]
    assert [progress for progress, _ in notes] == sorted(progress for progress, _ in notes)
    assert {"kind": "progress", "data": {"step": "read"}}.items() <= next(
        event for event in events if event.get("kind") == "progress").items()
    assert any(event.get("state") == "WAITING" for event in events)
    assert events[-1]["kind"] == "outcome"
