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
  do over the protocol (the README's client table), and no rule is written twice;
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
- on a standby (no core serving), 503 with the cluster as this node sees it.

Routes (GET unless said): ``overview`` (SERVER_STATS, the ten newest runs, the first 100
mailboxes), ``history?after=``, ``runs``, ``runs/RUN`` (SCOPE_STATUS, a page of claims
and of tasks), ``runs/RUN/groups``, ``runs/RUN/mailboxes``, ``runs/RUN/mailboxes/NAME``,
``runs/RUN/mailboxes/NAME/dead-letters``, ``runs/RUN/tasks/TASK``,
``runs/RUN/schedules``, ``mailboxes``, ``pools``, ``pools/NAME``, ``quotas``; POST
``runs/RUN/cancel``, ``runs/RUN/mailboxes/NAME/requeue``,
``runs/RUN/mailboxes/NAME/dead-letters/ID/delete``.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote

from rsproto import ErrorCode, Ext, Limits, Op

from ..core import DEFERRED, CoreError
from ..security.auth import DEFAULT_IDENTITY, Refusal, is_loopback
from ..wire.session import server_stats
from .httpserver import Request, Response, host_name

if TYPE_CHECKING:
    from ..core import Core
    from ..security.auth import Authenticator
    from ..security.tokens import Identity
    from ..wire.output import Output
    from .history import History

__all__ = ["MAX_ANSWER_BYTES", "MAX_ROWS", "Api", "ApiHost", "loopback_refusal"]

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
}


class ApiHost(Protocol):
    """What the API uses of the server (server.py's ``Server`` is one): no more."""

    core: Core
    output: Output

    def stats(self) -> dict[str, Any]: ...

    def internal_conn_id(self) -> int: ...


class _Refused(Exception):
    def __init__(self, status: int, code: str, message: str, delay: float = 0.0) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.delay = delay  # a wrong token's answer waits, as a HELLO's (ratelimit.py),
        # within the request's deadline


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
        raise _Refused(400, "INVALID_ARGUMENT", f"{name} must be from 1 to {high}")
    return int(raw)


def _cursor(request: Request, name: str = "cursor") -> int:
    raw = request.query.get(name, "0")
    if not raw.isdigit() or len(raw) > 19:
        raise _Refused(400, "INVALID_ARGUMENT", f"{name} must be a cursor the API gave")
    return int(raw)


def _paging(request: Request) -> dict[str, Any]:
    """A listing's paging arguments from the query: ``cursor``, ``limit`` and
    ``newest_first`` (``1`` or ``true``: from the newest down)."""
    args: dict[str, Any] = {"cursor": _cursor(request), "limit": _limit(request)}
    newest = request.query.get("newest_first", "").lower()
    if newest not in ("", "0", "1", "true", "false"):
        raise _Refused(400, "INVALID_ARGUMENT", "newest_first must be 1 or 0")
    if newest in ("1", "true"):
        args["newest_first"] = True
    return args


class Api:
    """Answers ``/api/...``; ``server()``: the server whose core answers (None on a
    standby), ``cluster()``: the cluster status (None alone)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        auth: Authenticator,
        server: Callable[[], ApiHost | None],
        cluster: Callable[[], dict[str, Any] | None] = lambda: None,
        history: History | None = None,
    ) -> None:
        self.loop = loop
        self.auth = auth
        self.server = server
        self.cluster = cluster
        self.history = history  # the last minutes, one row a second (history.py)

    # ---- who asks ----------------------------------------------------------------------

    def identity(self, request: Request) -> Identity:
        if self.auth.table is None:
            refusal = loopback_refusal(self.auth, request)
            if refusal is not None:
                raise _Refused(403, "PERMISSION_DENIED", refusal)
            return DEFAULT_IDENTITY
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise _Refused(401, "UNAUTHENTICATED", "send Authorization: Bearer <admin token>")
        admission = self.auth.authenticate(
            token.strip(), None, request.peer_host, request.peer_host, self.loop.time())
        if isinstance(admission, Refusal):
            raise _Refused(401, "UNAUTHENTICATED", admission.message, admission.delay)
        return admission.identity

    def call(self, who: Identity, op: int, args: dict[str, Any]) -> tuple[Any, bool]:
        """``op`` with ``args`` as ``who`` (CoreError if refused); and whether it wrote
        records (so its answer waits for them: ``when_replied``)."""
        server = self.server()
        if server is None:
            raise _Refused(503, "NOT_PRIMARY", "this node is not serving (a standby)")
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

    def page(self, who: Identity, op: int, args: dict[str, Any]) -> Any:
        """A listing that fits ``MAX_ANSWER_BYTES``: asked again with half the limit
        until it does (at most log2(MAX_ROWS) asks)."""
        while True:
            result = self.read(who, op, args)
            if len(encode(result)) <= MAX_ANSWER_BYTES // 2 or args.get("limit", 1) <= 1:
                return result
            args = {**args, "limit": args["limit"] // 2}

    # ---- routes ------------------------------------------------------------------------

    def handle(self, request: Request) -> Response | asyncio.Future[Response]:
        parts = [unquote(part) for part in request.path.split("/")[2:]]
        try:
            who = self.identity(request)
            if request.method == "POST":
                return self.act(who, parts, request)
            if request.method not in ("GET", "HEAD"):
                raise _Refused(405, "INVALID_ARGUMENT", "GET, or POST for an action")
            answer = self.look(who, parts, request)
            body = encode(answer)
            if len(body) > MAX_ANSWER_BYTES:  # a bug: every route keeps to the bound
                raise _Refused(500, "INTERNAL", "the answer is over 1 MiB")
            return Response(200, body, "application/json")
        except _Refused as exc:
            extra = (("WWW-Authenticate", "Bearer"),) if exc.status == 401 else ()
            refused = _error(exc.status, exc.code, exc.message, *extra)
            if exc.delay <= 0:
                return refused
            # it waits, but is written before the listener's deadline would cut it off
            due = min(self.loop.time() + exc.delay, request.deadline - REFUSAL_MARGIN_SECONDS)
            later: asyncio.Future[Response] = self.loop.create_future()
            self.loop.call_at(due, _settle, later, refused)
            return later
        except CoreError as exc:
            return _error(_STATUS.get(exc.code, 409), exc.code.name, exc.message)

    def look(self, who: Identity, parts: list[str], request: Request) -> Any:
        match parts:
            case ["overview"]:
                return self._overview(who)
            case ["history"]:
                self.stats(who)  # the same rule: the server's figures, admin only
                if self.history is None:
                    raise _Refused(404, "NOT_FOUND", "this listener keeps no history")
                return self.history.since(_cursor(request, "after"))
            case ["runs"]:
                return self.page(who, Op.ADMIN_SCOPES, _paging(request))
            case ["mailboxes"]:
                return self.page(who, Op.ADMIN_MAILBOXES, _paging(request))
            case ["quotas"]:
                return self.page(who, Op.ADMIN_QUOTAS, _paging(request))
            case ["pools", name]:
                return self.read(who, Op.POOL_INSPECT, {"name": name, "limit": _limit(request)})
            case ["runs", run, "groups"]:
                return self.page(who, Op.ADMIN_GROUPS, {"scope": run, **_paging(request)})
            case ["runs", run, "mailboxes"]:
                return self.page(who, Op.ADMIN_QUEUES, {"scope": run, **_paging(request)})
            case ["runs", run]:
                return self._run(who, run, request)
            case ["runs", run, "mailboxes", name]:
                return {"mailbox": name, "run": run,
                        "counts": self.read(who, Op.QUEUE_INSPECT,
                                            {"scope": run, "mailbox": name})}
            case ["runs", run, "mailboxes", name, "dead-letters"]:
                return self.page(who, Op.ADMIN_DEAD_LETTERS, {
                    "scope": run, "mailbox": name, "limit": _limit(request)})
            case ["runs", run, "tasks", task]:
                found = self.read(who, Op.ADMIN_TASK, {"scope": run, "task": task})
                for field in ("data", "outcome"):
                    found[field] = _preview(found.get(field), PREVIEW_BYTES * 64)
                return found
            case ["runs", run, "schedules"]:
                # one page of SCHEDULE_LIST (its data's bytes bounded by the core), each
                # one's data cut to 4 KiB
                listed = self.read(who, Op.SCHEDULE_LIST, {"scope": run, **_paging(request)})
                for schedule in listed["schedules"]:
                    schedule["data"] = _preview(schedule.get("data"), PREVIEW_BYTES)
                return listed
            case ["pools"]:
                return self.page(who, Op.ADMIN_POOLS, _paging(request))
        raise _Refused(404, "NOT_FOUND", f"no route {request.path}")

    def _overview(self, who: Identity) -> dict[str, Any]:
        """/overview: who is asking, the server's figures (admin only), the cluster, the
        newest runs and the first mailboxes."""
        stats = self.stats(who)
        return {
            "tenant": who.tenant, "role": who.role, "stats": stats,
            "cluster": self.cluster(),
            "recent_runs": self.read(who, Op.ADMIN_SCOPES, {
                "limit": RECENT_RUNS, "newest_first": True})["scopes"],
            "mailboxes": self.page(who, Op.ADMIN_MAILBOXES, {
                "limit": OVERVIEW_MAILBOXES}),
        }

    def _run(self, who: Identity, run: str, request: Request) -> dict[str, Any]:
        """/runs/<run>: its status, and a page each of its claims and its tasks (of one
        state if the query names one), each at most half of MAX_ROWS."""
        half = MAX_ROWS // 2
        args: dict[str, Any] = {"scope": run}
        state = request.query.get("state")
        tasks_args: dict[str, Any] = {
            **args, "cursor": _cursor(request, "tasks_cursor"),
            "limit": _limit(request, "tasks_limit", half)}
        if state:
            tasks_args["state"] = state
        return {
            "run": self.read(who, Op.SCOPE_STATUS, args),
            "claims": self.page(who, Op.ADMIN_CLAIMS, {
                **args, "cursor": _cursor(request, "claims_cursor"),
                "limit": _limit(request, "claims_limit", half)}),
            "tasks": self.page(who, Op.ADMIN_TASKS, tasks_args),
        }

    def stats(self, who: Identity) -> Any:
        """SERVER_STATS, under the session's rule (session.server_stats: admin only)."""
        server = self.server()
        if server is None:
            raise _Refused(503, "NOT_PRIMARY", "this node is not serving (a standby)")
        stats = server_stats(server, who.admin)
        # the server's figures, but only this tenant's mailboxes by name
        depths = stats.get("queue_depths")
        if isinstance(depths, dict):
            depths["mailboxes"] = [box for box in depths.get("mailboxes", ())
                                   if box.get("tenant") == who.tenant]
        return stats

    def act(self, who: Identity, parts: list[str], request: Request
            ) -> Response | asyncio.Future[Response]:
        # Another site's page can send a form POST without asking (a "simple" request,
        # no token needed on loopback): an action needs a JSON body, which a browser
        # sends cross-site only after a preflight this server never grants, and an
        # Origin, when one is sent, that is this listener's own.
        kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind != "application/json":
            raise _Refused(415, "INVALID_ARGUMENT",
                           "an action's body is JSON (Content-Type: application/json)")
        origin = request.headers.get("origin")
        host = request.headers.get("host", "")
        if origin is not None and origin not in (f"http://{host}", f"https://{host}"):
            raise _Refused(403, "PERMISSION_DENIED", "an action from another origin")
        if _nests_deeper(request.body, Limits.MAX_PAYLOAD_DEPTH):
            raise _Refused(400, "INVALID_ARGUMENT", "the body nests arrays and objects more "
                           f"than {Limits.MAX_PAYLOAD_DEPTH} levels deep")
        try:
            body = json.loads(request.body or b"{}")
        except ValueError:
            raise _Refused(400, "INVALID_ARGUMENT", "the body must be JSON") from None
        if type(body) is not dict:
            raise _Refused(400, "INVALID_ARGUMENT", "the body must be a JSON object")
        match parts:
            case ["runs", run, "cancel"]:
                reason = body.get("reason", "cancelled from the dashboard")
                result, wrote = self.call(who, Op.SCOPE_CANCEL, {"scope": run, "reason": reason})
            case ["runs", run, "mailboxes", name, "requeue"]:
                args: dict[str, Any] = {"scope": run, "mailbox": name}
                if body.get("all") is True:
                    args.update({"all": True, "limit": MAX_ROWS})
                elif isinstance(body.get("id"), str):
                    args["id"] = body["id"]
                else:
                    raise _Refused(400, "INVALID_ARGUMENT",
                                   'name one dead letter ({"id": ...}) or {"all": true}')
                result, wrote = self.call(who, Op.DEAD_LETTER_REQUEUE, args)
            case ["runs", run, "mailboxes", name, "dead-letters", dead_id, "delete"]:
                result, wrote = self.call(who, Op.DEAD_LETTER_DELETE, {
                    "scope": run, "mailbox": name, "id": dead_id})
            case _:
                raise _Refused(404, "NOT_FOUND", f"no action {request.path}")
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
