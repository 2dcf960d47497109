"""The portal: one event loop in one background thread, and the one way sync code
reaches it.

What always holds:
- every async call of a sync client runs on this one loop, so the async client's rules
  (one loop per client, see ``connection.py``) hold however many threads call it;
- ``call`` blocks the calling thread until the coroutine ends and returns its result or
  raises its exception; if the caller is interrupted (KeyboardInterrupt) the coroutine
  is cancelled, so a parked wait is withdrawn on the server rather than left behind;
- calling from the loop's own thread (a connection-event callback) would wait for
  itself forever: it is refused with a RunstateError instead;
- after ``close()`` every call raises UnavailableError("client is closed").
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ..connection import CLOSED
from ..errors import RunstateError, UnavailableError

__all__ = ["HANDLER_THREADS", "Portal"]

T = TypeVar("T")
HANDLER_THREADS = 64  # threads for plain handlers and run() functions of one client


class Portal:
    """A loop running in a daemon thread of its own, and calls into it from any thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            HANDLER_THREADS, thread_name_prefix=f"{name}-worker"
        )
        self.loop.set_default_executor(self._executor)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Start ``coro`` on the loop; its future (for callers that wait in their own way)."""
        if self._closed:
            coro.close()
            raise UnavailableError(CLOSED)
        if threading.current_thread() is self._thread:
            coro.close()
            raise RunstateError(
                "a sync client cannot be called from its own event loop thread (a connection "
                "event callback): hand the work to another thread"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it (see the module docstring)."""
        future = self.submit(coro)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # interrupted: cancel the coroutine too (no-op if it had ended)
            raise

    def run_sync(self, fn: Callable[[], T]) -> T:
        """Run the plain function ``fn`` on the loop's thread and return its result."""

        async def on_loop() -> T:
            return fn()

        return self.call(on_loop())

    def call_soon(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` on the loop's thread soon; do not wait for it."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to do
            self.loop.call_soon_threadsafe(fn)

    def close(self) -> None:
        """Stop the loop and its thread. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.loop.call_soon_threadsafe(self.loop.stop)
        if threading.current_thread() is not self._thread:
            self._thread.join(5)
        self._executor.shutdown(wait=False, cancel_futures=True)
        if not self.loop.is_running():
            self.loop.close()
