"""``rsd`` / ``python -m rsd``: parse options, lock the data directory, serve until SIGTERM.

On SIGTERM or SIGINT: stop accepting, flush what is pending, close, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from . import __version__
from .core import Core
from .datadir import DataDir, DataDirLocked
from .descriptors import budget, raise_file_limit
from .journal import POLICIES
from .logfile import FileDamaged
from .policy import Policy
from .recovery import RecoveryError
from .server import Server
from .snapshots import Snapshots
from .startup import recover

__all__ = ["main", "parse_args"]

log = logging.getLogger("rsd")


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {value!r}") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {value!r}")
    return number


def _count(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None


def parse_args(
    argv: list[str] | None = None, file_limit: int | None = None
) -> argparse.Namespace:
    """The options. With ``file_limit`` (the soft RLIMIT_NOFILE rsd runs with), the
    connection limits are resolved against it: defaults filled in, values out of range
    refused (exit 2, naming the option and its range)."""
    parser = argparse.ArgumentParser(
        prog="rsd", description="rsd: claims, shared tasks and work queues over leases"
    )
    parser.add_argument(
        "--listen", type=_listen, default=Policy.LISTEN, metavar="HOST:PORT",
        help="address to listen on (default 127.0.0.1:7420; port 0 picks a free one)",
    )
    parser.add_argument(
        "--data-dir", default=Policy.DATA_DIR, metavar="DIR",
        help="directory for the journal and snapshots (default ./var)",
    )
    parser.add_argument(
        "--handshake-timeout", type=_positive, default=Policy.HANDSHAKE_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="close connections that have not sent HELLO within this time (default %(default)s)",
    )
    parser.add_argument(
        "--frame-timeout", type=_positive, default=Policy.FRAME_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="close a connection whose frame is not complete this long after its first "
        "byte (default %(default)s)",
    )
    parser.add_argument(
        "--max-connections", type=_count, default=None, metavar="N",
        help="most client connections served at once; more are refused with "
        "RESOURCE_EXHAUSTED (default and maximum: the file limit minus the descriptors "
        "kept for the journal, snapshots and accept bursts)",
    )
    parser.add_argument(
        "--max-connections-per-peer", type=_count, default=None, metavar="N",
        help="most connections served at once from one IP address (default "
        f"{Policy.MAX_CONNECTIONS_PER_PEER}, or --max-connections if lower)",
    )
    parser.add_argument(
        "--retention-seconds", type=_positive, default=Policy.RETENTION_SECONDS,
        metavar="SECONDS",
        help="how long a finished task keeps its result before it is tombstoned "
        "(default %(default)s, 7 days)",
    )
    parser.add_argument(
        "--dedupe-seconds", type=_positive, default=Policy.DEDUPE_SECONDS, metavar="SECONDS",
        help="how long a message's work_key deduplicates sends (default %(default)s, 7 days)",
    )
    parser.add_argument(
        "--tombstone-seconds", type=_positive, default=Policy.TOMBSTONE_SECONDS,
        metavar="SECONDS",
        help="how long a tombstoned task (past retention) is still known by id and key "
        "before it is forgotten (default %(default)s, 30 days)",
    )
    parser.add_argument(
        "--fsync", choices=POLICIES, default=Policy.FSYNC,
        help="always: no change is acknowledged before it is on disk (group commit); "
        "everysec: fsync once a second, a crash loses at most about the last second; "
        "no: leave it to the OS (default %(default)s)",
    )
    parser.add_argument(
        "--snapshot-bytes", type=int, default=Policy.SNAPSHOT_BYTES, metavar="BYTES",
        help="write a snapshot and drop old journal segments once this much journal "
        "has been written since the last one (default %(default)s)",
    )
    parser.add_argument(
        "--repair", action="store_true",
        help="start even if the journal is damaged in the middle, keeping the longest "
        "valid prefix (damaged files are kept aside as *.damaged)",
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
    )
    parser.add_argument("--version", action="version", version=f"rsd {__version__}")
    args = parser.parse_args(argv)
    if file_limit is not None:
        _resolve_connection_limits(parser, args, file_limit)
    return args


def _resolve_connection_limits(
    parser: argparse.ArgumentParser, args: argparse.Namespace, file_limit: int
) -> None:
    share = budget(file_limit)
    ceiling = share.max_connections
    why = (
        f"the file limit {file_limit} minus {share.reserved} descriptors kept for "
        f"persistence, {share.backlog} for the accept backlog and {share.refused} for "
        "refused connections"
    )
    if ceiling < 1:
        parser.error(f"the file limit ({file_limit}) is too low to serve connections: {why}")
    if args.max_connections is None:
        args.max_connections = ceiling
    elif not 1 <= args.max_connections <= ceiling:
        parser.error(
            f"--max-connections must be from 1 to {ceiling} ({why}), "
            f"got {args.max_connections}"
        )
    if args.max_connections_per_peer is None:
        args.max_connections_per_peer = min(Policy.MAX_CONNECTIONS_PER_PEER, args.max_connections)
    elif not 1 <= args.max_connections_per_peer <= args.max_connections:
        parser.error(
            f"--max-connections-per-peer must be from 1 to --max-connections "
            f"({args.max_connections}), got {args.max_connections_per_peer}"
        )
    args.backlog = share.backlog
    args.max_refused_lingering = share.refused


def _new_scope_id() -> str:
    return secrets.token_hex(12)


async def serve(args: argparse.Namespace) -> int:
    loop = asyncio.get_running_loop()
    core = Core(
        _new_scope_id,
        wall_offset=time.time() - loop.time(),
        retention_seconds=args.retention_seconds,
        dedupe_seconds=args.dedupe_seconds,
        tombstone_seconds=args.tombstone_seconds,
        random_bytes=os.urandom,  # the random part of lease handles
    )
    try:
        journal, report = recover(
            Path(args.data_dir), core, loop.time(), policy=args.fsync, repair=args.repair
        )
    except (RecoveryError, FileDamaged) as exc:
        log.critical("cannot recover from %s: %s", args.data_dir, exc)
        return 2
    journal.write(core.effects.take_records())  # the id reservation, before any reply
    core.effects.take_sync()
    journal.sync_now()
    log.info(
        "recovered in %.3f s: snapshot %s (%d records), %d journal records in %d segments%s",
        report.seconds, report.snapshot or "none", report.snapshot_records, report.records,
        report.segments, "" if report.clean else "; the last stop was not clean",
    )
    server = Server(
        core, loop, journal=journal, snapshots=Snapshots(journal, core, args.snapshot_bytes),
        handshake_timeout=args.handshake_timeout,
        frame_timeout=args.frame_timeout,
        max_connections=args.max_connections,
        max_connections_per_peer=args.max_connections_per_peer,
        max_refused_lingering=args.max_refused_lingering,
        backlog=args.backlog,
    )
    host, port = await server.start(*args.listen)
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    print(f"rsd listening on {where}", flush=True)
    log.info(
        "rsd %s listening on %s, data in %s; at most %d connections (%d per peer)",
        __version__, where, args.data_dir, args.max_connections, args.max_connections_per_peer,
    )
    await stopping.wait()
    log.info("rsd stopping")
    await server.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, file_limit=raise_file_limit())
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    data = DataDir(args.data_dir)
    try:
        data.open()
    except DataDirLocked as exc:
        print(f"rsd: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"rsd: cannot use data directory {args.data_dir}: {exc}", file=sys.stderr)
        return 1
    try:
        try:
            import uvloop
        except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
            return asyncio.run(serve(args))
        return uvloop.run(serve(args))
    except OSError as exc:
        print(f"rsd: {exc}", file=sys.stderr)
        return 1
    finally:
        data.close()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
