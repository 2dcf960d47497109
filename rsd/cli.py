"""``rsd`` / ``python -m rsd``: one start, for one rsd alone and for a node of a cluster.

Every start takes the same steps in the same order, and the order is what keeps a failed
start harmless:
1. the options are checked: flags and config file, the tokens and TLS files, and with
   ``--etcd`` the cluster's options taken together (exit 2, nothing touched);
2. the data directory is locked (exit 1);
3. the client address is taken, and the HTTP listener's (exit 1, nothing written);
4. the data directory is read, and what recovery found logged (exit 2 when it cannot
   be used, naming the file); from here until rsd serves, any failure closes the
   journal cleanly: a start that fails leaves no sign of a crash (no "last stop was not
   clean", no jump of ids and generations at the next start);
5. rsd serves: the ready line ``rsd listening on HOST:PORT`` is printed, systemd is told
   READY and pinged from the loop (notify.py), and the data directory is watched (a
   directory removed or replaced stops rsd, exit 74: ``_data_dir_lost``);
6. SIGTERM or SIGINT (also one that came during recovery): stop accepting, flush what is
   pending, close, exit 0. SIGHUP: reload what may change live (reload.py).

What differs is the ``Mode``, the cluster being an option of the one start: ``Alone``
recovers its directory and serves it at once; a node of a cluster (clustermode.py)
answers NOT_PRIMARY from the start, waits for etcd, serves only while etcd makes it the
primary, and exits 75 when that may have lapsed (cluster/node.py).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rsproto import ErrorCode, error_frame
from rsproto.slots import DEFAULT_SHARD, SlotMap

from . import __version__, logs
from .core import Core
from .descriptors import budget, raise_file_limit
from .disk import failpoints
from .disk.datadir import DataDir, DataDirLocked
from .disk.journal import Journal, fatal
from .disk.logfile import FileDamaged
from .disk.recovery import RecoveryError, RecoveryReport
from .disk.snapshots import Snapshots
from .http.history import History
from .metrics import render
from .notify import Notifier, inherited_listener
from .options import OptionError, Settings, build_parser, read_config, resolve
from .policy import Policy
from .randomness import RandomPool
from .reload import Reloader
from .security import tokens
from .security.auth import Authenticator, exposure_problem, http_exposure_problem
from .security.tls import TlsFiles, tls_option_problem
from .server import Server
from .slotowner import SlotOwner
from .startup import recover

if TYPE_CHECKING:
    from .http.httpserver import HttpEndpoint

__all__ = ["Alone", "Mode", "main", "new_core", "new_server", "parse_args", "serve"]

log = logging.getLogger("rsd")

Listener = asyncio.base_events.Server  # the client port: bound first, accepting once served


def parse_args(argv: list[str] | None = None, file_limit: int | None = None) -> Settings:
    """The options: defaults < ``--config`` file < flags, each checked (options.py); a
    bad one exits 2 naming it and its range. With ``file_limit`` (the soft RLIMIT_NOFILE
    rsd runs with), the connection limits are resolved against it: defaults filled in,
    values out of range refused the same way."""
    parser = build_parser(__version__)
    given = vars(parser.parse_args(argv))
    config: dict[str, object] = {}
    if given.get("config"):
        try:
            config = read_config(given["config"])
        except OptionError as exc:
            parser.error(str(exc))
    settings = resolve(given, config.items())
    problem = tls_option_problem(settings.tls_cert, settings.tls_key, settings.tls_client_ca) or (
        exposure_problem(
            settings.listen[0], settings.tokens_file, settings.tls_client_ca, settings.insecure
        )
    )
    if problem is None and settings.http_listen is not None:
        problem = http_exposure_problem(settings.http_listen[0], settings.tokens_file)
    if problem is not None:
        parser.error(problem)
    if file_limit is not None:
        # The HTTP listener's descriptors come off the clients' share.
        metrics = 0
        if settings.http_listen is not None:
            from .http.httpserver import DESCRIPTORS  # imported late: see _listen

            metrics = DESCRIPTORS
        _resolve_connection_limits(parser, settings, file_limit, metrics)
    return settings


def _resolve_connection_limits(
    parser: argparse.ArgumentParser, args: Settings, file_limit: int, metrics: int = 0
) -> None:
    share = budget(file_limit - metrics)
    ceiling = share.max_connections
    why = (
        f"the file limit {file_limit} minus {share.reserved} descriptors kept for "
        f"persistence, {share.backlog} for the accept backlog and {share.refused} for "
        "refused connections" + (f", {metrics} for the HTTP listener" if metrics else "")
    )
    if ceiling < 1:
        parser.error(f"the file limit ({file_limit}) is too low to serve connections: {why}")
    if args.max_connections is None:
        args.max_connections = ceiling
    elif not 1 <= args.max_connections <= ceiling:
        parser.error(
            f"{args.source('max_connections')} must be from 1 to {ceiling} ({why}), "
            f"got {args.max_connections}"
        )
    if args.max_connections_per_peer is None:
        args.max_connections_per_peer = min(Policy.MAX_CONNECTIONS_PER_PEER, args.max_connections)
    elif not 1 <= args.max_connections_per_peer <= args.max_connections:
        parser.error(
            f"{args.source('max_connections_per_peer')} must be from 1 to --max-connections "
            f"({args.max_connections}), got {args.max_connections_per_peer}"
        )
    args.backlog = share.backlog
    args.max_refused_lingering = share.refused


def _new_scope_id() -> str:
    return secrets.token_hex(12)


def _security(args: Settings) -> tuple[Authenticator, TlsFiles | None] | str:
    """Load the tokens file and TLS files named by the options; or why they cannot be."""
    try:
        auth = Authenticator(args.tokens_file)
    except tokens.TokenFileError as exc:
        return str(exc)
    tls = None
    if args.tls_cert:
        assert args.tls_key is not None  # parse_args: a certificate goes with its key
        try:
            tls = TlsFiles(args.tls_cert, args.tls_key, args.tls_client_ca)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            return f"cannot use the TLS files (--tls-cert, --tls-key, --tls-client-ca): {exc}"
    return auth, tls


def _tenant_limits(args: Settings, cores: list[Core]) -> list[str]:
    """Start and SIGHUP: each tenant's payload byte limit, from the tokens file's
    ``limit`` lines, else --max-payload-bytes-per-tenant, in every core this rsd holds."""
    table = args.auth.table
    own = {} if table is None else {
        tenant: limits["max_payload_bytes_per_tenant"] for tenant, limits in table.limits.items()
    }
    changed: dict[str, None] = {}  # the same phrases from each core, said once
    for core in cores:
        changed.update(dict.fromkeys(
            core.tenants.set_byte_limits(args.max_payload_bytes_per_tenant, own)))
    return list(changed)


def _reload_security(args: Settings) -> list[str]:
    """SIGHUP: the tokens file and the TLS certificate, each kept as is if bad."""
    changed = []
    if args.auth.reload():
        changed.append("tokens file reloaded")
    if args.tls is not None and args.tls.reload():
        changed.append("TLS certificate reloaded")
    return changed


# ---- what differs: the mode --------------------------------------------------------------


class Mode(Protocol):
    """What a start does its own way: ``Alone``, or a node of a cluster (clustermode.py);
    every other step is ``serve``'s, the same for both. ``load`` reads the data directory
    (RecoveryError or FileDamaged when it cannot be); ``start`` accepts on the client port
    (``protocol`` makes its connections); ``log_listening`` says what this start is,
    before the ready line; ``run`` serves until ``stopping``; ``stop`` is a clean stop;
    ``abandon`` closes what ``load`` opened after a start that failed, cleanly (nothing
    was served). ``served``: the server clients reach now, if any (the dashboard's, the
    API's); ``status``: the cluster as this node sees it (None alone); ``unready``: why
    this node cannot do its job now (None: it can; /readyz, O(1)); ``cores``: every
    core held now (SIGHUP sets their tenants' limits)."""

    def protocol(self) -> asyncio.BaseProtocol: ...
    def served(self) -> Server | None: ...
    def status(self) -> dict[str, Any] | None: ...
    def unready(self) -> str | None: ...
    def metrics_text(self) -> bytes: ...
    def cores(self) -> list[Core]: ...
    def load(self, listener: Listener) -> RecoveryReport: ...
    async def start(self, listener: Listener) -> None: ...
    def log_listening(self, where: str) -> None: ...
    async def run(self, stopping: asyncio.Event, notifier: Notifier) -> None: ...
    async def stop(self) -> None: ...
    async def abandon(self) -> None: ...


class Alone:
    """One rsd alone: its own data directory recovered, and served at once."""

    def __init__(self, args: Settings) -> None:
        self.args = args
        self.server: Server | None = None
        self._loaded: tuple[Core, Journal] | None = None

    def protocol(self) -> asyncio.BaseProtocol:
        assert self.server is not None  # nothing is accepted before the server exists
        return self.server.protocol_factory()

    def served(self) -> Server | None:
        return self.server

    def status(self) -> None:
        return None

    def unready(self) -> str | None:
        return "starting" if self.server is None else self.server.unready()

    def metrics_text(self) -> bytes:
        assert self.server is not None  # nothing is accepted before the server exists
        return render(self.server)

    def cores(self) -> list[Core]:
        if self.server is not None:
            return [self.server.core]
        return [] if self._loaded is None else [self._loaded[0]]

    def load(self, listener: Listener) -> RecoveryReport:
        args, core = self.args, new_core(self.args)
        now = asyncio.get_running_loop().time()
        journal, report = recover(
            Path(args.data_dir), core, now, policy=args.fsync, repair=args.repair)
        self._loaded = core, journal
        return report

    async def start(self, listener: Listener) -> None:
        assert self._loaded is not None
        core, journal = self._loaded
        journal.write(core.effects.take_records())  # the id reservation, before any reply
        core.effects.take_sync()
        journal.sync_now()
        self.server = new_server(
            self.args, core, journal, Snapshots(journal, core, self.args.snapshot_bytes))
        await self.server.start(*self.args.listen, listener=listener)

    def log_listening(self, where: str) -> None:
        args = self.args
        log.info(
            "rsd %s listening on %s, data in %s; at most %d connections (%d per peer)",
            __version__, where, args.data_dir, args.max_connections,
            args.max_connections_per_peer,
        )

    async def run(self, stopping: asyncio.Event, notifier: Notifier) -> None:
        await stopping.wait()

    async def stop(self) -> None:
        assert self.server is not None
        await self.server.stop()

    async def abandon(self) -> None:
        if self._loaded is not None:
            self._loaded[1].close()  # nothing was served: the stop is clean


# ---- the one start ---------------------------------------------------------------------------


@dataclass
class Listeners:
    """The addresses a start takes before it reads its data directory: the client port,
    and with --http-listen the dashboard's (its page, the API, /metrics)."""

    clients: Listener
    history: History  # the dashboard's chart, started with it
    http: HttpEndpoint | None = None
    http_at: tuple[str, int] | None = None

    async def start_http(self) -> None:
        if self.http is not None:
            await self.http.start()
            self.history.start()

    def close_http(self) -> None:
        if self.http is not None:
            self.http.close()
            self.history.stop()

    def close(self) -> None:
        self.clients.close()
        if self.http is not None:
            self.http.close()


async def serve(args: Settings, data: DataDir | None, mode: Mode) -> int:
    """Take the addresses, read the data directory, serve until SIGTERM/SIGINT, stop
    cleanly (the module docstring's steps 3 to 6); the exit code. ``data``, the locked
    data directory, is watched while rsd serves."""
    loop = asyncio.get_running_loop()
    notifier = Notifier.from_env()
    stopping = _handle_signals(loop, args, notifier, mode)
    listeners = await _listen(loop, args, mode)
    if listeners is None:
        return 1
    if not await _open(args, mode, listeners):
        return 2
    _announce(loop, args, mode, listeners, notifier, data)
    await mode.run(stopping, notifier)
    notifier.stopping()
    log.info("rsd stopping")
    if data is not None:
        data.stop_watching()
    listeners.close_http()
    await mode.stop()
    listeners.clients.close()
    notifier.close()
    log.info("rsd stopped cleanly")
    return 0


def _handle_signals(
    loop: asyncio.AbstractEventLoop, args: Settings, notifier: Notifier, mode: Mode
) -> asyncio.Event:
    """SIGTERM and SIGINT set the event returned; SIGHUP reloads. Early: a SIGTERM during
    recovery is handled once it is done, by a clean stop."""
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    reloader = Reloader(args)
    reloader.register("logging", _reload_logging)
    reloader.register("security", lambda settings: _reload_security(args))
    reloader.register("tenant limits", lambda settings: _tenant_limits(args, mode.cores()))
    loop.add_signal_handler(signal.SIGHUP, _on_sighup, reloader, notifier)
    return stopping


async def _listen(loop: asyncio.AbstractEventLoop, args: Settings, mode: Mode) -> Listeners | None:
    """The client port and the HTTP listener, bound but not yet accepting; None (logged)
    if either address cannot be taken."""
    try:
        clients = await _bind(loop, mode.protocol, args)
    except OSError as exc:
        log.critical("cannot listen on %s:%d: %s", *args.listen, exc)
        return None
    listeners = Listeners(clients, History(loop, mode.served))
    if args.http_listen is None:
        return listeners
    # Imported only for a start that serves HTTP: h11 and the dashboard cost every other
    # start 15 ms of CPU (tests start rsd hundreds of times a run).
    from .http.api import Api
    from .http.dashboard import Dashboard
    from .http.httpserver import HttpEndpoint
    from .http.metricshttp import MetricsPage
    from .http.probes import Probes
    from .http.shardviews import Sharded

    api = Api(loop, args.auth, mode.served, mode.status, listeners.history, fanout=Sharded)
    site = Dashboard(MetricsPage(loop, mode.metrics_text), api, Probes(mode.unready))
    listeners.http = HttpEndpoint(loop, site.handle,
                                  tls=None if args.tls is None else args.tls.context)
    try:
        listeners.http_at = await listeners.http.bind(*args.http_listen)
    except OSError as exc:
        log.critical("cannot serve HTTP on %s:%d: %s", *args.http_listen, exc)
        clients.close()
        return None
    return listeners


async def _open(args: Settings, mode: Mode, listeners: Listeners) -> bool:
    """Read the data directory, log what recovery found, and start serving; False
    (logged, the listeners closed) if the directory cannot be used. Any other failure
    closes what was opened, the journal cleanly, and is raised."""
    try:
        try:
            report = mode.load(listeners.clients)
        except (RecoveryError, FileDamaged) as exc:
            log.critical("cannot recover from %s: %s", args.data_dir, exc)
            listeners.close()
            await mode.abandon()
            return False
        _log_recovery(args, report)
        await mode.start(listeners.clients)
        await listeners.start_http()
    except BaseException:
        listeners.close()
        await mode.abandon()
        raise
    return True


def _announce(
    loop: asyncio.AbstractEventLoop, args: Settings, mode: Mode, listeners: Listeners,
    notifier: Notifier, data: DataDir | None,
) -> None:
    """Everything about this start is logged before the ready line, so whoever waits for
    that line (a test, a supervisor) finds the whole story already written."""
    if listeners.http_at is not None:
        scheme = "http" if args.tls is None else "https"
        at = _where(*listeners.http_at)
        log.info("dashboard at %s://%s/, metrics at %s://%s/metrics", scheme, at, scheme, at)
    where = _where(*listeners.clients.sockets[0].getsockname()[:2])
    mode.log_listening(where)
    if args.insecure and not (args.tokens_file or args.tls_client_ca):
        log.warning(
            "INSECURE: no authentication (--insecure without --tokens-file): any client that "
            "reaches %s can claim, read, complete and cancel anything", where,
        )
    if data is not None:
        data.watch(loop, lambda problem: _data_dir_lost(mode.served(), problem))
    print(f"rsd listening on {where}", flush=True)
    notifier.ready(f"listening on {where}")
    notifier.start_watchdog(loop)


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def new_core(args: Settings) -> Core:
    """An empty core with the options' retention windows (and tenants' limits)."""
    core = Core(
        _new_scope_id,
        wall_offset=time.time() - asyncio.get_running_loop().time(),
        retention_seconds=args.retention_seconds,
        dedupe_seconds=args.dedupe_seconds,
        tombstone_seconds=args.tombstone_seconds,
        run_retention_seconds=args.run_retention_seconds,
        min_lease_seconds=args.min_lease_seconds,
        progress_rate=args.test_progress_rate,
        random_bytes=RandomPool(),  # lease handles' random part: os.urandom, pooled
    )
    _tenant_limits(args, [core])
    return core


def new_server(
    args: Settings, core: Core, journal: Journal, snapshots: Snapshots, **cluster: Any,
) -> Server:
    """The server around ``core`` with the options' limits; ``cluster``: a cluster
    primary's ``feeds``, ``cluster``, ``on_lapsed`` and ``slots`` (server.py). Its slots
    unless given: every one of ``--slots``, to ``--shard`` in a cluster (until the map in
    etcd is adopted), to the default shard alone."""
    shard = (args.shard or DEFAULT_SHARD) if args.etcd is not None else DEFAULT_SHARD
    cluster.setdefault("slots", SlotOwner(SlotMap.whole(shard, args.slots, 0, None), shard))
    # parse_args worked out the limits left unset (_resolve_connection_limits)
    assert args.max_connections is not None and args.max_connections_per_peer is not None
    return Server(
        core, asyncio.get_running_loop(), journal=journal,
        snapshots=snapshots,
        handshake_timeout=args.handshake_timeout,
        frame_timeout=args.frame_timeout,
        max_connections=args.max_connections,
        max_connections_per_peer=args.max_connections_per_peer,
        max_refused_lingering=args.max_refused_lingering,
        backlog=args.backlog,
        max_client_buffer_bytes=args.max_client_buffer_bytes,
        auth=args.auth,
        tls=None if args.tls is None else args.tls.context,
        loopback_only=not (args.tokens_file or args.tls_client_ca or args.insecure),
        collector=True,
        unready_wait_seconds=args.unready_wait_seconds,
        **cluster,
    )


def _data_dir_lost(server: Server | None, problem: str) -> None:
    """The data directory is no longer the one locked (removed, replaced): what rsd
    writes from now on would be lost, and another rsd may start on the path. Every
    connection to the server (if this rsd serves one) is told UNAVAILABLE (a
    connection-level error: its requests in flight fail, none is answered as a success;
    held replies are never sent), then rsd exits as on a failed write (exit 74,
    journal.fatal)."""
    frame = error_frame(0, ErrorCode.UNAVAILABLE, f"rsd is stopping: {problem}")
    for conn in server.conns.values() if server is not None else ():
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.write(frame)
    fatal(problem)


async def _bind(
    loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.BaseProtocol],
    args: Settings,
) -> Listener:
    """The listening address, taken but not yet accepting: the socket systemd passed
    (rsd.socket), or ``--listen``."""
    sock = inherited_listener()
    if sock is not None:
        log.info("serving the socket systemd passed; --listen is not used")
        return await loop.create_server(
            factory, sock=sock, backlog=args.backlog, start_serving=False
        )
    host, port = args.listen
    return await loop.create_server(
        factory, host, port, reuse_address=True, backlog=args.backlog, start_serving=False
    )


def _log_recovery(args: Settings, report: RecoveryReport) -> None:
    log.info(
        "recovered in %.3f s: snapshot %s (%d records), %d journal records in %d segments%s",
        report.seconds, report.snapshot or "none", report.snapshot_records, report.records,
        report.segments, "" if report.clean else "; the last stop was not clean",
        extra={
            "data_dir": str(args.data_dir), "snapshot": report.snapshot,
            "segments": report.segments, "records": report.records,
            "clean": report.clean, "repaired": report.repaired,
            "truncated": report.truncated, "segment": report.next_seq,
        },
    )


def _reload_logging(settings: Settings) -> list[str]:
    logs.configure(settings.log_level, settings.log_format)
    return []  # the options' own changes are reported by the reloader


def _on_sighup(reloader: Reloader, notifier: Notifier) -> None:
    notifier.reloading()
    try:
        reloader.reload()
    finally:
        notifier.ready("reloaded")


# ---- the command -----------------------------------------------------------------------------


def _mode(args: Settings) -> Mode | str:
    """Alone, or with --etcd a node of a cluster, its options checked together (what is
    wrong with them, if anything). The cluster's modules (and gRPC) load only then."""
    if args.etcd is None:
        return Alone(args)
    from .clustermode import ClusterMode

    return ClusterMode.from_settings(args, partial(new_core, args), partial(new_server, args))


def main(argv: list[str] | None = None) -> int:
    """The module docstring's steps 1 and 2, then ``serve`` in the event loop; the exit
    code."""
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["token"]:
        return tokens.command(argv[1:])
    if argv[:1] == ["mcp"]:
        # The MCP door is a client of rsd (through rsclient, as rsctl), shipped beside it:
        # imported only here, so a start of rsd itself loads neither it nor the mcp package.
        from rsctl.mcpdoor import main as mcp_door

        return mcp_door(argv[1:])
    failpoints.arm()  # the crash tests' points, read at the start, never at import
    args = parse_args(argv, file_limit=raise_file_limit())
    logs.configure(args.log_level, args.log_format)
    security = _security(args)
    if isinstance(security, str):
        print(f"rsd: {security}", file=sys.stderr)
        return 2
    args.auth, args.tls = security
    mode = _mode(args)
    if isinstance(mode, str):
        log.critical("%s", mode)
        return 2
    data = DataDir(args.data_dir)
    try:
        data.open()
    except DataDirLocked as exc:
        log.critical("%s", exc)
        return 1
    except OSError as exc:
        log.critical("cannot use data directory %s: %s", args.data_dir, exc)
        return 1
    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
            return asyncio.run(serve(args, data, mode))
        return uvloop.run(serve(args, data, mode))
    except OSError as exc:
        log.critical("%s", exc)
        return 1
    finally:
        data.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
