"""The SDK's task path makes no closure per task: none of its functions has a cell
variable (a name an inner function or lambda reads: CPython makes each one a cell
object at every call of the function, whether or not the inner function is ever
made) or an inner function or comprehension (a function object made at each call).

Cells are small but the garbage collector tracks them: at consume()'s pace the five a
task made (complete's lambda for its span, _handle's for its settlement) were 290 of
the 1,480 objects each young-generation collection walked, and the closures cost a
worker 8.1k instructions of its 17k per task above a bare client (bench.client_path
under callgrind, issue 33). A callback that needs its arguments later is a
``functools.partial`` or a method, made only on the path that needs it."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

from rsclient import deliveries, leases, mailboxes, tasks, worker

# The functions a task goes through: submit (and submit_and_wait, send), the wait for
# its result, a receive and its deliveries, the handler's run and settlement.
TASK_PATH: list[Callable[..., Any]] = [
    mailboxes.Mailbox.submit, mailboxes.Mailbox.submit_and_wait, mailboxes.Mailbox.send,
    mailboxes.Mailbox.receive, tasks.Ticket.result, deliveries.receive_many,
    deliveries._deliveries, deliveries.Delivery.__init__, deliveries.Delivery.complete,
    deliveries.Delivery.retry, deliveries.Delivery.reject, deliveries.Delivery._settle,
    worker.Worker._slot, worker.Worker._handle, worker.Worker._settle,
    leases.Lease._past_deadline,
]


def test_the_task_path_makes_no_closures() -> None:
    made = {}
    for function in TASK_PATH:
        code = function.__code__
        inner = [const.co_name for const in code.co_consts if isinstance(const, types.CodeType)]
        if code.co_cellvars or inner:
            made[code.co_qualname] = {"cells": code.co_cellvars, "inner": inner}
    assert not made, f"closures or cells made at every call: {made}"
