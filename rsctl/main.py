"""rsctl's command line: arguments, the connection, and the exit status.

``--address`` defaults like the SDK's (``$RUNSTATE_ADDRESS``, then 127.0.0.1:7420;
``tls://HOST:PORT`` for TLS), ``--token`` to ``$RUNSTATE_TOKEN``, ``--connect-timeout``
to the SDK's. ``--ca`` (the CA that signed rsd's certificate, in place of the system's),
``--cert`` and ``--key`` (a client certificate, for ``--tls-client-ca``) become the SDK's
``tls=`` context; any of them means TLS. Exit status: 0 done; 1 the server refused or
could not be reached (the error's code and message on stderr); 2 a usage error (also a
CA or certificate file that cannot be read); ``journal verify`` has its own (offline.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ssl
import sys
from collections.abc import Callable
from typing import Any

from rsclient import AsyncRunstate, RunstateError
from rsclient.connection import DEFAULT_CONNECT_TIMEOUT

from . import backup, offline, slots
from .online import COMMANDS
from .render import UsageError
from .top import top

__all__ = ["UsageError", "build_parser", "main", "run", "tls_context"]


def _common(parser: argparse.ArgumentParser, default: object) -> None:
    """The options every command takes, before or after its name (``default``: the
    sub-command's are SUPPRESS, so they do not overwrite what was given before it)."""
    parser.add_argument("--address", default=default,
                        help="HOST:PORT or tls://HOST:PORT of rsd, or a comma-separated list "
                        "of a cluster's nodes (default: $RUNSTATE_ADDRESS, then 127.0.0.1:7420)")
    parser.add_argument("--token", default=default,
                        help="an admin token (default: $RUNSTATE_TOKEN)")
    parser.add_argument("--json", action="store_true",
                        default=False if default is None else default,
                        help="print JSON instead of tables")
    parser.add_argument("--connect-timeout", type=float,
                        default=DEFAULT_CONNECT_TIMEOUT if default is None else default,
                        metavar="SECONDS",
                        help=f"give up reaching rsd after this long (default "
                        f"{DEFAULT_CONNECT_TIMEOUT:g}, as the SDK)")
    parser.add_argument("--ca", default=default, metavar="FILE",
                        help="TLS: trust the CA certificates in this PEM file (rsd's own "
                        "CA, e.g. a self-signed one) instead of the system's")
    parser.add_argument("--cert", default=default, metavar="FILE",
                        help="TLS: present this client certificate (PEM; with its key "
                        "unless --key names another file)")
    parser.add_argument("--key", default=default, metavar="FILE",
                        help="TLS: the private key of --cert (PEM)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rsctl", description="Inspect and operate a running rsd (admin token needed).",
    )
    _common(parser, None)
    common = argparse.ArgumentParser(add_help=False)
    _common(common, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, text: str, tenant: bool = True) -> argparse.ArgumentParser:
        cmd = sub.add_parser(name, help=text, description=text, parents=[common])
        if tenant:
            cmd.add_argument("--tenant", default=None,
                             help="another tenant's objects (default: the token's tenant)")
        return cmd

    stats = command("stats", "the server's figures (SERVER_STATS), with request rates",
                    tenant=False)
    stats.add_argument("--interval", type=float, default=1.0,
                       help="seconds between the two samples rates are computed from")
    command("scopes", "every run (scope)")
    command("claims", "the claims of a run").add_argument("scope")
    _item_commands(command)
    command("pools", "every pool")
    command("quotas", "every quota: limit, refill period, level now, waiters")
    command("mailboxes", "every mailbox: its settings and its depth over all runs")
    command("groups", "the task groups of a run: tasks by state, waiters").add_argument("scope")
    _operating_commands(command)
    command("schedules", "a run's schedules: next and last fire, paused (your own tenant's)",
            tenant=False).add_argument("scope")
    cancel = command("cancel", "cancel a run: its tasks end CANCELLED, its claims end")
    cancel.add_argument("scope")
    cancel.add_argument("reason")
    command("snapshot", "force a snapshot now; returns once it is written", tenant=False)
    command("cluster", "the cluster: its epoch, primary and members (role, synchronous "
            "standby, lag), and with shards each shard's; any member's address will do",
            tenant=False)
    slots.add_parser(sub, common)
    backup.add_parser(sub, common)
    live = command("top", "a live view, refreshed every second until Ctrl-C")
    live.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes")
    live.add_argument("--iterations", type=int, default=None,
                      help="stop after this many refreshes")
    journal = sub.add_parser("journal", help="read a data directory offline (no server)")
    what = journal.add_subparsers(dest="action", required=True, metavar="ACTION")
    what.add_parser("verify", help="check every file; exit 0 whole, 1 torn tail, 2 damaged",
                    parents=[common]).add_argument("dir")
    what.add_parser("dump", help="print every record", parents=[common]).add_argument("dir")
    return parser


def _operating_commands(command: Callable[..., argparse.ArgumentParser]) -> None:
    """The commands that act on a run's work rather than list it: ``mailbox`` (and its
    pause and resume) and ``signal`` (``command`` adds one, as ``build_parser``'s does)."""
    mailbox = command("mailbox", "a mailbox's counts in a run: ready, running, delayed, "
                      "waiting, parked consumers, dead letters, paused (your own tenant's); "
                      "`mailbox pause|resume NAME [--run RUN]` pauses or resumes it",
                      tenant=False)
    mailbox.add_argument("scope", help="the run, or the action: pause or resume")
    mailbox.add_argument("mailbox")
    mailbox.add_argument("--run", default=None,
                         help="pause or resume it in this run alone (default: every run)")
    signal = command("signal", "signal a task of a run (your own tenant's): a task waiting "
                     "for that name is ready again, one not yet waiting keeps it",
                     tenant=False)
    signal.add_argument("scope", help="the task's run")
    signal.add_argument("task", help="the task id")
    signal.add_argument("name", help="the signal's name")
    signal.add_argument("--data", default=None, help="the signal's data, as JSON")


def _item_commands(command: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """The commands on a run's tasks and messages: ``tasks``, ``task``, ``dead-letters``
    (``command`` adds one, as ``build_parser``'s does)."""
    tasks = command("tasks", "the tasks and messages of a run")
    tasks.add_argument("scope")
    tasks.add_argument("--state", default=None,
                       help="only this state (PENDING, RUNNING, SUCCEEDED, FAILED, ...)")
    tasks.add_argument("--mailbox", default=None, help="only this mailbox")
    task = command("task", "one task or message in full")
    task.add_argument("scope")
    task.add_argument("id")
    dead = command("dead-letters", "a mailbox's dead letters in a run; requeue or delete them")
    dead.add_argument("scope")
    dead.add_argument("mailbox")
    how = dead.add_mutually_exclusive_group()
    how.add_argument("--requeue", metavar="ID", default=None,
                     help="put this dead letter back on the queue as a new item")
    how.add_argument("--all", action="store_true", help="requeue every dead letter")
    how.add_argument("--delete", metavar="ID", default=None,
                     help="delete this dead letter for good")


def tls_context(args: argparse.Namespace) -> ssl.SSLContext | None:
    """The SDK's ``tls=`` from ``--ca``, ``--cert`` and ``--key`` (None without them: then
    ``tls://`` alone still means TLS against the system's CAs)."""
    if args.ca is None and args.cert is None and args.key is None:
        return None
    if args.key is not None and args.cert is None:
        raise UsageError("--key needs --cert (the certificate it is the key of)")
    try:
        context = ssl.create_default_context(cafile=args.ca)
        if args.cert is not None:
            context.load_cert_chain(args.cert, args.key)
    except (OSError, ssl.SSLError) as exc:
        named = ", ".join(
            f"{flag} {value}" for flag, value in
            (("--ca", args.ca), ("--cert", args.cert), ("--key", args.key)) if value
        )
        raise UsageError(f"cannot load {named}: {exc}") from None
    return context


async def _online(args: argparse.Namespace) -> int:
    run = top if args.command == "top" else COMMANDS[args.command]
    options: dict[str, Any] = {"tls": tls_context(args)}
    if args.connect_timeout is not None:
        options["connect_timeout"] = args.connect_timeout
    args.reach = {"token": args.token, **options}  # for the other shards' primaries
    async with AsyncRunstate(
        holder="rsctl", address=args.address, token=args.token, **options
    ) as rs:
        return await run(rs, args)


async def run(argv: list[str]) -> int:
    """One rsctl command in the running event loop; its exit status."""
    args = build_parser().parse_args(argv)
    if args.command == "journal":
        return offline.verify(args) if args.action == "verify" else offline.dump(args)
    try:
        return await _online(args)
    except UsageError as exc:
        print(f"rsctl: {exc}", file=sys.stderr)
        return 2
    except RunstateError as exc:
        print(f"rsctl: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    try:
        return asyncio.run(run(sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:
        return 0


def _entry() -> None:
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())


if __name__ == "__main__":
    _entry()
