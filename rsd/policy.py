"""Server policy: limits this server chooses, as opposed to the protocol's own limits.

``rsproto.Limits`` is what the protocol promises every client. The values here are this
server's choices (an operator may tune some of them by flag); the HELLO reply announces
both, so a client sees one table.
"""

from __future__ import annotations

from rsproto import Limits

__all__ = ["Policy", "announced_limits"]


class Policy:
    """Every option's one default: the flags, the core and the journal all read them here."""

    LISTEN = ("127.0.0.1", 7420)
    DATA_DIR = "var"
    FSYNC = "always"
    SNAPSHOT_BYTES = 64 << 20
    # After a failed snapshot (a full disk, say) the next one due by size waits this
    # long, doubled after each failure in a row up to the cap (snapshots.py).
    SNAPSHOT_RETRY_SECONDS = 1.0
    SNAPSHOT_RETRY_MAX_SECONDS = 60.0
    RETENTION_SECONDS = 7 * 24 * 3600
    DEDUPE_SECONDS = 7 * 24 * 3600
    TOMBSTONE_SECONDS = 30 * 24 * 3600
    RUN_RETENTION_SECONDS = 7 * 24 * 3600  # a run holding nothing this long is freed
    MAX_WAITS_PER_CONNECTION = 65_536
    HANDSHAKE_TIMEOUT_SECONDS = 10

    # Objects one tenant may hold at once (core/tenants.py); beyond, RESOURCE_EXHAUSTED
    # naming the limit. Runs are scopes in the table (created, used by id, or
    # cancelled); claims are held keys; items are tasks and messages kept (finished
    # tasks until they are forgotten); waits are pending waits of any kind; mailboxes are
    # mailbox definitions.
    MAX_RUNS_PER_TENANT = 100_000
    MAX_CLAIMS_PER_TENANT = 1_000_000
    MAX_ITEMS_PER_TENANT = 1_000_000
    MAX_WAITS_PER_TENANT = 100_000
    MAX_MAILBOXES_PER_TENANT = 10_000
    # Schedules (core/schedulebook.py): at most so many per run and per tenant, beyond
    # which SCHEDULE_ENSURE is RESOURCE_EXHAUSTED naming the limit. A fire time at most
    # SCHEDULE_LATE_SECONDS behind the core's clock when it is handled is on time and
    # fires whatever the schedule's catch_up; an older one was missed (rsd was down).
    MAX_SCHEDULES_PER_RUN = 100
    MAX_SCHEDULES_PER_TENANT = 1_000
    SCHEDULE_LATE_SECONDS = 5.0
    # Recent settlements remembered per tenant, to answer one sent again after its reply
    # was lost (core/settled.py): each for one lease length, the oldest forgotten first.
    MAX_SETTLED_PER_TENANT = 100_000
    # Stored payload bytes one tenant may hold at once (encoded sizes of task and message
    # data, recorded outcomes and dead letters' data): 1 GiB. Counts alone allow a tenant
    # ~500 GB (1,000,000 items of 256 KiB data and as much outcome); 1 GiB is 4,096
    # payloads at their limit, or a million of 1 KiB, and keeps a few tenants within the
    # RAM of a modest host (rsd holds every payload in memory). Settable per tenant in
    # the tokens file and for all by ``--max-payload-bytes-per-tenant``.
    MAX_PAYLOAD_BYTES_PER_TENANT = 1 << 30
    # The range of that limit (flag and tokens file): at least one payload at its limit
    # fits; at most 1 TiB.
    MIN_PAYLOAD_BYTES_PER_TENANT = Limits.MAX_PAYLOAD_BYTES
    MAX_PAYLOAD_BYTES_PER_TENANT_CAP = 1 << 40

    # Output per connection (server.py, connection.py). Output counts the bytes a
    # connection's replies and pushes take while not yet handed to the kernel: queued for
    # this turn's write, held for an fsync, and in the transport's write buffer. At or
    # above the high-water mark the connection's requests are not executed and its socket
    # is not read; both resume once its output is at or below the low-water mark. One
    # reply may pass the mark (a reply can be up to MAX_FRAME_BYTES), so a connection's
    # output stays under HIGH + MAX_FRAME_BYTES, plus the deferred replies and pushes it
    # is owed, which wait unencoded.
    OUTPUT_HIGH_WATER_BYTES = 1 << 20
    OUTPUT_LOW_WATER_BYTES = 256 << 10

    # Replication (feeds.py, follower.py). What a primary keeps for one standby beyond
    # what its connection has taken (the batches journaled while its copy is relayed,
    # and its transport's write buffer): past it the standby is dropped and starts again
    # with a new copy. A replication frame (a copy's push or one journal batch) may be
    # larger than a client's: the standby reads frames up to this size.
    MAX_FEED_BACKLOG_BYTES = 256 << 20
    # The latest journal batches a primary keeps, encoded, so that a standby that comes
    # back within them resumes where it was instead of taking a whole new copy.
    FEED_RING_BYTES = 64 << 20
    # Standbys a primary feeds at once (each costs a forked copy when it joins); a node
    # that follows again replaces its own earlier feed.
    MAX_FEEDS = 16
    MAX_REPL_FRAME_BYTES = 512 << 20
    # How long a primary holds replies waiting for a synchronous standby before it
    # refuses them (UNAVAILABLE): the changes may or may not survive a takeover.
    SYNC_WAIT_SECONDS = 10.0
    # /readyz (http/probes.py) says a serving node cannot do its job once a change has
    # waited this long for its acknowledgement (the journal's fsync, or the synchronous
    # standby's): far beyond a healthy fsync (milliseconds; about a second on a loaded
    # machine), and half the wait after which held replies are refused.
    UNREADY_WAIT_SECONDS = 5.0

    # The work all connections' input may do in one loop turn (turns.py): it is shared
    # among the connections that had more input than their share in the previous turn,
    # each getting at least MIN_TURN_SHARE_SECONDS. Past its share (measured on the
    # loop's clock from the start of its read), the rest of a connection's input waits,
    # unread, for the next loop turn, and other connections are served in between.
    TURN_BUDGET_SECONDS = 0.005
    MIN_TURN_SHARE_SECONDS = 0.0005

    # Deadlines the core fires per tick (Core.tick): a mass expiry at one instant is
    # fired this many at a time, one slice per loop turn, in deadline order.
    MAX_FIRED_PER_TICK = 512

    # Items that need capacity (core/blocked.py): one step (a RECEIVE, a dispatch, the
    # wake of one pool's or quota's line) examines at most this many items it cannot
    # start; the rest are examined in the next step, one loop turn later.
    MAX_BLOCKED_PER_STEP = 256

    # Fair shares (core/lanes.py): a mailbox (in all its runs together) has at most
    # this many live fairness keys (carried by an unfinished item); a submit or send
    # with one more is refused with RESOURCE_EXHAUSTED. Each live key costs a lane per
    # priority it is queued at: this bounds them whatever a client sends.
    MAX_FAIRNESS_KEYS_PER_MAILBOX = 10_000

    # Limits by key (core/work/keylimits.py): a tenant has at most this many live
    # concurrency and rate keys (each carried by an unfinished task, or a rate key in a
    # period not yet over), in all its runs together; a submit with one more is
    # refused with RESOURCE_EXHAUSTED (``TenantLimits.limit_keys``).
    MAX_LIMIT_KEYS_PER_TENANT = 100_000

    # A run's cancellation (core/cascade.py): one step ends at most this many of its
    # claims and unfinished tasks; the rest are ended in later steps, one per wheel tick,
    # so cancelling a run of 100,000 tasks never stops the loop for the whole of it.
    MAX_CANCELLED_PER_STEP = 512

    # Bytes held for all clients together (clientbudget.py, --max-client-buffer-bytes):
    # unfinished frames, undecoded input, output not yet handed to the kernel. Past it,
    # the connections holding the most are closed with RESOURCE_EXHAUSTED. The minimum
    # leaves room for one connection at its own bounds: a frame of MAX_FRAME_BYTES in,
    # output at the high-water mark plus one reply of MAX_FRAME_BYTES out, and the rest.
    MAX_CLIENT_BUFFER_BYTES = 32 << 20
    MIN_CLIENT_BUFFER_BYTES = 4 << 20

    # A frame begun must be complete this long after its first byte arrived; otherwise
    # the connection is closed with PROTOCOL_ERROR (``--frame-timeout``).
    FRAME_TIMEOUT_SECONDS = 30.0

    # A connection being closed (after a connection-level error, or refused by a limit)
    # has this long to take its last output; its input is read and discarded meanwhile,
    # up to DISCARD_LIMIT_BYTES, so that closing never resets replies still in flight.
    CLOSE_LINGER_SECONDS = 5.0
    DISCARD_LIMIT_BYTES = 16 << 20

    # Descriptors (descriptors.py). Kept free for the journal, snapshots and the process
    # itself, whatever the clients do.
    RESERVED_DESCRIPTORS = 64
    # The accept queue: the loop may accept this many connections in one burst before
    # it can refuse any, so they are kept free too.
    LISTEN_BACKLOG = 1024
    # Connections refused by a limit that may linger at once, each for at most
    # REFUSED_LINGER_SECONDS; beyond that a refused connection is closed at once.
    MAX_REFUSED_LINGERING = 64
    REFUSED_LINGER_SECONDS = 1.0
    # Default per-peer (remote IP address) connection limit, never above the total.
    MAX_CONNECTIONS_PER_PEER = 1000

    # Event-loop stall monitor (watchdog.py): a timer every MONITOR_INTERVAL_SECONDS
    # measures its own lateness; a lateness of STALL_SECONDS or more is logged and counted.
    MONITOR_INTERVAL_SECONDS = 0.05
    STALL_SECONDS = 0.1

    # Admin listings (core/admin.py): a page holds at most ADMIN_PAGE_MAX objects
    # (ADMIN_PAGE_DEFAULT when the request names no limit) and looks at no more than
    # ADMIN_SCAN_FACTOR entries per object asked for (filtered out or removed ones
    # included). A forced snapshot (SNAPSHOT_NOW) may have at most MAX_SNAPSHOT_WAITERS
    # requests waiting for it.
    ADMIN_PAGE_MAX = 1000
    ADMIN_PAGE_DEFAULT = 100
    ADMIN_SCAN_FACTOR = 4
    # A page of payloads (dead letters, schedules with their data) carries at most this
    # many bytes of them: the frame limit less room for the rest of the reply. A page
    # holds at least one object (one payload is at most Limits.MAX_PAYLOAD_BYTES).
    PAGE_PAYLOAD_BYTES = Limits.MAX_FRAME_BYTES - (64 << 10)
    MAX_SNAPSHOT_WAITERS = 64
    # Backups (disk/backups.py): at most MAX_BACKUPS pinned at once, each of at most
    # MAX_BACKUP_FILES files (the latest snapshot and the segments after it: a snapshot
    # asked for first leaves one or two), so backups hold at most 16 of the descriptors
    # kept for persistence; a BACKUP_READ answers at most BACKUP_CHUNK_BYTES, well under
    # a frame: one read is one short pread on the loop, never a file.
    MAX_BACKUPS = 2
    MAX_BACKUP_FILES = 8
    BACKUP_CHUNK_BYTES = 256 << 10


def announced_limits(
    handshake_timeout: float, min_lease_seconds: float = Limits.MIN_LEASE_SECONDS
) -> dict[str, int | float]:
    """The ``limits`` map of a HELLO reply, in the order protocol.md lists them.
    ``min_lease_seconds``: the core's (lower than the protocol's only in rsd's own tests,
    ``--test-min-lease-seconds``), so a client checks leases against what this server
    takes."""
    return {
        **Limits.as_dict(),
        "min_lease_seconds": _number(min_lease_seconds),
        "max_waits_per_connection": Policy.MAX_WAITS_PER_CONNECTION,
        "handshake_timeout_seconds": _number(handshake_timeout),
    }


def _number(seconds: float) -> int | float:
    """A whole number of seconds as an int (``10``, not ``10.0``), a fraction as is."""
    return int(seconds) if seconds == int(seconds) else seconds
