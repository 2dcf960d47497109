"""Forwarded handles: the leases a shard gave away with their runs, remembered for a while.

When a slot move drops runs from their old shard (transfer.py, the RUNS_DROPPED record),
their live leases (held claims, deliveries in flight) go on living on the new shard, under
the same handles. Their holders still renew them, or settle them, on the connection to
the old shard until they learn of the move. Without this memory the old shard would
answer STALE_CLAIM, and a holder would give up a lease it still holds. With it, the old
shard answers MOVED: a renewal item gets the outcome ``"MOVED"``, an op naming the
handle is refused with MOVED (the shell adds where the run's slot is now), and the SDK
takes the lease to the new owner's connection.

What always holds:
- entries are made only by the drop of runs (``forward``, called by RUNS_DROPPED's
  applier, so live operation, a restart's replay and a standby all make the same ones):
  never by a client, so the table is bounded by the leases that moved;
- an entry lives one full lease length (the lease's own length) from the drop, then is
  forgotten by one wheel timer per drop and length (``Core.tick``): on the live source no
  lease that moved can outlive it there (its deadline is at most that), and a replay,
  which knows no renewal, counts from the replay as it does for every lease it rebuilds;
- a handle is found only with its whole handle and by its own tenant (``run_of``): any
  other handle, or another tenant's, finds nothing, exactly as a stale one (STALE_CLAIM);
- a lease whose run is on this shard again (it moved back) is never MOVED here: the
  caller asks only for a handle that is not live, and takes a run it holds as no move
  (``Tables.forwarded_run``);
- asking costs nothing when nothing was forwarded: the callers look only on a miss of
  the lease table, and only when ``runs`` is not empty.
"""

from __future__ import annotations

from collections.abc import Iterable

from .timerwheel import TimerWheel

__all__ = ["Forwarded"]


class _Batch:
    """The handles one drop forwarded with one lease length: one wheel entry (itself)
    forgets them all when that length has passed."""

    __slots__ = ("handles", "runs")

    def __init__(self, runs: dict[bytes, tuple[str, str, _Batch]]) -> None:
        self.runs = runs
        self.handles: list[bytes] = []

    def fire(self, now: float) -> None:
        """Forget its handles (but one forwarded again since by a later drop: a later
        batch owns it)."""
        runs = self.runs
        for handle in self.handles:
            entry = runs.get(handle)
            if entry is not None and entry[2] is self:
                del runs[handle]


class Forwarded:
    """handle -> (tenant, run id) of the leases that left with their runs."""

    __slots__ = ("_wheel", "runs")

    def __init__(self, wheel: TimerWheel) -> None:
        self._wheel = wheel
        # handle -> (tenant, run id, the batch whose wheel entry forgets it)
        self.runs: dict[bytes, tuple[str, str, _Batch]] = {}

    def __len__(self) -> int:
        return len(self.runs)

    def forward(self, now: float, leases: Iterable[tuple[bytes, float, str, str]]) -> None:
        """The leases ``(handle, length, tenant, run id)`` left this shard with their
        runs at ``now``: each is remembered one lease length. O(leases); one wheel entry
        per distinct length."""
        batches: dict[float, _Batch] = {}
        runs = self.runs
        for handle, length, tenant, run in leases:
            batch = batches.get(length)
            if batch is None:
                batch = batches[length] = _Batch(runs)
                self._wheel.schedule(now + length, batch)
            batch.handles.append(handle)
            runs[handle] = (tenant, run, batch)

    def run_of(self, handle: bytes, tenant: str) -> str | None:
        """The run ``handle`` left with, if it is ``tenant``'s lease that moved. O(1)."""
        entry = self.runs.get(handle)
        return entry[1] if entry is not None and entry[0] == tenant else None
