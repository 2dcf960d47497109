"""Who is primary: ``Elector`` runs this node's side of the election on an ``EtcdStore``.

Three long-lived tasks, none per request:
- the session: keeps this node's lease (a new one when it is gone, with the member record
  put again) and refreshes it every third of the lease; each answered keep-alive moves
  the leadership deadline (counted from its send time: ``EtcdStore.keep_alive``);
- the watch: every change under the cluster's prefix, as a fresh view;
- the decider: acts on the latest view, one step at a time: campaigns when there is no
  leader and ``may_lead()`` allows it (asked right before each campaign), reports the
  leader it sees, notices a leadership that is no longer ours.

The owner hears (callbacks, called on the loop, which must not block):
- ``on_primary(epoch)``: this node won a campaign and leads at ``epoch``;
- ``on_standby(leader, address, epoch)``: another node leads (``leader`` None: none does,
  or only a former run of this node, whose key has yet to expire); called when any of the
  three changes;
- ``on_lost()``: leadership may have lapsed: the deadline passed without an answered
  keep-alive, the lease is gone, or the leader key is no longer ours. Once per term.

What always holds:
- ``is_primary`` is true only between ``on_primary`` and ``on_lost``, and only while the
  lease clock (leaseclock.py: the loop's, plus any suspend of the machine) is before
  the deadline. It reads the clock itself, so a node that
  was frozen (SIGSTOP, a long stall) knows on waking, before any timer fires, that it may
  no longer lead: check it synchronously before every act of a primary;
- ``deadline`` only grows within a term; a timer at the deadline ends the term when no
  keep-alive moved it;
- a term that ended while our leader key may still exist (etcd was out of reach) is
  closed in etcd too: the key is deleted (guarded by its create revision) once etcd
  answers, so the next leader, perhaps this node again, comes with a new epoch;
- one log line per election won, per leadership lost, and per leader seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine
from typing import Any

from . import leaseclock
from .client import EtcdError
from .etcd import ClusterView, EtcdStore

__all__ = ["PRIMARY", "STANDBY", "Elector"]

log = logging.getLogger("rsd")

PRIMARY = "primary"
STANDBY = "standby"
RETRY_SECONDS = 0.2  # after a call to etcd failed, before the next one
STOP_SECONDS = 0.1  # between cancellations of a task that has not ended


class Elector:
    """This node's election (see the module docstring). ``start()`` on the running loop,
    ``await stop()`` at the end."""

    def __init__(
        self,
        store: EtcdStore,
        address: str,
        *,
        may_lead: Callable[[], bool],
        on_primary: Callable[[int], None],
        on_standby: Callable[[str | None, str | None, int], None],
        on_lost: Callable[[], None],
    ) -> None:
        self.store = store
        self.address = address
        self.may_lead = may_lead
        self.on_primary = on_primary
        self.on_standby = on_standby
        self.on_lost = on_lost
        self.epoch = 0  # the epoch of the last view seen, or of our term
        self._loop: asyncio.AbstractEventLoop | None = None
        self._primary = False
        self._deadline = -math.inf
        self._term = 0  # the create revision of our leader key while primary
        self._lapse: asyncio.TimerHandle | None = None
        self._view: ClusterView | None = None
        self._changed = asyncio.Event()
        self._reported: tuple[str | None, str | None, int] | None = None
        self._registered: str | None = None  # the role the member record says
        self._dead_lease = 0  # our last lease etcd said was gone
        self._tasks: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:
        role = PRIMARY if self._primary else STANDBY
        return f"<Elector {self.store.node} {role} epoch={self.epoch}>"

    # ---- what the owner reads ----------------------------------------------------------

    @property
    def deadline(self) -> float:
        """Until when (the loop's clock, as it reads now: any suspend of the machine
        moves it earlier, leaseclock.py) this node may act as primary; -inf when not."""
        return leaseclock.in_loop_time(self._deadline) if self._primary else -math.inf

    @property
    def is_primary(self) -> bool:
        """Whether this node leads now (see the module docstring)."""
        return (self._primary and self._loop is not None
                and leaseclock.now() < self._deadline)

    @property
    def view(self) -> ClusterView | None:
        """The latest view of the cluster's keys (None before the first read)."""
        return self._view

    def reconsider(self) -> None:
        """``may_lead()`` may have become true: campaign soon if there is no leader."""
        self._changed.set()

    # ---- starting and stopping -----------------------------------------------------------

    def start(self) -> None:
        """Start the three tasks on the running loop."""
        assert self._loop is None, "an elector starts once"
        self._loop = asyncio.get_running_loop()
        for work, name in ((self._session, "session"), (self._watching, "watch"),
                           (self._deciding, "decider")):
            self._tasks.append(self._loop.create_task(
                self._guarded(work, name), name=f"elector-{name}"))

    async def stop(self, resign: bool = True) -> None:
        """Stop the tasks; with ``resign``, leave etcd at once (the leader key, if ours,
        and the member record are deleted: a standby takes over without waiting for the
        lease to expire). Without it, the lease runs out by itself, as after a crash.
        ``on_lost`` is not called: the owner is stopping. Once stopped, it does nothing."""
        if not self._tasks:
            return
        tasks, self._tasks = self._tasks, []
        while tasks:
            for task in tasks:  # again and again: aetcd's own waits may lose a cancellation
                task.cancel()
            await asyncio.wait(tasks, timeout=STOP_SECONDS)
            tasks = [task for task in tasks if not task.done()]
        self._end_term()
        if resign:
            try:
                await self.store.resign()
            except EtcdError as exc:
                log.warning("cluster %s: %s could not resign, its lease will expire: %s",
                            self.store.cluster, self.store.node, exc)

    async def _guarded(self, work: Callable[[], Coroutine[Any, Any, None]], name: str) -> None:
        """A task that must not end: an unexpected error is logged, and the work begins
        again after a pause (a bug must not leave a primary without its deadline checks,
        which are timers and keep running anyway)."""
        while True:
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cluster %s: elector %s of %s failed; starting it again",
                              self.store.cluster, name, self.store.node)
            await asyncio.sleep(RETRY_SECONDS)

    # ---- the session: the lease and its keep-alives ---------------------------------------

    def _role(self) -> str:
        return PRIMARY if self._primary else STANDBY

    async def _session(self) -> None:
        interval = self.store.lease_seconds / 3
        failing = False
        while True:
            lease = self.store.lease_id
            try:
                if lease is None:
                    role = self._role()
                    await self.store.register(self.address, role)  # remembered for the lease
                    await self.store.open_lease()
                    self._registered = role
                    self._changed.set()
                elif (deadline := await self.store.keep_alive()) is None:
                    self._dead_lease = lease
                    self._lose("the etcd lease is gone")
                    continue
                elif self._primary:
                    self._extend(deadline)
                elif self._view is not None and (
                    self._view.leader is None or self._view.leader_lease == lease
                ):
                    self._changed.set()  # may_lead() may say yes by now; a step down to retry
            except EtcdError as exc:
                if not failing:
                    failing = True
                    log.warning("cluster %s: %s cannot reach etcd: %s", self.store.cluster,
                                self.store.node, exc)
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if failing:
                failing = False
                log.info("cluster %s: %s reaches etcd again", self.store.cluster,
                         self.store.node)
            await asyncio.sleep(interval)

    # ---- the term: its deadline ------------------------------------------------------------

    def _extend(self, deadline: float) -> None:
        if not self._primary or deadline <= self._deadline:
            return
        self._deadline = deadline
        if self._lapse is not None:
            self._lapse.cancel()
        assert self._loop is not None
        self._lapse = self._loop.call_at(leaseclock.in_loop_time(deadline), self._check_lapse)

    def _check_lapse(self) -> None:
        self._lapse = None
        if not self._primary:
            return
        assert self._loop is not None
        if leaseclock.now() >= self._deadline:
            self._lose("no keep-alive reached etcd before the leadership deadline")
        else:  # a timer may fire a little early
            self._lapse = self._loop.call_at(leaseclock.in_loop_time(self._deadline),
                                             self._check_lapse)

    def _end_term(self) -> None:
        self._primary = False
        self._deadline = -math.inf
        self._term = 0
        if self._lapse is not None:
            self._lapse.cancel()
            self._lapse = None

    def _lose(self, why: str) -> None:
        if not self._primary:
            return
        self._end_term()
        log.warning("cluster %s: %s lost leadership at epoch %d: %s", self.store.cluster,
                    self.store.node, self.epoch, why)
        self._reported = None  # the next view is reported, whatever it says
        self._changed.set()
        self.on_lost()

    def _win(self, epoch: int, term: int) -> None:
        assert self._loop is not None
        self.epoch = epoch
        if leaseclock.now() >= self.store.lease_deadline:
            # The campaign outlasted the lease's deadline (a stall): not a term we can use.
            # The next view shows our key, and the decider steps it down.
            log.warning("cluster %s: %s won epoch %d past its leadership deadline; stepping "
                        "down", self.store.cluster, self.store.node, epoch)
            self._changed.set()
            return
        self._primary = True
        self._term = term
        self._deadline = -math.inf
        self._extend(self.store.lease_deadline)
        self._reported = None
        log.info("cluster %s: %s elected primary at epoch %d", self.store.cluster,
                 self.store.node, epoch)
        self.on_primary(epoch)

    # ---- the watch and the decider -------------------------------------------------------

    async def _watching(self) -> None:
        async for view in self.store.watch():
            self._view = view
            self._changed.set()

    async def _deciding(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            if self._view is not None:
                await self._decide(self._view)
            if self._registered != self._role() and self.store.lease_id is not None:
                await self._register()

    async def _register(self) -> None:
        role = self._role()
        try:
            await self.store.register(self.address, role)
        except EtcdError:
            return  # put again with the next lease, or at the next change
        self._registered = role

    async def _decide(self, view: ClusterView) -> None:
        lease = self.store.lease_id
        ours = lease is not None and view.leader_lease == lease
        if self._primary:
            if view.revision < self._term or (ours and view.leader_revision == self._term):
                return  # a view from before our campaign, or our own key
            self._lose("the leader key is no longer ours")
        if ours:
            # Our key from a term that ended here (etcd was out of reach): close it there.
            with contextlib.suppress(EtcdError):  # if not, the next keep-alive brings us back
                await self.store.step_down()
            return
        if view.leader is not None and view.leader_lease == self._dead_lease:
            return  # our key, gone with our lease: its deletion is on its way
        self.epoch = max(self.epoch, view.epoch)
        if view.leader is None:
            self._report(None, None, view.epoch)
            if lease is None or not self.may_lead():
                return
            try:
                epoch = await self.store.campaign()
            except EtcdError as exc:
                log.warning("cluster %s: %s could not campaign: %s", self.store.cluster,
                            self.store.node, exc)
                return
            if epoch is not None and self.store.leader_revision is not None:
                self._win(epoch, self.store.leader_revision)
        elif view.leader == self.store.node:
            self._report(None, None, view.epoch, "the leader key is held by an earlier run "
                         "of this node; waiting for its lease to expire")
        else:
            self._report(view.leader, view.address_of(view.leader), view.epoch)

    def _report(self, leader: str | None, address: str | None, epoch: int,
                why: str | None = None) -> None:
        seen = (leader, address, epoch)
        if seen == self._reported:
            return
        self._reported = seen
        cluster, node = self.store.cluster, self.store.node
        if why is not None:
            log.info("cluster %s: %s sees no leader (epoch %d): %s", cluster, node, epoch, why)
        elif leader is None:
            log.info("cluster %s: %s sees no leader (epoch %d)", cluster, node, epoch)
        else:
            log.info("cluster %s: %s sees leader %s at %s (epoch %d)", cluster, node, leader,
                     address, epoch)
        self.on_standby(leader, address, epoch)
