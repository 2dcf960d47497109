"""A client riding through a takeover: from a fault of the primary to its next acknowledged change.

Starts the three-node cluster of ``bench.cluster`` (3 etcd members, 3 rsd nodes, ``--fsync
always``, a 5 s cluster lease unless told otherwise) and one client of every node's
address, with the SDK's default options or a given ``connect_timeout``, submitting keyed
tasks in a loop (``bench.cluster.Submitter``'s loop: a failed call is counted and the next
one is made 50 ms later). Then, ``--rounds`` times each, for each fault:

- ``kill``: SIGKILL of the primary;
- ``stop``: SIGSTOP of the primary (a VM frozen, a long pause), which closes no socket
  and accepts TCP connections but answers nothing;

the time from the fault to the client's first acknowledged submit sent after it, and the
calls that raised meanwhile (with the default options the SDK used to give up after its
2 s connect timeout, a takeover taking about the cluster lease). After each round the
faulted node is killed, started again, and the run waits until every standby has its
copy.

    python -m bench.failover [--rounds N] [--lease-seconds S] [--faults kill,stop]
                             [--connect-timeouts default,30]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import time
from dataclasses import dataclass, field

from bench.cluster import DEFAULT_LEASE, TAKEOVER_GIVE_UP, Cluster, Submitter, running_cluster, say
from rsclient import AsyncRunstate

__all__ = ["Round", "measure"]


@dataclass
class Round:
    fault: str
    connect_timeout: float | None  # None: the SDK's default
    seconds: float | None  # fault to the next acknowledged change; None: none came
    raised: dict[str, int] = field(default_factory=dict)  # calls that failed meanwhile


def _client(address: str, connect_timeout: float | None) -> Submitter:
    submitter = Submitter(address)
    submitter.rs = (
        AsyncRunstate(holder="bench-failover", address=address) if connect_timeout is None
        else AsyncRunstate(holder="bench-failover", address=address,
                           connect_timeout=connect_timeout))
    return submitter


async def _one(cluster: Cluster, fault: str, connect_timeout: float | None) -> Round:
    await cluster.revive()
    primary, _ = await cluster.primary()
    await cluster.copies(primary)
    submitter = _client(cluster.address, connect_timeout)
    try:
        await asyncio.wait_for(submitter.start(), 30)
        if await submitter.first_ack_after(time.monotonic(), 10) is None:
            raise RuntimeError("nothing acknowledged before the fault")
        before = dict(submitter.errors)
        assert primary.proc is not None
        faulted_at = time.monotonic()
        os.kill(primary.proc.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        answered = await submitter.first_ack_after(faulted_at, TAKEOVER_GIVE_UP)
        raised = {name: n - before.get(name, 0) for name, n in submitter.errors.items()
                  if n - before.get(name, 0)}
        return Round(fault, connect_timeout,
                     None if answered is None else answered - faulted_at, raised)
    finally:
        await submitter.stop()
        await submitter.close()
        with contextlib.suppress(ProcessLookupError):
            if primary.proc is not None and primary.alive:
                os.kill(primary.proc.pid, signal.SIGCONT)
        await primary.kill()
        await cluster.restart(primary)


async def measure(rounds: int, lease: int, faults: list[str],
                  timeouts: list[float | None]) -> list[Round]:
    done: list[Round] = []
    async with running_cluster(lease) as cluster:
        for fault in faults:
            for connect_timeout in timeouts:
                for k in range(rounds):
                    one = await _one(cluster, fault, connect_timeout)
                    done.append(one)
                    took = "none" if one.seconds is None else f"{one.seconds:.2f} s"
                    say(f"  {fault} (connect_timeout {_name(connect_timeout)}) "
                        f"{k + 1}/{rounds}: next acknowledged change after {took}; "
                        f"calls that raised meanwhile: {one.raised or 'none'}")
    return done


def _name(connect_timeout: float | None) -> str:
    return "default" if connect_timeout is None else f"{connect_timeout:g}"


def report(done: list[Round], lease: int) -> str:
    lines = [f"cluster lease {lease} s; target 2 x lease + 1 s = {2 * lease + 1} s",
             "| fault | connect_timeout | fault -> next acknowledged change (each round) "
             "| median | calls that raised |",
             "| --- | --- | --- | --- | --- |"]
    keys = sorted({(one.fault, _name(one.connect_timeout)) for one in done})
    for fault, name in keys:
        these = [one for one in done if (one.fault, _name(one.connect_timeout)) == (fault, name)]
        seconds = [one.seconds for one in these if one.seconds is not None]
        each = ", ".join("none" if one.seconds is None else f"{one.seconds:.2f}" for one in these)
        raised: dict[str, int] = {}
        for one in these:
            for what, n in one.raised.items():
                raised[what] = raised.get(what, 0) + n
        median = f"{statistics.median(seconds):.2f} s" if seconds else "-"
        lines.append(f"| {fault} | {name} | {each} | {median} | {raised or 'none'} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.failover", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--lease-seconds", type=int, default=DEFAULT_LEASE)
    parser.add_argument("--faults", default="kill,stop")
    parser.add_argument("--connect-timeouts", default="default,30")
    return parser.parse_args(argv)


async def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    timeouts = [None if word == "default" else float(word)
                for word in args.connect_timeouts.split(",")]
    done = await measure(args.rounds, args.lease_seconds, args.faults.split(","), timeouts)
    print(report(done, args.lease_seconds))


if __name__ == "__main__":
    asyncio.run(main())
