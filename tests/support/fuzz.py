"""Hostile input for the fuzz tests and ``bench.fuzz``: values, requests and frames.

Everything here is drawn from a ``random.Random``, so one seed gives one input, in a test
and in a long bench run alike; the hypothesis tests draw the seed (and their own
structure) and shrink from there. Nothing here asserts: the callers say what must hold.

- ``junk``: any value msgpack carries, chosen for where code breaks: boundary integers,
  NaN and infinities, empty, long and odd strings, bytes, ext types and timestamps,
  maps with keys of every type, nesting past the payload depth limit;
- ``request``: an op (every code, and codes no server has) with args that are mostly
  right, then wrong field by field: of every wrong type and size, missing, extra, or
  taken from what the server answered before (``Known``: real scopes, leases, tasks);
- ``hello``: HELLO args, ``token`` included, of every type;
- ``mutated``: a valid frame with bytes flipped, truncated or spliced, its length forged,
  or its body a container declaring more items than any frame holds;
- ``hostile_body``: a well-framed body of the wrong shape.

``Tally`` counts what a run fed and how each input ended; the suite prints the totals
(conftest.py) and ``bench.fuzz`` prints its own.
"""

from __future__ import annotations

import os
import random
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import HealthCheck, settings

from rsproto import MAX_FRAME_BYTES, PROTOCOL_VERSION, Kind, Op

__all__ = [
    "BAD_OPS",
    "FIELDS",
    "OPS",
    "TALLY",
    "Known",
    "Tally",
    "documented_codes",
    "frame",
    "fuzz_settings",
    "hello",
    "hostile_body",
    "junk",
    "mutated",
    "request",
]

# ---- settings: one fixed seed in CI, a longer random run on demand -----------------------

# ``RSD_FUZZ_PROFILE=long`` runs every fuzz test with 50 times the examples and fresh seeds.
settings.register_profile(
    "fuzz-ci",
    deadline=None,
    derandomize=True,  # the same inputs on every run: a CI failure reproduces locally
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)
settings.register_profile(
    "fuzz-long", settings.get_profile("fuzz-ci"), derandomize=False
)
_PROFILE = os.environ.get("RSD_FUZZ_PROFILE", "ci")
SCALE = 50 if _PROFILE == "long" else 1


def fuzz_settings(max_examples: int, **extra: Any) -> settings:
    """Settings for one fuzz test: ``max_examples`` in CI, ``SCALE`` times that when long."""
    return settings(
        settings.get_profile(f"fuzz-{_PROFILE}"), max_examples=max_examples * SCALE, **extra
    )


# ---- what a run fed, and how it ended -------------------------------------------------------


@dataclass
class Tally:
    """Inputs fed, connections opened, how inputs were refused, and what escaped."""

    inputs: int = 0
    answered: int = 0
    connections: int = 0
    unhandled: int = 0
    refusals: Counter[str] = field(default_factory=Counter)

    def add(self, other: Tally) -> None:
        self.inputs += other.inputs
        self.answered += other.answered
        self.connections += other.connections
        self.unhandled += other.unhandled
        self.refusals.update(other.refusals)

    def lines(self) -> list[str]:
        codes = ", ".join(f"{code} {n}" for code, n in sorted(self.refusals.items()))
        return [
            f"inputs: {self.inputs}",
            f"answered: {self.answered}",
            f"connections: {self.connections}",
            f"unhandled exceptions: {self.unhandled}",
            f"refused by code: {codes or 'none'}",
        ]


TALLY = Tally()  # the suite's totals, printed at the end of a pytest run


# ---- the documented error codes ----------------------------------------------------------

_DOC = Path(__file__).resolve().parent.parent.parent / "protocol.md"
_ROW = re.compile(r"^\| ([A-Z_]+) \| ([a-z, ]+) \|")


def documented_codes(scope: str) -> frozenset[str]:
    """The error codes protocol.md's table lists with ``scope`` (request, connection)."""
    codes = set()
    for line in _DOC.read_text().splitlines():
        match = _ROW.match(line)
        if match and scope in {part.strip() for part in match.group(2).split(",")}:
            codes.add(match.group(1))
    assert codes, f"protocol.md lists no {scope} error codes"
    return frozenset(codes)


# ---- values ---------------------------------------------------------------------------------

INTS = [0, 1, -1, 2, 5, 29, 30, 600, 601, 1000, 3_600_000, 3_600_001, 2**31 - 1, 2**31,
        2**32, 2**53 + 1, 2**63 - 1, -(2**63), 2**64 - 1, 10_000, 10_001]
FLOATS = [0.0, -0.0, 0.5, 4.999, 5.0, 30.0, 600.0, 600.0001, 1e-300, 5e-324, 1e308,
          -1e308, float("inf"), float("-inf"), float("nan"), 2.0**63, 1.7e9, 1e18]
TEXTS = ["", "s1", "k1", "jobs", "x" * 129, "x" * 257, "x" * 513, "x" * 1025,
         "é" * 65, "\x00", " ", "WORK", "BROADCAST", "work", "../etc", "\u2028", "😀" * 40,
         "default", "admin"]
_TS = msgpack.Timestamp


def junk(rng: random.Random, depth: int = 0) -> Any:
    """Any value msgpack can carry, weighted towards the ones that break validation."""
    kind = rng.randrange(14 if depth < 4 else 10)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice(INTS)
    if kind == 3:
        return rng.randint(-(2**63), 2**64 - 1)
    if kind == 4:
        return rng.choice(FLOATS)
    if kind == 5:
        return rng.choice(TEXTS)
    if kind == 6:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0xA0, 0xD7FF)]))
                       for _ in range(rng.randrange(12)))
    if kind == 7:
        return rng.randbytes(rng.choice([0, 1, 8, 15, 16, 17, 32]))
    if kind == 8:
        return msgpack.ExtType(rng.randrange(128), rng.randbytes(rng.randrange(9)))
    if kind == 9:
        return _TS(rng.randrange(2**34), rng.randrange(10**9))
    if kind == 10:
        return [junk(rng, depth + 1) for _ in range(rng.randrange(5))]
    if kind == 11:
        return {_key(rng): junk(rng, depth + 1) for _ in range(rng.randrange(5))}
    if kind == 12:
        return nested(rng.randrange(90, 130), rng.random() < 0.5)
    return rng.choice([[None] * rng.randrange(100, 3000), "y" * rng.randrange(1000, 300_000)])


def nested(depth: int, maps: bool) -> Any:
    """A value nested ``depth`` deep (lists, or maps of one key)."""
    value: Any = 1
    for _ in range(depth):
        value = {"n": value} if maps else [value]
    return value


def _key(rng: random.Random) -> Any:
    """A map key: mostly strings, else any hashable msgpack value."""
    return rng.choice([
        rng.choice(TEXTS), rng.choice(list(FIELD_NAMES)), rng.choice(INTS), None, True,
        rng.choice(FLOATS[:6]), rng.randbytes(4), msgpack.ExtType(1, b"k"), _TS(1, 0),
    ])


# ---- requests ---------------------------------------------------------------------------------

OPS: list[int] = [int(op) for op in Op]
BAD_OPS: list[int] = [0, 5, 9, 12, 19, 25, 29, 45, 99, 255, 65_535, -1, 2**31, 2**63 - 1,
                      -(2**63), 2**64 - 1]
FIELDS: dict[int, tuple[str, ...]] = {
    Op.HELLO: ("version", "holder", "token"),
    Op.PING: (),
    Op.CANCEL: ("request",),
    Op.SERVER_STATS: (),
    Op.SCOPE_CREATE: ("scope",),
    Op.SCOPE_CANCEL: ("scope", "reason"),
    Op.CLAIM_ACQUIRE: ("scope", "key", "lease_seconds", "wait", "timeout_ms"),
    Op.LEASE_RENEW: ("leases",),
    Op.CLAIM_RELEASE: ("lease",),
    Op.CLAIM_INSPECT: ("scope", "key"),
    Op.FENCE_CHECK: ("scope", "key", "token"),
    Op.MAILBOX_ENSURE: ("name", "mode", "max_attempts", "retry_backoff_ms"),
    Op.MAILBOX_PAUSE: ("name", "paused"),
    Op.QUEUE_PAUSE: ("scope", "mailbox", "paused"),
    Op.TASK_SUBMIT: ("scope", "mailbox", "key", "subscriber_id", "deadline", "data", "trace",
                     "concurrency_key", "concurrency_limit", "rate_key", "rate_limit",
                     "rate_period_seconds"),
    Op.MESSAGE_SEND: ("scope", "mailbox", "work_key", "data", "debounce_key",
                      "debounce_seconds", "trace"),
    Op.RECEIVE: ("scope", "mailbox", "lease_seconds", "wait", "timeout_ms"),
    Op.DELIVERY_COMPLETE: ("lease", "outcome"),
    Op.DELIVERY_RETRY: ("lease", "reason", "delay_ms"),
    Op.DELIVERY_RELEASE: ("lease",),
    Op.DELIVERY_REJECT: ("lease", "reason"),
    Op.DEAD_LETTERS: ("scope", "mailbox", "limit"),
    Op.QUEUE_INSPECT: ("scope", "mailbox"),
    Op.TASK_STATUS: ("scope", "task"),
    Op.TASK_RESULT: ("scope", "task", "timeout_ms", "outcome_only"),
    Op.TASK_JOIN: ("scope", "task", "subscriber_id", "subscriber_scope"),
    Op.TASK_DETACH: ("scope", "task", "subscriber_id"),
    Op.TASK_CANCEL: ("scope", "task", "reason"),
    Op.DELIVERY_PROGRESS: ("lease", "data"),
    Op.TASK_EVENTS: ("scope", "task", "after", "stop"),
    Op.DELIVERY_SUSPEND: ("lease", "name", "timeout_seconds"),
    Op.TASK_SIGNAL: ("scope", "task", "name", "data"),
    Op.ADMIN_SCOPES: ("tenant", "cursor", "limit", "newest_first"),
    Op.ADMIN_CLAIMS: ("scope", "tenant", "cursor", "limit"),
    Op.ADMIN_TASKS: ("scope", "state", "mailbox", "tenant", "cursor", "limit"),
    Op.ADMIN_TASK: ("scope", "task", "tenant"),
    Op.ADMIN_POOLS: ("tenant", "cursor", "limit"),
    Op.DEAD_LETTER_REQUEUE: ("scope", "mailbox", "id", "all", "limit", "tenant"),
    Op.SNAPSHOT_NOW: (),
    Op.ADMIN_DEAD_LETTERS: ("scope", "mailbox", "tenant", "limit"),
    Op.DEAD_LETTER_DELETE: ("scope", "mailbox", "id", "tenant"),
    Op.ADMIN_GROUPS: ("scope", "tenant", "cursor", "limit", "newest_first"),
    Op.ADMIN_QUOTAS: ("tenant", "cursor", "limit", "newest_first"),
    Op.ADMIN_MAILBOXES: ("tenant", "cursor", "limit", "newest_first"),
    Op.ADMIN_QUEUES: ("scope", "tenant", "cursor", "limit", "newest_first"),
    Op.BACKUP_BEGIN: (),
    Op.BACKUP_READ: ("file", "offset", "length"),
    Op.BACKUP_END: (),
}
# How often each op is drawn: rarer for ops that end others' work (a cancelled scope
# refuses everything in it for good) and for the few the server answers itself.
OP_WEIGHTS: list[int] = [
    {Op.SCOPE_CANCEL: 1, Op.TASK_CANCEL: 2, Op.HELLO: 1, Op.PING: 1, Op.SERVER_STATS: 1,
     Op.SCOPE_CREATE: 2, Op.SNAPSHOT_NOW: 1}.get(Op(op), 4) for op in OPS
]
FIELD_NAMES = frozenset(name for names in FIELDS.values() for name in names)
WAITING_OPS = frozenset({int(Op.CLAIM_ACQUIRE), int(Op.RECEIVE), int(Op.TASK_RESULT)})


@dataclass
class Known:
    """What the server told so far, so that requests can name real objects: a fuzzer
    that only guesses names never gets past NOT_FOUND into the rules behind it."""

    scopes: list[str] = field(default_factory=lambda: ["s1", "s2"])
    keys: list[str] = field(default_factory=lambda: ["k1", "k2", "k3"])
    mailboxes: list[str] = field(default_factory=lambda: ["jobs", "fan"])
    leases: list[Any] = field(default_factory=list)
    tasks: list[tuple[str, str]] = field(default_factory=list)  # (scope, task id)
    rids: list[int] = field(default_factory=list)

    def learn(self, result: Any) -> None:
        """Take the names and leases a reply carries (bounded: the newest 64 of each)."""
        if not isinstance(result, dict):
            return
        delivery = result.get("delivery")
        if isinstance(delivery, dict):
            self.learn(delivery)
        if "lease" in result and result["lease"] is not None:
            _remember(self.leases, result["lease"])
        scope, item = result.get("scope"), result.get("id")
        if isinstance(scope, str):
            _remember(self.scopes, scope)
            if isinstance(item, str):
                _remember(self.tasks, (scope, item))


def _remember(pool: list[Any], value: Any) -> None:
    if value not in pool:
        pool.append(value)
        del pool[:-64]


def _valid(rng: random.Random, name: str, known: Known) -> Any:
    """A value a careful client would send for ``name``."""
    if name == "scope" or name == "subscriber_scope":  # a cancelled scope stays cancelled
        return rng.choice(known.scopes) if rng.random() < 0.5 else f"s{rng.randrange(40)}"
    if name in ("key", "work_key"):
        return rng.choice(known.keys)
    if name in ("mailbox", "name"):
        return rng.choice(known.mailboxes)
    if name == "lease":
        return rng.choice(known.leases) if known.leases else rng.randrange(1, 40)
    if name == "leases":
        pool = known.leases or [1, 2, 3]
        return [rng.choice(pool) if rng.random() < 0.7 else [rng.choice(pool), rng.choice(
            [None, 5, 30, 600])] for _ in range(rng.randrange(1, 4))]
    if name == "task":
        return rng.choice(known.tasks)[1] if known.tasks else "t-1"
    if name == "request":
        return rng.choice(known.rids) if known.rids else 1
    if name == "lease_seconds":
        return rng.choice([5, 10, 30, 600, 7.5])
    if name == "wait":
        return rng.random() < 0.3
    if name in ("timeout_ms", "delay_ms", "retry_backoff_ms"):
        return rng.choice([0, 10, 1000, 30_000])
    if name == "timeout_seconds":
        return rng.choice([0, 0.5, 3, 600])
    if name == "max_attempts":
        return rng.choice([1, 2, 5, 100])
    if name == "mode":
        return rng.choice(["WORK", "BROADCAST", None])
    if name == "limit":
        return rng.choice([0, 1, 100, 1000])
    if name == "deadline":
        return rng.choice([None, 1.7e9 + rng.randrange(100_000)])
    if name == "subscriber_id":
        return rng.choice(["sub-a", "sub-b", None])
    if name in ("data", "outcome"):
        return junk(rng, 2)
    if name == "reason":
        return rng.choice(["done", None, "r" * 100])
    if name == "version":
        return PROTOCOL_VERSION
    if name == "holder":
        return rng.choice(["alice", "bob", "fuzz"])
    if name == "token":
        return rng.choice([None, "t" * 32])
    if name == "cursor":
        return rng.choice([0, 1, 5, 2**40])
    if name == "tenant":
        return rng.choice([None, "default", "other"])
    if name == "state":
        return rng.choice([None, "PENDING", "FAILED", "nope"])
    if name == "id":  # a dead letter: a task or message id
        return rng.choice(known.tasks)[1] if known.tasks else "m-1"
    if name == "debounce_key":  # mostly none: a plain send, with or without work_key
        return rng.choice([None, None, "d1", "d2"])
    if name == "debounce_seconds":
        return rng.choice([0.01, 1, 5, 60])
    if name == "concurrency_key":  # limits by key: mostly none, else one of two keys
        return rng.choice([None, None, "u1", "u2"])
    if name == "concurrency_limit":
        return rng.choice([1, 2])
    if name == "rate_key":
        return rng.choice([None, None, None, "r1"])
    if name == "rate_limit":
        return rng.choice([1, 3])
    if name == "rate_period_seconds":
        return rng.choice([0.05, 1])
    if name == "trace":  # mostly none; a W3C context, or one with tracestate too
        return rng.choice([None, None, {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"},
                           {"traceparent": "00-" + "12" * 16 + "-" + "34" * 8 + "-00",
                            "tracestate": "k=v"}])
    if name in ("all", "newest_first", "outcome_only", "paused"):
        return rng.random() < 0.5
    if name == "stop":
        return rng.random() < 0.2
    if name == "after":
        return rng.choice([0, 1, 3, 64, 2**53])
    return junk(rng)


def field_value(rng: random.Random, name: str, known: Known) -> Any:
    """Mostly a right value for ``name``; otherwise any value at all."""
    return _valid(rng, name, known) if rng.random() < 0.7 else junk(rng)


def request(rng: random.Random, known: Known, *, map_args: bool = True) -> tuple[int, Any]:
    """One request's (op, args): right in six of ten, else one to three fields missing or
    wrong, sometimes an extra key. ``map_args=False`` also gives args that are not a map."""
    op = rng.choice(BAD_OPS) if rng.random() < 0.05 else rng.choices(OPS, OP_WEIGHTS)[0]
    if not map_args and rng.random() < 0.03:
        return op, rng.choice([None, [], 0, "args", b"", [{"scope": "s1"}]])
    names = FIELDS.get(op, ())
    args: dict[Any, Any] = {name: _valid(rng, name, known) for name in names}
    if "task" in args and known.tasks:  # a task is found in its own scope only
        args["scope"], args["task"] = rng.choice(known.tasks)
    if op == Op.MESSAGE_SEND:  # debounced without work_key (both: INVALID_ARGUMENT)
        if args["debounce_key"] is None:
            del args["debounce_key"], args["debounce_seconds"]
        elif rng.random() < 0.8:
            del args["work_key"]
    if op == Op.TASK_SUBMIT:  # a limit without its key is INVALID_ARGUMENT: mostly not
        if args["concurrency_key"] is None:
            del args["concurrency_key"], args["concurrency_limit"]
        if args["rate_key"] is None:
            del args["rate_key"], args["rate_limit"], args["rate_period_seconds"]
    if op == Op.FENCE_CHECK:  # its token is a lease handle (HELLO's is text)
        args["token"] = rng.choice(known.leases) if known.leases else rng.randbytes(16)
    if names and rng.random() < 0.4:
        for name in rng.sample(names, min(len(names), rng.randrange(1, 4))):
            if rng.random() < 0.2:
                args.pop(name, None)
            else:
                args[name] = junk(rng)
    if rng.random() < 0.1:
        args[_key(rng)] = junk(rng)
    return op, args


def hello(rng: random.Random, token: str | None = None) -> Any:
    """HELLO args, right (with ``token`` when the server wants one) or wrong field by
    field, the token included: missing, of every type, too long, almost right."""
    args: dict[Any, Any] = {"version": PROTOCOL_VERSION, "holder": f"fuzz-{rng.randrange(99)}"}
    if token is not None:
        args["token"] = token
    if rng.random() < 0.5:
        return args
    name = rng.choice(["version", "holder", "token", "token", "extra"])
    if name == "token":
        args["token"] = rng.choice([
            junk(rng), "", "x" * 100_000, (token or "t")[:-1], (token or "t") + "x",
            (token or "t").upper(), (token or "t").encode(), [token], {"token": token},
        ])
    elif name == "extra":
        args[_key(rng)] = junk(rng)
    elif rng.random() < 0.2:
        del args[name]
    else:
        args[name] = junk(rng)
    return args if rng.random() < 0.95 else rng.choice([None, [args], "HELLO", 1])


# ---- frames ---------------------------------------------------------------------------------

_PACK = msgpack.Packer(use_bin_type=True).pack
_HEADER = struct.Struct(">I")
# Container and string headers that declare far more than any frame holds.
HUGE_HEADERS = [b"\xdd\xff\xff\xff\xff", b"\xdf\xff\xff\xff\xff", b"\xdb\xff\xff\xff\xff",
                b"\xc6\xff\xff\xff\xff", b"\xc9\xff\xff\xff\xff\x01", b"\xdc\xff\xff",
                b"\xde\xff\xff", b"\xda\xff\xff", b"\xc5\xff\xff"]


def frame(body: bytes) -> bytes:
    """``body`` behind a right length header."""
    return _HEADER.pack(len(body)) + body


def encode_request(rid: Any, op: Any, args: Any) -> bytes:
    return frame(_PACK([int(Kind.REQUEST), rid, op, args]))


def hostile_body(rng: random.Random, known: Known) -> bytes:
    """A body a right header frames, of the wrong shape, type or size."""
    op, args = request(rng, known, map_args=False)
    choice = rng.randrange(11)
    if choice == 0:
        return _PACK(junk(rng))
    if choice == 1:
        return _PACK([int(Kind.REQUEST), rng.choice([0, -1, 1.5, "1", None, 2**64 - 1]), op,
                      args])
    if choice == 2:
        return _PACK([rng.choice([0, 2, 3, 4, 5, True, 1.0, "1"]), 1, op, args])
    if choice == 3:
        return _PACK([int(Kind.REQUEST), 1, op, args, junk(rng)][: rng.randrange(6)])
    if choice == 4:
        return _PACK([int(Kind.REQUEST), 1, rng.choice([None, "1", 1.0, True, b"\x01", [1]]),
                      args])
    if choice == 5:
        return rng.choice(HUGE_HEADERS) + rng.randbytes(rng.randrange(16))
    if choice == 6:
        return rng.choice([b"\x91", b"\x81\xa1k"]) * rng.randrange(100, 5000)
    if choice == 7:
        return _PACK([int(Kind.REQUEST), 1, op, args]) + rng.randbytes(rng.randrange(1, 4))
    if choice == 8:
        return rng.randbytes(rng.randrange(64))
    if choice == 9:  # a map with unhashable keys: msgpack refuses it
        return b"\x81\x91\x01\x01"
    return _PACK([int(Kind.REQUEST), 1, op, args])


def mutated(rng: random.Random, data: bytes) -> bytes:
    """``data`` (frames) damaged in one to three ways."""
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        how = rng.randrange(9)
        if how == 0 and out:  # flip bits
            for _ in range(rng.randrange(1, 4)):
                out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
        elif how == 1 and out:  # overwrite a byte
            out[rng.randrange(len(out))] = rng.randrange(256)
        elif how == 2:  # truncate
            del out[rng.randrange(len(out) + 1):]
        elif how == 3 and len(out) >= 4:  # forge the first length
            size = rng.choice([0, 1, len(out), len(out) + 100, MAX_FRAME_BYTES,
                               MAX_FRAME_BYTES + 1, 2**32 - 1, rng.randrange(2**32)])
            out[:4] = _HEADER.pack(size)
        elif how == 4 and out:  # delete a slice
            start = rng.randrange(len(out))
            del out[start:start + rng.randrange(1, 9)]
        elif how == 5:  # insert random bytes
            start = rng.randrange(len(out) + 1)
            out[start:start] = rng.randbytes(rng.randrange(1, 9))
        elif how == 6 and out:  # duplicate a slice
            start = rng.randrange(len(out))
            out[start:start] = out[start:start + rng.randrange(1, 32)]
        elif how == 7 and len(out) > 4:  # a huge container where a value was
            start = rng.randrange(4, len(out))
            out[start:start + 1] = rng.choice(HUGE_HEADERS)
        else:  # add a header-only frame
            out += _HEADER.pack(rng.choice([0, 1, 2**31, 2**32 - 1]))
    return bytes(out)


def stream(rng: random.Random, known: Known, count: int) -> bytes:
    """``count`` request frames, right or hostile, back to back."""
    parts = []
    for rid in range(1, count + 1):
        if rng.random() < 0.7:
            op, args = request(rng, known)
            parts.append(encode_request(rid, op, args))
        else:
            parts.append(frame(hostile_body(rng, known)))
    return b"".join(parts)

