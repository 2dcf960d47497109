"""``rsd mcp``: an MCP door for agents, a client of rsd through rsclient.

An agent (anything that speaks the Model Context Protocol: a desktop assistant, an IDE,
an agent framework) reaches rsd through this process's tools instead of an SDK. The door
is a client of rsd like rsctl: one ``AsyncRunstate`` for the whole process, its address
and token taken as rsctl takes them (``--address``, default ``$RUNSTATE_ADDRESS`` then
127.0.0.1:7420; ``--token``, default ``$RUNSTATE_TOKEN``; ``--ca``/``--cert``/``--key``
for TLS), so the door acts as that token's tenant and role, never more. It speaks MCP on
stdin/stdout (the default: the MCP client starts it) or, with ``--http HOST:PORT``, over
MCP's streamable HTTP on ``http://HOST:PORT/mcp`` (loopback only: the door has no
authentication of its own, whoever reaches it acts with its token).

What always holds:
- every tool is a thin call of the SDK; rsd's refusals come back as MCP tool errors
  (``isError``) whose text is rsd's code and message (``NOT_FOUND: ...``), once, in
  ``_rsd_errors``;
- what an agent holds through the door (a claim's lease, a delivery) is kept here by its
  fencing token, which the agent hands back to release, complete, report progress or
  suspend: at most ``MAX_HELD`` of each at once (RESOURCE_EXHAUSTED beyond; a lost one is
  swept first), and a settled or released one is forgotten at once. A claim's lease is
  renewed by the door while it runs (as the SDK renews a held claim); a delivery's is not
  (as ``receive()``'s): the agent chooses its ``lease_seconds``. When the door stops (its
  stdin closes: the agent's client went away), what it held lapses with its leases;
- waiting tools wait at most ``MAX_WAIT_SECONDS`` per call (an agent asks again by task
  id: ``await_task``); while a task is awaited for a caller that asked for progress
  (a ``progressToken``), each event of the task (``ticket.events()``: its progress,
  state changes, outcome) is sent as an MCP progress notification.

The MCP Python package this is built on (2.x) has no tasks utility (the experimental
``tasks/*`` support of 1.23 to 1.x is gone from it): awaiting a result is a tool call
that returns when the task ends, with progress notifications meanwhile, and a caller
that cancels the call (``notifications/cancelled``) stops only its own wait: the task
goes on in rsd, to be awaited again by id.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import ipaddress
import json
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, ParamSpec, Protocol, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field

from rsclient import AsyncRunstate, RunstateError, WaitTimeoutError
from rsclient.connection import DEFAULT_CONNECT_TIMEOUT
from rsclient.wire import ErrorCode, Limits, Op

from .main import UsageError, tls_context

if TYPE_CHECKING:
    from types import FrameType

    from rsclient.deliveries import Delivery
    from rsclient.leases import Lease
    from rsclient.tasks import Ticket

__all__ = ["MAX_HELD", "MAX_WAIT_SECONDS", "Door", "build_server", "main"]

MAX_HELD = 10_000  # claims, and deliveries, an agent may hold through one door at once
MAX_WAIT_SECONDS = Limits.MAX_WAIT_TIMEOUT_MS / 1000  # the longest a waiting call waits
DEFAULT_WAIT_SECONDS = 300.0
HTTP_PATH = "/mcp"

_P = ParamSpec("_P")
_R = TypeVar("_R")

Run = Annotated[str, Field(description="the run's id (from create_run, or another process)")]
Mailbox = Annotated[str, Field(description="the mailbox's name (ensured by an operator)")]
TaskId = Annotated[str, Field(description="the task's id (submit_task gave it)")]
DeliveryToken = Annotated[str, Field(
    description="the delivery's token, as receive_task returned it")]
WaitSeconds = Annotated[float, Field(
    ge=0, le=MAX_WAIT_SECONDS,
    description=f"how long to wait at most in this call (0 to {MAX_WAIT_SECONDS:g} s)")]


def _rsd_errors(tool: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
    """``tool``, with rsd's refusals raised as MCP tool errors: ``CODE: message``."""

    @functools.wraps(tool)
    async def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await tool(*args, **kwargs)
        except RunstateError as exc:
            raise ToolError(f"{exc.code}: {exc.message}") from None

    return call


def _refused(code: ErrorCode, message: str) -> ToolError:
    return ToolError(f"{code}: {message}")


def _field(event: Any, name: str) -> Any:
    """A field of a task event (``ticket.events()``'s: a map or an object)."""
    if isinstance(event, Mapping):
        return event.get(name)
    return getattr(event, name, None)


def _wants_progress(ctx: Context) -> bool:
    """Whether the caller sent a progress token with this call."""
    meta = ctx.request_context.meta or {}
    return meta.get("progress_token", meta.get("progressToken")) is not None


class _Lapsing(Protocol):
    @property
    def is_lost(self) -> bool: ...


_Held = TypeVar("_Held", bound=_Lapsing)


class Door:
    """One door: its client of rsd, and the leases and deliveries agents hold through it,
    by fencing token."""

    def __init__(self, rs: AsyncRunstate) -> None:
        self.rs = rs
        self.leases: dict[str, Lease] = {}
        self.deliveries: dict[str, Delivery] = {}

    def _room(self, held: dict[str, _Held], what: str) -> None:
        """Room for one more of ``held``: a lost one is forgotten first; at ``MAX_HELD``
        RESOURCE_EXHAUSTED."""
        if len(held) < MAX_HELD:
            return
        for token in [token for token, one in held.items() if one.is_lost]:
            del held[token]
        if len(held) >= MAX_HELD:
            raise _refused(ErrorCode.RESOURCE_EXHAUSTED,
                           f"this door holds {MAX_HELD} {what} already: release some first")

    def keep_lease(self, lease: Lease) -> str:
        self._room(self.leases, "claims")
        token = lease.token()
        self.leases[token] = lease
        return token

    def keep_delivery(self, delivery: Delivery) -> str:
        self._room(self.deliveries, "deliveries")
        token = delivery.token()
        self.deliveries[token] = delivery
        return token

    def delivery(self, token: str) -> Delivery:
        found = self.deliveries.get(token)
        if found is None:
            raise _refused(ErrorCode.NOT_FOUND, "no delivery of that token is held through "
                           "this door (settled already, or never received here)")
        return found

    async def settle(self, token: str, how: Callable[[Delivery], Awaitable[object]]) -> str:
        """Settle the delivery of ``token`` by ``how``; its state after. It is forgotten
        once settled or lost (refused STALE_CLAIM: it is not this agent's now); a refusal
        that decided nothing (a bad argument, no answer) leaves it held, to settle again."""
        delivery = self.delivery(token)
        try:
            await how(delivery)
        finally:
            if delivery.settled or delivery.is_lost:
                self.deliveries.pop(token, None)
        return delivery.state or "settled"


# At least this long, past the wait's own time, for the events before the outcome to be
# passed on once the result is known (ended at once when the outcome has been passed).
_FORWARD_GRACE_SECONDS = 10.0


async def _outcome(ticket: Ticket, wait_seconds: float, ctx: Context) -> dict[str, Any]:
    """The task's end as a tool answers it, or ``finished: false`` once ``wait_seconds``
    passed; its events forwarded as progress notifications if the caller asked for them."""
    forwarding = None
    if _wants_progress(ctx):
        forwarding = asyncio.ensure_future(_forward_events(ticket, ctx))
    deadline = asyncio.get_running_loop().time() + wait_seconds
    try:
        view = await ticket.result(timeout_ms=int(wait_seconds * 1000), outcome_only=True)
    except WaitTimeoutError:
        return {"task_id": ticket.id, "run": ticket.scope_id, "finished": False}
    finally:
        if forwarding is not None:
            left = deadline - asyncio.get_running_loop().time()
            await _stop(forwarding, max(left, _FORWARD_GRACE_SECONDS))
    return {"task_id": ticket.id, "run": ticket.scope_id, "finished": True,
            "state": view["state"], "outcome": view.get("outcome"),
            "reason": view.get("reason")}


async def _forward_events(ticket: Ticket, ctx: Context) -> None:
    """Each event of the task (item 1's ``ticket.events()``: retained ones first, then
    live ones, the outcome last) as an MCP progress notification: ``progress`` its
    sequence number, ``message`` the event as JSON."""
    async for event in ticket.events():
        seq = _field(event, "seq")
        shown = {name: _field(event, name)
                 for name in ("kind", "seq", "data", "state", "attempt", "missed")}
        await ctx.report_progress(float(seq or 0), None, json.dumps(
            {k: v for k, v in shown.items() if v is not None}, default=str))
        if _field(event, "kind") == "outcome":
            return


async def _stop(forwarding: asyncio.Future[None], seconds: float) -> None:
    """The forwarding ends with the wait: it passes on every event up to the outcome (the
    last, which the server never drops), however far behind the result its notifications
    are (a slow client reads them behind the result: a second was not enough on a loaded
    machine), within ``seconds``; then it is cancelled; its failure is not the wait's."""
    forwarding.add_done_callback(_quietly)
    try:
        await asyncio.wait_for(asyncio.shield(forwarding), seconds)
    except Exception:  # a timeout, or the events' own failure: the result stands
        pass
    finally:
        forwarding.cancel()


def _quietly(done: asyncio.Future[None]) -> None:
    """Read a finished forwarding's failure, so that none is reported as lost."""
    if not done.cancelled():
        done.exception()


def build_server(door: Door) -> MCPServer:
    """The MCP server of ``door``: its tools, each a thin call of the SDK."""
    server = MCPServer(
        "rsd", version=_version(), log_level="WARNING",
        instructions=(
            "rsd coordinates agents: claim a key so that only one agent does a piece of "
            "work (release it when done); submit a task to a mailbox and await its result "
            "(one task per key, whoever submits it); or take tasks from a mailbox as a "
            "worker (receive_task, then complete_task, fail_task, report_progress or "
            "suspend_task with the delivery's token). A task waiting for a signal "
            "(suspend_task) is woken by signal_task. Errors are rsd's CODE: message."),
    )
    _run_and_claim_tools(server, door)
    _task_tools(server, door)
    _worker_tools(server, door)
    _agent_tools(server, door)
    return server


def _run_and_claim_tools(server: MCPServer, door: Door) -> None:
    """The tools of runs and claims: create_run, claim_key, release_key."""
    rs = door.rs

    @server.tool()
    @_rsd_errors
    async def create_run(
        run_id: Annotated[str | None, Field(
            description="a chosen id (made if it does not exist yet); none: a fresh id")] = None,
    ) -> dict[str, Any]:
        """Create a run (the scope every claim and task lives in) and return its id."""
        run = await rs.scopes.create(id=run_id)
        return {"run": run.id, "created": run.created}

    @server.tool()
    @_rsd_errors
    async def claim_key(
        run: Run,
        key: Annotated[str, Field(description="what to hold alone, e.g. 'company:acme'")],
        lease_seconds: Annotated[float, Field(
            gt=0, le=Limits.MAX_LEASE_SECONDS,
            description="the lease's length; the door renews it while it runs")] = 30,
        wait_seconds: Annotated[float, Field(
            ge=0, le=MAX_WAIT_SECONDS, description="wait this long for a busy key "
            "(0: answer at once)")] = 0,
    ) -> dict[str, Any]:
        """Claim a key of a run, to do its work alone. Acquired: its fencing token (pass
        it to what you write, and to release_key) and generation (grows with each
        grant). Busy: who holds it."""
        claim = rs.scope(run).claim(key, lease_seconds=lease_seconds)
        if wait_seconds > 0:
            lease = await claim.acquire(wait=True, timeout_ms=int(wait_seconds * 1000))
        else:
            got = await claim.try_acquire()
            if got["kind"] == "busy":
                return {"acquired": False, "holder": got["holder"]}
            lease = got["lease"]
        return {"acquired": True, "token": door.keep_lease(lease),
                "generation": lease.generation, "lease_seconds": lease_seconds}

    @server.tool()
    @_rsd_errors
    async def release_key(
        token: Annotated[str, Field(description="the claim's token, as claim_key returned it")],
    ) -> dict[str, Any]:
        """Release a claim taken with claim_key, so the next agent may take the key."""
        lease = door.leases.get(token)
        if lease is None:
            raise _refused(ErrorCode.NOT_FOUND, "no claim of that token is held through "
                           "this door (released already, or never claimed here)")
        try:
            await lease.release()  # STALE_CLAIM if it was lost meanwhile
        finally:
            if lease.released or lease.is_lost:  # (else unanswered: the agent may retry)
                door.leases.pop(token, None)
        return {"released": True}


def _task_tools(server: MCPServer, door: Door) -> None:
    """The tools of a task submitted and awaited, and of a run's tasks read:
    submit_task, await_task, list_tasks."""
    rs = door.rs

    @server.tool()
    @_rsd_errors
    async def submit_task(
        run: Run, mailbox: Mailbox,
        data: Annotated[Any, Field(description="the task's input (any JSON)")],
        ctx: Context,
        key: Annotated[str | None, Field(
            description="the task's key: the same key and input join the one task")] = None,
        wait_seconds: WaitSeconds = DEFAULT_WAIT_SECONDS,
    ) -> dict[str, Any]:
        """Submit a task to a mailbox of a run and wait for its result: state
        (SUCCEEDED, FAILED, CANCELLED, ...), outcome and reason. If it has not finished
        within wait_seconds: finished false, and await_task(run, task_id) waits on.
        With a progress token, each event of the task comes as a progress notification."""
        ticket = await rs.scope(run).mailbox(mailbox).submit(data, key=key)
        return await _outcome(ticket, wait_seconds, ctx)

    @server.tool()
    @_rsd_errors
    async def await_task(
        run: Run, task_id: TaskId, ctx: Context,
        wait_seconds: WaitSeconds = DEFAULT_WAIT_SECONDS,
    ) -> dict[str, Any]:
        """Wait for a task to end (as submit_task does), by its id."""
        return await _outcome(rs.scope(run).task(task_id), wait_seconds, ctx)

    @server.tool()
    @_rsd_errors
    async def list_tasks(
        run: Run,
        cursor: Annotated[int | str, Field(
            description="0 for the first page, then the page's next")] = 0,
        limit: Annotated[int, Field(ge=1, le=1000, description="tasks per page")] = 50,
        state: Annotated[str | None, Field(
            description="only this state (PENDING, RUNNING, SUCCEEDED, ...)")] = None,
        mailbox: Annotated[str | None, Field(description="only this mailbox")] = None,
    ) -> dict[str, Any]:
        """One page of a run's tasks (admin token), oldest first: id, mailbox, key,
        state, attempt, reason; next is the cursor of the next page (null: the last)."""
        tasks, after = await rs.admin.page(Op.ADMIN_TASKS, "tasks", cursor=cursor,
                                           limit=limit, scope=run, state=state,
                                           mailbox=mailbox)
        return {"tasks": tasks, "next": after}


def _worker_tools(server: MCPServer, door: Door) -> None:
    """The tools of a worker's side of a task: receive_task, complete_task, fail_task."""
    rs = door.rs

    @server.tool()
    @_rsd_errors
    async def receive_task(
        run: Run, mailbox: Mailbox,
        lease_seconds: Annotated[float, Field(
            gt=0, le=Limits.MAX_LEASE_SECONDS,
            description="how long the delivery is yours: settle it before then, or it "
            "goes to another worker (not renewed by the door)")] = 300,
        wait_seconds: WaitSeconds = 0,
    ) -> dict[str, Any]:
        """Take the next task of a mailbox, as a worker. Returns the delivery's token
        (for complete_task, fail_task, report_progress, suspend_task), the task's id,
        data and attempt, and the signal that woke it (null unless it waited for one);
        delivery null if none is ready."""
        box = rs.scope(run).mailbox(mailbox)
        if wait_seconds > 0:
            got = await box.receive(lease_seconds=lease_seconds, wait=True,
                                    timeout_ms=int(wait_seconds * 1000))
        else:
            got = await box.receive(lease_seconds=lease_seconds)
        if got is None:
            return {"delivery": None}
        return {"delivery": door.keep_delivery(got), "task_id": got.task_id,
                "data": got.data, "attempt": got.attempt,
                "signal": getattr(got, "signal", None)}

    @server.tool()
    @_rsd_errors
    async def complete_task(
        delivery: DeliveryToken,
        result: Annotated[Any, Field(description="the task's outcome (any JSON)")] = None,
    ) -> dict[str, Any]:
        """Finish a delivery: the task SUCCEEDED with this outcome, pushed to whoever
        awaits it."""
        state = await door.settle(
            delivery, lambda held: held.complete(result={"payload": result}))
        return {"state": state}

    @server.tool()
    @_rsd_errors
    async def fail_task(
        delivery: DeliveryToken,
        reason: Annotated[str, Field(description="why, for whoever reads the task")],
        retry: Annotated[bool, Field(
            description="true: back on the queue with backoff (FAILED at the mailbox's "
            "attempt limit); false: FAILED now, dead-lettered")] = True,
    ) -> dict[str, Any]:
        """Give up on a delivery: retried later, or failed for good."""
        if retry:
            state = await door.settle(delivery, lambda held: held.retry(reason=reason))
        else:
            state = await door.settle(delivery, lambda held: held.reject(reason))
        return {"state": state}


def _agent_tools(server: MCPServer, door: Door) -> None:
    """The tools of what agents do beyond one result: report_progress, suspend_task, signal_task."""
    rs = door.rs

    @server.tool()
    @_rsd_errors
    async def report_progress(
        delivery: DeliveryToken,
        data: Annotated[Any, Field(description="the progress to publish (any JSON, "
                                   "at most 64 KiB)")],
    ) -> dict[str, Any]:
        """Publish progress on the task you hold: every caller awaiting it sees it
        (STALE_CLAIM if the delivery's lease was lost)."""
        await door.delivery(delivery).progress(data)
        return {"published": True}

    @server.tool()
    @_rsd_errors
    async def suspend_task(
        delivery: DeliveryToken,
        name: Annotated[str, Field(description="the signal to wait for, e.g. 'approval'")],
        timeout_seconds: Annotated[float, Field(
            gt=0, description="ready again without the signal after this long")],
    ) -> dict[str, Any]:
        """Set the task aside until signal_task sends it the signal of this name (or
        the timeout passes): it waits without a worker (state WAITING), and its next
        delivery carries the signal (null after a timeout). Costs no attempt."""
        state = await door.settle(delivery, lambda held: held.suspend(
            name, timeout_seconds=timeout_seconds))
        return {"state": state}

    @server.tool()
    @_rsd_errors
    async def signal_task(
        run: Run, task_id: TaskId,
        name: Annotated[str, Field(description="the signal's name, e.g. 'approval'")],
        data: Annotated[Any, Field(description="what the signal carries (any JSON)")] = None,
    ) -> dict[str, Any]:
        """Send a signal to a task: one waiting for it is ready again at once, and one
        not yet waiting keeps it for when it suspends."""
        reply = await rs.scope(run).task(task_id).signal(name, data)
        return reply if isinstance(reply, dict) else {"signalled": True}


def _version() -> str:
    from rsd import __version__

    return __version__


def build_parser() -> argparse.ArgumentParser:
    from .main import _common

    parser = argparse.ArgumentParser(
        prog="rsd mcp", description="An MCP server for agents, a client of rsd: claims, "
        "tasks, progress and signals as MCP tools (stdio, or streamable HTTP).")
    _common(parser, None)
    parser.add_argument("--holder", default="mcp",
                        help="the holder name rsd records for this door's claims and "
                        "deliveries (default mcp)")
    parser.add_argument("--http", default=None, metavar="HOST:PORT",
                        help="serve MCP's streamable HTTP on http://HOST:PORT/mcp (a loopback "
                        "address: the door has no authentication of its own) instead of stdio")
    return parser


def _http_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    host = host.strip("[]")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise UsageError(f"--http {text}: the door serves a loopback address only "
                         "(it has no authentication of its own)")
    if not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--http {text}: expected HOST:PORT")
    return host, int(port)


def _uvicorn_server() -> type[Any]:
    import uvicorn

    class Uvicorn(uvicorn.Server):
        """uvicorn's server, stopped by SIGTERM or SIGINT as rsd is: shut down, then exit
        0 (uvicorn raises the signal again once it has shut down, and the door would die
        of it before closing its client of rsd)."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            self._captured_signals.clear()

    return Uvicorn


async def _serve_http(server: MCPServer, host: str, port: int) -> None:
    """Streamable HTTP on a socket bound here (port 0: any), its address on stderr."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    app = server.streamable_http_app(host=host)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    shown = f"[{host}]" if family == socket.AF_INET6 else host
    print(f"rsd mcp listening on http://{shown}:{bound}{HTTP_PATH}", file=sys.stderr,
          flush=True)
    await _uvicorn_server()(config).serve(sockets=[sock])


async def _run(args: argparse.Namespace) -> int:
    http = _http_address(args.http) if args.http is not None else None
    options: dict[str, Any] = {"tls": tls_context(args)}
    if args.connect_timeout is not None:
        options["connect_timeout"] = args.connect_timeout
    rs = AsyncRunstate(holder=args.holder, address=args.address, token=args.token, **options)
    try:
        server = build_server(Door(rs))
        if http is None:
            await server.run_stdio_async()
        else:
            await _serve_http(server, *http)
    finally:
        await rs.close()
    return 0


def main(argv: list[str]) -> int:
    """``rsd mcp [options]``: the exit status (2: a usage error)."""
    args = build_parser().parse_args(argv)
    if args.connect_timeout is None:
        args.connect_timeout = DEFAULT_CONNECT_TIMEOUT
    try:
        return asyncio.run(_run(args))
    except UsageError as exc:
        print(f"rsd mcp: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 0

