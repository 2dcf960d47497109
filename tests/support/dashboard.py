"""A populated rsd for the dashboard's browser tests and its screenshots
(docs/screenshots.py): one busy run holding something of every kind a page shows, and a
few more runs beside it.

``populate(rs)`` makes, through the SDK (so the state is the one clients make):
- ``runs`` runs with a claim each, then the busy run (the newest);
- in the busy run: claims ``deploy-lock`` and ``db-migration``; mailbox ``jobs``
  (``max_attempts=1``) with 2 tasks rejected (dead letters), 1 succeeded with an
  outcome, 1 running (its delivery held), 3 pending in group ``batch-1`` (the first
  with a subscriber), 1 delayed an hour; mailbox ``emails`` with 2 messages;
- a slot of pool ``gpu`` (size 4) held by the run, quota ``api-calls`` (100 per 60 s)
  taken 30 from;
- schedules ``nightly`` (cron, Europe/Berlin) and ``every-5-min`` (an interval).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rsclient import AsyncRunstate

__all__ = ["Populated", "populate"]


@dataclass
class Populated:
    run: Any  # the busy run (rsclient's Scope)
    others: list[str]  # the other runs' ids, oldest first
    dead: list[str]  # the dead letters' ids in mailbox jobs, oldest first
    pending: str  # a pending task of group batch-1, with a subscriber
    succeeded: str  # the task that succeeded
    delivery: Any  # the running task's delivery (held)


async def populate(rs: AsyncRunstate, runs: int = 3) -> Populated:
    others = []
    for n in range(runs):
        other = await rs.scopes.create()
        await other.claim(f"shard-{n}").try_acquire()
        others.append(other.id)
    run = await rs.scopes.create()
    for key in ("deploy-lock", "db-migration"):
        await run.claim(key).try_acquire()
    await rs.mailboxes.ensure("jobs", mode="WORK", max_attempts=1)
    await rs.mailboxes.ensure("emails", mode="WORK")
    jobs = run.mailbox("jobs")
    dead = []
    for n in range(2):
        await jobs.submit({"file": f"report-{n}.csv", "rows": 1000 + n}, key=f"import-{n}")
        delivery = await jobs.receive()
        await delivery.reject("bad input: column 7 is not a date")
        dead.append(delivery.id)
    await jobs.submit({"file": "summary.csv"}, key="summarize")
    delivery = await jobs.receive()
    await delivery.complete({"payload": {"rows": 1999, "status": "ok"}})
    succeeded = delivery.id
    await jobs.submit({"file": "big.parquet"}, key="convert")
    running = await jobs.receive(lease_seconds=600)
    pending = ""
    for n in range(3):
        ticket = await jobs.submit({"part": n}, key=f"part-{n}", group="batch-1",
                                   subscriber_id="planner-1" if n == 0 else None)
        pending = pending or ticket.id
    await jobs.submit({"file": "later.csv"}, key="later", delay_seconds=3600)
    emails = run.mailbox("emails")
    for to in ("ada@example.com", "grace@example.com"):
        await emails.send({"to": to, "template": "welcome"})
    await rs.pools.ensure("gpu", size=4)
    await run.pool("gpu").try_acquire()
    await rs.quotas.ensure("api-calls", limit=100, per_seconds=60)
    await run.quota("api-calls").take(30)
    await run.schedules.ensure("nightly", mailbox="jobs", cron="0 3 * * *",
                               timezone="Europe/Berlin", data={"report": "daily"})
    await run.schedules.ensure("every-5-min", mailbox="emails", every_seconds=300)
    return Populated(run, others, dead, pending, succeeded, running)
