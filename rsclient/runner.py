"""The function runner: the user's function, run while a lease is held.

What always holds:
- a coroutine function (or a callable object with an async ``__call__``, or a plain
  function returning an awaitable) is cancelled the moment the lease is lost;
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

from .leases import Lease

__all__ = ["is_coroutine_function", "run_while_held"]


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
) -> Any:
    """Run ``fn(*args)`` while ``lease`` is held; if it is lost, stop it and raise.

    A coroutine function is cancelled on loss. A plain function runs in a worker thread,
    which cannot be interrupted: we stop waiting for it. Either way LeaseLostError is
    raised, also when the function finished but the lease was lost meanwhile. A
    cancellation of the caller itself propagates as CancelledError.
    """
    if is_coroutine is None:
        is_coroutine = is_coroutine_function(fn)
    if is_coroutine:
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
