"""What becomes of a request whose answer did not come: sent again, or UnavailableError.

A request can fail before its answer in two ways, and the rule differs:

- **answered NOT_PRIMARY**: its node is not (any more) the cluster's primary and did not
  execute it. The client reconnects to the primary (``connection.py``) and sends it
  again, whatever it is (but releases and requeues, sent once as always): nothing was
  done, so nothing can be done twice.
- **lost with its connection** (``LostConnection``: the node died or stepped down, the
  network failed): it may or may not have been executed. A client of a cluster (given
  several nodes, or answered NOT_PRIMARY once) sends it again on the new connection if a
  second execution cannot differ from one (the table); otherwise, and always for a lone
  rsd, it raises that UnavailableError, as it always did.

- **answered MOVED** (``Moved``: a sharded cluster's node whose shard does not own the
  request's slot): not executed either. The slot map is asked again (``shards.py``)
  and the request sent to the owner, ``MAX_REDIRECTS`` times in a row at most (these
  sends are not counted in ``MAX_SENDS``); then UnavailableError with code MOVED and
  the last answer's ``details``.

Either way a request is sent at most ``MAX_SENDS`` times (a request that takes down
every node it reaches must not take down the whole cluster), and the reconnect it needs
is bounded by the failover budget (two cluster leases plus the connect timeout:
``connection.py``), so a takeover is ridden through; a client that cannot follow raises
the UnavailableError it got (code NOT_PRIMARY, with ``details`` ``{"primary", "epoch"}``,
when that is what stopped it). Waits, renewals and settlements keep their own rules, noted
in the table. Per operation, when its connection is lost before the answer (``rsproto.sdkrules``):

=====================================  =============================================
operation                              fate unknown (the connection was lost)
=====================================  =============================================
reads: PING, SERVER_STATS, *_STATUS,   sent again (a read changes nothing)
*_INSPECT, FENCE_CHECK, DEAD_LETTERS,
admin listings
MAILBOX/POOL/QUOTA_ENSURE              sent again (declarative; ``created`` is the
                                       repeat's)
SCOPE_CREATE with an id / without      sent again (``created`` is the repeat's) /
                                       UnavailableError (a second run)
SCOPE_CANCEL                           sent again (the counts are the repeat's)
TASK_SUBMIT with a key / without       sent again (same key and input: the same task;
                                       ``created`` may say False) / UnavailableError
TASK_SUBMIT_MANY                       sent again if every item has a key, else
                                       UnavailableError
MESSAGE_SEND with work_key / without   sent again (``replay`` may say True) /
                                       UnavailableError (a second message)
TASK_JOIN, TASK_DETACH, TASK_CANCEL    sent again (idempotent)
SNAPSHOT_NOW                           sent again (a second snapshot is harmless)
DEAD_LETTER_REQUEUE                    UnavailableError (would requeue twice)
TASK_SIGNAL (ticket.signal)            UnavailableError (a second signal would be
                                       kept, and wake a later wait of that name)
DEAD_LETTER_DELETE                     UnavailableError (a second delete of a recorded
                                       one says NOT_FOUND, a failure that was none)
CLAIM_ACQUIRE, POOL_ACQUIRE, no wait   UnavailableError: a grant nobody knows may
                                       exist; sent again, it would meet that grant
                                       and say CLAIM_HELD / POOL_FULL, a false
                                       "busy"; the grant ends by expiry
CLAIM_ACQUIRE, POOL_ACQUIRE, waiting   waited again for the time left (``retry.py``);
                                       a lost grant holds the key until it expires
                                       (a new primary gives it one full lease)
RECEIVE, no wait / waiting             UnavailableError / waited again; a lost
                                       delivery comes back after its lease, attempt+1
QUOTA_TAKE, no wait / waiting          UnavailableError (would take twice) / waited
                                       again (a lost take may be taken twice)
TASK_RESULT, GROUP_WAIT                waited again for the time left (reads)
LEASE_RENEW (the keeper)               again every 0.25 s until the lease's deadline
lease.renew()                          sent again (renewing twice is harmless)
DELIVERY_COMPLETE / _RETRY / _REJECT,  sent again with the same handle until the
DELIVERY_SUSPEND (suspend)
                                       lease's deadline: a repeat of a recorded one
                                       is answered as the first (``deliveries.py``)
DELIVERY_RELEASE (requeue)             UnavailableError; the delivery comes back
                                       after its lease
CLAIM_RELEASE, POOL_RELEASE            sent once: unanswered, the lease ends by
                                       expiry (a repeat of a recorded release would
                                       be STALE_CLAIM, a loss that was none)
=====================================  =============================================

A lone rsd raises UnavailableError for every "sent again" row above but the waits,
renewals and settlements, exactly as before clusters.

The table itself, op by op, is ``rsproto.sdkrules.RESEND``, which both SDKs follow
(``safe_to_repeat`` and ``MAX_SENDS`` are its); this module applies it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rsproto.sdkrules import MAX_REDIRECTS, MAX_SENDS, safe_to_repeat

from .connection import LostConnection, Moved, NotExecuted
from .errors import UnavailableError
from .wire import ErrorCode

if TYPE_CHECKING:
    from .connection import Connection

__all__ = ["MAX_SENDS", "follow_moved", "may_send_again", "safe_to_repeat", "send_again"]

T = TypeVar("T")

def may_send_again(
    conn: Connection, failure: UnavailableError, op: int, args: dict[str, Any]
) -> bool:
    """Whether a request that failed with ``failure`` is sent again (the module docstring)."""
    if conn.closed:
        return False
    if isinstance(failure, NotExecuted):
        return True  # answered NOT_PRIMARY: not executed
    return isinstance(failure, LostConnection) and conn.cluster and safe_to_repeat(op, args)


async def send_again(
    conn: Connection,
    failure: UnavailableError,
    op: int,
    args: dict[str, Any],
    send: Callable[[], Awaitable[T]] | None = None,
) -> T:
    """``op`` with ``args`` failed with ``failure`` before its answer: send it again
    (``send()``, by default ``conn.request(op, args)``) while the module's rule allows,
    after reconnecting; its answer, or the UnavailableError that ends it."""
    sends = 1
    redirects = 0  # MOVED answers in a row
    while True:
        if isinstance(failure, Moved):
            redirects += 1
            await follow_moved(conn, failure, redirects)
        elif sends < MAX_SENDS and may_send_again(conn, failure, op, args):
            redirects = 0
            if conn.shards is None or not conn.shards.routing:  # (routed: the shard's own
                await conn.connect()  # connection connects) can't reach it: its error ends it
            sends += 1
        else:
            raise failure
        try:
            if send is None:
                reply: T = await conn.request(op, args)
                return reply
            return await send()
        except UnavailableError as exc:
            failure = exc


async def follow_moved(conn: Connection, failure: UnavailableError, redirects: int) -> None:
    """``failure``, a MOVED answer (the ``redirects``-th in a row), is followed: the
    slot map refreshed (``Shards.follow``) before the request goes again. Past
    ``MAX_REDIRECTS``, or for a client that keeps no map or was closed,
    UnavailableError with code MOVED (the answer's ``details``) is raised instead."""
    shards = conn.shards
    if not isinstance(failure, Moved) or shards is None or conn.closed:
        raise failure
    if redirects > MAX_REDIRECTS:
        raise UnavailableError(
            f"{failure.message} (answered MOVED {redirects} times in a row: the slot map "
            "did not settle)", ErrorCode.MOVED, dict(failure.details),
        ) from None
    await shards.follow(failure, redirects)
