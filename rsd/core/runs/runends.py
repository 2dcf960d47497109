"""Runs end: a run that has held nothing for the run window is freed.

A run holds something while it has a claim (held or waited on), a queue (items ready,
running or blocked, parked consumers, dedupe entries, dead letters), a task the server
still knows (live, retained or tombstoned, keyed or not: each is still read by its run
and id until it is forgotten), an unfinished message, a pool slot, a parked pool or
quota wait, or a group (``Scope.holds_nothing``). Once it
holds nothing it is *quiet*: a RUN_QUIET record says since when. A run quiet for the
window (``--run-retention-seconds``, 7 days by default like the results' retention) is
freed by a RUN_FREED record: its tenant's runs count drops, a request naming it gets
NOT_FOUND as for a run never made, and SCOPE_CREATE with that id makes a new, empty run.
A cancelled run is freed the same way, so it answers SCOPE_CANCELLED for a window after
it emptied (or was cancelled), then NOT_FOUND.

What keeps a run is what it holds, never being read: a run that gets something and
empties again starts a fresh window (a new RUN_QUIET), and so does SCOPE_CREATE naming
it and SCOPE_CANCEL; SCOPE_STATUS, a receive that finds nothing, a fence check do not
(reads change no state, so they write no record: a process that comes back to a run
after more than a window creates it again at start, as the guide's pattern does).

What always holds:
- O(1) per change: ``Tables.release_scope``, called wherever a run may have emptied,
  announces it once (``run_emptied``), and ``emptied`` queues it; ``arm``, at the end
  of the request or tick that emptied it (``now`` known then), writes its RUN_QUIET;
  each run has at most one entry on one ``DueLine`` (``Scope.lined``), never a walk
  over runs;
- a run is freed a window and a *slack* (``window / SLACK_PARTS``) after its last
  RUN_QUIET, and an emptying writes a new RUN_QUIET only once the last one is a slack
  old: so a run is freed no sooner than a window after it last held anything, no later
  than a window and a slack after (plus a wheel tick), and a run that fills and empties
  without end writes one record per slack (about 2.6 hours of the default 7 days), not
  one per emptying;
- expiry work per tick is bounded: the line fires at most ``Policy.MAX_FIRED_PER_TICK``
  entries per tick (dueline.py), the rest stay due;
- the window is in the journal and the snapshot (SNAP_SCOPE's last field), so replaying
  either arms the same window, and a restart neither frees a run sooner nor restarts
  its window; RUN_QUIET and RUN_FREED applied twice change nothing, and RUN_FREED frees
  only a run that holds nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ..ground.dueline import DueLine
from ..records import Rec, RunFreed, RunQuiet
from ..run.scope import ARMED, IDLE, QUEUED, Scope

if TYPE_CHECKING:
    from ..state.tables import Applier, Handler, Tables

__all__ = ["SLACK_PARTS", "RunEnds"]

SLACK_PARTS: Final = 64  # the slack is this part of the window


class RunEnds:
    """Frees quiet runs after the window. Owned by the Core; a book (RUN_QUIET, RUN_FREED)."""

    def __init__(self, tables: Tables, window: float) -> None:
        self.tables = tables
        self.window = window  # --run-retention-seconds
        self.slack = window / SLACK_PARTS
        self.lasts = window + self.slack  # from a RUN_QUIET to the run's end
        self.line = DueLine(tables.clock, self._due)
        self.emptied: list[Scope] = []  # runs found empty, for ``arm`` (``run_emptied``)
        self.ops: dict[int, Handler] = {}
        self.appliers: dict[int, Applier] = {
            Rec.RUN_QUIET: self.apply_quiet,
            Rec.RUN_FREED: self.apply_freed,
        }

    def run_emptied(self, scope: Scope) -> None:
        """``run_emptied``: ``scope`` holds nothing; ``arm`` starts its window. O(1)."""
        self.emptied.append(scope)

    def arm(self, now: float) -> None:
        """A RUN_QUIET for each run found empty since the last call, unless its last
        one is less than a slack old. O(runs emptied)."""
        tables = self.tables
        emptied, self.emptied = self.emptied, []
        # After replay, a run left emptied since its last RUN_QUIET was emptied again
        # within a slack of it (else a RUN_QUIET would follow): its window stands, as it
        # did live.
        replayed, tables.replayed = tables.replayed, False
        wall = tables.wall(now)
        scopes = tables.scopes
        for scope in emptied:
            if scope.quiet != QUEUED or scopes.get(scope.key) is not scope:
                continue
            since = scope.quiet_since
            if not scope.holds_nothing():
                scope.quiet = IDLE  # quiet_since stays: its last RUN_QUIET's instant
            elif since is not None and (replayed or 0 <= wall - since < self.slack):
                scope.quiet = ARMED
            else:
                tables.commit(RunQuiet(Rec.RUN_QUIET, scope.id, wall, scope.tenant), now)

    def extra_timers(self) -> int:
        """Quiet runs beyond the one wheel entry they share (stats). O(1)."""
        return self.line.extra_timers()

    def _due(self, now: float, scope: Scope) -> None:
        """A quiet run's entry came due: free it if its window has passed and it still
        holds nothing; put it back for a window that began later."""
        scope.lined = False
        tables = self.tables
        since = scope.quiet_since
        if since is None or tables.scopes.get(scope.key) is not scope:  # freed
            return
        if tables.after(since + self.lasts, now):  # a fresh window began meanwhile
            scope.lined = True
            self.line.add(since + self.lasts, scope)
        elif scope.quiet == ARMED and scope.holds_nothing():
            tables.commit(RunFreed(Rec.RUN_FREED, scope.id, scope.tenant), now)
        elif scope.quiet == ARMED:  # it got something and holds it: nothing armed
            scope.quiet = IDLE
        # QUEUED: emptied again in this very turn; ``arm`` writes its fresh window

    def apply_quiet(self, rec: RunQuiet, now: float) -> None:
        # (RUN_QUIET, scope_id, since_wall, tenant)
        scope = self.tables.scopes.get((rec[3], rec[1]))
        if scope is not None:
            self.start(scope, rec[2])

    def start(self, scope: Scope, since: float) -> None:
        """The quiet window of ``scope`` began at wall instant ``since``."""
        scope.quiet = ARMED
        scope.quiet_since = since
        if not scope.lined:
            scope.lined = True
            self.line.add(since + self.lasts, scope)

    def apply_freed(self, rec: RunFreed, now: float) -> None:
        # (RUN_FREED, scope_id, tenant)
        scope = self.tables.scopes.get((rec[2], rec[1]))
        if scope is not None and scope.holds_nothing():
            self.tables.drop_scope(scope)
