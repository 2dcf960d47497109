"""The function runner: the user's function, run while a lease is held.

What always holds:
- a coroutine function (or a callable object with an async ``__call__``, or a plain
  function returning an awaitable) is cancelled the moment the lease is lost; a
  coroutine function runs in the caller's own task (no task of its own per call), and
  the runner cancels that task only while the function runs in it and takes its own
  cancellation back after, so the caller's later awaits never see it (and, being the
  same task, context variables the function sets stay set in the caller);
- a plain function runs in a worker thread, which cannot be interrupted: on loss the
  runner stops waiting for it and the thread runs to its end unobserved;
- either way a loss raises LeaseLostError, also when the function finished but the lease
  was lost meanwhile; a cancellation of the caller itself propagates as CancelledError;
- the runner adds one loss callback to the lease and always removes it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from .leases import Lease, hold_here, unhold, unhold_here

__all__ = ["InTask", "in_task", "is_coroutine_function", "run_in_task", "run_while_held"]


def is_coroutine_function(fn: Any) -> bool:
    """Whether calling ``fn`` gives a coroutine: an async function or callable object."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
    )


async def run_while_held(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    lease: Lease,
    is_coroutine: bool | None = None,
    task: asyncio.Task[Any] | None = None,
) -> Any:
    """Run ``fn(*args)`` while ``lease`` is held; if it is lost, stop it and raise.

    A coroutine function is cancelled on loss. A plain function runs in a worker thread,
    which cannot be interrupted: we stop waiting for it. Either way LeaseLostError is
    raised, also when the function finished but the lease was lost meanwhile. A
    cancellation of the caller itself propagates as CancelledError. ``task``: the
    current task, if the caller knows it already.
    """
    if is_coroutine is None:
        is_coroutine = is_coroutine_function(fn)
    if is_coroutine:
        current = task or asyncio.current_task()
        if current is not None:
            return await run_in_task(fn, args, lease, current)
        running: asyncio.Future[Any] = asyncio.ensure_future(fn(*args))
    else:
        running = asyncio.ensure_future(asyncio.to_thread(fn, *args))

    def stop() -> None:
        running.cancel()  # whatever runs now: the function, or the awaitable it returned

    lease.add_loss_callback(stop)
    current = asyncio.current_task()
    try:
        result = await running
        if inspect.isawaitable(result):  # `lambda lease: work(lease)`: the work is this
            running = asyncio.ensure_future(result)
            if lease.is_lost:
                running.cancel()
            result = await running
    except asyncio.CancelledError:
        if lease.is_lost and (current is None or not current.cancelling()):
            lease.raise_if_lost()
        raise
    finally:
        lease.remove_loss_callback(stop)
    lease.raise_if_lost()
    return result


class InTask:
    """A coroutine function run in the caller's task ``task`` while ``lease`` is held,
    the awaiting done by the caller (``run_in_task``, or the worker's slot: no coroutine
    between it and the function): made by ``in_task`` before the first await, then
    ``failed`` for whatever the awaiting raised or ``done`` after it returned, exactly
    one of them. It is the lease's loss callback meanwhile: it cancels the task only
    while the function runs there (``running``), and remembers that it did
    (``cancelled``) so that cancellation is taken back."""

    __slots__ = ("cancelled", "lease", "running", "task")

    def __init__(self, task: asyncio.Task[Any], lease: Lease) -> None:
        self.task = task
        self.lease = lease
        self.running = True
        self.cancelled = False

    def failed(self, exc: BaseException) -> None:
        """The function (or what it returned) raised ``exc``, which the caller raises
        on after this: a loss of the lease instead (LeaseLostError) for a cancellation
        that was ours, not the caller's own."""
        self.running = False
        unhold(self.lease, self)
        if isinstance(exc, asyncio.CancelledError):
            task = self.task
            if self.cancelled:  # ours: take it back
                self.cancelled = False
                task.uncancel()
            if task.cancelling() == 0 and self.lease.is_lost:  # not the caller's own
                self.lease.raise_if_lost()

    def done(self) -> None:
        """The function returned: LeaseLostError if the lease was lost meanwhile."""
        self.running = False
        if self.cancelled:  # the function swallowed our cancellation: take it back
            self.task.uncancel()
        unhold_here(self.lease, self)  # (``unhold`` and ``raise_if_lost_here``: a call)

    def __call__(self) -> None:
        if asyncio.current_task() is self.task:
            # Lost while the function itself runs (it looked at the lease): a task cannot
            # take back a cancellation of itself it has not yet seen, so cancel from the
            # loop, at its next await, if the function is still running by then.
            self.task.get_loop().call_soon(self._cancel)
        else:
            self._cancel()

    def _cancel(self) -> None:
        if self.running and not self.cancelled:
            self.cancelled = True
            self.task.cancel()


async def run_in_task(
    fn: Callable[..., Any], args: tuple[Any, ...], lease: Lease, task: asyncio.Task[Any]
) -> Any:
    """``run_while_held`` for a coroutine function, awaited in ``task``, the current task."""
    held = in_task(task, lease)
    try:
        result = await fn(*args)
        while result is not None and inspect.isawaitable(result):  # (None: most handlers)
            result = await result
    except BaseException as exc:
        held.failed(exc)
        raise
    held.done()
    return result


def in_task(task: asyncio.Task[Any], lease: Lease) -> InTask:
    """Start running a coroutine function in ``task`` (the current one) while ``lease``
    is held (``InTask``); LeaseLostError, and it does not start, if it is lost already
    (as a new task's would not)."""
    held = InTask(task, lease)
    hold_here(lease, held)
    return held
