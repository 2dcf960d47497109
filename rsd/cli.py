"""``rsd`` / ``python -m rsd``: read the options, lock the data directory, bind, recover,
serve until SIGTERM.

The order is what keeps a failed start harmless: options are checked first (exit 2,
nothing touched), then the data directory is locked (exit 1), then the listening
address is taken (exit 1, nothing written), and only then does recovery write to the
journal. On SIGTERM or SIGINT: stop accepting, flush what is pending, close, exit 0.
SIGHUP: reload what may change live (reload.py). systemd is told READY/STOPPING and
pinged from the loop (notify.py).
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
from pathlib import Path
from typing import Any

from rsproto import ErrorCode, error_frame

from . import __version__, logs, tokens
from .api import Api
from .auth import Authenticator, exposure_problem, http_exposure_problem
from .connection import Connection
from .core import Core
from .dashboard import Dashboard
from .datadir import DataDir, DataDirLocked
from .descriptors import budget, raise_file_limit
from .history import History
from .httpserver import DESCRIPTORS as HTTP_DESCRIPTORS
from .httpserver import HttpEndpoint
from .journal import Journal, fatal
from .logfile import FileDamaged
from .metrics import render
from .metricshttp import MetricsPage
from .notify import Notifier, inherited_listener
from .options import OptionError, Settings, build_parser, read_config, resolve
from .policy import Policy
from .randomness import RandomPool
from .recovery import RecoveryError, RecoveryReport
from .reload import Reloader
from .server import Server
from .snapshots import Snapshots
from .startup import recover
from .tls import TlsFiles, tls_option_problem

__all__ = ["main", "parse_args"]

log = logging.getLogger("rsd")


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
        metrics = HTTP_DESCRIPTORS if settings.http_listen is not None else 0
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


def _tenant_limits(args: Settings, core: Core) -> list[str]:
    """Start and SIGHUP: each tenant's payload byte limit, from the tokens file's
    ``limit`` lines, else --max-payload-bytes-per-tenant."""
    table = args.auth.table
    own = {} if table is None else {
        tenant: limits["max_payload_bytes_per_tenant"] for tenant, limits in table.limits.items()
    }
    return core.tenants.set_byte_limits(args.max_payload_bytes_per_tenant, own)


def _reload_security(args: Settings) -> list[str]:
    """SIGHUP: the tokens file and the TLS certificate, each kept as is if bad."""
    changed = []
    if args.auth.reload():
        changed.append("tokens file reloaded")
    if args.tls is not None and args.tls.reload():
        changed.append("TLS certificate reloaded")
    return changed


async def serve(args: Settings, data: DataDir | None = None) -> int:
    """Bind, recover, serve until SIGTERM/SIGINT, stop cleanly. The address is taken
    before recovery writes anything, and from the moment the journal is open until rsd
    serves, any failure closes it cleanly: a start that fails leaves no sign of a crash
    (no "last stop was not clean", no jump of ids and generations at the next start).
    ``data``, the locked data directory, is watched while rsd serves (``_data_dir_lost``)."""
    loop = asyncio.get_running_loop()
    notifier = Notifier.from_env()
    stopping = asyncio.Event()
    # Early: a SIGTERM during recovery is handled once it is done, by a clean stop.
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    reloader = Reloader(args)
    reloader.register("logging", _reload_logging)
    reloader.register("security", lambda settings: _reload_security(args))
    loop.add_signal_handler(signal.SIGHUP, _on_sighup, reloader, notifier)

    if args.etcd is not None:  # a node of a cluster: etcd decides whether it serves
        from .cluster.serve import serve_node

        return await serve_node(
            args, lambda factory: _bind(loop, factory, args),
            lambda: _new_core(args, loop),
            lambda core, journal, snapshots, **cluster: _new_server(
                args, core, loop, journal, snapshots, **cluster),
            stopping, notifier,
        )
    server: Server | None = None

    def connection() -> Connection:
        assert server is not None  # nothing is accepted before the server exists
        return server.protocol_factory()

    try:
        listener = await _bind(loop, connection, args)
    except OSError as exc:
        log.critical("cannot listen on %s:%d: %s", *args.listen, exc)
        return 1

    def metrics_text() -> bytes:
        assert server is not None  # nothing is accepted before the server exists
        return render(server)

    metrics = None
    history = History(loop, lambda: server)  # the dashboard's chart (started with it)
    if args.http_listen is not None:
        api = Api(loop, args.auth, lambda: server, history=history)
        site = Dashboard(MetricsPage(loop, metrics_text), api)
        metrics = HttpEndpoint(loop, site.handle,
                               tls=None if args.tls is None else args.tls.context)
        try:
            metrics_at = await metrics.bind(*args.http_listen)
        except OSError as exc:
            log.critical("cannot serve HTTP on %s:%d: %s", *args.http_listen, exc)
            listener.close()
            return 1
    try:
        core = _new_core(args, loop)
        _tenant_limits(args, core)
        reloader.register("tenant limits", lambda settings: _tenant_limits(args, core))
        try:
            journal, report = recover(
                Path(args.data_dir), core, loop.time(), policy=args.fsync, repair=args.repair
            )
        except (RecoveryError, FileDamaged) as exc:
            log.critical("cannot recover from %s: %s", args.data_dir, exc)
            listener.close()
            if metrics is not None:
                metrics.close()
            return 2
    except BaseException:
        listener.close()
        if metrics is not None:
            metrics.close()
        raise
    try:
        journal.write(core.effects.take_records())  # the id reservation, before any reply
        core.effects.take_sync()
        journal.sync_now()
        _log_recovery(args, report, journal.seq)
        server = _new_server(
            args, core, loop, journal, Snapshots(journal, core, args.snapshot_bytes)
        )
        host, port = args.listen
        host, port = await server.start(host, port, listener=listener)
        if metrics is not None:
            await metrics.start()
            history.start()
    except BaseException:
        listener.close()
        if metrics is not None:
            metrics.close()
        journal.close()  # nothing was served: the stop is clean
        raise
    if metrics is not None:
        mhost, mport = metrics_at
        scheme = "http" if args.tls is None else "https"
        at = f"[{mhost}]:{mport}" if ":" in mhost else f"{mhost}:{mport}"
        log.info("dashboard at %s://%s/, metrics at %s://%s/metrics", scheme, at, scheme, at)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    # Everything about this start is logged before the ready line, so whoever waits for
    # that line (a test, a supervisor) finds the whole story already written.
    log.info(
        "rsd %s listening on %s, data in %s; at most %d connections (%d per peer)",
        __version__, where, args.data_dir, args.max_connections, args.max_connections_per_peer,
    )
    if args.insecure and not (args.tokens_file or args.tls_client_ca):
        log.warning(
            "INSECURE: no authentication (--insecure without --tokens-file): any client that "
            "reaches %s can claim, read, complete and cancel anything", where,
        )
    if data is not None:
        data.watch(loop, lambda problem: _data_dir_lost(server, problem))
    print(f"rsd listening on {where}", flush=True)
    notifier.ready(f"listening on {where}")
    notifier.start_watchdog(loop)
    await stopping.wait()
    notifier.stopping()
    log.info("rsd stopping")
    if data is not None:
        data.stop_watching()
    if metrics is not None:
        metrics.close()
        history.stop()
    await server.stop()
    notifier.close()
    log.info("rsd stopped cleanly")
    return 0


def _new_core(args: Settings, loop: asyncio.AbstractEventLoop) -> Core:
    """An empty core with the options' retention windows (and tenants' limits)."""
    core = Core(
        _new_scope_id,
        wall_offset=time.time() - loop.time(),
        retention_seconds=args.retention_seconds,
        dedupe_seconds=args.dedupe_seconds,
        tombstone_seconds=args.tombstone_seconds,
        run_retention_seconds=args.run_retention_seconds,
        min_lease_seconds=args.min_lease_seconds,
        random_bytes=RandomPool(),  # lease handles' random part: os.urandom, pooled
    )
    _tenant_limits(args, core)
    return core


def _new_server(
    args: Settings, core: Core, loop: asyncio.AbstractEventLoop, journal: Journal,
    snapshots: Snapshots, **cluster: Any,
) -> Server:
    """The server around ``core`` with the options' limits; ``cluster``: a cluster
    primary's ``feeds``, ``cluster`` and ``on_lapsed`` (server.py)."""
    # parse_args worked out the limits left unset (_resolve_connection_limits)
    assert args.max_connections is not None and args.max_connections_per_peer is not None
    return Server(
        core, loop, journal=journal,
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
        **cluster,
    )


def _data_dir_lost(server: Server, problem: str) -> None:
    """The data directory is no longer the one locked (removed, replaced): what rsd
    writes from now on would be lost, and another rsd may start on the path. Every
    connection is told UNAVAILABLE (a connection-level error: its requests in flight
    fail, none is answered as a success; held replies are never sent), then rsd exits
    as on a failed write (exit 74, journal.fatal)."""
    frame = error_frame(0, ErrorCode.UNAVAILABLE, f"rsd is stopping: {problem}")
    for conn in server.conns.values():
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.write(frame)
    fatal(problem)


async def _bind(
    loop: asyncio.AbstractEventLoop, factory: Callable[[], asyncio.BaseProtocol],
    args: Settings,
) -> asyncio.base_events.Server:
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


def _log_recovery(args: Settings, report: RecoveryReport, segment: int) -> None:
    log.info(
        "recovered in %.3f s: snapshot %s (%d records), %d journal records in %d segments%s",
        report.seconds, report.snapshot or "none", report.snapshot_records, report.records,
        report.segments, "" if report.clean else "; the last stop was not clean",
        extra={
            "data_dir": str(args.data_dir), "snapshot": report.snapshot,
            "segments": report.segments, "records": report.records,
            "clean": report.clean, "repaired": report.repaired,
            "truncated": report.truncated, "segment": segment,
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


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["token"]:
        return tokens.command(argv[1:])
    args = parse_args(argv, file_limit=raise_file_limit())
    logs.configure(args.log_level, args.log_format)
    security = _security(args)
    if isinstance(security, str):
        print(f"rsd: {security}", file=sys.stderr)
        return 2
    args.auth, args.tls = security
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
            return asyncio.run(serve(args, data))
        return uvloop.run(serve(args, data))
    except OSError as exc:
        log.critical("%s", exc)
        return 1
    finally:
        data.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
