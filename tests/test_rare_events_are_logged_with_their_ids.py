"""Every lease takeover, dead letter and run cancellation is logged with its ids.

The core notes these rare events (core/effects.py) and the server logs them after the
turn's flush: one line each, the ids as ``key=value`` extras in text and as fields in
JSON. Nothing is noted on a request's usual path, and at most MAX_NOTES wait between
two drains, so an undrained core cannot grow."""

from __future__ import annotations

import json
import logging
import sys

import pytest

from rsd.core import DEFERRED
from rsd.core.ground.effects import MAX_NOTES, Effects
from rsd.logs import JsonFormatter, TextFormatter, log_notes
from rsproto import Op
from tests.support.core import ALICE, BOB, CoreDriver


def notes(core: CoreDriver) -> list[tuple[str, dict]]:
    taken, dropped = core.effects.take_notes()
    assert dropped == 0
    return taken


def test_an_expired_claim_lease_is_noted_with_who_took_the_key_over() -> None:
    core = CoreDriver()
    grant = core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 5})
    assert core.call(
        Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k", "lease_seconds": 5, "wait": True}, BOB
    ) is DEFERRED
    assert notes(core) == []  # grants and waits are not events
    core.advance(6)
    [(event, ids)] = notes(core)
    assert event == "claim lease expired"
    assert ids["scope"] == "s" and ids["key"] == "k"
    assert ids["holder"] == "alice" and ids["generation"] == grant["generation"]
    assert ids["taken_over_by"] == "bob" and ids["new_lease"] not in (None, ids["lease"])


def test_an_expired_delivery_lease_and_a_dead_letter_are_noted() -> None:
    core = CoreDriver()
    core.call(Op.MAILBOX_ENSURE, {"name": "once", "max_attempts": 1})
    for mailbox in ("jobs", "once"):
        core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": mailbox, "data": 1})
        core.call(Op.RECEIVE, {"scope": "s", "mailbox": mailbox, "lease_seconds": 5})
    core.drain()
    assert notes(core) == []
    core.advance(6)
    by_then = {ids["mailbox"]: (event, ids) for event, ids in notes(core) if "then" in ids}
    assert by_then["jobs"][1]["then"] == "requeued"
    assert by_then["jobs"][1]["holder"] == "alice" and by_then["jobs"][1]["attempt"] == 1
    assert by_then["once"][1]["then"] == "dead-lettered"
    core.drain()
    # The requeued task comes back; rejected, it is dead-lettered, and noted as such.
    delivery = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"}, ALICE)["delivery"]
    core.call(Op.DELIVERY_REJECT, {"lease": delivery["lease"], "reason": "malformed"})
    [(event, ids)] = notes(core)
    assert event == "dead letter"
    assert (ids["scope"], ids["mailbox"], ids["item"]) == ("s", "jobs", delivery["id"])
    assert ids["reason"] == "rejected: malformed"


def test_a_cancelled_run_is_noted_with_what_it_ended() -> None:
    core = CoreDriver()
    core.call(Op.CLAIM_ACQUIRE, {"scope": "s", "key": "k"})
    core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": None})
    core.call(Op.SCOPE_CANCEL, {"scope": "s", "reason": "operator"})
    assert notes(core) == [
        ("run cancelled", {"scope": "s", "reason": "operator", "tasks": 1, "claims": 1,
                           "slots": 0})
    ]


def test_notes_kept_between_drains_are_bounded() -> None:
    effects = Effects()
    for i in range(MAX_NOTES + 10):
        effects.note("dead letter", item=str(i))
    taken, dropped = effects.take_notes()
    assert (len(taken), dropped) == (MAX_NOTES, 10)
    assert effects.take_notes() == ([], 0)


def record(msg: str, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("bad\nthing")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("rsd.events", logging.INFO, __file__, 1, msg, None, exc_info)
    rec.__dict__.update(extra)
    return rec


def test_text_logs_are_one_line_per_event_with_the_ids_as_key_value() -> None:
    line = TextFormatter().format(record("run cancelled", scope="s 1", tasks=2, reason=None))
    assert "\n" not in line
    assert line.endswith('INFO rsd.events: run cancelled scope="s 1" tasks=2 reason=None')
    failed = TextFormatter().format(record("two\nlines", exc=True))
    assert "\n" not in failed and "two | lines" in failed and "ValueError: bad | thing" in failed


def test_json_logs_are_one_object_per_line_with_the_ids_as_fields() -> None:
    line = JsonFormatter().format(record("lease", exc=True, lease=7, key="k"))
    assert "\n" not in line
    event = json.loads(line)
    assert list(event)[:4] == ["time", "level", "logger", "message"]
    assert (event["level"], event["logger"], event["message"]) == ("INFO", "rsd.events", "lease")
    assert (event["lease"], event["key"]) == (7, "k")
    assert "ValueError: bad" in event["exc"]
    assert event["time"].endswith("Z")


def test_the_shell_logs_each_note_and_counts_the_rest(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="rsd.events"):
        log_notes([("dead letter", {"item": "t1"}), ("run cancelled", {"scope": "s"})], 3)
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels == [
        ("WARNING", "dead letter"), ("INFO", "run cancelled"),
        ("WARNING", "3 more events in the same turn were not logged"),
    ]
    assert caplog.records[0].item == "t1"  # type: ignore[attr-defined]
