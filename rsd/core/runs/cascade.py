"""A run's cancellation, and a group's ``cancel_rest``, worked through in slices across
loop turns.

SCOPE_CANCEL records SCOPE_CANCELLED and from then on the run refuses new work, so what it
holds can only shrink. Ending what it holds (its claims, each with its waiters, and its
unfinished tasks, each with its own records and pushes) is work in proportion to the run,
not to the request; so is ending up to 10,000 unfinished members of a group once a
GROUP_WAIT with ``cancel_rest`` is met. This module does both in steps.

What always holds:
- one step ends at most ``Policy.MAX_CANCELLED_PER_STEP`` claims and tasks together, the
  claims first; the first step runs inside the SCOPE_CANCEL request, so a run that small is
  wholly ended when the reply is sent, exactly as before slicing;
- while a run has something left, one wheel entry is scheduled strictly after the step's
  ``now``: the next step runs at a later tick (one loop turn or more later), never twice
  in one ``Core.tick``, so other clients are served between two steps;
- each step works from the lists taken when the cancellation started (the run can gain
  nothing, being cancelled); an entry that ended meanwhile (released, expired) is passed
  over, so no claim or task is ended twice and none is missed;
- until its last step, the run is in ``Deliveries.cancelling``: a settlement of one of
  its deliveries still running is refused SCOPE_CANCELLED, as it is once the cascade has
  ended that delivery, so a task of a cancelled run never ends other than CANCELLED;
- after recovery (``resume``), a cancelled run that still holds claims or unfinished tasks
  (a crash in the middle of a cascade) is worked through again the same way.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Final

from ...policy import Policy
from ..holds.claimbook import ClaimBook
from ..run.claim import Claim
from ..run.items import Event, Item
from ..run.scope import Scope
from ..state.tables import Tables
from ..work.deliveries import Deliveries
from ..work.endings import Endings

__all__ = ["Cascade"]

_STEP: Final = Policy.MAX_CANCELLED_PER_STEP


class _Run:
    """One job's remaining work: positions in its claim and task lists. ``reason`` None
    is a run's cancellation; a text is a group's ``cancel_rest``, with that reason."""

    __slots__ = ("claims", "items", "next_claim", "next_item", "reason", "scope")

    def __init__(
        self, scope: Scope, claims: list[Claim], items: list[Item], reason: str | None
    ) -> None:
        self.scope = scope
        self.claims = claims
        self.items = items
        self.reason = reason
        self.next_claim = 0
        self.next_item = 0

    @classmethod
    def of(cls, scope: Scope) -> _Run:
        return cls(scope, list(scope.claims.values()), list(scope.live_items.values()), None)

    def done(self) -> bool:
        return self.next_claim >= len(self.claims) and self.next_item >= len(self.items)


class Cascade:
    """The runs whose cancellation is still being worked through (it hears
    ``run_cancelled``: ``start``), and groups' ``cancel_rest``. Owned by the Core."""

    def __init__(
        self, tables: Tables, claims: ClaimBook, endings: Endings, deliveries: Deliveries
    ) -> None:
        self.tables = tables
        self.claims = claims
        self.endings = endings
        self.cancelling = deliveries.cancelling
        self.runs: deque[_Run] = deque()
        self._scheduled = False

    def __len__(self) -> int:
        return len(self.runs)

    def start(self, now: float, scope: Scope) -> None:
        """End what the cancelled ``scope`` holds: its first step now, the rest later."""
        self._begin(now, _Run.of(scope))

    def cancel_members(self, now: float, scope: Scope, items: list[Item], reason: str) -> None:
        """GROUP_WAIT's ``cancel_rest``: ``items`` (unfinished members of a group of
        ``scope``) end CANCELLED with ``reason``, the first step now, the rest later."""
        self._begin(now, _Run(scope, [], items, reason))

    def _begin(self, now: float, run: _Run) -> None:
        self._step(now, run, _STEP)
        if not run.done():
            self._add(run)
            self._schedule(now)

    def resume(self, now: float, scopes: Iterable[Scope] | None = None) -> None:
        """After recovery: go on with every cancelled run that still holds something.
        One walk over the runs, at start only. ``scopes``: only those (runs moved in
        from another shard in the middle of their cancellation: transfer.py)."""
        for scope in list(self.tables.scopes.values()) if scopes is None else scopes:
            if scope.cancelled is not None and (scope.live_items or scope.held_claims):
                run = _Run.of(scope)
                if not run.done():
                    self._add(run)
        if self.runs:
            self._schedule(now)

    def forget(self, scope: Scope) -> None:
        """``scope`` left this core (moved to another shard): nothing more of it is
        worked through here. O(runs being cancelled)."""
        if any(run.scope is scope for run in self.runs):
            self.runs = deque(run for run in self.runs if run.scope is not scope)
            self.cancelling.discard(scope.key)

    def fire(self, now: float) -> None:
        """The wheel entry: one step, shared out over the runs in cancellation order."""
        self._scheduled = False
        budget = _STEP
        runs = self.runs
        while runs and budget > 0:
            run = runs[0]
            budget -= self._step(now, run, budget)
            if run.done():
                runs.popleft()
                if run.reason is None:
                    self.cancelling.discard(run.scope.key)
        if runs:
            self._schedule(now)

    def _add(self, run: _Run) -> None:
        self.runs.append(run)
        if run.reason is None:
            self.cancelling.add(run.scope.key)

    def _schedule(self, now: float) -> None:
        if not self._scheduled:
            self._scheduled = True
            wheel = self.tables.wheel
            wheel.schedule(now + wheel.tick / 2, self)  # strictly after now: a later tick

    def _step(self, now: float, run: _Run, budget: int) -> int:
        """End up to ``budget`` of ``run``'s claims, then tasks; returns how many were
        looked at (each costs its own records and pushes)."""
        used = 0
        if run.next_claim < len(run.claims):
            end = min(len(run.claims), run.next_claim + budget)
            self.claims.cancel_slice(now, run.scope, run.claims[run.next_claim : end])
            used = end - run.next_claim
            run.next_claim = end
            if run.next_claim >= len(run.claims):
                run.claims = []
                run.next_claim = 0
        if used < budget and run.next_item < len(run.items):
            end = min(len(run.items), run.next_item + budget - used)
            items = run.items[run.next_item : end]
            if run.reason is None:
                self.endings.cancel_slice(now, run.scope, items)
            else:
                for item in items:
                    if not item.terminal:  # settled or cancelled meanwhile: passed over
                        self.endings.finish(now, item, Event.CANCEL, None, run.reason)
            used += end - run.next_item
            run.next_item = end
            if run.next_item >= len(run.items):
                run.items = []
                run.next_item = 0
        return used
