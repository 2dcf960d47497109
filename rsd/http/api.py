"""The dashboard's JSON API under ``/api/`` (the page uses it; scripts may too): the
admin listings ``rsctl`` uses, answered by the core's own handlers.

What always holds:
- who asks is decided once per request, as a HELLO would decide it (auth.py): with a
  tokens file, ``Authorization: Bearer <token>`` names the tenant and role (401
  without a valid one; no cookie is ever read or set, so no other site can act with a
  browser's rights; a wrong token's 401 waits as a HELLO's refusal would, but is written
  before the connection's deadline); without one, loopback peers addressing a loopback
  name only (``loopback_refusal``), as tenant ``default`` with admin rights;
- every core call goes through ``Core.handle`` on an internal connection id registered
  with that tenant and role (``core.connected``) for the call only: the core's rules
  (admin-only ops, a tenant sees only its own objects) apply unchanged, in one place. A
  listing here never names another ``tenant``: a token reads its own tenant's objects.
  The server's figures (the overview, the chart) go by SERVER_STATS' rule, the session's
  own (``session.server_stats``). So a client-role token may do here exactly what it may
  do over the protocol (the manual's client table, docs/http.md), and no rule is written twice;
- an action (POST) answers once its records are as durable as a protocol reply to it
  would be (``Output.when_replied``: the same group commit); a GET writes nothing; an
  action's body is a JSON object nesting at most ``Limits.MAX_PAYLOAD_DEPTH`` levels,
  checked before it is parsed (400 otherwise);
- every answer is one page: at most ``MAX_ROWS`` rows and ``MAX_ANSWER_BYTES`` of JSON;
  a listing over the bytes is asked again with half the limit (each ask a bounded page),
  and a task's data over it, or a schedule's over ``PREVIEW_BYTES``, is cut to a
  preview; a listing's ``cursor``, ``limit`` and ``newest_first`` are checked here
  (400) and passed on, so its cost is the core's page (pages.py), never a walk or a
  sort: the overview's newest runs are one page of ADMIN_SCOPES walked newest first;
- the chart's rows (``/api/history``) come from the shell's ring (history.py) under
  SERVER_STATS' rule, only those after the number the page last got;
- on a standby (no core serving), 503 with the cluster as this node sees it;
- of a sharded cluster (this node's slot map names more than one shard), the listings
  that name no run, the overview and a run's routes cover every shard: shardviews.py
  says how; a server alone, or a cluster of one shard, is answered here from its own
  core at once, as before (a route's coroutine over this node's core never suspends:
  ``_at_once``).

Routes (GET unless said): ``overview`` (SERVER_STATS, the ten newest runs, the first 100
mailboxes), ``history?after=``, ``runs``, ``runs/RUN`` (SCOPE_STATUS, a page of claims
and of tasks), ``runs/RUN/groups``, ``runs/RUN/mailboxes``, ``runs/RUN/mailboxes/NAME``,
``runs/RUN/mailboxes/NAME/dead-letters``, ``runs/RUN/tasks/TASK``,
``runs/RUN/schedules``, ``mailboxes``, ``pools``, ``pools/NAME``, ``quotas``; POST
``runs/RUN/cancel``, ``runs/RUN/mailboxes/NAME/requeue``,
``runs/RUN/mailboxes/NAME/pause`` (``{"paused": false}`` resumes: QUEUE_PAUSE, in that
run alone), ``runs/RUN/mailboxes/NAME/dead-letters/ID/delete``,
``runs/RUN/tasks/TASK/signal`` (``{"name", "data"}``: TASK_SIGNAL, in the token's own
tenant).
"""

from __future__ import annotations

import asyncio
import json
import math
import ssl
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from urllib.parse import unquote

from rsproto import ErrorCode, Ext, Limits, Op
from rsproto.fanout import CursorError, read_cursor

from ..core import DEFERRED, CoreError
from ..security.auth import DEFAULT_IDENTITY, Refusal, is_loopback
from ..wire.session import server_stats
from .httpserver import Request, Response, host_name

if TYPE_CHECKING:
    from rsproto.slots import SlotMap

    from ..core import Core
    from ..security.auth import Authenticator
    from ..security.tokens import Identity
    from ..slotowner import SlotOwner
    from ..wire.output import Output
    from .history import History

__all__ = ["MAX_ANSWER_BYTES", "MAX_ROWS", "Api", "ApiHost", "Asking", "Here", "Reader",
           "Refused", "loopback_refusal", "many_shards", "own_mailboxes", "page"]

MAX_ROWS = 1000
MAX_ANSWER_BYTES = 1 << 20
DEFAULT_ROWS = 100
PREVIEW_BYTES = 4096
RECENT_RUNS = 10  # the overview's newest runs
# A wrong token's 401 waits as a HELLO's refusal would (ratelimit.py, up to 5 s), but goes
# out this long before the connection's deadline at the latest: held past it, the
# listener would cut the connection off and the client would see no 401 at all.
REFUSAL_MARGIN_SECONDS = 0.25
OVERVIEW_MAILBOXES = 100  # the overview's first page of mailboxes (a link goes on)

_STATUS = {
    ErrorCode.NOT_FOUND: 404, ErrorCode.PERMISSION_DENIED: 403,
    ErrorCode.UNAUTHENTICATED: 401, ErrorCode.INVALID_ARGUMENT: 400,
    ErrorCode.SCOPE_CANCELLED: 409, ErrorCode.RESOURCE_EXHAUSTED: 429,
    ErrorCode.NOT_PRIMARY: 503, ErrorCode.UNAVAILABLE: 503,
    ErrorCode.MOVED: 503,  # a run moved between shards meanwhile: the next poll finds it
}
_T = TypeVar("_T")


class _Reach(Protocol):
    @property
    def tls(self) -> ssl.SSLContext | None: ...  # how this node reaches another primary


class ApiHost(Protocol):
    """What the API uses of the server (server.py's ``Server`` is one): no more."""

    core: Core
    output: Output
    slots: SlotOwner

    @property
    def moves(self) -> _Reach: ...

    def stats(self) -> dict[str, Any]: ...

    def internal_conn_id(self) -> int: ...


class Refused(Exception):
    def __init__(self, status: int, code: str, message: str, delay: float = 0.0) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.delay = delay  # a wrong token's answer waits, as a HELLO's (ratelimit.py),
        # within the request's deadline


class Reader(Protocol):
    """One shard's answers to the API's ops, as the requester: this node's core
    (``Here``), or another shard's primary (shardviews.py). CoreError if refused."""

    async def read(self, op: int, args: dict[str, Any]) -> Any: ...


class Asking(Protocol):
    """Where one request's ops go: ``One`` (this node's core alone) or the shards of a
    sharded cluster (shardviews.py's ``Sharded``). ``sharded``: rows and runs name their
    shard; ``at(key)``: the shard owning the slot of a run or pool named ``key``."""

    who: Identity
    sharded: bool

    def at(self, key: str) -> Reader: ...
    def shard_of(self, key: str) -> str | None: ...
    async def listing(self, op: int, field: str, args: dict[str, Any]) -> Any: ...
    async def overview(self) -> Any: ...
    def close(self) -> None: ...


async def page(reader: Reader, op: int, args: dict[str, Any]) -> Any:
    """A listing that fits ``MAX_ANSWER_BYTES``: asked again with half the limit until it
    does (at most log2(MAX_ROWS) asks)."""
    while True:
        result = await reader.read(op, args)
        if len(encode(result)) <= MAX_ANSWER_BYTES // 2 or args.get("limit", 1) <= 1:
            return result
        args = {**args, "limit": args["limit"] // 2}


def _at_once(work: Coroutine[Any, Any, _T]) -> _T:
    """The result of ``work``, a route over this node's core alone: its reads never
    suspend (``Here``), so it ends at its first step; answered at once, as an HTTP
    request to a server alone always was (no task, no turn of the loop)."""
    try:
        work.send(None)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    work.close()
    raise RuntimeError("a route over this node's core alone waited")


def many_shards(slot_map: SlotMap) -> bool:
    """Whether ``slot_map`` names more than one shard (a shard known without a slot yet
    counts: the overview shows it). O(shards)."""
    names = set(slot_map.primaries)
    names.update(shard for _, _, shard in slot_map.ranges)
    return len(names) > 1


def own_mailboxes(stats: dict[str, Any], tenant: str) -> dict[str, Any]:
    """SERVER_STATS ``stats`` naming only ``tenant``'s mailboxes (the server's figures,
    but only this tenant's mailboxes by name)."""
    depths = stats.get("queue_depths")
    if isinstance(depths, dict):
        depths["mailboxes"] = [box for box in depths.get("mailboxes", ())
                               if isinstance(box, dict) and box.get("tenant") == tenant]
    return stats


def loopback_refusal(auth: Authenticator, request: Request) -> str | None:
    """Why ``request`` is not answered by a listener without a tokens file (None: it is,
    or there is a tokens file): it must come from a loopback peer, addressed to a
    loopback name (``Host``: localhost, a name under .localhost or a loopback address,
    parsed strictly: httpserver.host_name). A page of another site whose name was made
    to resolve to 127.0.0.1 (DNS rebinding) sends its own name as Host: no token stops
    it, this does. The dashboard applies it to every path, /metrics included."""
    if auth.table is not None:
        return None
    if not is_loopback(request.peer_host):
        return "without a tokens file the HTTP listener serves loopback only"
    name = host_name(request.headers.get("host", ""))
    if name is None or not (name == "localhost" or name.endswith(".localhost")
                            or is_loopback(name)):
        return ("without a tokens file the HTTP listener answers requests addressed to a "
                "loopback name only (Host: localhost or a loopback address)")
    return None


def _nests_deeper(text: bytes, most: int) -> bool:
    """Whether JSON ``text`` opens more than ``most`` arrays and objects inside each other
    (brackets within strings do not count). Read before the parser, which recurses once
    per level: a body of a few thousand ``[`` would raise RecursionError in it. One pass,
    O(len(text)), and the body is at most MAX_BODY_BYTES."""
    depth = 0
    in_string = escaped = False
    for byte in text:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > most:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def _settle(future: asyncio.Future[Response], response: Response) -> None:
    if not future.done():
        future.set_result(response)


def plain(value: Any) -> Any:
    """``value`` (what the core answers: msgpack's types) as JSON can carry it: bytes as
    ``{"hex": ...}``, non-finite floats as null, keys as strings."""
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return {"hex": bytes(value).hex()}
    if isinstance(value, Ext):  # an extension value in a payload: [type, data]
        return [value.code, {"hex": value.data.hex()}]  # (as msgpack's ExtType was)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def encode(value: Any) -> bytes:
    return json.dumps(plain(value), separators=(",", ":"), allow_nan=False).encode()


def _preview(value: Any, most: int) -> Any:
    """``value``, or, if its JSON is over ``most`` bytes, its first ``PREVIEW_BYTES``
    as ``{"preview": text, "cut": true}`` (an answer stays within its bound)."""
    text = encode(value)
    if len(text) <= most:
        return value
    return {"preview": text[:PREVIEW_BYTES].decode("utf-8", "replace"), "cut": True}


def _json(status: int, value: Any) -> Response:
    return Response(status, encode(value), "application/json")


def _error(status: int, code: str, message: str, *headers: tuple[str, str]) -> Response:
    return Response(status, encode({"error": code, "message": message}), "application/json",
                    headers)


def _limit(request: Request, name: str = "limit", high: int = MAX_ROWS) -> int:
    raw = request.query.get(name, str(DEFAULT_ROWS))
    if not raw.isdigit() or not 1 <= int(raw) <= high:
        raise Refused(400, "INVALID_ARGUMENT", f"{name} must be from 1 to {high}")
    return int(raw)


def _cursor(request: Request, name: str = "cursor") -> int:
    raw = request.query.get(name, "0")
    if not raw.isdigit() or len(raw) > 19:
        raise Refused(400, "INVALID_ARGUMENT", f"{name} must be a cursor the API gave")
    return int(raw)


def _paging(request: Request, merged: bool = False) -> dict[str, Any]:
    """A listing's paging arguments from the query: ``cursor``, ``limit`` and
    ``newest_first`` (``1`` or ``true``: from the newest down). ``merged``: a listing of
    every shard, whose cursor is 0 or the string a page of it gave (rsproto/fanout.py)."""
    if merged:
        raw = request.query.get("cursor", "0")
        try:
            read_cursor(0 if raw == "0" else raw)
        except CursorError:
            raise Refused(400, "INVALID_ARGUMENT", "cursor must be a cursor the API gave "
                          "(a sharded cluster's listing: 0 or a page's next)") from None
        cursor: int | str = 0 if raw == "0" else raw
    else:
        cursor = _cursor(request)
    args: dict[str, Any] = {"cursor": cursor, "limit": _limit(request)}
    newest = request.query.get("newest_first", "").lower()
    if newest not in ("", "0", "1", "true", "false"):
        raise Refused(400, "INVALID_ARGUMENT", "newest_first must be 1 or 0")
    if newest in ("1", "true"):
        args["newest_first"] = True
    return args


class Here:
    """This node's core, asked as ``who`` (``Api.read``): a read never suspends."""

    def __init__(self, api: Api, who: Identity) -> None:
        self.api, self.who = api, who

    async def read(self, op: int, args: dict[str, Any]) -> Any:
        return self.api.read(self.who, op, args)


class One:
    """A request to a server alone, or a node of a cluster of one shard: every op to
    this node's core, as before shards."""

    sharded = False

    def __init__(self, api: Api, who: Identity) -> None:
        self.who = who
        self.api = api
        self.here = Here(api, who)

    def at(self, key: str) -> Reader:
        return self.here

    def shard_of(self, key: str) -> str | None:
        return None

    async def listing(self, op: int, field: str, args: dict[str, Any]) -> Any:
        return await page(self.here, op, args)

    async def overview(self) -> Any:
        return self.api.overview(self.who)

    def close(self) -> None:
        pass


# Makes the Asking of a sharded cluster's request (shardviews.py's ``Sharded``): the API,
# the requester, its bearer token (None without a tokens file), the server, the request.
Fanout = Callable[["Api", "Identity", "str | None", ApiHost, Request], Asking]


class Api:
    """Answers ``/api/...``; ``server()``: the server whose core answers (None on a
    standby), ``cluster()``: the cluster status (None alone); ``fanout``: how a sharded
    cluster's request is asked (shardviews.py; None: this node's core alone, always)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        auth: Authenticator,
        server: Callable[[], ApiHost | None],
        cluster: Callable[[], dict[str, Any] | None] = lambda: None,
        history: History | None = None,
        fanout: Fanout | None = None,
    ) -> None:
        self.loop = loop
        self.auth = auth
        self.server = server
        self.cluster = cluster
        self.history = history  # the last minutes, one row a second (history.py)
        self.fanout = fanout

    # ---- who asks ----------------------------------------------------------------------

    def identity(self, request: Request) -> Identity:
        if self.auth.table is None:
            refusal = loopback_refusal(self.auth, request)
            if refusal is not None:
                raise Refused(403, "PERMISSION_DENIED", refusal)
            return DEFAULT_IDENTITY
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Refused(401, "UNAUTHENTICATED", "send Authorization: Bearer <admin token>")
        admission = self.auth.authenticate(
            token.strip(), None, request.peer_host, request.peer_host, self.loop.time())
        if isinstance(admission, Refusal):
            raise Refused(401, "UNAUTHENTICATED", admission.message, admission.delay)
        return admission.identity

    def asking(self, who: Identity, request: Request) -> Asking:
        """Where this request's ops go: every shard's primary if this node's map names
        more than one shard (and a fan-out is given), else this node's core alone."""
        server = self.server()
        if server is None or self.fanout is None or not many_shards(server.slots.map):
            return One(self, who)
        token = None
        if self.auth.table is not None:
            token = request.headers.get("authorization", "").partition(" ")[2].strip()
        return self.fanout(self, who, token, server, request)

    def call(self, who: Identity, op: int, args: dict[str, Any]) -> tuple[Any, bool]:
        """``op`` with ``args`` as ``who`` (CoreError if refused); and whether it wrote
        records (so its answer waits for them: ``when_replied``)."""
        server = self.server()
        if server is None:
            raise Refused(503, "NOT_PRIMARY", "this node is not serving (a standby)")
        core = server.core
        now = self.loop.time()
        core.tick(now)  # as a batch does: no request sees a lapsed lease
        conn = server.internal_conn_id()
        before = len(core.effects.records)
        core.connected(conn, "dashboard", tenant=who.tenant, admin=who.admin)
        try:
            result = core.handle(now, conn, 1, op, args)
        finally:
            core.disconnected(conn, now)
        assert result is not DEFERRED, f"op {op} cannot wait on an HTTP request"
        wrote = len(core.effects.records) > before or core.effects.sync
        server.output.schedule_flush()
        return result, bool(wrote)

    def read(self, who: Identity, op: int, args: dict[str, Any]) -> Any:
        return self.call(who, op, args)[0]

    # ---- routes ------------------------------------------------------------------------

    def handle(self, request: Request) -> Response | asyncio.Future[Response]:
        parts = [unquote(part) for part in request.path.split("/")[2:]]
        try:
            who = self.identity(request)
            if request.method not in ("GET", "HEAD", "POST"):
                raise Refused(405, "INVALID_ARGUMENT", "GET, or POST for an action")
            asking = self.asking(who, request)
            if isinstance(asking, One):
                try:
                    if request.method == "POST":
                        return self.act(asking, parts, request)
                    return _answer(_at_once(self.look(asking, parts, request)))
                finally:
                    asking.close()
            work = (self._act_there(asking, parts, request) if request.method == "POST"
                    else self.look(asking, parts, request))
            return self.loop.create_task(self._later(asking, work))
        except Refused as exc:
            return self._refused(exc, request)
        except CoreError as exc:
            return _error(_STATUS.get(exc.code, 409), exc.code.name, exc.message)

    async def _later(self, asking: Asking, work: Coroutine[Any, Any, Any]) -> Response:
        """The answer of a request to a sharded cluster, once its shards answered (each
        within its time-out: shardviews.py)."""
        try:
            found = await work
            return found if isinstance(found, Response) else _answer(found)
        except Refused as exc:
            return _error(exc.status, exc.code, exc.message)
        except CoreError as exc:
            return _error(_STATUS.get(exc.code, 409), exc.code.name, exc.message)
        finally:
            asking.close()

    def _refused(self, exc: Refused, request: Request) -> Response | asyncio.Future[Response]:
        extra = (("WWW-Authenticate", "Bearer"),) if exc.status == 401 else ()
        refused = _error(exc.status, exc.code, exc.message, *extra)
        if exc.delay <= 0:
            return refused
        # it waits, but is written before the listener's deadline would cut it off
        due = min(self.loop.time() + exc.delay, request.deadline - REFUSAL_MARGIN_SECONDS)
        later: asyncio.Future[Response] = self.loop.create_future()
        self.loop.call_at(due, _settle, later, refused)
        return later

    async def look(self, asking: Asking, parts: list[str], request: Request) -> Any:
        """The answer to GET ``parts``: each run's ops to its shard, each listing that
        names no run over every shard (``asking``)."""
        merged = asking.sharded
        match parts:
            case ["overview"]:
                return await asking.overview()
            case ["history"]:
                self.stats(asking.who)  # the same rule: the server's figures, admin only
                if self.history is None:
                    raise Refused(404, "NOT_FOUND", "this listener keeps no history")
                return self.history.since(_cursor(request, "after"))
            case ["runs"]:
                return await asking.listing(Op.ADMIN_SCOPES, "scopes",
                                            _paging(request, merged))
            case ["mailboxes"]:
                return await asking.listing(Op.ADMIN_MAILBOXES, "mailboxes",
                                            _paging(request, merged))
            case ["quotas"]:
                return await asking.listing(Op.ADMIN_QUOTAS, "quotas", _paging(request, merged))
            case ["pools"]:
                return await asking.listing(Op.ADMIN_POOLS, "pools", _paging(request, merged))
            case ["pools", name]:
                return await asking.at(name).read(
                    Op.POOL_INSPECT, {"name": name, "limit": _limit(request)})
            case ["runs", run, *rest]:
                return await self._look_run(asking, run, rest, request)
        raise Refused(404, "NOT_FOUND", f"no route {request.path}")

    async def _look_run(self, asking: Asking, run: str, rest: list[str],
                        request: Request) -> Any:
        """The routes under ``runs/RUN``: asked of the run's shard."""
        there = asking.at(run)
        match rest:
            case []:
                return await self._run(asking, run, request)
            case ["groups"]:
                return await page(there, Op.ADMIN_GROUPS, {"scope": run, **_paging(request)})
            case ["mailboxes"]:
                return await page(there, Op.ADMIN_QUEUES, {"scope": run, **_paging(request)})
            case ["mailboxes", name]:
                return {"mailbox": name, "run": run,
                        "counts": await there.read(Op.QUEUE_INSPECT,
                                                   {"scope": run, "mailbox": name})}
            case ["mailboxes", name, "dead-letters"]:
                return await page(there, Op.ADMIN_DEAD_LETTERS, {
                    "scope": run, "mailbox": name, "limit": _limit(request)})
            case ["tasks", task]:
                found = await there.read(Op.ADMIN_TASK, {"scope": run, "task": task})
                for field in ("data", "outcome"):
                    found[field] = _preview(found.get(field), PREVIEW_BYTES * 64)
                events = found.get("events") or []  # at most 64, each cut to 4 KiB
                found["events"] = [
                    {**event, "data": _preview(event.get("data"), PREVIEW_BYTES)}
                    if event.get("kind") == "progress" else event for event in events
                ]
                return found
            case ["schedules"]:
                # one page of SCHEDULE_LIST (its data's bytes bounded by the core), each
                # one's data cut to 4 KiB
                listed = await there.read(Op.SCHEDULE_LIST, {"scope": run, **_paging(request)})
                for schedule in listed["schedules"]:
                    schedule["data"] = _preview(schedule.get("data"), PREVIEW_BYTES)
                return listed
        raise Refused(404, "NOT_FOUND", f"no route {request.path}")

    def overview(self, who: Identity) -> dict[str, Any]:
        """/overview of this node alone: who is asking, the server's figures (admin only),
        the cluster, the newest runs and the first mailboxes."""
        stats = self.stats(who)
        here = Here(self, who)
        return {
            "tenant": who.tenant, "role": who.role, "stats": stats,
            "cluster": self.cluster(),
            "recent_runs": self.read(who, Op.ADMIN_SCOPES, {
                "limit": RECENT_RUNS, "newest_first": True})["scopes"],
            "mailboxes": _at_once(page(here, Op.ADMIN_MAILBOXES, {
                "limit": OVERVIEW_MAILBOXES})),
        }

    async def _run(self, asking: Asking, run: str, request: Request) -> dict[str, Any]:
        """/runs/<run>: its status, and a page each of its claims and its tasks (of one
        state if the query names one), each at most half of MAX_ROWS; of a sharded
        cluster, the shard it lives on."""
        half = MAX_ROWS // 2
        args: dict[str, Any] = {"scope": run}
        state = request.query.get("state")
        tasks_args: dict[str, Any] = {
            **args, "cursor": _cursor(request, "tasks_cursor"),
            "limit": _limit(request, "tasks_limit", half)}
        if state:
            tasks_args["state"] = state
        claims_args = {**args, "cursor": _cursor(request, "claims_cursor"),
                       "limit": _limit(request, "claims_limit", half)}
        there = asking.at(run)
        found = {
            "run": await there.read(Op.SCOPE_STATUS, args),
            "claims": await page(there, Op.ADMIN_CLAIMS, claims_args),
            "tasks": await page(there, Op.ADMIN_TASKS, tasks_args),
        }
        if asking.sharded:
            found["shard"] = asking.shard_of(run)
        return found

    def stats(self, who: Identity) -> Any:
        """SERVER_STATS, under the session's rule (session.server_stats: admin only)."""
        server = self.server()
        if server is None:
            raise Refused(503, "NOT_PRIMARY", "this node is not serving (a standby)")
        return own_mailboxes(server_stats(server, who.admin), who.tenant)

    # ---- actions -----------------------------------------------------------------------

    def action(self, parts: list[str], request: Request) -> tuple[str, int, dict[str, Any]]:
        """The action POSTed to ``parts``: its run, op and args (Refused if the request
        is no action this API takes)."""
        # Another site's page can send a form POST without asking (a "simple" request,
        # no token needed on loopback): an action needs a JSON body, which a browser
        # sends cross-site only after a preflight this server never grants, and an
        # Origin, when one is sent, that is this listener's own.
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise Refused(415, "INVALID_ARGUMENT",
                          "an action's body is JSON (Content-Type: application/json)")
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            raise Refused(403, "PERMISSION_DENIED", "an action from another origin")
        if _nests_deeper(request.body, Limits.MAX_PAYLOAD_DEPTH):
            raise Refused(400, "INVALID_ARGUMENT", "the body nests arrays and objects more "
                          f"than {Limits.MAX_PAYLOAD_DEPTH} levels deep")
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            raise Refused(400, "INVALID_ARGUMENT", "the body must be JSON") from None
        if type(body) is not dict:
            raise Refused(400, "INVALID_ARGUMENT", "the body must be a JSON object")
        match parts:
            case ["runs", run, "cancel"]:
                reason = body.get("reason", "cancelled from the dashboard")
                return run, Op.SCOPE_CANCEL, {"scope": run, "reason": reason}
            case ["runs", run, "mailboxes", name, "requeue"]:
                args: dict[str, Any] = {"scope": run, "mailbox": name}
                if body.get("all") is True:
                    args.update({"all": True, "limit": MAX_ROWS})
                elif isinstance(body.get("id"), str):
                    args["id"] = body["id"]
                else:
                    raise Refused(400, "INVALID_ARGUMENT",
                                  'name one dead letter ({"id": ...}) or {"all": true}')
                return run, Op.DEAD_LETTER_REQUEUE, args
            case ["runs", run, "tasks", task, "signal"]:
                return run, Op.TASK_SIGNAL, {"scope": run, "task": task,
                                             "name": body.get("name"), "data": body.get("data")}
            case ["runs", run, "mailboxes", name, "pause"]:
                paused = body.get("paused", True)
                if type(paused) is not bool:
                    raise Refused(400, "INVALID_ARGUMENT", "paused must be true or false")
                return run, Op.QUEUE_PAUSE, {"scope": run, "mailbox": name, "paused": paused}
            case ["runs", run, "mailboxes", name, "dead-letters", dead_id, "delete"]:
                return run, Op.DEAD_LETTER_DELETE, {"scope": run, "mailbox": name,
                                                    "id": dead_id}
        raise Refused(404, "NOT_FOUND", f"no action {request.path}")

    def act(self, asking: Asking, parts: list[str], request: Request
            ) -> Response | asyncio.Future[Response]:
        """An action on this node's core: answered once its records are as durable as a
        protocol reply to it would be."""
        _, op, args = self.action(parts, request)
        result, wrote = self.call(asking.who, op, args)
        server = self.server()
        if not wrote or server is None:
            return _json(200, result)
        answer: asyncio.Future[Response] = self.loop.create_future()

        def replied(ok: bool) -> None:
            if answer.done():
                return
            answer.set_result(_json(200, result) if ok else _error(
                503, "UNAVAILABLE", "no standby acknowledged the change in time: its "
                "outcome is unknown"))

        server.output.when_replied(replied)
        return answer

    async def _act_there(self, asking: Asking, parts: list[str], request: Request
                         ) -> Response:
        """An action of a sharded cluster: on the run's shard (another primary answers
        once the change is as durable as its protocol reply is)."""
        run, op, args = self.action(parts, request)
        there = asking.at(run)
        if isinstance(there, Here):
            found = self.act(asking, parts, request)
            return found if isinstance(found, Response) else await found
        return _json(200, await there.read(op, args))


def _answer(found: Any) -> Response:
    body = encode(found)
    if len(body) > MAX_ANSWER_BYTES:  # a bug: every route keeps to the bound
        raise Refused(500, "INTERNAL", "the answer is over 1 MiB")
    return Response(200, body, "application/json")
