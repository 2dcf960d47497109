"""Protocol limits: what every server enforces and every client may rely on.

A server announces these (plus its own policy values, see ``rsd.policy``) in its HELLO
reply. Values a server operator may tune, such as waits per connection or the handshake
timeout, are policy and do not live here.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "LEASE_HANDLE_BYTES", "MAX_FRAME_BYTES", "MAX_TRACEPARENT_BYTES", "MAX_TRACESTATE_BYTES",
    "Limits",
]

MAX_FRAME_BYTES = 1 << 20  # largest body a peer may send; larger closes the connection
# A lease handle: 8 bytes of lease id (big-endian) then 8 random bytes. Opaque to clients.
LEASE_HANDLE_BYTES: Final = 16
# A submit's or send's ``trace`` (the W3C trace context carried to the handler): its
# traceparent is 55 characters in version 00, room left for a later version's; its
# tracestate at most the 512 characters W3C asks every vendor to propagate.
MAX_TRACEPARENT_BYTES: Final = 128
MAX_TRACESTATE_BYTES: Final = 512


class Limits:
    """Validation limits the server enforces and announces in its HELLO reply."""

    MAX_FRAME_BYTES = MAX_FRAME_BYTES
    MAX_KEY_BYTES = 512
    MAX_SCOPE_ID_BYTES = 128
    MAX_HOLDER_BYTES = 256
    MIN_LEASE_SECONDS = 5
    MAX_LEASE_SECONDS = 600
    DEFAULT_LEASE_SECONDS = 30
    MAX_WAIT_TIMEOUT_MS = 3_600_000
    DEFAULT_WAIT_TIMEOUT_MS = 30_000
    MAX_RENEW_BATCH = 10_000
    MAX_WAITERS_PER_KEY = 10_000
    MAX_PAYLOAD_BYTES = 256 * 1024
    MAX_PAYLOAD_DEPTH = 100
    MAX_MAILBOX_NAME_BYTES = 128
    MAX_SUBSCRIBER_ID_BYTES = 256
    MAX_REASON_BYTES = 1024
    DEFAULT_MAX_ATTEMPTS = 5
    MAX_ATTEMPTS = 100
    DEFAULT_RETRY_BACKOFF_MS = 1000
    MAX_RETRY_BACKOFF_MS = 3_600_000
    MAX_DEAD_LETTERS = 1000
    MAX_SUBSCRIBERS_PER_TASK = 1000
    MAX_POOL_NAME_BYTES = 128
    MAX_POOL_SIZE = 10_000
    MAX_POOLS_PER_TENANT = 1000
    MAX_WAITERS_PER_POOL = 10_000
    DEFAULT_POOL_INSPECT_HOLDERS = 100
    MAX_POOL_INSPECT_HOLDERS = 1000
    MAX_QUOTA_NAME_BYTES = 128
    MAX_QUOTA_LIMIT = 1_000_000_000
    MIN_QUOTA_PER_SECONDS = 1
    MAX_QUOTA_PER_SECONDS = 31_622_400
    MAX_QUOTAS_PER_TENANT = 1000
    MAX_WAITERS_PER_QUOTA = 10_000
    MAX_NEEDS_POOLS = 8
    MAX_NEEDS_QUOTAS = 8
    MAX_GROUP_NAME_BYTES = 128
    MAX_GROUP_TASKS = 10_000
    MAX_WAITERS_PER_GROUP = 10_000
    MAX_RECEIVE_BATCH = 256
    MAX_RECEIVE_BATCH_BYTES = 512 * 1024
    MAX_SUBMIT_BATCH = 256
    MAX_DELAY_MS = 31_622_400_000  # a delayed item's delay_ms, or its not_before ahead of now
    MAX_PRIORITY = 9  # priorities are 0 (the default) to this, higher delivered first
    MAX_FAIRNESS_KEY_BYTES = 256
    MAX_DEBOUNCE_SECONDS = 604_800  # a debounced send's window (7 days); more than 0
    MAX_TASK_PARENTS = 64  # the task ids a submit's ``after`` may name
    MAX_TASK_CHILDREN = 10_000  # children (``parent``) of one task; also its dependents
    MAX_CONCURRENCY_LIMIT = 10_000  # a concurrency key's limit: 1 to this tasks running
    MAX_RATE_LIMIT = 1_000_000  # a rate key's limit: 1 to this deliveries per period
    MIN_RATE_PERIOD_MS = 10  # a rate key's shortest period (its rate_period_seconds: 0.01)
    MAX_RATE_PERIOD_SECONDS = 86_400
    MAX_SCHEDULE_NAME_BYTES = 128
    MIN_SCHEDULE_EVERY_SECONDS = 1
    MAX_SCHEDULE_EVERY_SECONDS = 31_622_400
    MAX_CRON_BYTES = 128
    MAX_TIMEZONE_BYTES = 64
    MAX_SCHEDULE_CATCH_UP = 100
    MAX_SCHEDULE_NEXT_FIRES = 10
    MAX_EVENT_BYTES = 64 * 1024  # a progress event's data, encoded
    EVENTS_RETAINED = 64  # a task keeps its last this many events ...
    EVENTS_RETAINED_BYTES = 256 * 1024  # ... and at most this many bytes of their data
    PROGRESS_EVENTS_PER_SECOND = 100  # a task's sustained progress rate ...
    PROGRESS_EVENTS_BURST = 200  # ... with bursts of this many
    MAX_EVENT_SUBSCRIPTIONS = 1000  # tasks one connection may subscribe to at once
    # A task that waits for a signal (DELIVERY_SUSPEND, TASK_SIGNAL): a signal's name and
    # data, the signals a task keeps before it waits for them, and the longest wait.
    MAX_SIGNAL_NAME_BYTES = 128
    MAX_SIGNAL_DATA_BYTES = 64 * 1024
    MAX_SIGNALS_KEPT = 16
    MAX_SUSPEND_SECONDS = 31_622_400  # 366 days: a delay's and a schedule's longest too

    @classmethod
    def as_dict(cls) -> dict[str, int]:
        return {
            name.lower(): value
            for name, value in vars(cls).items()
            if name.isupper() and isinstance(value, int)
        }
