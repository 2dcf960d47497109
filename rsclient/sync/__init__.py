"""``rsclient.sync``: the sync client, the same API as ``AsyncRunstate`` with plain calls.

    from rsclient.sync import Runstate

    with Runstate(holder="worker-1") as rs:
        run = rs.scopes.create()
        with run.claim("company:acme").acquire() as lease:
            ...

One event loop in one background thread serves the client; it is safe to share between
threads. The errors are the async client's (``rsclient.ConflictError`` and the rest).
"""

from ..errors import (
    AuthenticationError,
    ConflictError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    RunstateError,
    ScopeCancelledError,
    UnavailableError,
    WaitTimeoutError,
)
from .claims import Claim, Lease
from .client import Mailboxes, Runstate, Scope, Scopes, TaskGroup
from .mailboxes import Delivery, Mailbox, Ticket
from .pools import Pools, Quota, Quotas
from .schedules import Schedules

__all__ = [
    "AuthenticationError",
    "Claim",
    "ConflictError",
    "Delivery",
    "InvalidArgumentError",
    "Lease",
    "LeaseLostError",
    "Mailbox",
    "Mailboxes",
    "NotFoundError",
    "Pools",
    "Quota",
    "Quotas",
    "Runstate",
    "RunstateError",
    "Schedules",
    "Scope",
    "ScopeCancelledError",
    "Scopes",
    "TaskGroup",
    "Ticket",
    "UnavailableError",
    "WaitTimeoutError",
]
