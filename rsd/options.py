"""rsd's options: one table, from which the command line, the config file and the checks
are all built.

Each ``Option`` is declared once: its name (the TOML key; ``--`` plus the name with
dashes is the flag), its kind, its default, its allowed range or choices, its help text
and whether SIGHUP may change it while rsd runs. From the table:
- ``build_parser`` makes the argparse parser (``rsd --help`` lists every option with its
  default and range);
- ``read_config`` reads a TOML file (``--config PATH``, standard library ``tomllib``);
- ``resolve`` merges defaults < config file < flags and checks every value.

What always holds:
- a value reaches rsd only through ``Option.check``, whether it came from a flag or the
  config file, so both obey one range; a value out of range, of the wrong type, NaN or
  infinite is refused with a message naming the option (``--flag`` or ``FILE: key``)
  and its allowed range, and rsd exits 2 before touching its data directory;
- an unknown key in the config file, or a table where a value belongs, is refused
  naming the file and the key; so is a key given twice (tomllib says only where);
- flags given on the command line always win over the config file, also on reload;
- a test-only option (``test_only``, named ``test_...``) is for rsd's own test suite: a
  flag only (no config file key), and refused, exit 2, unless the environment holds
  ``RSD_TEST_ONLY_OPTIONS=1`` (``TEST_ONLY_ENVIRONMENT``) too, so no production start
  can carry one by accident: it takes a flag and a variable that say "test".
"""

from __future__ import annotations

import argparse
import math
import os
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rsproto import Limits
from rsproto.slots import DEFAULT_SHARD, DEFAULT_SLOTS, MAX_SLOTS

from .cluster.options import NAME_RULE, valid_name
from .disk.journal import POLICIES
from .policy import Policy

if TYPE_CHECKING:
    import tomllib

    from .security.auth import Authenticator
    from .security.tls import TlsFiles

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "OPTIONS",
    "TEST_ONLY_ENVIRONMENT",
    "Option",
    "OptionError",
    "Settings",
    "build_parser",
    "read_config",
    "resolve",
]

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMATS = ("text", "json")

_HOUR = 3600
_TEN_YEARS = 10 * 365 * 24 * _HOUR  # the longest retention/dedupe/tombstone window
# The connection limits' range depends on the file limit: cli.py checks it at start.
_CONNECTIONS_NOTE = "from 1 to what the file limit allows, checked at start"

# Kinds: how a value is written on the command line and in TOML.
SECONDS = "seconds"  # a finite number > low and <= high (int or float in TOML)
INTEGER = "integer"  # a whole number in [low, high]
CHOICE = "choice"  # one of ``choices``, case-insensitive
ADDRESS = "address"  # HOST:PORT
PATH = "path"  # a non-empty string
TEXT = "text"  # a non-empty string that is not a path (a name, a list of endpoints)
FLAG = "flag"  # present or not on the command line; true/false in TOML

# The variable (name, value) without which a test-only option is refused.
TEST_ONLY_ENVIRONMENT = ("RSD_TEST_ONLY_OPTIONS", "1")


class OptionError(Exception):
    """A value that rsd refuses; the message names where it came from and the range."""


@dataclass(frozen=True)
class Option:
    name: str
    kind: str
    default: Any
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    reload: bool = False  # SIGHUP may change it while rsd runs
    cli_only: bool = False  # not a config file key (an action, or the file itself)
    metavar: str | None = None
    range_note: str = ""  # said after the range in messages and help
    aliases: tuple[str, ...] = ()  # older names, as flags and config keys
    test_only: bool = False  # for rsd's own tests: needs TEST_ONLY_ENVIRONMENT (cli_only)
    valid: Callable[[str], bool] | None = None  # a TEXT value's rule (said in range_note)

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def allowed(self) -> str:
        """The allowed values, as said in ``--help`` and in every refusal."""
        note = f" ({self.range_note})" if self.range_note else ""
        if self.kind == SECONDS:
            assert self.low is not None and self.high is not None
            return (f"a number of seconds greater than {_num(self.low)} and at most "
                    f"{_num(self.high)}{note}")
        if self.kind == INTEGER:
            if self.low is None or self.high is None:
                return "a whole number" + note
            return f"a whole number from {_num(self.low)} to {_num(self.high)}{note}"
        if self.kind == CHOICE:
            return "one of " + ", ".join(self.choices) + " (any case)"
        if self.kind == ADDRESS:
            return "HOST:PORT, port from 0 to 65535 (0 picks a free one)"
        if self.kind == FLAG:
            return "true or false"
        if self.kind == TEXT:
            return "a non-empty string" + note
        return "a path"

    def parse_text(self, text: str) -> Any:
        """A command-line value, checked. OptionError says what is wrong (not where)."""
        if self.test_only:
            variable, value = TEST_ONLY_ENVIRONMENT
            if os.environ.get(variable) != value:
                raise OptionError(
                    f"is for rsd's own tests only, and refused unless the environment "
                    f"holds {variable}={value} too (a production rsd never sets it)"
                )
        if self.kind == SECONDS:
            try:
                return self.check(float(text))
            except ValueError:
                raise OptionError(f"must be {self.allowed()}, got {text!r}") from None
        if self.kind == INTEGER:
            try:
                return self.check(int(text))
            except ValueError:
                raise OptionError(f"must be {self.allowed()}, got {text!r}") from None
        return self.check(text)

    def parse_toml(self, value: Any) -> Any:
        """A config-file value, checked: TOML types must match the kind."""
        wanted = {
            SECONDS: (int, float), INTEGER: (int,), CHOICE: (str,), ADDRESS: (str,),
            PATH: (str,), TEXT: (str,), FLAG: (bool,),
        }[self.kind]
        if isinstance(value, bool) != (self.kind == FLAG) or not isinstance(value, wanted):
            raise OptionError(
                f"must be {self.allowed()}, got the {type(value).__name__} {value!r}"
            )
        return self.check(float(value) if self.kind == SECONDS else value)

    def check(self, value: Any) -> Any:
        """``value`` in range (normalised: choices in their canonical case, addresses
        parsed). OptionError otherwise."""
        if value is None:
            return None  # "not set": only defaults are None, and they mean "work it out"
        kind = self.kind
        if kind == SECONDS:
            assert self.low is not None and self.high is not None
            if not (math.isfinite(value) and self.low < value <= self.high):
                raise OptionError(f"must be {self.allowed()}, got {value!r}")
            return value
        if kind == INTEGER:
            if self.low is not None and self.high is not None and not (
                self.low <= value <= self.high
            ):
                raise OptionError(f"must be {self.allowed()}, got {value!r}")
            return value
        if kind == CHOICE:
            for choice in self.choices:
                if choice.lower() == str(value).lower():
                    return choice
            raise OptionError(f"must be {self.allowed()}, got {value!r}")
        if kind == ADDRESS:
            return _address(value, self)
        if kind in (PATH, TEXT):
            if not value or "\0" in value or (self.valid is not None and not self.valid(value)):
                raise OptionError(f"must be {self.allowed()}, got {value!r}")
            return value
        return bool(value)


def _address(value: str | tuple[str, int], option: Option) -> tuple[str, int]:
    if isinstance(value, tuple):  # already parsed (the default)
        value = "{}:{}".format(*value)
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise OptionError(f"must be {option.allowed()}, got {value!r}")
    return host.strip("[]"), int(port)


def _seconds(name: str, default: float, high: float, text: str, note: str) -> Option:
    return Option(name, SECONDS, default, text, low=0, high=high, metavar="SECONDS",
                  range_note=note)


def _num(value: float) -> str:
    """A number as people write it: 315360000, not 3.1536e+08."""
    return str(int(value)) if float(value).is_integer() else repr(value)


OPTIONS: tuple[Option, ...] = (
    Option("config", PATH, None, "read options from this TOML file (keys are the option "
           "names with underscores, e.g. retention_seconds = 3600); flags override it",
           cli_only=True, metavar="PATH"),
    Option("listen", ADDRESS, Policy.LISTEN, "address to listen on (ignored when systemd "
           "passes a listening socket: rsd.socket)", metavar="HOST:PORT"),
    Option("data_dir", PATH, Policy.DATA_DIR, "directory for the journal and snapshots",
           metavar="DIR"),
    Option("fsync", CHOICE, Policy.FSYNC, "always: no change is acknowledged before it is "
           "on disk (group commit); everysec: fsync once a second, a crash loses at most "
           "about the last second; no: leave it to the OS", choices=POLICIES),
    Option("snapshot_bytes", INTEGER, Policy.SNAPSHOT_BYTES, "write a snapshot and drop old "
           "journal segments once this much journal has been written since the last one",
           low=4096, high=1 << 40, metavar="BYTES", range_note="4 KiB to 1 TiB"),
    _seconds("retention_seconds", Policy.RETENTION_SECONDS, _TEN_YEARS,
             "how long a finished task keeps its result before it is tombstoned", "10 years"),
    _seconds("dedupe_seconds", Policy.DEDUPE_SECONDS, _TEN_YEARS,
             "how long a message's work_key deduplicates sends", "10 years"),
    _seconds("tombstone_seconds", Policy.TOMBSTONE_SECONDS, _TEN_YEARS,
             "how long a tombstoned task (past retention) is still known by id and key "
             "before it is forgotten", "10 years"),
    Option("run_retention_seconds", SECONDS, Policy.RUN_RETENTION_SECONDS,
           "how long a run that holds nothing (no claim, task, tombstone, message, slot or "
           "wait) is kept, then freed: naming it is then NOT_FOUND, its id free to create "
           "again", low=1, high=_TEN_YEARS, metavar="SECONDS", range_note="10 years"),
    _seconds("handshake_timeout", Policy.HANDSHAKE_TIMEOUT_SECONDS, _HOUR,
             "close connections that have not sent HELLO within this time", "an hour"),
    _seconds("frame_timeout", Policy.FRAME_TIMEOUT_SECONDS, _HOUR,
             "close a connection whose frame is not complete this long after its first "
             "byte", "an hour"),
    Option("max_connections", INTEGER, None, "most client connections served at once; more "
           "are refused with RESOURCE_EXHAUSTED (default: the file limit minus the "
           "descriptors kept for the journal, snapshots and accept bursts, which is also "
           "the maximum)", metavar="N", range_note=_CONNECTIONS_NOTE),
    Option("max_connections_per_peer", INTEGER, None, "most connections served at once "
           f"from one IP address (default {Policy.MAX_CONNECTIONS_PER_PEER}, or "
           "--max-connections if lower)", metavar="N", range_note=_CONNECTIONS_NOTE),
    Option("max_client_buffer_bytes", INTEGER, Policy.MAX_CLIENT_BUFFER_BYTES, "most bytes "
           "held for all clients together (unfinished frames, unsent output); past it the "
           "connections holding the most are closed with RESOURCE_EXHAUSTED",
           low=Policy.MIN_CLIENT_BUFFER_BYTES, high=1 << 40, metavar="BYTES"),
    Option("max_payload_bytes_per_tenant", INTEGER, Policy.MAX_PAYLOAD_BYTES_PER_TENANT,
           "most payload bytes (task and message data, results, dead letters; encoded "
           "sizes) one tenant may store at once; a request past it is refused with "
           "RESOURCE_EXHAUSTED. A 'limit <tenant> max_payload_bytes_per_tenant=<bytes>' line "
           "in the tokens file sets one tenant's own; reloaded on SIGHUP",
           low=Policy.MIN_PAYLOAD_BYTES_PER_TENANT,
           high=Policy.MAX_PAYLOAD_BYTES_PER_TENANT_CAP, metavar="BYTES",
           range_note="256 KiB to 1 TiB", reload=True),
    Option("tokens_file", PATH, None, "require a token in every HELLO: lines "
           "'<sha256:digest> <tenant> <admin|client>' (make them with `rsd token new TENANT "
           "ROLE`); reloaded on SIGHUP. Without it rsd serves loopback clients only",
           metavar="FILE", reload=True),
    Option("insecure", FLAG, False, "allow listening on a non-loopback address with no "
           "authentication (anyone who reaches the port can do anything)"),
    Option("tls_cert", PATH, None, "serve TLS with this certificate chain (PEM); needs "
           "tls_key; reloaded on SIGHUP", metavar="FILE", reload=True),
    Option("tls_key", PATH, None, "the private key of tls_cert (PEM)", metavar="FILE",
           reload=True),
    Option("tls_client_ca", PATH, None, "require client certificates signed by these CAs "
           "(PEM); a 'cert:<CN> <tenant> <role>' line in the tokens file maps a certificate "
           "to a tenant", metavar="FILE"),
    Option("repair", FLAG, False, "start even if the journal is damaged in the middle, "
           "keeping the longest valid prefix (damaged files are kept aside as *.damaged); "
           "a one-off action, so a command-line flag only", cli_only=True),
    Option("log_level", CHOICE, "INFO", "least severe log events written to stderr",
           choices=LOG_LEVELS, reload=True),
    Option("log_format", CHOICE, "text", "text: one line per event, key=value extras; "
           "json: one JSON object per line (time, level, logger, message, extras)",
           choices=LOG_FORMATS, reload=True),
    Option("http_listen", ADDRESS, None, "serve HTTP at HOST:PORT: Prometheus metrics at "
           "/metrics (no authentication, and the series name tenants and mailboxes), the "
           "dashboard at / and its JSON API at /api/ (an admin token as 'Authorization: "
           "Bearer' with tokens_file; without one, loopback only, and rsd refuses a "
           "non-loopback address); TLS as the protocol port's (tls_cert)",
           metavar="HOST:PORT", aliases=("metrics_listen",)),
    # A cluster (rsd/cluster/): with etcd, this rsd is one node, primary or standby.
    Option("etcd", TEXT, None, "run as a node of a cluster whose primary etcd elects: the "
           "etcd members' client endpoints, HOST:PORT[,HOST:PORT...] (http:// or https:// "
           "may lead each); needs cluster and node", metavar="ENDPOINTS"),
    Option("cluster", TEXT, None, "the cluster's name (its keys in etcd are under "
           "/rsd/NAME/): 1 to 63 letters, digits, dots, dashes, underscores",
           metavar="NAME"),
    Option("node", TEXT, None, "this node's name in its cluster, unique in it (same form "
           "as cluster)", metavar="NAME"),
    Option("advertise", ADDRESS, None, "the address clients and other nodes reach this node "
           "at (default: the address it listens on)", metavar="HOST:PORT"),
    Option("cluster_lease_seconds", INTEGER, 5, "the etcd lease of a node, in seconds: a "
           "primary that cannot renew it within this time stops answering, and a standby "
           "takes over after it", low=2, high=60, metavar="SECONDS"),
    Option("cluster_token_file", PATH, None, "a file holding an admin token of the "
           "cluster's tokens file, for following the primary (needed with --tokens-file)",
           metavar="FILE"),
    Option("cluster_ca", PATH, None, "when the nodes serve TLS: the CAs (PEM) a standby "
           "checks the primary's certificate against (default: the system's); a standby "
           "presents its own tls_cert, for a primary that requires client certificates",
           metavar="FILE"),
    # Scale-out (rsproto/slots.py): the cluster's slots, and the shard this node is of.
    Option("slots", INTEGER, DEFAULT_SLOTS, "the slots of a sharded cluster, fixed when it "
           "is first made (stored in etcd: a node started with another number refuses to "
           "start); a run belongs to the slot of its id. Alone, one shard holds them all",
           low=1, high=MAX_SLOTS, metavar="N"),
    Option("shard", TEXT, None, "the shard (an HA group: one primary, its standbys) this "
           f"node is of; nodes without it form the shard {DEFAULT_SHARD!r}, today's one "
           "group. Ignored without --etcd", metavar="NAME", range_note=NAME_RULE,
           valid=valid_name),
    Option("etcd_cacert", PATH, None, "speak TLS to etcd, checking its certificate against "
           "these CAs (PEM)", metavar="FILE"),
    Option("etcd_cert", PATH, None, "a client certificate for etcd (PEM); needs etcd_key",
           metavar="FILE"),
    Option("etcd_key", PATH, None, "the private key of etcd_cert (PEM)", metavar="FILE"),
    # For rsd's own tests: a lease that must run out runs out in a second, not in the
    # protocol's 5 (the HELLO reply announces the lower min_lease_seconds).
    Option("test_min_lease_seconds", SECONDS, None, "FOR RSD'S OWN TESTS ONLY, refused "
           f"unless {TEST_ONLY_ENVIRONMENT[0]}={TEST_ONLY_ENVIRONMENT[1]} is in the "
           "environment too: the shortest lease a request may ask for, below the "
           f"protocol's {Limits.MIN_LEASE_SECONDS} s, so that tests waiting out a lease "
           "wait less (a number of seconds greater than 0 and at most "
           f"{Limits.MIN_LEASE_SECONDS})", low=0, high=Limits.MIN_LEASE_SECONDS,
           metavar="SECONDS", cli_only=True, test_only=True),
    # For rsd's own tests: /readyz says "unready" after a change held a second, not 5.
    Option("test_unready_wait_seconds", SECONDS, None, "FOR RSD'S OWN TESTS ONLY, refused "
           f"unless {TEST_ONLY_ENVIRONMENT[0]}={TEST_ONLY_ENVIRONMENT[1]} is in the "
           "environment too: how long a change may wait for its acknowledgement before "
           f"/readyz says the node is unready, below the {Policy.UNREADY_WAIT_SECONDS:g} s "
           "rsd is built with, so that the test of it waits less (a number of seconds "
           f"greater than 0 and at most {Policy.UNREADY_WAIT_SECONDS:g})", low=0,
           high=Policy.UNREADY_WAIT_SECONDS, metavar="SECONDS", cli_only=True,
           test_only=True),
    # For rsd's own tests: strays dropped after a fraction of a second, not 2 leases.
    Option("test_stray_settle_seconds", SECONDS, None, "FOR RSD'S OWN TESTS ONLY, refused "
           f"unless {TEST_ONLY_ENVIRONMENT[0]}={TEST_ONLY_ENVIRONMENT[1]} is in the "
           "environment too: how long runs of slots the slot map gives another shard are "
           "kept before they are dropped as strays, instead of twice the cluster lease, so "
           "that a test of the drop waits less (a number of seconds greater than 0 and at "
           "most 120)", low=0, high=120, metavar="SECONDS", cli_only=True, test_only=True),
    # For rsd's own tests and bench: the fan-out of one task's events measured past the
    # protocol's per-task rate (bench.progress).
    Option("test_progress_rate", INTEGER, None, "FOR RSD'S OWN TESTS ONLY, refused unless "
           f"{TEST_ONLY_ENVIRONMENT[0]}={TEST_ONLY_ENVIRONMENT[1]} is in the environment "
           "too: a task's progress events per second (and twice that in a burst) instead "
           f"of the protocol's {Limits.PROGRESS_EVENTS_PER_SECOND}, so that bench can "
           "measure one task's fan-out past it (1 to 1000000)", low=1, high=1_000_000,
           metavar="EVENTS", cli_only=True, test_only=True),
)

BY_NAME: dict[str, Option] = {option.name: option for option in OPTIONS}
ALIASES: dict[str, str] = {alias: option.name for option in OPTIONS for alias in option.aliases}


def _help(option: Option) -> str:
    parts = []
    if option.kind == FLAG:
        parts.append("default: off")
    elif option.kind == ADDRESS:
        parts.append("default: {}:{}".format(*option.default) if option.default
                     else "default: off")
    elif option.default is not None:
        value = option.default
        parts.append(f"default: {_num(value) if option.kind in (SECONDS, INTEGER) else value}")
    if option.kind in (SECONDS, INTEGER, CHOICE) and option.default is not None:
        parts.append(option.allowed())
    if option.reload:
        parts.append("SIGHUP reloads it")
    text = option.help + (f" ({'; '.join(parts)})" if parts else "")
    return text.replace("%", "%%")


def build_parser(version: str) -> argparse.ArgumentParser:
    """The command line: every option of the table, no default filled in (a flag that is
    absent stays absent, so the config file can supply it)."""
    parser = argparse.ArgumentParser(
        prog="rsd",
        description="rsd: claims, shared tasks and work queues over leases. Every option "
        "may also be set in the --config file; a flag given here wins over it.",
        argument_default=argparse.SUPPRESS,
    )
    for option in OPTIONS:
        if option.kind == FLAG:
            parser.add_argument(option.flag, action="store_true", help=_help(option))
            continue
        kwargs: dict[str, Any] = {"type": _cli_type(option), "help": _help(option)}
        if option.kind == CHOICE:
            kwargs["metavar"] = "{" + ",".join(option.choices) + "}"
        else:
            kwargs["metavar"] = option.metavar
        flags = [option.flag, *("--" + alias.replace("_", "-") for alias in option.aliases)]
        parser.add_argument(*flags, dest=option.name, **kwargs)
    parser.add_argument("--version", action="version", version=f"rsd {version}")
    return parser


def _cli_type(option: Option) -> Any:
    def parse(text: str) -> Any:
        try:
            return option.parse_text(text)
        except OptionError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = option.name  # argparse names the type in some messages
    return parse


def read_config(path: str) -> dict[str, Any]:
    """The checked values of the TOML file at ``path``, by option name."""
    # Imported here, not at the top: only a start with --config (or a SIGHUP reload of
    # one) reads TOML or suggests a key; a plain start pays for neither (3.5 ms of CPU,
    # tests/test_a_plain_start_imports_only_what_it_uses.py).
    import tomllib
    from difflib import get_close_matches

    try:
        with open(path, "rb") as file:
            text = file.read().decode()
        data = tomllib.loads(text)
    except OSError as exc:
        raise OptionError(f"cannot read the config file {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise OptionError(f"{path}: not valid TOML: not UTF-8 text ({exc.reason} at byte "
                          f"{exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise OptionError(f"{path}: not valid TOML: {_named(exc, text)}") from None
    values: dict[str, Any] = {}
    keys = [option.name for option in OPTIONS if not option.cli_only]
    for key, value in data.items():
        option = BY_NAME.get(ALIASES.get(key, key))
        if option is None or option.cli_only:
            near = get_close_matches(key.replace("-", "_"), keys, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            why = "is a command-line flag only" if option is not None else "is not an option"
            raise OptionError(f"{path}: key {key!r} {why}{hint}; the keys are: "
                              + ", ".join(keys))
        try:
            values[option.name] = option.parse_toml(value)
        except OptionError as exc:
            raise OptionError(f"{path}: {key} {exc}") from None
    return values


_WHERE = re.compile(r"\(at line (\d+), column \d+\)")
_TWICE = ("Cannot overwrite a value", "Cannot declare")


def _named(exc: tomllib.TOMLDecodeError, text: str) -> str:
    """tomllib's message, with the key it refused a second value for named: it says only
    where ("Cannot overwrite a value (at line 47, column 14)"), and the key is the one
    that line sets (``key = value``) or declares (``[table]``)."""
    message = str(exc)
    where = _WHERE.search(message)
    lines = text.splitlines()
    if not message.startswith(_TWICE) or where is None or int(where[1]) > len(lines):
        return message
    line = lines[int(where[1]) - 1].strip()
    key = line.strip("[]").strip() if line.startswith("[") else line.partition("=")[0].strip()
    return f"key {key!r} is given twice (again at line {where[1]}: {message})"


class Settings(argparse.Namespace):
    """Every option's value (attributes by option name), with where each came from:
    ``flags`` holds the values given on the command line, ``configured`` the merged
    values before anything was derived from them (what SIGHUP compares)."""

    flags: dict[str, Any]
    configured: dict[str, Any]

    # Each option's value, as ``Option.check`` gives it (one annotation per OPTIONS entry:
    # tests/test_every_option_has_one_declared_type.py). None: not set.
    config: str | None
    listen: tuple[str, int]
    data_dir: str
    fsync: str
    snapshot_bytes: int
    retention_seconds: float
    dedupe_seconds: float
    tombstone_seconds: float
    run_retention_seconds: float
    handshake_timeout: float
    frame_timeout: float
    max_connections: int | None  # worked out from the file limit when not set (cli.py)
    max_connections_per_peer: int | None  # likewise
    max_client_buffer_bytes: int
    max_payload_bytes_per_tenant: int
    tokens_file: str | None
    insecure: bool
    tls_cert: str | None
    tls_key: str | None
    tls_client_ca: str | None
    repair: bool
    log_level: str
    log_format: str
    http_listen: tuple[str, int] | None
    etcd: str | None
    cluster: str | None
    node: str | None
    advertise: tuple[str, int] | None
    cluster_lease_seconds: int
    slots: int
    shard: str | None  # None: DEFAULT_SHARD
    cluster_token_file: str | None
    cluster_ca: str | None
    etcd_cacert: str | None
    etcd_cert: str | None
    etcd_key: str | None
    test_min_lease_seconds: float | None  # None: the protocol's Limits.MIN_LEASE_SECONDS
    test_progress_rate: int | None  # None: the protocol's Limits.PROGRESS_EVENTS_PER_SECOND
    test_unready_wait_seconds: float | None  # None: Policy.UNREADY_WAIT_SECONDS
    test_stray_settle_seconds: float | None  # None: twice the cluster lease (slotimport.py)

    # Worked out by cli.py before it serves.
    backlog: int
    max_refused_lingering: int
    auth: Authenticator
    tls: TlsFiles | None

    @property
    def min_lease_seconds(self) -> float:
        """The shortest lease the core takes: the protocol's, unless a test lowered it."""
        lowered = self.test_min_lease_seconds
        return Limits.MIN_LEASE_SECONDS if lowered is None else lowered

    @property
    def unready_wait_seconds(self) -> float:
        """How long a change may wait before /readyz says unready: rsd's, unless a test
        lowered it."""
        lowered = self.test_unready_wait_seconds
        return Policy.UNREADY_WAIT_SECONDS if lowered is None else lowered

    def source(self, name: str) -> str:
        """How a message names option ``name``: its flag, or the config file's key."""
        option = BY_NAME[name]
        if name not in self.flags and getattr(self, "config", None):
            return f"{self.config}: {name}"
        return option.flag


def resolve(flags: Mapping[str, Any], config: Iterable[tuple[str, Any]] = ()) -> Settings:
    """Defaults, overridden by ``config`` (checked values from ``read_config``),
    overridden by ``flags`` (checked values from the command line)."""
    merged = {option.name: option.default for option in OPTIONS}
    merged.update(config)
    merged.update(flags)
    settings = Settings(**merged)
    settings.flags = dict(flags)
    settings.configured = dict(merged)
    return settings
