"""A submit's or send's ``trace``: the W3C trace context its submitter was in, kept with
the item and handed back with each of its deliveries, so the handler's span is a child
of the submitter's (both SDKs: rsclient/tracing.py, sdk/typescript/src/tracing.ts).

What always holds: a trace is a map of ``traceparent`` (a string of 1 to
MAX_TRACEPARENT_BYTES UTF-8 bytes) and, optionally, ``tracestate`` (at most
MAX_TRACESTATE_BYTES), nothing else; rsd never reads what they say (a tracing system
does), so any other shape is INVALID_ARGUMENT and nothing else about it is checked.
It is no part of an item's input: the same key submitted in another trace is the same
task (its first submitter's trace is kept).
"""

from __future__ import annotations

from typing import Any, Final

from rsproto import MAX_TRACEPARENT_BYTES, MAX_TRACESTATE_BYTES

from .validate import invalid, opt_text, req_text

__all__ = ["trace_arg"]

_FIELDS: Final = frozenset({"traceparent", "tracestate"})


def trace_arg(args: dict[str, Any]) -> dict[str, str] | None:
    """The request's ``trace``, checked: None when absent or nil, else a new map of its
    traceparent and its tracestate (when given and not nil)."""
    trace = args.get("trace")
    if trace is None:
        return None
    if type(trace) is not dict:
        raise invalid(f"trace must be a map of traceparent and tracestate, got "
                      f"{type(trace).__name__}")
    unknown = set(trace) - _FIELDS
    if unknown:
        raise invalid(f"trace has unknown fields {sorted(map(str, unknown))}; "
                      "allowed: traceparent, tracestate")
    checked = {"traceparent": req_text(trace, "traceparent", MAX_TRACEPARENT_BYTES)}
    state = opt_text(trace, "tracestate", MAX_TRACESTATE_BYTES)
    if state is not None:
        checked["tracestate"] = state
    return checked
