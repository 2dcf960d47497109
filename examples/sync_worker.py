"""The sync client from plain threads: planners in threads, a consumer in a thread,
stopped with a threading.Event.

    RUNSTATE_ADDRESS=127.0.0.1:7420 python examples/sync_worker.py
"""

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rsclient.sync import Delivery, Runstate


def main() -> None:
    with Runstate(holder="sync-demo") as rs:
        rs.mailboxes.ensure("research")
        run = rs.scopes.create()

        def handle(data: dict[str, str], delivery: Delivery) -> None:
            with run.claim(f"company:{data['company']}").acquire(wait=True) as lease:
                delivery.complete(result={"payload": f"{data['company']}, gen {lease.generation}"})

        stop = threading.Event()
        worker = threading.Thread(
            target=run.mailbox("research").consume, args=(handle,),
            kwargs={"concurrency": 4, "stop": stop},
        )
        worker.start()

        def plan(company: str) -> Any:
            ticket = run.mailbox("research").submit({"company": company}, key=company)
            return ticket.result(timeout_ms=60_000)["outcome"]

        with ThreadPoolExecutor(4) as pool:
            for outcome in pool.map(plan, ["acme", "globex", "initech", "umbrella"]):
                print(outcome)
        stop.set()
        worker.join()


if __name__ == "__main__":
    main()
