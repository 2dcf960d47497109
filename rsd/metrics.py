"""What rsd measures about itself, and its rendering in the Prometheus text format.

The shell bumps plain counters and observes into fixed-bucket histograms as it works
(``Metrics``); ``render`` turns them, with the core's own O(1) counts, into the text
exposition format 0.0.4 that Prometheus scrapes (``metricshttp.py`` serves it), and
``summary`` gives SERVER_STATS its share.

What always holds:
- recording is cheap and allocation-free beyond a counter bump: replies are counted in a
  list indexed by op; a histogram observation is a bisect into a tuple of bounds and
  three additions; request latency is measured once per batch (around all the requests
  of one read), never per request;
- everything here is touched by the event loop's thread only: the fsync thread hands
  its measured duration back to the loop as its future's result (journal.py);
- every table is bounded whatever clients send: ops are the protocol's (an unknown op
  counts as ``UNKNOWN``), error codes are the closed set, rare events are the core's
  literal names, and mailboxes are shown for the first ``MAX_MAILBOX_SERIES``
  definitions only (the rest are counted in ``rsd_mailbox_series_omitted``), tenants'
  stored payload bytes for the first ``MAX_MAILBOX_SERIES`` tenants (tenants are the
  tokens file's, the operator's to bound);
- a scrape reads counters and sizes, never walks leases, items or queues: its cost
  depends on the number of series (bounded above), not on what the server holds.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sized
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

from rsproto import Op

from . import __version__
from .core.run.items import State
from .policy import Policy

if TYPE_CHECKING:
    from rsproto.slots import SlotMap

    from .core import Core
    from .disk.journal import Journal
    from .disk.snapshots import Snapshots
    from .watchdog import Watchdog

__all__ = ["MAX_MAILBOX_SERIES", "Histogram", "Metrics", "Observed", "StandbyHeld", "render",
           "render_standby", "shard_series", "summary"]

MAX_MAILBOX_SERIES = 100  # mailboxes given series of their own (the first defined)
RECENT_FSYNCS = 1024  # fsync durations kept for SERVER_STATS' p50/p99

_OP_NAMES = {int(op): op.name for op in Op}
_OP_SLOTS = max(_OP_NAMES) + 1
UNKNOWN_OP = -1

# Bucket upper bounds, in seconds.
LATENCY_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                   0.05, 0.1, 0.25, 0.5, 1.0)
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                 0.25, 0.5, 1.0, 2.5)
SNAPSHOT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Counts of observations per bucket (not cumulative; ``render`` sums them)."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1


class Metrics:
    """The shell's counters and histograms (server.py owns one)."""

    def __init__(self) -> None:
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.ok = [0] * _OP_SLOTS  # replies by op
        self.deferred = [0] * _OP_SLOTS  # requests whose answer comes later (waits)
        self.errors: dict[tuple[int, str], int] = {}  # (op or UNKNOWN_OP, code) -> count
        self.late_errors: dict[str, int] = {}  # deferred requests answered with an error
        self.connection_errors: dict[str, int] = {}  # connections failed, by code
        self.accepted = 0
        self.batch = Histogram(LATENCY_BUCKETS)
        self.commit_wait = Histogram(LATENCY_BUCKETS)
        self.fsync = Histogram(FSYNC_BUCKETS)
        self.recent_fsyncs: deque[float] = deque(maxlen=RECENT_FSYNCS)
        self.snapshot = Histogram(SNAPSHOT_BUCKETS)
        self.last_snapshot_at: float | None = None  # wall clock of the last one written
        self.last_snapshot_seconds: float | None = None
        self.loop_lag = Histogram(LAG_BUCKETS)

    def error(self, op: int, code: str) -> None:
        """A request of ``op`` was answered with error ``code`` (at once)."""
        key = (op if type(op) is int and op in _OP_NAMES else UNKNOWN_OP, str(code))
        self.errors[key] = self.errors.get(key, 0) + 1

    def late_error(self, code: str) -> None:
        self.late_errors[code] = self.late_errors.get(code, 0) + 1

    def connection_error(self, code: str) -> None:
        self.connection_errors[code] = self.connection_errors.get(code, 0) + 1

    def fsynced(self, seconds: float) -> None:
        self.fsync.observe(seconds)
        self.recent_fsyncs.append(seconds)

    def snapshot_written(self, seconds: float) -> None:
        self.snapshot.observe(seconds)
        self.last_snapshot_at = time.time()
        self.last_snapshot_seconds = seconds

    def uptime(self) -> float:
        return time.monotonic() - self.started


# ---- SERVER_STATS' share ----------------------------------------------------------------


def _quantile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


class _Held(Protocol):
    @property
    def total(self) -> int: ...  # bytes held for all clients (clientbudget.py)


class Observed(Protocol):
    """What the series are read from (server.py's ``Server`` is one): no more."""

    @property
    def metrics(self) -> Metrics: ...
    @property
    def core(self) -> Core: ...
    @property
    def journal(self) -> Journal | None: ...
    @property
    def snapshots(self) -> Snapshots | None: ...
    @property
    def conns(self) -> Sized: ...
    @property
    def refused_total(self) -> int: ...
    @property
    def budget(self) -> _Held: ...
    @property
    def watchdog(self) -> Watchdog[Any]: ...
    @property
    def cluster_status(self) -> Callable[[], dict[str, Any]] | None: ...
    @property
    def cluster(self) -> str | None: ...  # None: a server alone
    @property
    def slots(self) -> Slots: ...
    @property
    def moves(self) -> Paused: ...


class Slots(Protocol):
    """What the shard series read of the slots a node serves (slotowner.py's
    ``SlotOwner``)."""

    @property
    def map(self) -> SlotMap: ...
    @property
    def shard(self) -> str: ...
    @property
    def moves(self) -> dict[str, int]: ...


class Paused(Protocol):
    """The last move's write pause (wire/slotmoves.py's ``SlotMoves``)."""

    @property
    def paused(self) -> float: ...


def summary(server: Observed) -> dict[str, Any]:
    """The fields SERVER_STATS adds for operators (protocol.md lists them). Bounded:
    at most ``MAX_MAILBOX_SERIES`` mailboxes, ``RECENT_FSYNCS`` samples sorted."""
    metrics, core = server.metrics, server.core
    ops: dict[str, dict[str, int]] = {}
    for op, name in _OP_NAMES.items():
        if metrics.ok[op] or metrics.deferred[op]:
            ops[name] = {"ok": metrics.ok[op], "deferred": metrics.deferred[op], "errors": 0}
    errors: dict[str, int] = {}
    for (op, code), count in metrics.errors.items():
        entry = ops.setdefault(
            _OP_NAMES.get(op, "UNKNOWN"), {"ok": 0, "deferred": 0, "errors": 0}
        )
        entry["errors"] += count
        errors[code] = errors.get(code, 0) + count
    for code, count in metrics.late_errors.items():
        errors[code] = errors.get(code, 0) + count
    work = core.work
    tasks = {state.value: work.by_state[(False, state)] for state in State}
    messages = {state.value: work.by_state[(True, state)] for state in State}
    shown = list(islice(work.mailboxes.values(), MAX_MAILBOX_SERIES))
    recent = sorted(metrics.recent_fsyncs)
    journal = server.journal
    return {
        "uptime_seconds": round(metrics.uptime(), 3),
        "ops_total": sum(metrics.ok) + sum(metrics.deferred) + sum(metrics.errors.values()),
        "ops": ops,
        "errors": errors,
        "leases_held": len(core.leases),
        "tasks": tasks,
        "messages": messages,
        "queue_depths": {
            "mailboxes": [
                {"tenant": box.tenant, "mailbox": box.name, "ready": box.depth.ready,
                 "running": box.depth.running}
                for box in shown
            ],
            "omitted": len(work.mailboxes) - len(shown),
        },
        "journal_bytes": None if journal is None else journal.disk_bytes,
        "last_snapshot_at": metrics.last_snapshot_at,
        "last_snapshot_seconds": metrics.last_snapshot_seconds,
        "fsync_ms": {
            "count": metrics.fsync.count,
            "last": round(metrics.recent_fsyncs[-1] * 1000, 3) if recent else None,
            "p50": round(_quantile(recent, 0.5) * 1000, 3) if recent else None,
            "p99": round(_quantile(recent, 0.99) * 1000, 3) if recent else None,
        },
    }


# ---- the text exposition format ---------------------------------------------------------


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


class _Text:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, text: str) -> None:
        self.lines.append(f"# HELP {name} {text.replace(chr(92), chr(92) * 2)}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: float, labels: Iterable[tuple[str, str]] = ()) -> None:
        pairs = ",".join(f'{key}="{_escape_label(str(val))}"' for key, val in labels)
        self.lines.append(f"{name}{{{pairs}}} {_number(value)}" if pairs
                          else f"{name} {_number(value)}")

    def one(self, name: str, kind: str, text: str, value: float) -> None:
        self.family(name, kind, text)
        self.sample(name, value)

    def histogram(self, name: str, text: str, hist: Histogram) -> None:
        self.family(name, "histogram", text)
        running = 0
        for bound, count in zip(hist.bounds, hist.counts, strict=False):
            running += count
            self.sample(name + "_bucket", running, [("le", _number(float(bound)))])
        self.sample(name + "_bucket", hist.count, [("le", "+Inf")])
        self.sample(name + "_sum", hist.sum)
        self.sample(name + "_count", hist.count)


def render(server: Observed) -> bytes:
    """Every series, in the Prometheus text format (version 0.0.4)."""
    metrics, core = server.metrics, server.core
    out = _Text()
    out.family("rsd_build_info", "gauge", "rsd's version (always 1)")
    out.sample("rsd_build_info", 1, [("version", __version__)])
    out.one("rsd_start_time_seconds", "gauge", "when rsd started (Unix time)",
            metrics.started_wall)
    out.one("rsd_uptime_seconds", "gauge", "seconds since rsd started", metrics.uptime())
    _request_series(out, metrics)
    _connection_series(out, server)
    _table_series(out, core)
    _disk_series(out, server)
    out.histogram("rsd_event_loop_lag_seconds",
                  "how late the watchdog's timer ran, sampled every "
                  f"{server.watchdog.interval:g} s", metrics.loop_lag)
    out.one("rsd_event_loop_stalls_total", "counter",
            f"event loop stalls of {Policy.STALL_SECONDS * 1000:g} ms or more",
            server.watchdog.stalls)
    if server.cluster_status is not None:
        cluster_series(out, server.cluster_status())
    if server.cluster is not None:
        slots = server.slots
        shard_series(out, slots.shard, slots.map)
        out.family("rsd_slot_moves_total", "counter",
                   "moves of this shard's slots to another shard that ended, by result: "
                   "done (the map gave them away) or failed (they stayed)")
        for result, count in slots.moves.items():
            out.sample("rsd_slot_moves_total", count, [("result", result)])
        out.one("rsd_slot_move_pause_seconds", "gauge",
                "how long the last move held its slots' requests (0: no move yet)",
                server.moves.paused)
    out.lines.append("")
    return "\n".join(out.lines).encode()


def shard_series(out: _Text, shard: str, slot_map: SlotMap | None) -> None:
    """A node of a cluster: its shard, and the slots its map gives that shard (a node of
    a cluster only, standbys too: a server alone is one shard with every slot, as ever,
    and shows none of it)."""
    out.family("rsd_shard_info", "gauge", "the shard this node is of (always 1)")
    out.sample("rsd_shard_info", 1, [("shard", shard)])
    if slot_map is None:
        return  # a standby that has not read the map yet
    owned = sum(hi + 1 - lo for lo, hi, owner in slot_map.ranges if owner == shard)
    out.one("rsd_slots", "gauge", "the cluster's slots (fixed when it was made)",
            slot_map.slots)
    out.one("rsd_slots_owned", "gauge", "slots the slot map gives this node's shard", owned)
    out.one("rsd_slot_map_epoch", "gauge", "the epoch of the slot map this node holds",
            slot_map.epoch)


def _request_series(out: _Text, metrics: Metrics) -> None:
    """Requests by op and result, errors by code, the batch and commit-wait histograms."""
    out.family("rsd_requests_total", "counter",
               "requests answered, by op and result: ok, deferred (the answer comes later: "
               "a wait) or the error code")
    for op, name in _OP_NAMES.items():
        if metrics.ok[op]:
            out.sample("rsd_requests_total", metrics.ok[op], [("op", name), ("result", "ok")])
        if metrics.deferred[op]:
            out.sample("rsd_requests_total", metrics.deferred[op],
                       [("op", name), ("result", "deferred")])
    errors: dict[str, int] = dict(metrics.late_errors)
    for (op, code), count in sorted(metrics.errors.items()):
        out.sample("rsd_requests_total", count,
                   [("op", _OP_NAMES.get(op, "UNKNOWN")), ("result", code)])
        errors[code] = errors.get(code, 0) + count
    out.family("rsd_errors_total", "counter",
               "error answers by code, immediate and deferred (a wait that ended in an error)")
    for code, count in sorted(errors.items()):
        out.sample("rsd_errors_total", count, [("code", code)])
    out.histogram("rsd_request_batch_seconds",
                  "time the core took to run the requests of one read (a batch), on the loop",
                  metrics.batch)
    out.histogram("rsd_commit_wait_seconds",
                  "time replies were held for the fsync covering their changes",
                  metrics.commit_wait)


def _connection_series(out: _Text, server: Observed) -> None:
    """Connections served, admitted, refused, failed; the bytes held for clients."""
    metrics = server.metrics
    out.one("rsd_connections", "gauge", "client connections served now", len(server.conns))
    out.one("rsd_connections_accepted_total", "counter", "client connections admitted",
            metrics.accepted)
    out.one("rsd_connections_refused_total", "counter",
            "client connections refused by a connection limit or as non-loopback",
            server.refused_total)
    out.family("rsd_connection_errors_total", "counter",
               "connections closed by rsd with a connection-level error, by code")
    for code, count in sorted(metrics.connection_errors.items()):
        out.sample("rsd_connection_errors_total", count, [("code", code)])
    out.one("rsd_client_buffer_bytes", "gauge",
            "bytes held for all clients (unfinished frames, unsent output)", server.budget.total)


def _table_series(out: _Text, core: Core) -> None:
    """The core's tables: leases, claims, waits, runs, timers and tenants; each tenant's
    payload bytes and limit; items by state; mailbox depths; rare events."""
    stats = core.stats()
    for key, text in (("leases", "live leases (claims, deliveries, pool slots)"),
                      ("claims", "claims held"), ("waits", "pending waits of every kind"),
                      ("scopes", "runs in the table"), ("timers", "timers pending"),
                      ("tenants", "tenants with objects")):
        out.one(f"rsd_{key}", "gauge", text, stats[key])

    tenants = core.tenants
    out.family("rsd_tenant_payload_bytes", "gauge", "payload bytes a tenant stores (data, "
               f"results, dead letters, subscriptions; the first {MAX_MAILBOX_SERIES} tenants)")
    shown_tenants = list(islice(tenants.usage.items(), MAX_MAILBOX_SERIES))
    for tenant, usage in shown_tenants:
        out.sample("rsd_tenant_payload_bytes", usage.bytes, [("tenant", tenant)])
    out.family("rsd_tenant_payload_limit_bytes", "gauge",
               "a tenant's max_payload_bytes_per_tenant (the same tenants)")
    for tenant, _ in shown_tenants:
        out.sample("rsd_tenant_payload_limit_bytes", tenants.byte_limit(tenant),
                   [("tenant", tenant)])

    out.family("rsd_items", "gauge", "tasks and messages kept, by kind and state")
    for (is_message, state), count in core.work.by_state.items():
        out.sample("rsd_items", count,
                   [("kind", "message" if is_message else "task"), ("state", state.value)])
    mailboxes = core.work.mailboxes
    shown = list(islice(mailboxes.values(), MAX_MAILBOX_SERIES))
    for name, attr, text in (
        ("rsd_mailbox_ready", "ready", "items ready for delivery, per mailbox over all runs"),
        ("rsd_mailbox_running", "running", "deliveries under a lease, per mailbox"),
    ):
        out.family(name, "gauge", f"{text} (the first {MAX_MAILBOX_SERIES} mailboxes defined)")
        for box in shown:
            out.sample(name, getattr(box.depth, attr),
                       [("tenant", box.tenant), ("mailbox", box.name)])
    out.one("rsd_mailbox_series_omitted", "gauge",
            f"mailboxes past the first {MAX_MAILBOX_SERIES}, not given series of their own",
            len(mailboxes) - len(shown))

    counts = core.effects.counts
    out.one("rsd_deliveries_expired_total", "counter",
            "deliveries whose lease expired (requeued or dead-lettered)",
            counts.get("delivery lease expired", 0))
    out.family("rsd_events_total", "counter",
               "rare events, as logged: lease expiries, dead letters, cancelled runs")
    for event, count in sorted(counts.items()):
        out.sample("rsd_events_total", count, [("event", event)])


def _disk_series(out: _Text, server: Observed) -> None:
    """The journal and snapshots (a server with a data directory only)."""
    metrics = server.metrics
    journal, snapshots = server.journal, server.snapshots
    if journal is not None and snapshots is not None:
        out.one("rsd_journal_bytes", "gauge", "journal segments on disk, in bytes",
                journal.disk_bytes)
        out.one("rsd_journal_written_bytes_total", "counter",
                "journal record bytes written since start", journal.bytes_written)
        out.one("rsd_journal_records_total", "counter", "journal records written since start",
                int(journal.stats["records"]))
        out.histogram("rsd_fsync_seconds", "duration of each journal fsync", metrics.fsync)
        out.histogram("rsd_snapshot_seconds",
                      "duration of each snapshot, from the fork to the file renamed",
                      metrics.snapshot)
        out.one("rsd_snapshot_fork_pause_seconds", "gauge",
                "how long the last snapshot's fork paused the loop",
                snapshots.stats["last_fork_ms"] / 1000.0)
        out.one("rsd_snapshot_failures_total", "counter",
                "snapshots that failed (a full disk, say): the journal kept everything",
                int(snapshots.stats["snapshot_failures"]))
        if metrics.last_snapshot_at is not None:
            out.one("rsd_snapshot_last_time_seconds", "gauge",
                    "when the last snapshot was written (Unix time)", metrics.last_snapshot_at)


def cluster_series(out: _Text, view: dict[str, Any]) -> None:
    """A cluster node's series: its role, the epoch, takeovers, each standby's lag."""
    out.family("rsd_cluster_role", "gauge", "this node's role in its cluster (1 for its role)")
    for role in ("primary", "standby", "joining"):
        out.sample("rsd_cluster_role", 1 if view["role"] == role else 0, [("role", role)])
    out.one("rsd_cluster_epoch", "gauge", "the cluster epoch this node knows", view["epoch"])
    out.one("rsd_cluster_takeovers_total", "counter",
            "times this process became the primary", view["takeovers"])
    for unit in ("records", "bytes"):
        name = f"rsd_cluster_lag_{unit}"
        out.family(name, "gauge",
                   f"{unit} of batches the primary journaled that a standby has not "
                   "acknowledged (on the primary)")
        for member in view["members"]:
            behind = member.get(f"lag_{unit}")
            if member["role"] != "primary" and behind is not None:
                out.sample(name, behind, [("node", member["node"])])


def render_standby(view: dict[str, Any], held: StandbyHeld, started_wall: float,
                   uptime: float, shard: tuple[str, SlotMap | None] | None = None) -> bytes:
    """A node that is not the primary: who it is, the cluster as it sees it, its shard
    and the slots the map it watches gives it (``shard``), and what it holds of the
    primary's stream (a standby serves no client, so it has none of the primary's
    request series)."""
    out = _Text()
    out.family("rsd_build_info", "gauge", "rsd's version (always 1)")
    out.sample("rsd_build_info", 1, [("version", __version__)])
    out.one("rsd_start_time_seconds", "gauge", "when rsd started (Unix time)", started_wall)
    out.one("rsd_uptime_seconds", "gauge", "seconds since rsd started", uptime)
    cluster_series(out, view)
    if shard is not None:
        shard_series(out, *shard)
    out.one("rsd_standby_copies_total", "counter",
            "copies of the primary's whole state this standby received", held.copies)
    out.one("rsd_standby_batch", "gauge",
            "the last batch of the primary's journal this standby holds (-1: none)",
            held.last_batch)
    out.one("rsd_standby_records_total", "counter",
            "records of the primary's journal this standby journaled and applied",
            held.records)
    out.one("rsd_standby_received_bytes_total", "counter",
            "bytes of the replication stream this standby received", held.received_bytes)
    age = held.batch_age()
    out.one("rsd_standby_last_batch_age_seconds", "gauge",
            "seconds since this standby received a batch (NaN: none yet)",
            math.nan if age is None else age)
    out.lines.append("")
    return "\n".join(out.lines).encode()


class StandbyHeld(Protocol):
    """What a standby counts of the stream it follows (follower.py's ``Follower``)."""

    @property
    def copies(self) -> int: ...
    @property
    def last_batch(self) -> int: ...
    @property
    def records(self) -> int: ...
    @property
    def received_bytes(self) -> int: ...
    def batch_age(self) -> float | None: ...
