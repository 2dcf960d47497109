"""One node of a cluster (``rsd --etcd ...``): a standby that follows the primary, or the
primary, as etcd decides (elector.py), on one client port.

- As a standby, the node serves no client: its port answers NOT_PRIMARY, naming the
  primary (notprimary.py); it follows the primary's journal (follower.py) and holds a
  hot copy of its state.
- At start it reads its own directory as the records left it (``load``): a standby's
  state (its STREAM_AT says up to which batch of which epoch; core/streamat.py) is held
  and followed on from there, without a new copy if the primary still has the batches
  after it; a primary's own state is kept aside, to be recovered only if it leads again.
- It campaigns only when it holds every acknowledged change (``may_lead``): as the
  synchronous standby named in etcd, holding the current epoch primary's stream (also
  after a restart of its own: its directory holds every batch it acknowledged); as the
  node that led the current epoch, from a directory that says it led that epoch (a
  restart of the primary, when nobody took over; an emptied or older directory may
  not); or in a cluster that never had a primary (epoch 0: nothing was ever
  acknowledged).
- Elected, it becomes the primary at the new epoch: its hot copy is promoted (every
  live lease gets one full lease, ids and generations jump: ``Core.promoted``), or,
  without one, its own directory is recovered as at a plain start; it serves clients
  and feeds the standbys (feeds.py), and names the synchronous standby in etcd before
  relying on it.
- A primary whose leadership may have lapsed (its deadline passed without an answered
  keep-alive, its lease or key gone) answers nothing more (``Server.lapsed``: every
  connection aborted, held replies dropped) and the process exits with
  ``EXIT_STEPPED_DOWN``: its supervisor starts it again, and it comes back as a standby
  that takes a fresh copy from the new primary (its own journal may hold changes the
  cluster never acknowledged, which the copy replaces).
- The replication stream's deadline (feeds.py) is the cluster lease: the time after
  which the cluster already counts a silent node as gone (its etcd lease, and with it
  its member record, runs out; a primary that long without an answered keep-alive stops
  acting). A standby that has acknowledged nothing for that long is hung, not slow (a
  healthy one acknowledges each batch within an fsync), so replacing it takes no
  healthy standby's place; and a hung synchronous standby then costs the writes about
  one lease and an etcd write, within what a takeover costs (two leases and a second).
- Under ``--fsync always``, a primary whose changes have waited that long while no
  standby acknowledged anything (it is cut off from them, but not from etcd) steps
  down (``_step_down``) when the synchronous standby named in etcd is a live member
  (it keeps its etcd lease, so it is alive and reaches etcd): it answers nothing more,
  gives up the leader key at once and exits ``EXIT_STEPPED_DOWN``; that standby, which
  holds every acknowledged change, takes over without waiting for a lease to run out.
  Under ``everysec`` and ``no`` a primary acknowledges without its standbys, so it
  keeps leading.
- A clean stop (SIGTERM) ends the same way whatever happens meanwhile: it names no
  synchronous standby any more (its standbys stop following as it stops), and the end
  of its term (the elector stops; a core timer that still fires sees no leadership)
  does not turn into ``EXIT_STEPPED_DOWN``: it stops serving, resigns and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import ssl
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cluster.client import EtcdError
from ..cluster.elector import Elector
from ..cluster.etcd import ClusterView, EtcdStore
from ..core import Core
from ..disk.journal import Journal
from ..disk.recovery import RecoveryReport
from ..disk.snapshots import Snapshots
from ..notprimary import NotPrimary
from ..server import Server
from ..startup import replay
from ..wire.feeds import Feeds
from .follower import Follower, FollowRefused, Standby, StreamBroken, refused_primary

__all__ = ["EXIT_STEPPED_DOWN", "ClusterNode"]

log = logging.getLogger("rsd")

EXIT_STEPPED_DOWN = 75  # EX_TEMPFAIL: leadership lapsed; start again (as a standby)
FOLLOW_RETRY_SECONDS = 0.2


@dataclass
class Own:
    """A node's directory as it was at start, when it was not a standby's: the state,
    its journal, whether its last stop was clean, and the epoch it says it led (None:
    none, a new directory or a single rsd's)."""

    core: Core
    journal: Journal
    clean: bool
    led: int | None


class ClusterNode:
    """This node's role and what goes with it (see the module docstring)."""

    def __init__(
        self,
        store: EtcdStore,
        address: str,
        directory: Path,
        new_core: Callable[[], Core],
        new_server: Callable[..., Server],
        *,
        policy: str,
        snapshot_bytes: int,
        token: str | None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``address``: this node's advertised HOST:PORT; ``new_core``: an empty core
        with the server's options; ``new_server(core, journal, snapshots, feeds,
        on_lapsed)``: the server around a core; ``token``: an admin token for following
        a primary that requires one."""
        self.store = store
        self.address = address
        self.directory = Path(directory)
        self.new_core = new_core
        self.new_server = new_server
        self.policy = policy
        self.snapshot_bytes = snapshot_bytes
        self.follower = Follower(
            directory, new_core, cluster=store.cluster, node=store.node, token=token,
            policy=policy, snapshot_bytes=snapshot_bytes, tls=tls,
        )
        self.elector = Elector(
            store, address, may_lead=self.may_lead, on_primary=self._on_primary,
            on_standby=self._on_standby, on_lost=self._on_lost,
        )
        self.server: Server | None = None
        self.takeovers = 0  # times this process became the primary
        self.primary: str | None = None  # the primary's address, as last seen
        self.epoch = 0
        self.view: ClusterView | None = None
        # This node's directory as it was at start, when it is a primary's own (or new):
        # recovered if this node leads again, else closed once it follows.
        self.own: Own | None = None
        self._following: asyncio.Task[None] | None = None
        self._follow_to: str | None = None
        # Set once this process is on its way out (a clean stop, or a step down): its
        # term ends as it leaves, which is no cause for another exit.
        self.leaving = False
        self.listener: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()  # kept until done (the loop keeps weak ones)

    # ---- the client port -----------------------------------------------------------------

    def protocol(self) -> asyncio.Protocol:
        """The listener's factory: the server's connection as primary, else NOT_PRIMARY."""
        if self.server is not None:
            return self.server.protocol_factory()
        return NotPrimary(self.where)

    def where(self) -> tuple[str | None, int]:
        return self.primary, self.epoch

    @property
    def role(self) -> str:
        if self.server is not None:
            return "primary"
        return "standby" if self.follower.standby is not None else "joining"

    def unready(self) -> str | None:
        """Why this node cannot do its job now, one line (None: it can): the primary
        serving with its journal keeping up (``Server.unready``), a standby caught up
        with its primary (``Follower.unready``). O(1): /readyz (http/probes.py)."""
        if self.leaving:
            return "leaving the cluster (stopping or stepping down)"
        if self.server is not None:
            return self.server.unready()
        return self.follower.unready()

    # ---- running ---------------------------------------------------------------------------

    def load(self, now: float) -> RecoveryReport:
        """Read this node's directory as its records left it (RecoveryError if it
        cannot be used): a standby's state is held by the follower; any other is ``own``.
        Returns what recovery found (logged by the start, as a single rsd's)."""
        core = self.new_core()
        journal, report = replay(self.directory, core, now, policy=self.policy)
        at = core.stream_mark.at
        if at is not None and not at.led:
            log.info("cluster %s: %s holds batch %d of epoch %d from its directory",
                     self.store.cluster, self.store.node, at.batch, at.epoch,
                     extra={"epoch": at.epoch, "batch": at.batch})
            self.follower.hold(Standby(core, journal,
                                       Snapshots(journal, core, self.snapshot_bytes),
                                       at.epoch, at.batch))
            return report
        self.own = Own(core, journal, report.clean, at.epoch if at is not None else None)
        return report

    def _drop_own(self) -> None:
        own, self.own = self.own, None
        if own is not None:
            own.journal.close()

    def start(self, listener: asyncio.base_events.Server) -> None:
        self.listener = listener
        self.elector.start()

    async def stop(self) -> None:
        """A clean stop: stop serving (what no standby holds is never sent), stop
        following, then leave etcd at once (a standby takes over without waiting for the
        lease to run out)."""
        self.leaving = True
        if self.server is not None:
            await self.server.stop()
            if self.server.feeds is not None:
                self.server.feeds.close()
        await self._stop_following()
        self.follower.close()
        await self.elector.stop(resign=True)

    # ---- the election's callbacks ------------------------------------------------------------

    def may_lead(self) -> bool:
        """Whether this node holds every acknowledged change (the module docstring)."""
        view = self.elector.view
        if view is None:
            return False
        node = self.store.node
        if view.epoch == 0:
            return True
        standby = self.follower.standby
        if view.sync == node and standby is not None and standby.epoch == view.epoch:
            return True
        if view.last_leader != node:
            return False
        # It won the current epoch: as its primary, from a directory that says so (not
        # one emptied or older), or as the synchronous standby of the epoch before,
        # whose term ended before it served anything (a promotion that failed): nobody
        # else has led since.
        if standby is None:
            return self.own is not None and self.own.led == view.epoch
        return view.sync == node and standby.epoch == view.epoch - 1

    def _on_standby(self, leader: str | None, address: str | None, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)
        self.follower.known_epoch = max(self.follower.known_epoch, epoch)
        self.primary = address
        if self.server is not None:
            return  # (a primary hears of no other leader but through on_lost)
        if leader is not None and address is not None and leader != self.store.node:
            self._follow(address)

    def _on_primary(self, epoch: int) -> None:
        self.epoch = max(self.epoch, epoch)
        self.primary = self.address
        self._background(self._lead(epoch), "cluster-lead")

    def _on_lost(self) -> None:
        server = self.server
        if server is not None:
            server.lapsed()  # answers nothing more; exits through _lapsed
        else:
            self._lapsed()

    def _lapsed(self) -> None:
        if self.leaving:  # (the server answers nothing more; the stop goes on)
            log.info("cluster %s: %s's term ended as it leaves", self.store.cluster,
                     self.store.node)
            return
        log.warning("cluster %s: %s steps down (leadership may have lapsed); exiting %d to "
                    "start again as a standby", self.store.cluster, self.store.node,
                    EXIT_STEPPED_DOWN)
        _exit(EXIT_STEPPED_DOWN)

    def _silent(self) -> None:
        """No standby has acknowledged anything for the cluster lease while changes
        wait (feeds.py): step down if the synchronous standby named in etcd is a live
        member, which may then take over (the module docstring)."""
        view = self.elector.view
        server = self.server
        if self.leaving or server is None or view is None or not self.elector.is_primary:
            return
        sync = view.sync
        if sync is None or sync == self.store.node or sync not in view.members:
            return  # no other node may take over: leading on costs nobody anything
        self.leaving = True
        feeds = server.feeds
        quiet = (asyncio.get_running_loop().time() - feeds.acked_at
                 if feeds is not None else math.nan)
        log.warning("cluster %s: %s steps down: no standby has acknowledged anything for "
                    "%.1f s while changes wait; %s, the synchronous standby, may take over",
                    self.store.cluster, self.store.node, quiet, sync,
                    extra={"epoch": self.epoch, "node": sync})
        self._background(self._step_down(server), "cluster-step-down")

    async def _step_down(self, server: Server) -> None:
        """Answer nothing more, give up the leader key (and the lease) at once, and
        exit to start again as a standby."""
        if server.feeds is not None:
            server.feeds.close()
        server.lapsed()  # every connection aborted, held replies dropped
        try:
            await self.elector.stop(resign=True)
        finally:
            log.warning("cluster %s: %s stepped down; exiting %d to start again as a "
                        "standby", self.store.cluster, self.store.node, EXIT_STEPPED_DOWN)
            _exit(EXIT_STEPPED_DOWN)

    # ---- following -----------------------------------------------------------------------

    def _follow(self, address: str) -> None:
        if self._follow_to == address and self._following is not None:
            return
        self._drop_own()  # another leads: a copy of its state replaces this one
        if self._following is not None:
            self._following.cancel()
        self._follow_to = address
        self._following = asyncio.get_running_loop().create_task(
            self._follow_loop(address), name="cluster-follow")

    async def _stop_following(self) -> None:
        task, self._following = self._following, None
        self._follow_to = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _follow_loop(self, address: str) -> None:
        """Follow the primary at ``address`` until another is seen; start again after a
        stream ends (with a new copy)."""
        while self.server is None:
            host, _, port = address.rpartition(":")
            try:
                await self.follower.follow(host.strip("[]"), int(port))
                log.info("cluster %s: the stream from %s ended", self.store.cluster, address)
            except FollowRefused as exc:
                named = refused_primary(exc)
                log.info("cluster %s: %s refused to be followed: %s", self.store.cluster,
                         address, exc)
                if named is not None and named != address:
                    address = self._follow_to = named
                    continue
            except (OSError, StreamBroken, EOFError) as exc:
                log.info("cluster %s: following %s failed: %s", self.store.cluster, address,
                         exc)
            self.elector.reconsider()
            await asyncio.sleep(FOLLOW_RETRY_SECONDS)

    # ---- leading -------------------------------------------------------------------------

    async def _lead(self, epoch: int) -> None:
        """Become the primary of ``epoch`` (``_become``); a node that cannot is no use
        holding the leader key: it exits, and its lease ends its term."""
        try:
            await self._become(epoch)
        except Exception:
            log.exception("cluster %s: %s could not become the primary of epoch %d",
                          self.store.cluster, self.store.node, epoch)
            self._lapsed()

    async def _become(self, epoch: int) -> None:
        """Promote the hot copy (or recover the directory), then serve and feed the
        standbys."""
        await self._stop_following()
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self.follower.standby is not None:
            self._drop_own()
            standby = self.follower.promote(now)
            core, journal, snapshots = standby.core, standby.journal, standby.snapshots
            how = f"its copy (up to batch {standby.last} of epoch {standby.epoch})"
        else:
            own, self.own = self.own, None
            if own is None:  # (may_lead allows none: nothing to lead from)
                raise RuntimeError("neither a copy nor a directory of its own to lead from")
            core, journal = own.core, own.journal
            core.recovered(now, own.clean)
            snapshots = Snapshots(journal, core, self.snapshot_bytes)
            how = "its own directory"
        core.stream_mark.led(epoch, now)  # its directory now says it led this epoch
        journal.write(core.effects.take_records())
        core.effects.take_sync()
        journal.sync_now()
        server: Server | None = None

        def acked() -> None:
            if server is not None and server.commit is not None:
                server.commit.acked()

        def propose(node: str | None) -> None:
            if not self.leaving:  # (stopping, its standbys stop following: none is named)
                self._background(self._name_sync(feeds, node), "cluster-name-sync")

        feeds = Feeds(core, loop, lambda: epoch, acked, propose,
                      silence=float(self.store.lease_seconds),
                      on_silent=self._silent if self.policy == "always" else None)
        server = self.new_server(core, journal, snapshots, feeds, self._lapsed)
        server.leadership = lambda: self.elector.deadline
        server.cluster_status = self.status
        self.takeovers += 1
        if self.listener is not None:
            await server.start("", 0, listener=self.listener)
        self.server = server
        log.info("cluster %s: %s is the primary (epoch %d), from %s", self.store.cluster,
                 self.store.node, epoch, how, extra={"epoch": epoch})

    async def _name_sync(self, feeds: Feeds, node: str | None) -> None:
        """Name ``node`` the synchronous standby in etcd, then rely on it."""
        try:
            named = await self.store.name_sync(node)
        except EtcdError as exc:
            log.warning("cluster %s: could not name %s the synchronous standby: %s",
                        self.store.cluster, node, exc)
            named = False
        if named:
            log.info("cluster %s: %s is named the synchronous standby", self.store.cluster,
                     node, extra={"node": node})
            feeds.named(node)
        else:
            feeds.named(None)  # not named: another is proposed later

    def _background(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def status(self) -> dict[str, Any]:
        """The cluster as this node sees it (SERVER_STATS' ``cluster``, ``rsctl cluster``):
        ``{cluster, epoch, primary, members: [{node, address, role, sync, lag_records,
        lag_bytes}]}``, with ``role`` "primary", "standby" or "joining" (no copy yet),
        ``lag_records`` and ``lag_bytes`` what the primary has journaled that the member
        has not acknowledged (None when not known here), and this node's own ``node``,
        ``role`` and ``takeovers``."""
        view = self.elector.view
        feeds = self.server.feeds if self.server is not None else None
        lag = feeds.lag() if feeds is not None else {}
        sync = feeds.sync.node if feeds is not None and feeds.sync is not None else (
            view.sync if view is not None else None)
        leader = view.leader if view is not None else None
        members = []
        for name, record in sorted((view.members if view is not None else {}).items()):
            role = "primary" if name == leader else (
                "standby" if name in lag or name == sync else "joining")
            if name == self.store.node:
                role = self.role
            behind = (0, 0) if role == "primary" else lag.get(name)
            members.append({
                "node": name, "address": record.get("address"), "role": role,
                "sync": name == sync,
                "lag_records": behind[0] if behind is not None else None,
                "lag_bytes": behind[1] if behind is not None else None,
            })
        return {
            "cluster": self.store.cluster, "epoch": self.epoch, "primary": leader,
            "members": members, "node": self.store.node, "role": self.role,
            "takeovers": self.takeovers,
        }


def _exit(code: int) -> None:
    """Leave the process at once with ``code`` (after the log is out): nothing of this
    node may act any more, not even a cleanup."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(code)
