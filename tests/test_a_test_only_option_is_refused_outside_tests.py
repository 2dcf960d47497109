"""rsd's own tests may lower the shortest lease (``--test-min-lease-seconds``) so that a
test waiting out a lease waits a second, not the protocol's 5; no production rsd can.

The option takes a flag AND an environment variable that both say "test": without
``RSD_TEST_ONLY_OPTIONS=1`` rsd refuses the flag (exit 2, naming the variable, before it
touches its data directory), a config file cannot set it at all, and a value above the
protocol's minimum is refused (it only ever lowers). Lowered, the one lease rule takes
the lower bound everywhere a lease length is asked for (claims, pool slots, receives, a
settlement's next receive, renewals with a new length), and HELLO announces it, so a
client checks against what the server takes. Unset, everything is the protocol's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.core import CoreDriver
from support.process import REPO, subprocess_env

from rsd.cli import parse_args
from rsd.options import TEST_ONLY_ENVIRONMENT
from rsd.policy import announced_limits
from rsproto import ErrorCode, Limits, Op

VARIABLE, VALUE = TEST_ONLY_ENVIRONMENT
FLAG = "--test-min-lease-seconds"


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("set_to", [None, "0", "yes", "true"])
def test_the_flag_is_refused_without_the_variable_naming_it(
    set_to: str | None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    if set_to is None:
        monkeypatch.delenv(VARIABLE, raising=False)
    else:
        monkeypatch.setenv(VARIABLE, set_to)
    err = refused([FLAG, "1"], capsys)
    assert f"argument {FLAG}: is for rsd's own tests only" in err
    assert f"{VARIABLE}={VALUE}" in err


def test_a_config_file_cannot_set_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, VALUE)
    path = tmp_path / "rsd.toml"
    path.write_text("test_min_lease_seconds = 1\n")
    err = refused(["--config", str(path)], capsys)
    assert "key 'test_min_lease_seconds' is a command-line flag only" in err


@pytest.mark.parametrize("value", ["0", "-1", "5.5", "nan", "inf"])
def test_it_only_lowers_the_minimum(
    value: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, VALUE)
    err = refused([FLAG, value], capsys)
    assert f"argument {FLAG}: must be a number of seconds greater than 0 and at most 5" in err


def test_with_the_variable_it_lowers_the_minimum_and_unset_it_is_the_protocols(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    assert parse_args([]).min_lease_seconds == Limits.MIN_LEASE_SECONDS
    monkeypatch.setenv(VARIABLE, VALUE)
    assert parse_args([FLAG, "0.5"]).min_lease_seconds == 0.5


def test_rsd_refuses_it_before_touching_its_data_directory(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = subprocess_env()
    env.pop(VARIABLE, None)
    proc = subprocess.run(
        [sys.executable, "-m", "rsd", "--data-dir", str(data), FLAG, "1"],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=30,
    )
    assert proc.returncode == 2
    assert f"{FLAG}: is for rsd's own tests only" in proc.stderr
    assert not data.exists()


# ---- the core: one lease rule, with the bound it was given -------------------------------


def claim(lease_seconds: float) -> dict[str, Any]:
    return {"scope": "run-a", "key": "k", "lease_seconds": lease_seconds}


def test_the_core_takes_the_protocols_minimum_unless_given_a_lower_one() -> None:
    core = CoreDriver(runs=("run-a",))
    error = core.refused(Op.CLAIM_ACQUIRE, claim(1))
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert "lease_seconds must be between 5 and 600, got 1" in error.message

    lowered = CoreDriver(runs=("run-a",), min_lease_seconds=0.5)
    assert lowered.call(Op.CLAIM_ACQUIRE, claim(0.5))["lease_seconds"] == 0.5
    error = lowered.refused(Op.CLAIM_ACQUIRE, claim(0.25))
    assert "lease_seconds must be between 0.5 and 600, got 0.25" in error.message


def test_every_lease_length_asked_for_obeys_the_lowered_bound() -> None:
    core = CoreDriver(runs=("run-a",), min_lease_seconds=1)
    core.call(Op.POOL_ENSURE, {"name": "gpus", "size": 1})
    slot = core.call(Op.POOL_ACQUIRE, {"scope": "run-a", "pool": "gpus", "lease_seconds": 1})
    assert slot["lease_seconds"] == 1
    renewed = core.call(Op.LEASE_RENEW, {"leases": [[slot["lease"], 1.5]]})
    assert renewed["results"] == [None]
    too_short = core.refused(Op.LEASE_RENEW, {"leases": [[slot["lease"], 0.5]]})
    assert "lease_seconds must be between 1 and 600, got 0.5" in too_short.message
    box = {"scope": "run-a", "mailbox": "jobs"}
    core.call(Op.TASK_SUBMIT, {**box, "data": 1})
    core.call(Op.TASK_SUBMIT, {**box, "data": 2})
    taken = core.call(Op.RECEIVE, {**box, "lease_seconds": 1})["delivery"]
    assert taken["lease_seconds"] == 1
    settle = {"lease": taken["lease"], "outcome": 1}
    error = core.refused(Op.DELIVERY_COMPLETE, {**settle, "next": {"lease_seconds": 0.5}})
    assert "next.lease_seconds must be between 1 and 600, got 0.5" in error.message
    done = core.call(Op.DELIVERY_COMPLETE, {**settle, "next": {"lease_seconds": 1}})
    assert [delivery["lease_seconds"] for delivery in done["next"]] == [1]
    repeated = core.refused(Op.DELIVERY_COMPLETE, {**settle, "next": {"lease_seconds": 0.5}})
    assert "next.lease_seconds must be between 1 and 600" in repeated.message


def test_hello_announces_the_minimum_the_core_takes() -> None:
    assert announced_limits(10)["min_lease_seconds"] == Limits.MIN_LEASE_SECONDS
    lowered = announced_limits(10, 0.5)
    assert lowered["min_lease_seconds"] == 0.5
    assert list(lowered) == list(announced_limits(10))  # in protocol.md's order
