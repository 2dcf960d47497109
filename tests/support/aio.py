"""Async helpers shared by the integration tests: waiting for a condition, comparing a
result, and ending tasks and clients without leaving anything running.

A wait here always has a deadline: a condition that never holds fails the test with an
AssertionError instead of hanging the suite.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from rsclient import AsyncRunstate


class Hang:
    """Work that never ends by itself: it says when it started and when it was cancelled.

    Call it with any arguments (a claim's function, a consume handler); it waits until
    cancelled, sets ``cancelled`` and re-raises, as a well-behaved coroutine does.
    """

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def __call__(self, *args: Any) -> None:
        self.started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise


def now() -> float:
    """The running loop's clock (monotonic seconds)."""
    return asyncio.get_running_loop().time()


async def eventually(
    check: Callable[[], Awaitable[bool]], timeout: float = 5.0, interval: float = 0.01
) -> None:
    """Poll the async predicate ``check`` until it is true: for server state that no event
    announces, such as "a waiter is queued"."""
    deadline = now() + timeout
    while not await check():
        if now() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s")
        await asyncio.sleep(interval)


async def eventually_true(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """``eventually`` for a plain (not async) predicate."""
    deadline = now() + timeout
    while not check():
        assert now() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def equals(value: Awaitable[Any], expected: Any) -> bool:
    """``await value == expected``, as a predicate for ``eventually``."""
    return await value == expected


async def stop_task(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait (up to 5 s) for it to end, whatever it raises."""
    task.cancel()
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(task, 5)


async def close_quietly(client: AsyncRunstate) -> None:
    """Close a client at teardown; a server already gone is no error here."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), 5)


@contextlib.asynccontextmanager
async def own_client(holder: str, address: str, **options: Any) -> AsyncIterator[AsyncRunstate]:
    """A client with non-default options (the ``clients`` fixture makes only default ones)."""
    client = AsyncRunstate(holder=holder, address=address, **options)
    try:
        yield client
    finally:
        await close_quietly(client)
