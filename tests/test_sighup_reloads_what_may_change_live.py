"""SIGHUP re-reads the config file: the log level and format change live and the change
is logged; an option that cannot change live is named in a warning and keeps its value;
a config file that became bad is refused and nothing changes. And the rare events a
running rsd logs (here: a cancelled run) carry their ids, in text and in JSON."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from rsclient import wire
from tests.support.aio import eventually_true
from tests.support.process import Rsd
from tests.support.raw import raw_connect


async def cancel_run(address: str, scope: str) -> None:
    conn = await raw_connect(address)
    try:
        await conn.ok(wire.Op.HELLO, {"version": wire.PROTOCOL_VERSION, "holder": "ops"})
        await conn.ok(wire.Op.SCOPE_CREATE, {"scope": scope})  # runs must exist
        await conn.ok(wire.Op.SCOPE_CANCEL, {"scope": scope, "reason": "by the operator"})
    finally:
        conn.writer.close()


async def test_sighup_reloads_the_log_level_and_format_and_says_what_changed(
    rsds: Callable[..., Rsd], tmp_path: Path
) -> None:
    config = tmp_path / "rsd.toml"
    config.write_text('log_level = "info"\nretention_seconds = 600\n')
    server = rsds("hup")
    address = await server.start("--config", str(config))
    assert server.alive

    await cancel_run(address, "run-1")
    await eventually_true(lambda: "run cancelled" in server.log())
    [line] = [line for line in server.log().splitlines() if "run cancelled" in line]
    assert line.endswith('run cancelled scope=run-1 reason="by the operator" tasks=0 claims=0 '
                         'slots=0')

    config.write_text('log_level = "DEBUG"\nlog_format = "json"\nretention_seconds = 60\n')
    server.hangup()
    await eventually_true(lambda: '"message": "reloaded ' in server.log())
    events = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    [reloaded] = [e for e in events if e["message"].startswith("reloaded")]
    assert reloaded["level"] == "INFO" and reloaded["logger"] == "rsd"
    assert "log_level INFO -> DEBUG" in reloaded["message"]
    assert "log_format text -> json" in reloaded["message"]
    # The warning was written before the format changed: in text, one line.
    assert (
        f"{config}: retention_seconds changed from 600.0 to 60.0, which takes effect only "
        "at the next start" in server.log()
    )

    await cancel_run(address, "run-2")
    await eventually_true(lambda: '"run-2"' in server.log())
    events = [json.loads(line) for line in server.log().splitlines() if line.startswith("{")]
    [cancelled] = [e for e in events if e.get("scope") == "run-2"]
    assert cancelled["message"] == "run cancelled" and cancelled["logger"] == "rsd.events"
    assert (cancelled["reason"], cancelled["tasks"], cancelled["claims"]) == (
        "by the operator", 0, 0,
    )

    config.write_text('log_level = "shouty"\n')
    server.hangup()
    await eventually_true(lambda: "reload refused" in server.log())
    assert "log_level must be one of DEBUG" in server.log()
    assert server.alive
    assert await server.stop() == 0
