"""The rules every SDK must follow alike, declared once: both SDKs read them from here.

What a server does is the protocol; these are what a *client* does where two clients
doing it differently would be a bug that no server could notice: which requests are sent
again after their connection was lost (and which raise UnavailableError instead), when a
lease is renewed and when the client gives it up as lost, which error class a wire
error code becomes, and how long a request answered MOVED waits before it goes again.
(The limits are ``limits.Limits``, the other half of what both SDKs share.)

The Python SDK (``rsclient``) imports this module. The TypeScript SDK cannot import
Python, so ``python -m rsproto.sdkrules`` writes it a copy generated from these tables
(``sdk/typescript/src/sdkrules.ts``) and the cases both SDKs are tested on
(``sdk/typescript/test/sdkrules_cases.ts``); a test fails when either committed file is not
what this module generates (as TigerBeetle generates every client's constants from one
source and runs each client on the same cases). ``protocol.md`` states the tables under
"## Rules every SDK shares"; a test checks that they agree.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from .limits import Limits
from .slots import DEFAULT_SHARD, DEFAULT_SLOTS, MAX_PLACEMENT_BYTES, SLOT_VECTORS
from .vocabulary import ErrorCode, Op

__all__ = [
    "CONNECTION_RULES",
    "CONNECT_TIMEOUT_SECONDS",
    "DEFAULT_CLUSTER_LEASE_SECONDS",
    "ERROR_CLASSES",
    "FAILOVER_PAUSE_SECONDS",
    "FANNED_OUT",
    "LAGGING_NODE_PAUSE_SECONDS",
    "LEASE_RULES",
    "LOSS_MARGIN_FRACTION",
    "LOSS_MARGIN_MIN_SECONDS",
    "LOSS_MARGIN_MOST_DIVISOR",
    "MAX_REDIRECTS",
    "MAX_SENDS",
    "MAX_SLOWED_PAUSE_SECONDS",
    "MIN_ATTEMPT_SECONDS",
    "NODE_ANSWER_SECONDS",
    "PAGE_DEFAULT",
    "PAGE_MAX",
    "RECONNECT_BACKOFF_FIRST_SECONDS",
    "RECONNECT_BACKOFF_MOST_SECONDS",
    "RENEWAL_BATCH_DIVISOR",
    "RENEWAL_DIVISOR",
    "RENEWAL_RETRY_SECONDS",
    "RESEND",
    "ROUTE",
    "SILENCE_SECONDS",
    "STATS_SUMMED",
    "WAIT_GRACE_DIVISOR",
    "WAIT_GRACE_SECONDS",
    "WRITE_AT_FRAMES",
    "Resend",
    "Route",
    "RouteRule",
    "error_class",
    "loss_margin",
    "moved_pause",
    "route_key",
    "safe_to_repeat",
]


class Resend(StrEnum):
    """What becomes of a request whose connection was lost before its answer (its
    outcome unknown), for a client of a cluster. A lone rsd sends none of these again but
    the waits, renewals and settlements (which keep their own rules)."""

    READ = "read"  # sent again: a read changes nothing
    IDEMPOTENT = "idempotent"  # sent again: a second execution is the first's
    KEYED = "keyed"  # sent again if the field named is given (the key makes it one), else raise
    WAIT = "wait"  # waited again for the time left; without ``wait``: raise
    SETTLEMENT = "settlement"  # sent again with the same handle until the lease's deadline
    ONCE = "once"  # sent once, whatever happens (also when answered NOT_PRIMARY)
    RAISE = "raise"  # UnavailableError: a second execution could differ from one


@dataclass(frozen=True, slots=True)
class Rule:
    """One op's row: its class and, for ``KEYED``, the field that makes a repeat the same
    request (``items[].key``: the ``key`` of every item of ``items``)."""

    resend: Resend
    keyed_by: str | None = None


_R, _I, _W, _S, _O, _X = (Resend.READ, Resend.IDEMPOTENT, Resend.WAIT, Resend.SETTLEMENT,
                          Resend.ONCE, Resend.RAISE)

# Every op's row. Releases are sent once (a repeat of a recorded release would say
# STALE_CLAIM, a loss that was none); a lost grant without ``wait`` raises (sent again,
# it would meet the grant nobody knows and say CLAIM_HELD / POOL_FULL); a requeue or a
# take would happen twice; a delete of a recorded dead letter would say NOT_FOUND.
RESEND: Mapping[Op, Rule] = {
    Op.HELLO: Rule(_O),  # part of every connect
    Op.PING: Rule(_R),
    Op.CANCEL: Rule(_O),  # the withdrawal of a wait
    Op.SERVER_STATS: Rule(_R),
    Op.SLOT_MAP: Rule(_R),
    Op.SCOPE_CREATE: Rule(Resend.KEYED, "scope"),  # without an id: a second run
    Op.SCOPE_CANCEL: Rule(_I),  # the counts are the repeat's
    Op.SCOPE_STATUS: Rule(_R),
    Op.CLAIM_ACQUIRE: Rule(_W),
    Op.LEASE_RENEW: Rule(_I),  # the keeper's rounds: again every RENEWAL_RETRY_SECONDS
    Op.CLAIM_RELEASE: Rule(_O),
    Op.CLAIM_INSPECT: Rule(_R),
    Op.FENCE_CHECK: Rule(_R),
    Op.MAILBOX_ENSURE: Rule(_I),  # declarative; ``created`` is the repeat's
    Op.TASK_SUBMIT: Rule(Resend.KEYED, "key"),  # the same task; ``created`` may say False
    Op.MESSAGE_SEND: Rule(Resend.KEYED, "work_key"),  # ``replay`` may say True
    Op.RECEIVE: Rule(_W),  # a lost delivery comes back after its lease, attempt + 1
    Op.DELIVERY_COMPLETE: Rule(_S),
    Op.DELIVERY_RETRY: Rule(_S),
    Op.DELIVERY_RELEASE: Rule(_O),  # the delivery comes back after its lease
    Op.DELIVERY_REJECT: Rule(_S),
    Op.DEAD_LETTERS: Rule(_R),
    Op.QUEUE_INSPECT: Rule(_R),
    Op.MAILBOX_PAUSE: Rule(_I),  # declarative: paused or not
    Op.QUEUE_PAUSE: Rule(_I),
    Op.TASK_STATUS: Rule(_R),
    Op.TASK_RESULT: Rule(_W),
    Op.TASK_JOIN: Rule(_I),
    Op.TASK_DETACH: Rule(_I),
    Op.TASK_CANCEL: Rule(_I),
    Op.TASK_SUBMIT_MANY: Rule(Resend.KEYED, "items[].key"),
    Op.GROUP_WAIT: Rule(_W),
    Op.GROUP_STATUS: Rule(_R),
    Op.POOL_ENSURE: Rule(_I),
    Op.POOL_ACQUIRE: Rule(_W),
    Op.POOL_RELEASE: Rule(_O),
    Op.POOL_INSPECT: Rule(_R),
    Op.QUOTA_ENSURE: Rule(_I),
    Op.QUOTA_TAKE: Rule(_W),  # waiting, a lost take may be taken twice
    Op.QUOTA_INSPECT: Rule(_R),
    # Schedules are not sent again today (reads and ensure alike): a change would be a
    # change of behaviour, made in both SDKs at once by changing these rows.
    Op.SCHEDULE_ENSURE: Rule(_X),
    Op.SCHEDULE_LIST: Rule(_X),
    Op.SCHEDULE_GET: Rule(_X),
    Op.SCHEDULE_PAUSE: Rule(_X),
    Op.SCHEDULE_RESUME: Rule(_X),
    Op.SCHEDULE_DELETE: Rule(_X),
    # A progress event is sent again with its handle, as a settlement (a repeat whose
    # first was recorded publishes it twice: at least once, its seq tells); a
    # subscription is a read: sent again with ``after`` the last seq seen.
    Op.DELIVERY_PROGRESS: Rule(_S),
    Op.TASK_EVENTS: Rule(_R),
    Op.DELIVERY_SUSPEND: Rule(_S),  # a repeat is answered as the first (settled.py)
    # Raised: a signal applied twice could wake a later wait of the same name (the
    # second is kept), so one whose answer was lost is not sent again.
    Op.TASK_SIGNAL: Rule(_X),
    Op.TASK_CHILDREN: Rule(_R),
    Op.ADMIN_SCOPES: Rule(_R),
    Op.ADMIN_CLAIMS: Rule(_R),
    Op.ADMIN_TASKS: Rule(_R),
    Op.ADMIN_TASK: Rule(_R),
    Op.ADMIN_POOLS: Rule(_R),
    Op.DEAD_LETTER_REQUEUE: Rule(_X),
    Op.SNAPSHOT_NOW: Rule(_I),  # a second snapshot is harmless
    Op.ADMIN_DEAD_LETTERS: Rule(_R),
    Op.DEAD_LETTER_DELETE: Rule(_X),
    Op.ADMIN_GROUPS: Rule(_R),
    Op.REPL_ACK: Rule(_O),  # a standby's, never an SDK's
    Op.ADMIN_QUOTAS: Rule(_R),
    Op.ADMIN_MAILBOXES: Rule(_R),
    Op.ADMIN_QUEUES: Rule(_R),
    Op.SLOTS_MOVE: Rule(_I),  # a move whose slots are already the target's answers as done
    Op.SLOTS_IMPORT: Rule(_I),  # a part taken twice is refused (its runs are there)
    # A backup lives on its connection: after a lost one it is gone; rsctl starts again.
    Op.BACKUP_BEGIN: Rule(_X),
    Op.BACKUP_READ: Rule(_X),
    Op.BACKUP_END: Rule(_X),
}



class Route(StrEnum):
    """Where a client of a sharded cluster sends an op (protocol.md, "Slots"): each
    shard's primary owns some slots, and a request goes to the owner of its slot."""

    RUN = "run"  # the owner of the slot of the first field given (a run id, a placement)
    NAME = "name"  # the owner of the slot of the named pool or quota
    CONNECTION = "connection"  # the connection that holds the lease or the wait it names
    EVERY = "every"  # every shard's primary (a declaration every shard must know)
    ANY = "any"  # any connection (reads of the cluster, admin ops, a run not yet named)


@dataclass(frozen=True, slots=True)
class RouteRule:
    """One op's route and the fields whose slot decides it (the first given; none given:
    any connection)."""

    route: Route
    fields: tuple[str, ...] = ()


_RUN = RouteRule(Route.RUN, ("scope",))
_CONN = RouteRule(Route.CONNECTION)
_ANY = RouteRule(Route.ANY)

# Every op's route. Leases and waits stay on the connection (the shard) that granted them;
# pools and quotas live on the shard of their name's slot (a run uses the capacity of its
# own shard: a `{tag}` places both together); a mailbox declaration goes to every shard.
ROUTE: Mapping[Op, RouteRule] = {
    Op.HELLO: _ANY,
    Op.PING: _ANY,
    Op.CANCEL: _CONN,
    Op.SERVER_STATS: _ANY,
    Op.SLOT_MAP: _ANY,
    Op.SCOPE_CREATE: RouteRule(Route.RUN, ("scope", "placement")),
    Op.SCOPE_CANCEL: _RUN,
    Op.SCOPE_STATUS: _RUN,
    Op.CLAIM_ACQUIRE: _RUN,
    Op.LEASE_RENEW: _CONN,
    Op.CLAIM_RELEASE: _CONN,
    Op.CLAIM_INSPECT: _RUN,
    Op.FENCE_CHECK: _RUN,
    Op.MAILBOX_ENSURE: RouteRule(Route.EVERY),
    Op.TASK_SUBMIT: _RUN,
    Op.MESSAGE_SEND: _RUN,
    Op.RECEIVE: _RUN,
    Op.DELIVERY_COMPLETE: _CONN,
    Op.DELIVERY_RETRY: _CONN,
    Op.DELIVERY_RELEASE: _CONN,
    Op.DELIVERY_REJECT: _CONN,
    Op.DEAD_LETTERS: _RUN,
    Op.QUEUE_INSPECT: _RUN,
    Op.MAILBOX_PAUSE: RouteRule(Route.EVERY),
    Op.QUEUE_PAUSE: _RUN,
    Op.TASK_STATUS: _RUN,
    Op.TASK_RESULT: _RUN,
    Op.TASK_JOIN: _RUN,
    Op.TASK_DETACH: _RUN,
    Op.TASK_CANCEL: _RUN,
    Op.TASK_SUBMIT_MANY: _RUN,
    Op.GROUP_WAIT: _RUN,
    Op.GROUP_STATUS: _RUN,
    Op.POOL_ENSURE: RouteRule(Route.NAME, ("name",)),
    Op.POOL_ACQUIRE: RouteRule(Route.NAME, ("pool",)),
    Op.POOL_RELEASE: _CONN,
    Op.POOL_INSPECT: RouteRule(Route.NAME, ("name",)),
    Op.QUOTA_ENSURE: RouteRule(Route.NAME, ("name",)),
    Op.QUOTA_TAKE: RouteRule(Route.NAME, ("quota",)),
    Op.QUOTA_INSPECT: RouteRule(Route.NAME, ("name",)),
    Op.SCHEDULE_ENSURE: _RUN,
    Op.SCHEDULE_LIST: _RUN,
    Op.SCHEDULE_GET: _RUN,
    Op.SCHEDULE_PAUSE: _RUN,
    Op.SCHEDULE_RESUME: _RUN,
    Op.SCHEDULE_DELETE: _RUN,
    Op.DELIVERY_PROGRESS: _CONN,
    Op.TASK_EVENTS: _RUN,
    Op.DELIVERY_SUSPEND: _CONN,
    Op.TASK_SIGNAL: _RUN,
    Op.TASK_CHILDREN: _RUN,
    Op.ADMIN_SCOPES: _ANY,
    Op.ADMIN_CLAIMS: _RUN,
    Op.ADMIN_TASKS: _RUN,
    Op.ADMIN_TASK: _RUN,
    Op.ADMIN_POOLS: _ANY,
    Op.DEAD_LETTER_REQUEUE: _RUN,
    Op.SNAPSHOT_NOW: _ANY,
    Op.ADMIN_DEAD_LETTERS: _RUN,
    Op.DEAD_LETTER_DELETE: _RUN,
    Op.ADMIN_GROUPS: _RUN,
    Op.REPL_ACK: _CONN,
    Op.ADMIN_QUOTAS: _ANY,
    Op.ADMIN_MAILBOXES: _ANY,
    Op.ADMIN_QUEUES: _RUN,
    Op.SLOTS_MOVE: _ANY,
    Op.SLOTS_IMPORT: _ANY,
    Op.BACKUP_BEGIN: _ANY,  # (on the connection that began it: its own node's files)
    Op.BACKUP_READ: _CONN,
    Op.BACKUP_END: _CONN,
}


def route_key(op: int, args: Mapping[str, Any]) -> tuple[Route, str | None]:
    """Where ``op`` with ``args`` goes: its route and, for RUN and NAME, the key whose
    slot decides (None: any connection will do, e.g. SCOPE_CREATE of a fresh run)."""
    rule = ROUTE.get(op, _ANY)  # type: ignore[call-overload]  # an int that is no Op: any
    for name in rule.fields:
        value = args.get(name)
        if isinstance(value, str):
            return rule.route, value
    return (Route.ANY, None) if rule.fields else (rule.route, None)


MAX_SENDS = 3  # sends of one request at most, the first included (waits etc. keep their own)

# Leases. A lease is renewed 1/RENEWAL_DIVISOR of its length after its last confirmed
# grant or renewal; a renewal round takes along every lease due within
# 1/RENEWAL_BATCH_DIVISOR of its length; a renewal that got no answer is tried again
# every RENEWAL_RETRY_SECONDS until the lease's deadline. The client's deadline is the
# confirmed send time plus the lease, less ``loss_margin``: max(LOSS_MARGIN_MIN_SECONDS,
# LOSS_MARGIN_FRACTION of the lease), at most 1/LOSS_MARGIN_MOST_DIVISOR of it.
RENEWAL_DIVISOR = 3
RENEWAL_BATCH_DIVISOR = 6
RENEWAL_RETRY_SECONDS = 0.25
LOSS_MARGIN_MIN_SECONDS = 1.0
LOSS_MARGIN_FRACTION = 0.1
LOSS_MARGIN_MOST_DIVISOR = 2

# Connections (protocol.md, "Client behaviour"): a connect gives up after
# CONNECT_TIMEOUT_SECONDS (rsctl's default too), backing off from
# RECONNECT_BACKOFF_FIRST_SECONDS, doubling, to RECONNECT_BACKOFF_MOST_SECONDS, with
# jitter; a HELLO slowed down is tried again after its retry_after_ms, at most
# MAX_SLOWED_PAUSE_SECONDS. Of several nodes: at most MAX_REDIRECTS NOT_PRIMARY redirects
# in a row (and MOVED answers of a sharded cluster, each after ``moved_pause``: a node
# whose map is behind the client's is given LAGGING_NODE_PAUSE_SECONDS, doubled with
# each MOVED in a row, to catch up); each attempt at least MIN_ATTEMPT_SECONDS (more than
# the 0.5 s a slowed-down refusal waits) and at most NODE_ANSWER_SECONDS; a node that
# told no cluster lease is assumed DEFAULT_CLUSTER_LEASE_SECONDS; rounds pause at most
# FAILOVER_PAUSE_SECONDS while reconnecting to a cluster; a connection silent for
# SILENCE_SECONDS is probed with a PING, for twice that given up. A wait is given
# WAIT_GRACE_SECONDS plus 1/WAIT_GRACE_DIVISOR of its limit past it before the SDK's own
# timer ends it. Frames queued in one turn leave as soon as WRITE_AT_FRAMES are queued.
CONNECT_TIMEOUT_SECONDS = 2.0
RECONNECT_BACKOFF_FIRST_SECONDS = 0.05
RECONNECT_BACKOFF_MOST_SECONDS = 2.0
MAX_SLOWED_PAUSE_SECONDS = 30.0
MAX_REDIRECTS = 3
LAGGING_NODE_PAUSE_SECONDS = 0.1
MIN_ATTEMPT_SECONDS = 1.0
NODE_ANSWER_SECONDS = 2.0
DEFAULT_CLUSTER_LEASE_SECONDS = 5.0
FAILOVER_PAUSE_SECONDS = 1.0
SILENCE_SECONDS = 1.5
WAIT_GRACE_SECONDS = 0.25
WAIT_GRACE_DIVISOR = 20
WRITE_AT_FRAMES = 64

# The constants above as protocol.md's tables list them, in order (a test checks).
LEASE_RULES = ("MAX_SENDS", "RENEWAL_DIVISOR", "RENEWAL_BATCH_DIVISOR",
               "RENEWAL_RETRY_SECONDS", "LOSS_MARGIN_MIN_SECONDS", "LOSS_MARGIN_FRACTION",
               "LOSS_MARGIN_MOST_DIVISOR")
CONNECTION_RULES = ("CONNECT_TIMEOUT_SECONDS", "RECONNECT_BACKOFF_FIRST_SECONDS",
                    "RECONNECT_BACKOFF_MOST_SECONDS", "MAX_SLOWED_PAUSE_SECONDS",
                    "MAX_REDIRECTS", "LAGGING_NODE_PAUSE_SECONDS", "MIN_ATTEMPT_SECONDS",
                    "NODE_ANSWER_SECONDS", "DEFAULT_CLUSTER_LEASE_SECONDS",
                    "FAILOVER_PAUSE_SECONDS", "SILENCE_SECONDS", "WAIT_GRACE_SECONDS",
                    "WAIT_GRACE_DIVISOR", "WRITE_AT_FRAMES")

# One view of many shards (protocol.md's table of that name: the merged cursor too). A
# client whose map gives slots to more than one shard asks each listing of FANNED_OUT (op
# -> the reply's field that lists its objects; they name no run) of every shard that owns
# slots and merges the pages (rsproto/fanout.py, the TypeScript SDK's fanout.ts); a
# page's ``limit`` is PAGE_DEFAULT when none is given and at most PAGE_MAX (the server's
# own, rsd/policy.py's ADMIN_PAGE_DEFAULT and ADMIN_PAGE_MAX: a test checks they agree).
# The stats of several shards add up the SERVER_STATS counters of STATS_SUMMED (maps key
# by key); the others are each shard's own.
PAGE_DEFAULT = 100
PAGE_MAX = 1000
FANNED_OUT: Mapping[Op, str] = {
    Op.ADMIN_SCOPES: "scopes",
    Op.ADMIN_POOLS: "pools",
    Op.ADMIN_QUOTAS: "quotas",
    Op.ADMIN_MAILBOXES: "mailboxes",
}
STATS_SUMMED = ("connections", "connections_refused", "ops_total", "ops", "errors",
                "leases_held", "tasks", "messages", "core", "output_pauses")

# The class each wire error code becomes in every SDK (of the same name in each). A code
# an SDK does not know becomes RunstateError carrying it. CANCELLED answers a wait the
# client withdrew: its caller has already been told (Python: asyncio's own cancellation).
ERROR_CLASSES: Mapping[str, str] = {  # by ErrorCode
    ErrorCode.INVALID_ARGUMENT: "InvalidArgumentError",
    ErrorCode.NOT_FOUND: "NotFoundError",
    ErrorCode.CLAIM_HELD: "ConflictError",
    ErrorCode.IDEMPOTENCY_CONFLICT: "ConflictError",
    ErrorCode.STALE_CLAIM: "LeaseLostError",
    ErrorCode.WAIT_TIMEOUT: "WaitTimeoutError",
    ErrorCode.CANCELLED: "CancelledError",
    ErrorCode.SCOPE_CANCELLED: "ScopeCancelledError",
    ErrorCode.UNAUTHENTICATED: "AuthenticationError",
    ErrorCode.PERMISSION_DENIED: "PermissionDeniedError",
    ErrorCode.RESOURCE_EXHAUSTED: "RunstateError",
    ErrorCode.POOL_FULL: "ConflictError",
    ErrorCode.QUOTA_EXHAUSTED: "ConflictError",
    ErrorCode.UNAVAILABLE: "UnavailableError",
    ErrorCode.NOT_PRIMARY: "UnavailableError",
    ErrorCode.MOVED: "UnavailableError",  # followed by the SDK; raised only past MAX_REDIRECTS
    ErrorCode.UNKNOWN_OP: "RunstateError",
    ErrorCode.UNSUPPORTED_VERSION: "RunstateError",
    ErrorCode.PROTOCOL_ERROR: "RunstateError",
    ErrorCode.FRAME_TOO_LARGE: "RunstateError",
    ErrorCode.INTERNAL: "RunstateError",
}


def _given(args: Mapping[str, Any], field: str) -> bool:
    """Whether ``args`` give ``field`` (``items[].key``: every item of ``items`` its key)."""
    if "[]." in field:
        items, key = field.split("[].")
        return all(item.get(key) is not None for item in args.get(items) or ())
    return args.get(field) is not None


def safe_to_repeat(op: int, args: Mapping[str, Any]) -> bool:
    """Whether executing ``op`` with ``args`` twice cannot differ from once, so that a
    client of a cluster sends it again after a lost connection (``RESEND``)."""
    rule = RESEND.get(op)  # type: ignore[call-overload]  # an int that is no Op: none
    if rule is None:
        return False
    if rule.keyed_by is not None:
        return _given(args, rule.keyed_by)
    return rule.resend in (Resend.READ, Resend.IDEMPOTENT)


def loss_margin(lease_seconds: float) -> float:
    """How long before the server could end a lease the SDK gives it up: max(1 s, 10 %)
    (never more than half the lease). It absorbs clock-rate drift between the two hosts
    and the time between reading the clock and acting on the answer."""
    margin = LOSS_MARGIN_FRACTION * lease_seconds  # (min and max spelled out: once per grant)
    if margin < LOSS_MARGIN_MIN_SECONDS:
        margin = LOSS_MARGIN_MIN_SECONDS
    most = lease_seconds / LOSS_MARGIN_MOST_DIVISOR
    return most if margin > most else margin


def moved_pause(known_epoch: int | None, told_epoch: object, moved: int) -> float | None:
    """What a client does before a request answered MOVED goes again (``moved``: the
    MOVED answers in a row, this one included, at most MAX_REDIRECTS), by the epoch of
    the map it holds (``known_epoch``; None: none yet) and of the map the answer was made
    with (the details' ``map_epoch``): None, it asks for the map again (on the node that
    answered) first, the answer's map being newer than its own (or not told); else the
    seconds it waits first. 0 when its map is the answer's: it goes at once to the owner
    that map names. LAGGING_NODE_PAUSE_SECONDS, doubled with each MOVED in a row (0.1,
    0.2, 0.4 s), when its map is the newer: the node that answered lags behind the map
    (a slot move's source lets its held requests go to the target once it has the new
    map, while the target adopts it only when its etcd watch says so). Sent straight
    back, the request is answered MOVED again and uses up its MAX_REDIRECTS at once;
    asking that node for its map would only give the older one."""
    if known_epoch is None or type(told_epoch) is not int or told_epoch > known_epoch:
        return None
    if told_epoch == known_epoch:
        return 0.0
    return LAGGING_NODE_PAUSE_SECONDS * (1 << (moved - 1))


def error_class(code: str) -> str:
    """The name of the class an SDK raises for ``code`` (RunstateError for an unknown one)."""
    return ERROR_CLASSES.get(code, "RunstateError")


# -- the TypeScript SDK's copy, generated ------------------------------------------------

TYPESCRIPT_MODULE = Path("sdk/typescript/src/sdkrules.ts")
TYPESCRIPT_CASES = Path("sdk/typescript/test/sdkrules_cases.ts")
_HEADER = ("// Generated by `python -m rsproto.sdkrules` from rsproto/sdkrules.py: do not edit.\n"
           "// tests/test_both_sdks_follow_the_one_table_of_shared_rules.py checks it.\n")


def _ts(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _rows(rows: list[Any]) -> str:
    """``rows`` as a TypeScript array literal, one row a line."""
    return "[\n" + "".join(f"  {json.dumps(row, ensure_ascii=False)},\n" for row in rows) + "]"


def _connection_constants() -> list[str]:
    """``CONNECTION_RULES`` for TypeScript: a duration in whole milliseconds (``_MS``)."""
    lines = []
    for name in CONNECTION_RULES:
        value = globals()[name]
        if name.endswith("_SECONDS"):
            name, value = name.removesuffix("_SECONDS") + "_MS", round(value * 1000)
        lines.append(f"export const {name} = {value};")
    return lines


def _routes() -> list[str]:
    """``ROUTE`` and the slot constants, for TypeScript."""
    route = "".join(
        f"  {int(op)}: ['{rule.route.value}', {json.dumps(list(rule.fields))}], // {op.name}\n"
        for op, rule in sorted(ROUTE.items()))
    return [
        "/** Where a client of a sharded cluster sends an op (protocol.md, \"Slots\"). */",
        "export type Route = " + " | ".join(f"'{r.value}'" for r in Route) + ";",
        "",
        "/** Each op's route and the fields whose slot decides it (the first given). */",
        f"export const ROUTE: Readonly<Record<number, [Route, string[]]>> = {{\n{route}}};",
        "",
        "/** The slots of a cluster unless it was made with others; the default shard. */",
        f"export const DEFAULT_SLOTS = {DEFAULT_SLOTS};",
        f"export const DEFAULT_SHARD = '{DEFAULT_SHARD}';",
        f"export const MAX_PLACEMENT_BYTES = {MAX_PLACEMENT_BYTES};",
        "",
    ]


def typescript_module() -> str:
    """``sdk/typescript/src/sdkrules.ts``: the tables and constants above, and the limits."""
    resend = "".join(f"  {int(op)}: '{rule.resend.value}', // {op.name}\n"
                     for op, rule in sorted(RESEND.items()))
    keyed = {str(int(op)): rule.keyed_by for op, rule in sorted(RESEND.items())
             if rule.keyed_by is not None}
    limits = {name.upper(): value for name, value in Limits.as_dict().items()}
    parts = [
        _HEADER,
        "/** What becomes of a request whose connection was lost (rsproto/sdkrules.py). */",
        "export type Resend = " + " | ".join(f"'{r.value}'" for r in Resend) + ";",
        "",
        "/** Each op's class (the op codes of `Op`, wire.ts). */",
        f"export const RESEND: Readonly<Record<number, Resend>> = {{\n{resend}}};",
        "",
        "/** For a `keyed` op, the field that makes a repeat the same request (`items[].key`:",
        " * the key of every item). */",
        f"export const KEYED_BY: Readonly<Record<number, string>> = {_ts(keyed)};",
        "",
        *_routes(),
        "/** Sends of one request at most, the first included. */",
        f"export const MAX_SENDS = {MAX_SENDS};",
        "",
        "/** A lease is renewed 1/RENEWAL_DIVISOR of its length after its last confirmed",
        " * renewal; a round takes along every lease due within 1/RENEWAL_BATCH_DIVISOR of it;",
        " * an unanswered renewal is tried again every RENEWAL_RETRY_SECONDS. */",
        f"export const RENEWAL_DIVISOR = {RENEWAL_DIVISOR};",
        f"export const RENEWAL_BATCH_DIVISOR = {RENEWAL_BATCH_DIVISOR};",
        f"export const RENEWAL_RETRY_SECONDS = {RENEWAL_RETRY_SECONDS};",
        "",
        "/** The loss margin: max(LOSS_MARGIN_MIN_SECONDS, LOSS_MARGIN_FRACTION of the lease),",
        " * at most 1/LOSS_MARGIN_MOST_DIVISOR of it. */",
        f"export const LOSS_MARGIN_MIN_SECONDS = {LOSS_MARGIN_MIN_SECONDS};",
        f"export const LOSS_MARGIN_FRACTION = {LOSS_MARGIN_FRACTION};",
        f"export const LOSS_MARGIN_MOST_DIVISOR = {LOSS_MARGIN_MOST_DIVISOR};",
        "",
        "/** Connections (rsproto/sdkrules.py: what each is for), durations in milliseconds. */",
        *_connection_constants(),
        "",
        "/** The class each wire error code becomes; an unknown code, RunstateError. */",
        "export const ERROR_CLASSES: Readonly<Record<string, string>> = "
        f"{_ts({str(code): name for code, name in ERROR_CLASSES.items()})};",
        "",
        "/** The defaults of protocol.md's \"Limits\" table; the HELLO reply's values take",
        " * precedence. */",
        f"export const LIMITS = {_ts(limits)} as const;",
        "",
        "/** One view of many shards: the listings asked of every shard and merged (op → the",
        " * reply's field of objects), a page's default and largest `limit`, and the",
        " * SERVER_STATS counters summed over the shards. */",
        "export const FANNED_OUT: Readonly<Record<number, string>> = "
        f"{_ts({str(int(op)): field for op, field in FANNED_OUT.items()})};",
        f"export const PAGE_DEFAULT = {PAGE_DEFAULT};",
        f"export const PAGE_MAX = {PAGE_MAX};",
        f"export const STATS_SUMMED = {_ts(list(STATS_SUMMED))} as const;",
        "",
    ]
    return "\n".join(parts)


_LEASES = (5, 7.5, 10, 20, 30, 59.5, 600)  # lease lengths in seconds, for the cases
# [the client's map epoch (None: no map), the MOVED answer's ``map_epoch``], for the cases
_MAP_EPOCHS = ((None, 4), (5, 6), (5, None), (5, "5"), (5, 5), (5, 4), (5, 1))


def cases() -> dict[str, list[Any]]:
    """The cases every SDK is run on, with the answers this module gives."""
    args: list[tuple[int, dict[str, Any]]] = []
    for op, rule in sorted(RESEND.items()):
        args.append((int(op), {}))
        if rule.keyed_by == "items[].key":
            args += [(int(op), {"items": [{"key": "a"}, {"key": "b"}]}),
                     (int(op), {"items": [{"key": "a"}, {"data": 1}]}),
                     (int(op), {"items": [{"key": "a"}, {"key": None}]})]
        elif rule.keyed_by is not None:
            args += [(int(op), {rule.keyed_by: "k"}), (int(op), {rule.keyed_by: None})]
    return {
        "sent_again": [[op, given, safe_to_repeat(op, given)] for op, given in args]
        + [[999, {}, safe_to_repeat(999, {})]],
        "loss_margin": [[s, loss_margin(s)] for s in _LEASES],
        "renewal": [[s, 100.0, 100.0 + s / RENEWAL_DIVISOR, 100.0 + s - loss_margin(s)]
                    for s in _LEASES],
        "error_class": [[str(code), name] for code, name in ERROR_CLASSES.items()]
        + [["NO_SUCH_CODE", error_class("NO_SUCH_CODE")]],
        "op_codes": [[op.name, int(op)] for op in Op],
        "route": [[op, given, *route_key(op, given)] for op, given in _route_args()],
        "slot_of": [list(vector) for vector in SLOT_VECTORS],
        "moved_pause": [[known, told, moved, moved_pause(known, told, moved)]
                        for known, told in _MAP_EPOCHS
                        for moved in range(1, MAX_REDIRECTS + 1)],
    }


def _route_args() -> list[tuple[int, dict[str, Any]]]:
    """Each op without args, and with each of its route's fields given alone."""
    args: list[tuple[int, dict[str, Any]]] = []
    for op, rule in sorted(ROUTE.items()):
        args.append((int(op), {}))
        args += [(int(op), {name: f"{name}-1"}) for name in rule.fields]
    args += [(int(Op.SCOPE_CREATE), {"scope": "{a}b", "placement": "c"})]
    return args


def typescript_cases() -> str:
    """``sdk/typescript/test/sdkrules_cases.ts``: ``cases()`` for the TypeScript tests."""
    table = cases()
    return "\n".join([
        _HEADER,
        "/** [op, args, sent again after a lost connection by a client of a cluster] */",
        "export const SENT_AGAIN: Array<[number, Record<string, unknown>, boolean]> = "
        f"{_rows(table['sent_again'])};",
        "",
        "/** [lease seconds, loss margin in seconds] */",
        f"export const LOSS_MARGIN: Array<[number, number]> = {_rows(table['loss_margin'])};",
        "",
        "/** [lease seconds, confirmed at (sent at), renewed at, lost at] */",
        "export const RENEWAL: Array<[number, number, number, number]> = "
        f"{_rows(table['renewal'])};",
        "",
        "/** [wire error code, class name] */",
        f"export const ERROR_CLASS: Array<[string, string]> = {_rows(table['error_class'])};",
        "",
        "/** [op name, op code]: an SDK may lack an op, never number one otherwise */",
        f"export const OP_CODES: Array<[string, number]> = {_rows(table['op_codes'])};",
        "",
        "/** [op, args, route, the key whose slot decides (null: any connection)] */",
        "export const ROUTES: Array<[number, Record<string, unknown>, string, string | null]> = "
        f"{_rows(table['route'])};",
        "",
        "/** [key, slots, slot]: protocol.md's test vectors of the slot hash */",
        f"export const SLOT_OF: Array<[string, number, number]> = {_rows(table['slot_of'])};",
        "",
        "/** [the client's map epoch (null: no map), the MOVED answer's map_epoch, MOVED",
        " * answers in a row, seconds waited before it goes again (null: the map asked first)] */",
        "export const MOVED_PAUSE: Array<[number | null, unknown, number, number | null]> = "
        f"{_rows(table['moved_pause'])};",
        "",
    ])


def main(argv: list[str]) -> int:
    """Write the TypeScript SDK's generated files under the checkout ``argv[0]`` (or .)."""
    root = Path(argv[0]) if argv else Path()
    for path, text in ((TYPESCRIPT_MODULE, typescript_module()),
                       (TYPESCRIPT_CASES, typescript_cases())):
        (root / path).write_text(text, encoding="utf-8")
        print(f"wrote {root / path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
