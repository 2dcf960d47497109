"""Logging: one line per event on stderr, as text or as JSON, switchable while running.

What always holds:
- every event is one line, whatever it holds: in ``text`` a newline inside a message or
  a traceback is written as `` | ``; in ``json`` each event is one JSON object (``time``,
  ``level``, ``logger``, ``message``, then the event's extras, then ``exc`` for a
  traceback);
- extras (``log.info(..., extra={"lease": 7})``) are the event's ids: in ``text`` they
  follow the message as ``key=value``, in ``json`` they are fields of their own;
- ``configure`` may be called again at any time (SIGHUP): it swaps the level and the
  format of the one handler rsd owns, so no event is written twice or lost meanwhile;
- logging stays off the hot paths: rsd logs rare events (starts, stops, recoveries,
  snapshots, expired leases, dead letters, cancelled runs, reloads), never a request;
- a rare event that can still come in a flood (``SUMMED``: a schedule's fire skipped
  each second while its tenant has no room) is logged at most twice an interval per
  kind (``NoteLog``, logsummary.py): its first at once, the rest summed up in one line;
  so are the notes a turn had too many of to keep (core/effects.py's ``MAX_NOTES``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from functools import partial
from typing import Any

from .logsummary import Interval, LogSummary

__all__ = ["SUMMED", "JsonFormatter", "NoteLog", "TextFormatter", "configure", "extras",
           "log_notes"]

events = logging.getLogger("rsd.events")

# The notes that can come in floods, each with what its summary counts and the ids that
# tell its sources apart: event -> (what, ids).
SUMMED: dict[str, tuple[str, tuple[str, ...]]] = {
    "schedule fire skipped": ("schedule fires skipped", ("tenant", "scope", "schedule")),
}

# The attributes every LogRecord has: anything else on a record is an extra.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message", "asctime", "taskName",
}


def extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a caller attached with ``extra=``, in the order given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _timestamp(record: logging.LogRecord) -> str:
    """ISO 8601 in UTC with milliseconds."""
    seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{seconds}.{int(record.msecs):03d}Z"


def _one_line(text: str) -> str:
    return text.replace("\r", "").replace("\n", " | ")


def _text_value(value: Any) -> str:
    text = str(value)
    if not text or any(c in text for c in ' ="|\n'):
        return json.dumps(text)
    return text


class TextFormatter(logging.Formatter):
    """``TIME LEVEL logger: message key=value ...`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        fields = extras(record)
        if fields:
            line += " " + " ".join(f"{k}={_text_value(v)}" for k, v in fields.items())
        if record.exc_info:
            line += " | " + self.formatException(record.exc_info)
        elif record.exc_text:
            line += " | " + record.exc_text
        return _one_line(line)


class JsonFormatter(logging.Formatter):
    """One JSON object per event."""

    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, Any] = {
            "time": _timestamp(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in extras(record).items():
            event.setdefault(key, value)
        if record.exc_info:
            event["exc"] = self.formatException(record.exc_info)
        return json.dumps(event, default=str, ensure_ascii=False)


_FORMATTERS = {"text": TextFormatter, "json": JsonFormatter}
_handler: logging.Handler | None = None


def configure(level: str, fmt: str) -> None:
    """Log events at ``level`` and above to stderr in ``fmt`` ("text" or "json")."""
    global _handler
    root = logging.getLogger()
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        root.addHandler(_handler)
    _handler.setFormatter(_FORMATTERS[fmt]())
    root.setLevel(level.upper())


def _level(event: str) -> int:
    return logging.WARNING if event == "dead letter" else logging.INFO


def log_notes(notes: list[tuple[str, dict[str, Any]]], dropped: int) -> None:
    """Log the core's notes (core/effects.py): one line each, their ids as extras."""
    for event, ids in notes:
        events.log(_level(event), event, extra=ids)
    if dropped:
        events.warning("%d more events in the same turn were not logged", dropped)


class NoteLog:
    """The core's notes to the log as ``log_notes`` writes them, but for the kinds in
    ``SUMMED``: of each, the first of an interval at once, the rest in one line when it
    ends (logsummary.py, as failed HELLOs are)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._summaries = {
            event: LogSummary(loop, partial(_sum_up, event)) for event in SUMMED
        }
        self._dropped = LogSummary(loop, _sum_up_dropped)  # notes only counted

    def log(self, notes: list[tuple[str, dict[str, Any]]], dropped: int) -> None:
        summaries = self._summaries
        plain = []
        for event, ids in notes:
            summary = summaries.get(event)
            if summary is None:
                plain.append((event, ids))
            elif summary.note("/".join(str(ids.get(name)) for name in SUMMED[event][1])):
                events.log(_level(event), "%s (more in the next %g s are summed up in one "
                           "line)", event, summary.seconds, extra=ids)
        log_notes(plain, 0)
        if dropped and self._dropped.note("notes", dropped):
            events.warning("%d more events in the same turn were not logged (more in the "
                           "next %g s are summed up in one line)", dropped,
                           self._dropped.seconds)

    def stop(self) -> None:
        """The server stops: every open interval's line is written now."""
        for summary in (*self._summaries.values(), self._dropped):
            summary.stop()


def _sum_up_dropped(interval: Interval) -> None:
    events.warning("%d more events were not logged in the last %.0f s (too many in one "
                   "turn; rsd_events_total counts them all)", interval.count, interval.seconds)


def _sum_up(event: str, interval: Interval) -> None:
    what, names = SUMMED[event]
    events.log(
        _level(event), "%d %s in the last %.0f s, from %s %s; most: %s", interval.count,
        what, interval.seconds, interval.keys(), "/".join(names), interval.worst(),
        extra={"event": event, "count": interval.count},
    )
