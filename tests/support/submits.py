"""A recorded workload of keyed submits, for the cluster fault tests that check what was
acknowledged across a fault (support/history.py): ``Submits`` runs a few clients, each
given every node's address, submitting new keyed tasks one after another (one in flight
each, so a write stalled by the cluster shows as a pause in its acknowledgements);
``final_reads`` submits every acknowledged key again on the final primary (the same task
must come back), the reads ``check_acknowledged_changes_present`` compares.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools

from rsclient import AsyncRunstate, RunstateError

from .history import History, Process

__all__ = ["MAILBOX", "Submits", "final_reads"]

MAILBOX = "work"
RETRY_SECONDS = 0.05  # after a refused submit (UNAVAILABLE, NOT_PRIMARY ...), before the next


class Submits:
    """``clients`` recorded clients of ``address`` submitting keyed tasks in one run, from
    ``start()`` to ``stop()``."""

    def __init__(self, history: History, address: str, clients: int = 3) -> None:
        self.history = history
        self.address = address
        self.count = clients
        self.clients: list[AsyncRunstate] = []
        self.run_id = ""
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def client(self, name: str) -> tuple[Process, AsyncRunstate]:
        """A recorded client of every node (closed by ``close``)."""
        rs = AsyncRunstate(holder=name, address=self.address, connect_timeout=15.0)
        self.clients.append(rs)
        return self.history.process(name, rs), rs

    async def start(self) -> None:
        _, setup = self.client("setup")
        await setup.mailboxes.ensure(MAILBOX, mode="WORK")
        self.run_id = (await setup.scopes.create()).id
        loop = asyncio.get_running_loop()
        for i in range(self.count):
            proc, rs = self.client(f"submitter-{i}")
            self._tasks.append(loop.create_task(self._submit(proc, rs, f"s{i}-")))

    async def _submit(self, proc: Process, rs: AsyncRunstate, prefix: str) -> None:
        mailbox = rs.scope(self.run_id).mailbox(MAILBOX)
        n = 0
        while not self._stop.is_set():
            n += 1
            key = f"{prefix}{n}"
            try:
                await proc.call("submit", {"key": key, "input": {"n": n}},
                                functools.partial(mailbox.submit, {"n": n}, key=key),
                                reply=lambda ticket: {"task": ticket.id})
            except RunstateError:
                await asyncio.sleep(RETRY_SECONDS)

    def acknowledged_since(self, since: float) -> int:
        """Submits invoked after ``since`` (the history's clock) and acknowledged."""
        return sum(1 for op in self.history.ops
                   if op.f == "submit" and op.ok and op.invoked > since)

    async def until_acknowledged(self, since: float, count: int = 3,
                                 timeout: float = 60.0) -> None:
        """Until ``count`` submits invoked after ``since`` are acknowledged (AssertionError
        after ``timeout`` s: the cluster is stuck)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.acknowledged_since(since) < count:
            assert loop.time() < deadline, (
                f"fewer than {count} submits acknowledged within {timeout:g} s")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """Stop submitting: each client's submit in flight is cancelled (recorded as
        ``info``)."""
        self._stop.set()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, RunstateError):
                await task

    async def close(self) -> None:
        await self.stop()
        for rs in self.clients:
            with contextlib.suppress(Exception):
                await rs.close()


async def final_reads(submits: Submits) -> None:
    """Every fault is over: each acknowledged key submitted again on the final primary,
    pipelined on one client (``History.begin_final`` first)."""
    history = submits.history
    history.begin_final()
    acknowledged = {op.value["key"]: op.value["input"] for op in history.ops
                    if op.f == "submit" and op.ok}
    proc, rs = submits.client("final")
    mailbox = rs.scope(submits.run_id).mailbox(MAILBOX)
    await asyncio.gather(*(
        proc.call("submit", {"key": key, "input": data},
                  functools.partial(mailbox.submit, data, key=key),
                  reply=lambda ticket: {"task": ticket.id})
        for key, data in sorted(acknowledged.items())))
