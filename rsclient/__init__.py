"""rsclient: the Python SDK for rsd.

    from rsclient import AsyncRunstate

    async with AsyncRunstate(holder="researcher-1") as rs:
        run = await rs.scopes.create()
        report = await run.claim("company:acme").run(research, wait=True)
"""

import logging

from rsproto import __version__

from .claims import Claim
from .client import AsyncRunstate, Scope
from .deliveries import Delivery
from .errors import (
    AuthenticationError,
    ConflictError,
    InvalidArgumentError,
    LeaseLostError,
    NotFoundError,
    PermissionDeniedError,
    RunstateError,
    ScopeCancelledError,
    UnavailableError,
    WaitTimeoutError,
)
from .events import ConnectionEvent
from .groups import TaskGroup
from .leases import Lease
from .mailboxes import Mailbox
from .pools import Pool
from .quotas import Quota
from .schedules import Schedules
from .tasks import Ticket

logging.getLogger("rsclient").addHandler(logging.NullHandler())


__all__ = [
    "AsyncRunstate",
    "AuthenticationError",
    "Claim",
    "ConflictError",
    "ConnectionEvent",
    "Delivery",
    "InvalidArgumentError",
    "Lease",
    "LeaseLostError",
    "Mailbox",
    "NotFoundError",
    "PermissionDeniedError",
    "Pool",
    "Quota",
    "RunstateError",
    "Schedules",
    "Scope",
    "ScopeCancelledError",
    "TaskGroup",
    "Ticket",
    "UnavailableError",
    "WaitTimeoutError",
    "__version__",
]
