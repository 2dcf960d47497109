"""Every option, from a flag or the config file, is checked at start: a bad value exits 2
with a message naming the option and its allowed range, before rsd touches its data
directory. Flags win over the config file; the config file refuses unknown keys and wrong
types naming the file and the key; ``rsd --help`` documents each option's default and
range. (The connection limits, whose range follows the file limit, are checked in
test_connection_limits.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rsd.cli import parse_args
from rsd.options import OPTIONS, SECONDS
from tests.support.process import REPO, subprocess_env

FILE_LIMIT = 20_000


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        parse_args(argv, file_limit=FILE_LIMIT)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--retention-seconds", "inf", "at most 315360000 (10 years), got inf"),
        ("--retention-seconds", "0", "greater than 0"),
        ("--dedupe-seconds", "inf", "at most 315360000 (10 years), got inf"),
        ("--dedupe-seconds", "-1", "greater than 0"),
        ("--tombstone-seconds", "1e12", "at most 315360000"),
        ("--run-retention-seconds", "1", "greater than 1"),  # a run made must live to be used
        ("--run-retention-seconds", "inf", "at most 315360000 (10 years), got inf"),
        ("--handshake-timeout", "inf", "at most 3600 (an hour), got inf"),
        ("--handshake-timeout", "1e300", "at most 3600 (an hour), got 1e+300"),
        ("--frame-timeout", "nan", "got nan"),
        ("--frame-timeout", "soon", "got 'soon'"),
        ("--snapshot-bytes", "0", "from 4096 to 1099511627776 (4 KiB to 1 TiB), got 0"),
        ("--snapshot-bytes", "-4096", "got -4096"),
        ("--snapshot-bytes", "1.5", "got '1.5'"),
        ("--snapshot-bytes", str(1 << 41), "to 1099511627776"),
        ("--fsync", "sometimes", "one of always, everysec, no"),
        ("--log-level", "verbose", "one of DEBUG, INFO, WARNING, ERROR, CRITICAL"),
        ("--log-format", "xml", "one of text, json"),
        ("--listen", "7420", "HOST:PORT"),
        ("--listen", "localhost:70000", "HOST:PORT"),
        ("--data-dir", "", "a path"),
        ("--slots", "0", "a whole number from 1 to 16384, got 0"),
        ("--slots", "16385", "a whole number from 1 to 16384, got 16385"),
        ("--slots", "many", "got 'many'"),
        ("--shard", "east 1", "1 to 63 letters, digits, '.', '-' or '_', starting with a "
         "letter or digit), got 'east 1'"),
        ("--shard", "_east", "got '_east'"),
        ("--shard", "{acme}", "got '{acme}'"),
    ],
)
def test_a_bad_flag_refuses_to_start_naming_the_option_and_its_range(
    flag: str, value: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused([flag, value], capsys)
    assert f"argument {flag}: must be" in err
    assert says in err


def test_the_log_level_is_case_insensitive() -> None:
    assert parse_args(["--log-level", "debug"]).log_level == "DEBUG"
    assert parse_args(["--log-level", "Warning"]).log_level == "WARNING"
    assert parse_args(["--fsync", "EVERYSEC"]).fsync == "everysec"
    assert parse_args(["--log-format", "JSON"]).log_format == "json"


def test_the_defaults_are_in_range_and_as_documented() -> None:
    args = parse_args([], file_limit=FILE_LIMIT)
    for option in OPTIONS:
        if option.default is not None:
            assert option.check(option.default) == getattr(args, option.name)
    assert args.listen == ("127.0.0.1", 7420)
    assert (args.log_level, args.log_format, args.repair) == ("INFO", "text", False)


def test_help_documents_every_option_with_its_default_and_range(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in OPTIONS:
        assert option.flag in text
        if option.kind == SECONDS:
            assert f"at most {int(option.high or 0)}" in text, option.name
    assert "default: 604800; a number of seconds greater than 0 and at most 315360000" in text
    assert "one of DEBUG, INFO, WARNING, ERROR, CRITICAL (any case); SIGHUP reloads it" in text
    assert "default: 67108864; a whole number from 4096 to 1099511627776" in text


# ---- the config file --------------------------------------------------------------------


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "rsd.toml"
    path.write_text(text)
    return str(path)


def test_the_config_file_sets_options_and_flags_override_it(tmp_path: Path) -> None:
    path = config(tmp_path, "\n".join([
        'listen = "0.0.0.0:7500"',
        "insecure = true",
        'data_dir = "/srv/rsd"',
        "retention_seconds = 3600",
        "dedupe_seconds = 1.5",
        "snapshot_bytes = 1048576",
        'fsync = "everysec"',
        'log_level = "debug"',
        "max_connections = 50",
        "slots = 64",
        'shard = "east"',
    ]))
    args = parse_args(["--config", path], file_limit=FILE_LIMIT)
    assert args.listen == ("0.0.0.0", 7500)
    assert (args.data_dir, args.retention_seconds, args.dedupe_seconds) == ("/srv/rsd", 3600, 1.5)
    assert (args.snapshot_bytes, args.fsync, args.log_level) == (1 << 20, "everysec", "DEBUG")
    assert args.max_connections == 50
    assert args.handshake_timeout == 10  # not in the file: the default
    assert (args.slots, args.shard) == (64, "east")
    assert (parse_args([]).slots, parse_args([]).shard) == (1024, None)  # DEFAULT_SLOTS

    flags = ["--config", path, "--retention-seconds", "60", "--listen", "127.0.0.1:0",
             "--fsync", "always"]
    args = parse_args(flags, file_limit=FILE_LIMIT)
    assert (args.retention_seconds, args.listen, args.fsync) == (60, ("127.0.0.1", 0), "always")
    assert args.dedupe_seconds == 1.5  # the file still supplies what no flag gives
    # A flag given before --config wins just the same.
    args = parse_args(["--retention-seconds", "61", "--config", path])
    assert args.retention_seconds == 61


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("retention_seconds = inf", "retention_seconds must be a number of seconds greater "
         "than 0 and at most 315360000 (10 years), got inf"),
        ("dedupe_seconds = nan", "dedupe_seconds must be"),
        ("handshake_timeout = 1e300", "handshake_timeout must be"),
        ('retention_seconds = "7d"', "retention_seconds must be a number of seconds greater "
         "than 0 and at most 315360000 (10 years), got the str '7d'"),
        ("retention_seconds = true", "got the bool True"),
        ("snapshot_bytes = 0", "snapshot_bytes must be a whole number from 4096"),
        ("snapshot_bytes = 65536.0", "got the float 65536.0"),
        ("fsync = 1", "fsync must be one of always, everysec, no"),
        ('log_level = "loud"', "log_level must be one of DEBUG"),
        ("listen = 7420", "listen must be HOST:PORT"),
        ("retention-seconds = 60", "key 'retention-seconds' is not an option (did you mean "
         "retention_seconds?)"),
        ("colour = 1", "key 'colour' is not an option"),
        ("repair = true", "key 'repair' is a command-line flag only"),
        ("config = 'other.toml'", "key 'config' is a command-line flag only"),
        ("[server]\nlisten = '127.0.0.1:1'", "key 'server' is not an option"),
        ("retention_seconds = ", "not valid TOML"),
        ("# rsd\nlisten = '127.0.0.1:1'\nfsync = 'no'\nlisten = '127.0.0.1:2'",
         "not valid TOML: key 'listen' is given twice (again at line 4"),
        ("[server]\nlisten = 1\n[server]\nfsync = 1", "key 'server' is given twice"),
        ("max_connections = 0", "max_connections must be from 1 to"),
        ("slots = 0", "slots must be a whole number from 1 to 16384, got 0"),
        ('slots = "1024"', "got the str '1024'"),
        ('shard = "a/b"', "shard must be a non-empty string (1 to 63 letters"),
        ("shard = 7", "got the int 7"),
    ],
)
def test_a_bad_config_file_refuses_to_start_naming_the_file_and_key(
    text: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = config(tmp_path, text + "\n")
    err = refused(["--config", path], capsys)
    assert f"{path}: " in err
    assert says in " ".join(err.split())


def test_a_config_file_that_is_not_utf8_refuses_to_start_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "rsd.toml"
    path.write_bytes(b'listen = "\xff"\n')
    err = refused(["--config", str(path)], capsys)
    assert f"{path}: not valid TOML: not UTF-8 text" in err


def test_a_missing_config_file_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["--config", str(tmp_path / "nowhere.toml")], capsys)
    assert "cannot read the config file" in err and "nowhere.toml" in err


def test_the_sample_config_file_is_valid_and_says_the_defaults() -> None:
    path = REPO / "systemd" / "rsd.toml"
    args = parse_args(["--config", str(path)], file_limit=FILE_LIMIT)
    defaults = parse_args([], file_limit=FILE_LIMIT)
    assert args.data_dir == "/var/lib/rsd"
    for option in OPTIONS:
        if option.name not in ("data_dir", "config"):
            assert getattr(args, option.name) == getattr(defaults, option.name), option.name


def test_rsd_refuses_a_bad_option_before_touching_its_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = subprocess.run(
        [sys.executable, "-m", "rsd", "--data-dir", str(data), "--retention-seconds", "inf"],
        capture_output=True, text=True, env=subprocess_env(), cwd=REPO, timeout=30,
    )
    assert proc.returncode == 2
    assert "--retention-seconds: must be" in proc.stderr
    assert not data.exists()
