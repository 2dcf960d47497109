"""Histories of what clients did to a cluster, in the Jepsen style, and the rules a
history must keep.

**Recording.** A ``History`` holds every client operation as one ``Op``: its invocation
(the process, the function ``f``, its arguments ``value``, the monotonic time) and its
completion, one of

- ``ok``: answered, with the reply (made plain data by the caller: ids, generations);
- ``fail``: a definite refusal (an error code the server or the SDK answered: CLAIM_HELD,
  STALE_CLAIM, NOT_FOUND, ...): nothing was done;
- ``info``: the fate is unknown (UnavailableError, a lost connection, a wait that timed
  out, a cancellation): it may or may not have happened, now or later;

or none, if the history ended first (as ``info``). (``release(lease)`` here records a
release the server never answered as ``info``: ``lease.release()`` itself returns then
too, counting the lease as ending by expiry.) An op answered by a reply names the
node (``HOST:PORT``) that sent it: each recorded client (``Process``) watches which node
its connection's messages come from. Beside the ops: when a lease was lost
(``LeaseLoss``), what the test did to the nodes and what it saw of them (``NodeEvent``:
a node observed leading an epoch, killed, paused, resumed, started, its network cut and
healed), and when the
final reads began (``begin_final``): reads of the surviving primary after every fault.
Of a sharded cluster also: each switch of the slot map that gave the run's slot to
another shard (``SlotSwitch``: the map epoch, the shard that gave it away and its nodes,
when the test saw it done), and every version of the slot map etcd kept (``MapVersion``,
read at the end: support/moves.py).

**Checking.** ``check(history)`` runs each named rule (``CHECKS``) and returns its
violations, each with the ops that show it. What a rule may claim is only what the
client side can prove, given how rsd and the SDK promise to behave:

- a holder's *interval* of a claim is [its acquire's ok, the first of: its release's
  invocation, the loss of its lease]; the SDK declares a lease lost no later than the
  server could end it (its deadline counts from the send time of the last confirmed
  renewal, less a margin), and the server grants a key again only after its lease
  ended; so two holders' non-empty intervals of one key never overlap;
- an op invoked after another completed was executed after it (real-time order);
- a replaced primary's deadline passed before its successor was elected: a request
  sent to it after that (or after it was paused past its lease, or killed) can never be
  answered by it;
- a shard that gave a slot away (the map switched, by compare-and-swap, after the
  shard stopped serving the slot) answers nothing about it from then on: a request sent
  after the switch was seen is answered MOVED there, or, if it names a lease handle the
  shard no longer has (a renewal, a release, a settlement: sent on the connection that
  holds it), refused; never served. The slot map in etcd changes only by
  compare-and-swap, each change one epoch up, each version covering every slot once.

The checks are pure (no I/O, no clock): they run on hand-written histories too
(tests/test_the_history_checker_finds_every_broken_rule.py), and on one written by
``History.dump`` and read back by ``load``.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from rsclient import RunstateError, UnavailableError, WaitTimeoutError
from rsproto import ErrorCode, Kind
from rsproto.slots import ranges_problem

if TYPE_CHECKING:
    from rsclient import AsyncRunstate
    from rsclient.leases import Lease

__all__ = [
    "CHECKS", "History", "LeaseLoss", "MapVersion", "NodeEvent", "Op", "Outcome", "Process",
    "SlotSwitch", "Unanswered", "Violation",
    "check", "check_acknowledged_changes_present", "check_live_holders_tokens_current",
    "check_no_reply_for_a_slot_given_away", "check_no_reply_from_a_replaced_primary",
    "check_one_live_holder_per_claim", "check_one_owner_per_slot_at_every_map_epoch",
    "check_one_result_per_task", "check_refused_completions_change_nothing",
    "check_stale_tokens_refused", "load", "release", "report",
]

T = TypeVar("T")
Outcome = Literal["ok", "fail", "info"]
NodeKind = Literal["primary", "killed", "paused", "resumed", "started", "cut", "healed"]
TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED"})
INF = float("inf")
# The ops that name a lease handle, sent on the connection that holds the lease (ROUTE's
# CONNECTION): a shard that gave their run's slot away refuses them, as it no longer has
# the handle. Every other op of a run is routed by its slot.
BY_HANDLE = frozenset({"renew", "release", "complete"})
# Answers that say where to go, not what was done: no node answers an op with them.
_REDIRECTS = frozenset({ErrorCode.MOVED.value, ErrorCode.NOT_PRIMARY.value})
_ANSWERS = frozenset({int(Kind.REPLY), int(Kind.ERROR)})
# The op a recorded client's task is running (``Process.call``): its requests are its own.
_RUNNING: contextvars.ContextVar[Op | None] = contextvars.ContextVar("history_op", default=None)


@dataclass
class Op:
    """One client operation: its invocation and (once known) its completion."""

    index: int
    process: str
    f: str  # submit, result, status, complete, acquire, release, fence, inspect, ...
    value: dict[str, Any]
    invoked: float
    outcome: Outcome | None = None  # None: never completed (counts as info)
    completed: float | None = None
    reply: Any = None
    error: str | None = None
    node: str | None = None  # the node whose message completed it, if one did

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def __str__(self) -> str:
        done = "never completed" if self.completed is None else (
            f"-> {self.outcome} {self.reply if self.ok else self.error!r} "
            f"at {self.completed:.3f}")
        node = f" from {self.node}" if self.node else ""
        return (f"#{self.index} {self.process} {self.f} {self.value} "
                f"invoked at {self.invoked:.3f} {done}{node}")


@dataclass(frozen=True)
class LeaseLoss:
    """A held claim's lease was lost, as its holder's SDK saw it: ``at`` is when (its
    deadline if that was earlier than when the loss was noticed)."""

    process: str
    key: str
    token: str
    generation: int
    at: float
    reason: str


@dataclass(frozen=True)
class NodeEvent:
    """What the test did to a node (killed, paused, resumed, started, its network cut
    or healed: support/netns.py) or saw of it (``primary``: observed leading ``epoch``,
    no sooner than it began to). ``shard``: the node's shard, in a sharded cluster
    (each shard counts its epochs apart: a reign ends at a higher epoch of its own
    shard)."""

    kind: NodeKind
    node: str  # HOST:PORT, as clients name it
    at: float
    epoch: int | None = None
    shard: str | None = None


@dataclass(frozen=True)
class SlotSwitch:
    """The slot map gave slots ``lo``..``hi`` (the run's among them) of shard ``source``
    (its nodes ``nodes``, HOST:PORT) to ``target`` at map epoch ``epoch``; the test saw
    it done at ``at`` (no sooner than it was)."""

    lo: int
    hi: int
    source: str
    target: str
    epoch: int
    at: float
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class MapVersion:
    """One version of the slot map as etcd kept it: the etcd revision that wrote it and
    its value (``{"slots", "epoch", "ranges"}``)."""

    revision: int
    value: dict[str, Any]


@dataclass(frozen=True)
class Violation:
    """A broken rule: which check, what is wrong, and the ops that show it."""

    check: str
    message: str
    ops: tuple[Op, ...] = ()

    def __str__(self) -> str:
        lines = [f"[{self.check}] {self.message}"]
        lines += [f"    {op}" for op in self.ops]
        return "\n".join(lines)


class Unanswered(Exception):
    """The call returned, but without the server's answer: its fate is unknown (info)."""


async def release(lease: Lease) -> None:
    """``lease.release()``, but raising Unanswered where it returned without the
    server's answer: the SDK gives up on a release the server does not answer (the
    connection was lost, or no answer came before the lease's deadline) and counts the
    lease as ending by expiry, so a normal return is no acknowledgement."""
    await lease.release()
    fut = lease._release_fut
    if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
        raise Unanswered(f"the release of lease on {lease.key!r} was not answered")


def _classify(exc: BaseException) -> Outcome:
    """``fail`` for a definite refusal, ``info`` when the fate is unknown."""
    if isinstance(exc, UnavailableError | WaitTimeoutError):
        return "info"
    if isinstance(exc, RunstateError):
        return "fail"
    return "info"  # cancelled, timed out on our side, anything else: unknown


class History:
    """The ops, lease losses and node events of one test, on one monotonic clock."""

    def __init__(self, lease_seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        """``lease_seconds``: the cluster lease (``--cluster-lease-seconds``)."""
        self.lease_seconds = lease_seconds
        self.clock = clock
        self.origin = clock()  # times are recorded from the history's start
        self.ops: list[Op] = []
        self.losses: list[LeaseLoss] = []
        self.nodes: list[NodeEvent] = []
        self.switches: list[SlotSwitch] = []
        self.maps: list[MapVersion] = []
        self.final_at: float | None = None

    def now(self) -> float:
        """Seconds since the history began (monotonic)."""
        return self.clock() - self.origin

    def process(self, name: str, rs: AsyncRunstate) -> Process:
        """A recorded client named ``name`` (its ops' ``process``)."""
        return Process(self, name, rs)

    def node(self, kind: NodeKind, node: str, epoch: int | None = None,
             shard: str | None = None) -> NodeEvent:
        """Record what was done to ``node`` (of ``shard``, if sharded) or seen of it now."""
        event = NodeEvent(kind, node, self.now(), epoch, shard)
        self.nodes.append(event)
        return event

    def switched(self, lo: int, hi: int, source: str, target: str, epoch: int,
                 nodes: Iterable[str]) -> SlotSwitch:
        """Record that the map gave slots ``lo``..``hi`` of ``source`` (its ``nodes``) to
        ``target`` at ``epoch``, seen done now."""
        switch = SlotSwitch(lo, hi, source, target, epoch, self.now(), tuple(nodes))
        self.switches.append(switch)
        return switch

    def begin_final(self) -> None:
        """Every fault is over: ops invoked from now on are the final reads."""
        self.final_at = self.now()

    def invoke(self, process: str, f: str, value: dict[str, Any]) -> Op:
        op = Op(len(self.ops), process, f, value, self.now())
        self.ops.append(op)
        return op

    def complete(self, op: Op, outcome: Outcome, reply: Any = None, error: str | None = None,
                 node: str | None = None) -> None:
        op.outcome, op.completed, op.reply, op.error = outcome, self.now(), reply, error
        op.node = node

    def dump(self, path: Path) -> None:
        """Write the whole history as JSON lines (ops, losses, node events), to debug
        (``load`` reads it back)."""
        with path.open("w") as out:
            out.write(json.dumps({"lease_seconds": self.lease_seconds}) + "\n")
            for op in self.ops:
                out.write(json.dumps({"op": asdict(op)}, default=str) + "\n")
            for loss in self.losses:
                out.write(json.dumps({"loss": asdict(loss)}) + "\n")
            for event in self.nodes:
                out.write(json.dumps({"node": asdict(event)}) + "\n")
            for switch in self.switches:
                out.write(json.dumps({"switch": asdict(switch)}) + "\n")
            for version in self.maps:
                out.write(json.dumps({"map": asdict(version)}) + "\n")
            out.write(json.dumps({"final_at": self.final_at}) + "\n")


def load(path: Path) -> History:
    """A history written by ``History.dump``, to check again (or with a new check)."""
    history = History(0.0, clock=lambda: 0.0)
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if "op" in entry:
            history.ops.append(Op(**entry["op"]))
        elif "loss" in entry:
            history.losses.append(LeaseLoss(**entry["loss"]))
        elif "node" in entry:
            history.nodes.append(NodeEvent(**entry["node"]))
        elif "switch" in entry:
            switch = entry["switch"]
            history.switches.append(SlotSwitch(**{**switch, "nodes": tuple(switch["nodes"])}))
        elif "map" in entry:
            history.maps.append(MapVersion(**entry["map"]))
        elif "final_at" in entry:
            history.final_at = entry["final_at"]
        elif "lease_seconds" in entry:
            history.lease_seconds = entry["lease_seconds"]
    return history


class Process:
    """One recorded client: ``call`` records each op it runs, ``hold`` a lease's loss.

    Which node answered: the client's connections (one, or one per shard of a sharded
    cluster: each watched from when it is made) are watched as they send and read. A
    request sent while an op runs (in its task, or a task it started) is that op's; the
    node that answers it (the connection's peer when the answer is read) answered the op,
    unless the answer only said where to go (MOVED, NOT_PRIMARY: the SDK sends it again),
    and the op's last such answer is its node. An op none of whose requests was seen
    (sent by a task it did not start) is given the node of the last batch read since its
    invocation, as long as the client has one connection (with several, that batch may
    be another connection's). It watches by wrapping each connection's ``_send`` and
    ``_received`` and the router's ``_open``: a test's liberty with the SDK's internals.
    """

    def __init__(self, history: History, name: str, rs: AsyncRunstate) -> None:
        self.history = history
        self.name = name
        self.rs = rs
        self.answered_by: str | None = None
        self.batches = 0  # message batches read, to tell whether any came during an op
        self.connections = 0
        self.answers: dict[int, str] = {}  # op index -> the node that last answered it
        self._watch(rs._conn)
        shards = rs._shards
        opened = shards._open

        def open_watched(name: str) -> Any:
            made = opened(name)
            self._watch(made[0])
            return made

        setattr(shards, "_open", open_watched)  # noqa: B010 (the instance's)

    def _watch(self, conn: Any) -> None:
        """Watch one connection of the client (see the class docstring)."""
        self.connections += 1
        sent: dict[int, Op] = {}  # request id -> the op it was sent for
        send, received = conn._send, conn._received

        def tracked_send(op: int, args: dict[str, Any]) -> Any:
            rid, fut = send(op, args)
            running = _RUNNING.get()
            if running is not None and running.completed is None:
                sent[rid] = running
            return rid, fut

        def tracked(proto: Any, messages: list[Any]) -> None:
            node = f"{conn.host}:{conn.port}"
            self.answered_by = node
            self.batches += 1
            if sent:
                for msg in messages:
                    if type(msg) is not list or len(msg) < 3 or msg[0] not in _ANSWERS:
                        continue
                    op = sent.pop(msg[1], None)
                    if op is None or op.completed is not None:
                        continue
                    if msg[0] == Kind.ERROR and msg[2] in _REDIRECTS:
                        continue
                    self.answers[op.index] = node
            received(proto, messages)

        setattr(conn, "_send", tracked_send)  # noqa: B010 (the instance's, not the class's)
        setattr(conn, "_received", tracked)  # noqa: B010

    def _answerer(self, op: Op, batches: int) -> str | None:
        node = self.answers.pop(op.index, None)
        if node is not None or self.connections > 1:
            return node
        return self.answered_by if self.batches != batches else None

    async def call(self, f: str, value: dict[str, Any], action: Callable[[], Awaitable[T]],
                   reply: Callable[[T], Any] | None = None) -> T:
        """Run ``action()`` as op ``f`` with arguments ``value``; record its outcome
        (``reply(result)`` as the recorded reply) and return or raise what it did."""
        history = self.history
        op = history.invoke(self.name, f, value)
        batches = self.batches
        running = _RUNNING.set(op)
        try:
            result = await action()
        except BaseException as exc:
            history.complete(op, _classify(exc), error=f"{type(exc).__name__}: {exc}",
                             node=self._answerer(op, batches))
            raise
        finally:
            _RUNNING.reset(running)
        history.complete(op, "ok", result if reply is None else reply(result),
                         node=self._answerer(op, batches))
        return result

    def hold(self, lease: Lease) -> None:
        """Record when ``lease`` (a claim's, acquired by this process) is lost."""
        history = self.history

        loop = asyncio.get_running_loop()  # lease deadlines are on the loop's clock

        def lost() -> None:
            at = history.now() + min(0.0, lease.lost_at - loop.time())
            history.losses.append(LeaseLoss(self.name, lease.key, lease.token(),
                                            lease.generation, at, lease.lost_reason or ""))

        lease.add_loss_callback(lost)
        _ = lease.lost_event  # arms the deadline's timer: a loss nobody looks for is seen


# ---- reading a history --------------------------------------------------------------


def _before(first: Op, second: Op) -> bool:
    """Whether ``first`` completed before ``second`` was invoked (real-time order)."""
    return first.completed is not None and first.completed < second.invoked


def _ops(history: History, *fs: str, final: bool | None = False) -> list[Op]:
    """The ops of functions ``fs``: before the final reads (``final=False``), the final
    reads alone (True), or all (None)."""
    start = INF if history.final_at is None else history.final_at
    return [op for op in history.ops if op.f in fs
            and (final is None or (op.invoked >= start) == final)]


def _claim(op: Op) -> tuple[str, str]:
    return (str(op.value.get("scope", "")), str(op.value["key"]))


@dataclass
class _Holding:
    """One grant of a claim and its holder's interval [start, end)."""

    grant: Op
    token: str
    generation: int
    start: float
    end: float = INF
    ended_by: list[Op] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.end > self.start


def _holdings(history: History) -> dict[tuple[str, str], list[_Holding]]:
    """Every acknowledged grant per claim, with its holder's interval."""
    by_token: dict[str, _Holding] = {}
    claims: dict[tuple[str, str], list[_Holding]] = defaultdict(list)
    for op in _ops(history, "acquire", final=None):
        if op.ok and op.completed is not None:
            holding = _Holding(op, str(op.reply["token"]), int(op.reply["generation"]),
                               op.completed)
            by_token[holding.token] = holding
            claims[_claim(op)].append(holding)
    for op in _ops(history, "release", final=None):
        released = by_token.get(str(op.value.get("token")))
        if released is not None and op.invoked < released.end:
            released.end = op.invoked
            released.ended_by = [op]
    for loss in history.losses:
        lost = by_token.get(loss.token)
        if lost is not None and loss.at < lost.end:
            lost.end = loss.at
            lost.ended_by = []
    return claims


# ---- the rules ----------------------------------------------------------------------


def check_acknowledged_changes_present(history: History) -> list[Violation]:
    """Every acknowledged change is on the final primary: each key whose submit was
    acknowledged is the same task there; each acknowledged completion is its task's
    result there; each claim's generation there is at least every one granted, and a
    released grant is not held there."""
    name = "acknowledged changes present"
    if history.final_at is None:
        return [Violation(name, "the history has no final reads (begin_final was not called)")]
    out: list[Violation] = []
    final_submits: dict[str, list[Op]] = defaultdict(list)
    for op in _ops(history, "submit", final=True):
        final_submits[str(op.value["key"])].append(op)
    final_status: dict[str, list[Op]] = defaultdict(list)
    for op in _ops(history, "status", final=True):
        final_status[str(op.value["task"])].append(op)
    acknowledged: dict[str, Op] = {}
    for op in _ops(history, "submit"):
        if op.ok:
            acknowledged.setdefault(str(op.value["key"]), op)
    for key, op in sorted(acknowledged.items()):
        reads = final_submits.get(key, [])
        if not any(read.ok for read in reads):
            out.append(Violation(name, f"key {key!r} was acknowledged but never read at the "
                                 "end", (op, *reads)))
        for read in reads:
            if read.ok and read.reply["task"] != op.reply["task"]:
                out.append(Violation(
                    name, f"key {key!r} was acknowledged as task {op.reply['task']} but the "
                    f"final primary has task {read.reply['task']}", (op, read)))
    for op in _ops(history, "complete"):
        if not op.ok:
            continue
        task = str(op.value["task"])
        reads = [read for read in final_status.get(task, []) if read.ok]
        if not reads:
            out.append(Violation(name, f"task {task}'s completion was acknowledged but its "
                                 "status was never read at the end",
                                 (op, *final_status.get(task, []))))
        for read in reads:
            if (read.reply["state"], read.reply.get("outcome")) != (
                    "SUCCEEDED", op.value["outcome"]):
                out.append(Violation(
                    name, f"task {task} was acknowledged complete with "
                    f"{op.value['outcome']!r}; the final primary says {read.reply['state']} "
                    f"{read.reply.get('outcome')!r}", (op, read)))
    inspected: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for op in _ops(history, "inspect", final=True):
        inspected[_claim(op)].append(op)
    released = {str(op.value["token"]): op for op in _ops(history, "release") if op.ok}
    for claim, holdings in sorted(_holdings(history).items()):
        reads = [read for read in inspected.get(claim, []) if read.ok]
        top = max(holdings, key=lambda holding: holding.generation)
        if not reads:
            out.append(Violation(name, f"claim {claim[1]!r} was granted but never inspected "
                                 "at the end", (top.grant, *inspected.get(claim, []))))
        for read in reads:
            if int(read.reply["generation"]) < top.generation:
                out.append(Violation(
                    name, f"claim {claim[1]!r} was granted generation {top.generation}; the "
                    f"final primary is at generation {read.reply['generation']}",
                    (top.grant, read)))
            for holding in holdings:
                release = released.get(holding.token)
                if (release is not None and read.reply.get("held")
                        and int(read.reply["generation"]) == holding.generation):
                    out.append(Violation(
                        name, f"claim {claim[1]!r}: generation {holding.generation} was "
                        "released (acknowledged) but the final primary holds it",
                        (holding.grant, release, read)))
    return out


def check_one_result_per_task(history: History) -> list[Violation]:
    """One key is one task, and a task has one recorded result: every reader saw the same
    terminal state and outcome, and every acknowledged completion is that result."""
    name = "one result per task"
    out: list[Violation] = []
    tasks_of_key: dict[str, dict[str, Op]] = defaultdict(dict)
    for op in _ops(history, "submit", final=None):
        if op.ok:
            tasks_of_key[str(op.value["key"])].setdefault(str(op.reply["task"]), op)
    for key, tasks in sorted(tasks_of_key.items()):
        if len(tasks) > 1:
            out.append(Violation(name, f"key {key!r} was answered as {len(tasks)} tasks: "
                                 f"{sorted(tasks)}", tuple(tasks.values())))
    results: dict[str, dict[tuple[str, str], Op]] = defaultdict(dict)
    for op in _ops(history, "result", "status", "complete", final=None):
        if not op.ok:
            continue
        if op.f == "complete":
            seen = ("SUCCEEDED", json.dumps(op.value["outcome"], sort_keys=True))
        elif op.reply["state"] in TERMINAL:
            seen = (str(op.reply["state"]), json.dumps(op.reply.get("outcome"), sort_keys=True))
        else:
            continue
        results[str(op.value["task"])].setdefault(seen, op)
    for task, distinct in sorted(results.items()):
        if len(distinct) > 1:
            shown = "; ".join(f"{state} {outcome}" for state, outcome in sorted(distinct))
            out.append(Violation(name, f"task {task} has {len(distinct)} results: {shown}",
                                 tuple(distinct.values())))
    return out


def check_refused_completions_change_nothing(history: History) -> list[Violation]:
    """A completion refused (a definite answer: STALE_CLAIM, the lease was lost) left
    nothing behind: no reader sees its outcome as the task's result, unless another
    completion with that outcome was acknowledged (outcomes name their worker and
    attempt, so one delivery's outcome is its own)."""
    name = "refused completions change nothing"
    out: list[Violation] = []
    acknowledged = {(str(op.value["task"]), json.dumps(op.value["outcome"], sort_keys=True))
                    for op in _ops(history, "complete", final=None) if op.ok}
    reads: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for op in _ops(history, "result", "status", final=None):
        if op.ok and op.reply["state"] == "SUCCEEDED":
            outcome = json.dumps(op.reply.get("outcome"), sort_keys=True)
            reads[(str(op.value["task"]), outcome)].append(op)
    for op in _ops(history, "complete", final=None):
        if op.outcome != "fail":
            continue
        seen = (str(op.value["task"]), json.dumps(op.value["outcome"], sort_keys=True))
        if seen in acknowledged or not reads.get(seen):
            continue
        out.append(Violation(
            name, f"task {seen[0]}: a completion refused ({op.error}) is the task's "
            "recorded result", (op, *reads[seen][:2])))
    return out


def check_one_live_holder_per_claim(history: History) -> list[Violation]:
    """Never two live holders of one claim: the grants of a key have distinct
    generations, growing in real-time order, and no two holders' intervals overlap."""
    name = "one live holder per claim"
    out: list[Violation] = []
    for claim, holdings in sorted(_holdings(history).items()):
        for i, first in enumerate(holdings):
            for second in holdings[i + 1:]:
                a, b = first.grant, second.grant
                if first.generation == second.generation:
                    out.append(Violation(
                        name, f"claim {claim[1]!r}: generation {first.generation} was granted "
                        f"twice ({a.process} and {b.process})", (a, b)))
                for older, newer in ((first, second), (second, first)):
                    if _before(older.grant, newer.grant) and older.generation > newer.generation:
                        out.append(Violation(
                            name, f"claim {claim[1]!r}: generation {newer.generation} was "
                            f"granted after generation {older.generation}",
                            (older.grant, newer.grant)))
                if first.live and second.live:
                    start, end = max(first.start, second.start), min(first.end, second.end)
                    if start < end:
                        out.append(Violation(
                            name, f"claim {claim[1]!r}: {a.process} (generation "
                            f"{first.generation}) and {b.process} (generation "
                            f"{second.generation}) both held it from {start:.3f} to "
                            f"{end:.3f}", (a, *first.ended_by, b, *second.ended_by)))
    return out


def check_stale_tokens_refused(history: History) -> list[Violation]:
    """A fenced op (a fence check, a renewal, a release) with a token older than a
    generation already granted (or already accepted by a fence check) when it was
    invoked, or a token already released, is refused: never current, never ok."""
    name = "stale tokens refused"
    out: list[Violation] = []
    grants: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for op in _ops(history, "acquire", final=None):
        if op.ok:
            grants[_claim(op)].append(op)
    accepted: dict[tuple[str, str], list[Op]] = defaultdict(list)
    for op in _ops(history, "fence", final=None):
        if op.ok and op.reply["current"]:
            accepted[_claim(op)].append(op)
    releases = [op for op in _ops(history, "release", final=None) if op.ok]
    for op in _ops(history, "fence", "renew", "release", final=None):
        if not op.ok or (op.f == "fence" and not op.reply["current"]):
            continue
        generation = int(op.value["generation"])
        what = "was current" if op.f == "fence" else f"was answered ok ({op.f})"
        newer = [grant for grant in grants[_claim(op)]
                 if _before(grant, op) and int(grant.reply["generation"]) > generation]
        if newer:
            out.append(Violation(
                name, f"claim {op.value['key']!r}: a token of generation {generation} {what} "
                f"after generation {newer[0].reply['generation']} was granted",
                (newer[0], op)))
        fenced = [other for other in accepted[_claim(op)]
                  if _before(other, op) and int(other.value["generation"]) > generation]
        if fenced:
            out.append(Violation(
                name, f"claim {op.value['key']!r}: a token of generation {generation} {what} "
                f"after a fenced op accepted generation {fenced[0].value['generation']}",
                (fenced[0], op)))
        gone = [release for release in releases if release is not op
                and release.value["token"] == op.value["token"] and _before(release, op)]
        if gone:
            out.append(Violation(name, f"claim {op.value['key']!r}: a released token {what}",
                                 (gone[0], op)))
    return out


def check_live_holders_tokens_current(history: History) -> list[Violation]:
    """A fence check invoked and answered within its holder's interval finds its token
    current (the server cannot have ended the lease yet: a grant it acknowledged and
    lost would say otherwise)."""
    name = "a live holder's token is current"
    out: list[Violation] = []
    by_token = {holding.token: holding for holdings in _holdings(history).values()
                for holding in holdings}
    for op in _ops(history, "fence", final=None):
        holding = by_token.get(str(op.value["token"]))
        if (holding is None or not op.ok or op.reply["current"] or op.completed is None
                or not holding.start <= op.invoked or not op.completed <= holding.end):
            continue
        out.append(Violation(
            name, f"claim {op.value['key']!r}: the token of generation {holding.generation} "
            f"was not current while {holding.grant.process} held it", (holding.grant, op)))
    return out


def _silent_windows(history: History) -> list[tuple[str, float, float, int, str]]:
    """For each reign (a node observed leading an epoch): from when on that node may
    answer nothing, until a new process of it starts (or forever), and why:
    ``(node, from, until, epoch, why)``."""
    events = sorted(history.nodes, key=lambda event: event.at)
    windows: list[tuple[str, float, float, int, str]] = []
    for reign in (event for event in events if event.kind == "primary"):
        node, epoch = reign.node, reign.epoch or 0
        later = [event for event in events if event.at >= reign.at]
        silent, why = INF, ""
        for event in later:
            if (event.kind == "primary" and (event.epoch or 0) > epoch
                    and event.shard == reign.shard and event.at < silent):
                silent, why = event.at, f"epoch {event.epoch} led by {event.node} was seen"
            if event.node != node:
                continue
            if event.kind == "started":
                break  # a new process: its reign, if any, is another one
            if event.kind == "killed" and event.at < silent:
                silent, why = event.at, "it was killed"
            if event.kind == "paused":
                resumed = next((e.at for e in later if e.node == node and e.at > event.at
                                and e.kind in ("resumed", "killed")), INF)
                if resumed - event.at > history.lease_seconds and event.at < silent:
                    silent, why = event.at, (
                        f"it was paused past its lease ({resumed - event.at:.1f} s)")
        if silent < INF:
            start = next((event.at for event in later if event.node == node
                          and event.kind == "started" and event.at > silent), INF)
            windows.append((node, silent, start, epoch, why))
    return windows


def check_no_reply_from_a_replaced_primary(history: History) -> list[Violation]:
    """No node answers a request sent after its reign ended (its successor seen, or it
    was killed, or paused past its lease): its deadline had passed. Once a new process
    of it started, a reply is from that one unless it came before the start, and counts
    only if that node never led again."""
    name = "no reply from a replaced primary"
    out: list[Violation] = []
    leads = [(event.node, event.epoch or 0) for event in history.nodes
             if event.kind == "primary"]
    for node, silent, restarted, epoch, why in _silent_windows(history):
        leads_again = any(other == node and later > epoch for other, later in leads)
        for op in history.ops:
            if op.node != node or op.outcome not in ("ok", "fail") or op.invoked < silent:
                continue
            if leads_again and (op.completed is None or op.completed >= restarted):
                continue
            out.append(Violation(
                name, f"{node} (primary of epoch {epoch}) answered a request sent "
                f"{op.invoked - silent:.3f} s after its reign ended at {silent:.3f} ({why})",
                (op,)))
    return out


def check_no_reply_for_a_slot_given_away(history: History) -> list[Violation]:
    """No node of a shard that gave the run's slot away serves a request sent after the
    switch was seen (until a later switch gives the slot back): it answers MOVED (which
    is no answer: the SDK goes to the owner), or refuses a lease handle it no longer has
    (``BY_HANDLE``); any other answer, a reply or a refusal of an op routed by the slot,
    is about a slot it does not own."""
    name = "no reply for a slot from a shard after it gave it away"
    out: list[Violation] = []
    for i, switch in enumerate(history.switches):
        back = next((later.at for later in history.switches[i + 1:]
                     if later.target == switch.source), INF)
        nodes = set(switch.nodes)
        for op in history.ops:
            if op.node not in nodes or not switch.at <= op.invoked < back:
                continue
            if op.outcome == "ok" or (op.outcome == "fail" and op.f not in BY_HANDLE):
                out.append(Violation(
                    name, f"{op.node} (shard {switch.source!r}) answered a request sent "
                    f"{op.invoked - switch.at:.3f} s after map epoch {switch.epoch} gave "
                    f"slots {switch.lo}-{switch.hi} to shard {switch.target!r}", (op,)))
    return out


def check_one_owner_per_slot_at_every_map_epoch(history: History) -> list[Violation]:
    """Every version of the slot map etcd kept covers each slot once (one owner, never
    none), of the same number of slots, each one epoch above the one before (a
    compare-and-swap per change); and each switch the test saw is one of them, giving
    its slots to its target."""
    name = "one owner per slot at every map epoch"
    out: list[Violation] = []
    previous: dict[str, Any] | None = None
    for version in sorted(history.maps, key=lambda version: version.revision):
        value = version.value
        slots, epoch, ranges = value.get("slots"), value.get("epoch"), value.get("ranges")
        where = f"map epoch {epoch} (etcd revision {version.revision})"
        if type(slots) is not int or type(epoch) is not int or not isinstance(ranges, list):
            out.append(Violation(name, f"{where} is not a slot map: {value!r}"))
            continue
        problem = ranges_problem(ranges, slots)
        if problem is not None:
            out.append(Violation(name, f"{where}: {problem}"))
        if previous is not None and (epoch != previous["epoch"] + 1
                                     or slots != previous["slots"]):
            out.append(Violation(name, f"{where} follows map epoch {previous['epoch']} of "
                                 f"{previous['slots']} slots: a change is one epoch up, "
                                 "the slots fixed"))
        previous = value
    for switch in history.switches:
        if not any(version.value.get("epoch") == switch.epoch and all(
                shard == switch.target for lo, hi, shard in version.value.get("ranges", [])
                if lo <= switch.hi and hi >= switch.lo) for version in history.maps):
            out.append(Violation(name, f"no version of the map in etcd gives slots "
                                 f"{switch.lo}-{switch.hi} to shard {switch.target!r} at "
                                 f"epoch {switch.epoch}, as the test saw"))
    return out


CHECKS: dict[str, Callable[[History], list[Violation]]] = {
    "acknowledged changes present": check_acknowledged_changes_present,
    "one result per task": check_one_result_per_task,
    "refused completions change nothing": check_refused_completions_change_nothing,
    "one live holder per claim": check_one_live_holder_per_claim,
    "stale tokens refused": check_stale_tokens_refused,
    "a live holder's token is current": check_live_holders_tokens_current,
    "no reply from a replaced primary": check_no_reply_from_a_replaced_primary,
    "no reply for a slot from a shard after it gave it away":
        check_no_reply_for_a_slot_given_away,
    "one owner per slot at every map epoch": check_one_owner_per_slot_at_every_map_epoch,
}


def check(history: History, only: Iterable[str] | None = None) -> list[Violation]:
    """Every violation of every rule (or of the rules named in ``only``)."""
    names = list(CHECKS) if only is None else list(only)
    return [violation for name in names for violation in CHECKS[name](history)]


def report(history: History, violations: list[Violation], seed: int | None = None) -> str:
    """A failure message: the seed, counts, each violation with its ops, the faults."""
    counts: dict[str, int] = defaultdict(int)
    for op in history.ops:
        counts[f"{op.f} {op.outcome or 'pending'}"] += 1
    lines = [f"{len(violations)} violation(s)" + (f" (seed {seed})" if seed is not None else "")]
    lines += [str(violation) for violation in violations[:20]]
    lines.append("ops: " + ", ".join(f"{key}: {n}" for key, n in sorted(counts.items())))
    lines += [f"node {event.kind} {event.node} at {event.at:.3f}"
              + (f" epoch {event.epoch}" if event.epoch is not None else "")
              for event in history.nodes]
    lines += [f"map epoch {switch.epoch} gave slots {switch.lo}-{switch.hi} of shard "
              f"{switch.source!r} to {switch.target!r}, seen at {switch.at:.3f}"
              for switch in history.switches]
    return "\n".join(lines)
