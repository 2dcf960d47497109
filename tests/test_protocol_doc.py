"""protocol.md and rsclient/wire.py state the same protocol: this test keeps them in step.

Each normative table of protocol.md sits right under a fixed heading ("## Op codes",
"## Push events", "## Error codes", "## Frame kinds", "## Limits", "### Constants",
"## Task states", "## Durability") and must list exactly what the code defines, no more
and no less. Every ```hex block of the worked example must decode to exactly one
well-formed frame that the codec encodes to the same bytes.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from rsclient import wire
from rsd.cli import parse_args
from rsd.core.run.items import TRANSITIONS, State
from rsd.disk.journal import POLICIES
from rsd.policy import Policy, announced_limits
from rsproto import ErrorCode, Kind, Limits, Op, Push

DOC = Path(__file__).resolve().parent.parent / "protocol.md"


@cache
def doc_text() -> str:
    if not DOC.is_file():
        pytest.fail(f"{DOC} is missing")
    return DOC.read_text(encoding="utf-8")


def _cells(line: str) -> list[str]:
    return [cell.strip().strip("`").strip() for cell in line.strip().strip("|").split("|")]


def table(heading: str, columns: list[str]) -> list[list[str]]:
    """The rows of the first table under ``heading``, checked to start with ``columns``."""
    lines = doc_text().splitlines()
    hits = [i for i, line in enumerate(lines) if line.strip() == heading]
    assert len(hits) == 1, (
        f"protocol.md must have exactly one heading {heading!r}, found {len(hits)}"
    )
    rows: list[list[str]] = []
    for line in lines[hits[0] + 1 :]:
        stripped = line.strip()
        if stripped.startswith("#"):
            break
        if stripped.startswith("|"):
            rows.append(_cells(stripped))
        elif rows:
            break
    assert len(rows) >= 2, f"no table under {heading!r} in protocol.md"
    header, separator, body = rows[0], rows[1], rows[2:]
    assert header[: len(columns)] == columns, (
        f"the table under {heading!r} must start with the columns {columns}, found {header}"
    )
    assert all(set(cell) <= set("-: ") for cell in separator), (
        f"the second line of the table under {heading!r} must be its |---| separator"
    )
    for row in body:
        assert len(row) == len(header), (
            f"row {row} under {heading!r} has {len(row)} cells, the header has {len(header)}"
        )
    return body


def keyed(heading: str, pairs: list[tuple[Any, str]]) -> dict[Any, str]:
    """``pairs`` as a dict, refusing a key that the table lists twice."""
    keys = [key for key, _ in pairs]
    dupes = sorted({key for key in keys if keys.count(key) > 1})
    assert not dupes, f"the table under {heading!r} lists {dupes} more than once"
    return dict(pairs)


def disagreement(what: str, doc: dict[Any, Any], code: dict[Any, Any]) -> str:
    """A readable account of how two mappings differ; empty if they agree."""
    problems = []
    missing = {k: code[k] for k in code.keys() - doc.keys()}
    extra = {k: doc[k] for k in doc.keys() - code.keys()}
    wrong = {k: (doc[k], code[k]) for k in doc.keys() & code.keys() if doc[k] != code[k]}
    if missing:
        problems.append(f"in the code but missing from protocol.md: {missing}")
    if extra:
        problems.append(f"in protocol.md but not in the code: {extra}")
    for k, (in_doc, in_code) in sorted(wrong.items(), key=lambda item: str(item[0])):
        problems.append(f"{k!r}: protocol.md says {in_doc!r}, the code says {in_code!r}")
    if not problems:
        return ""
    return f"{what} disagree:\n  " + "\n  ".join(problems)


def integer(heading: str, text: str) -> int:
    assert re.fullmatch(r"\d+", text), f"{text!r} under {heading!r} must be a plain decimal integer"
    return int(text)


# ---- the tables ----------------------------------------------------------------------


def test_op_codes() -> None:
    heading = "## Op codes"
    rows = table(heading, ["code", "name"])
    doc = keyed(heading, [(row[1], row[0]) for row in rows])
    doc_ops = {name: integer(heading, code) for name, code in doc.items()}
    problem = disagreement(
        "op codes in protocol.md and wire.Op", doc_ops, {op.name: op.value for op in Op}
    )
    assert not problem, problem


def test_push_events() -> None:
    heading = "## Push events"
    rows = table(heading, ["code", "name"])
    doc = keyed(heading, [(row[1], row[0]) for row in rows])
    doc_events = {name: integer(heading, code) for name, code in doc.items()}
    problem = disagreement(
        "push events in protocol.md and wire.Push", doc_events, {p.name: p.value for p in Push}
    )
    assert not problem, problem


def test_error_codes() -> None:
    heading = "## Error codes"
    rows = table(heading, ["code"])
    doc = keyed(heading, [(row[0], row[0]) for row in rows])
    missing = sorted({code.value for code in ErrorCode} - doc.keys())
    extra = sorted(doc.keys() - {code.value for code in ErrorCode})
    assert not missing and not extra, (
        "error codes in protocol.md and wire.ErrorCode disagree:\n"
        f"  in the code but missing from protocol.md: {missing}\n"
        f"  in protocol.md but not in the code: {extra}"
    )


# What a server with default settings announces: protocol limits, then its policy.
_ANNOUNCED = announced_limits(Policy.HANDSHAKE_TIMEOUT_SECONDS)


def test_limits() -> None:
    heading = "## Limits"
    rows = table(heading, ["name", "value"])
    doc = keyed(heading, [(row[0], row[1]) for row in rows])
    doc_limits = {name: integer(heading, value) for name, value in doc.items()}
    problem = disagreement(
        "limits in protocol.md and the HELLO reply's limits", doc_limits, _ANNOUNCED
    )
    assert not problem, problem


_ENCODERS = {
    Kind.REQUEST: lambda: wire.request_frame(7, Op.PING, {}),
    Kind.REPLY: lambda: wire.reply_frame(7, {}),
    Kind.ERROR: lambda: wire.error_frame(7, ErrorCode.INTERNAL, "m", None),
    Kind.PUSH: lambda: wire.push_frame(Push.LEASE_LOST, {}),
}


def test_frame_kinds() -> None:
    heading = "## Frame kinds"
    rows = table(heading, ["code", "name", "layout"])
    doc = keyed(heading, [(row[1], row[0]) for row in rows])
    doc_kinds = {name: integer(heading, code) for name, code in doc.items()}
    problem = disagreement(
        "frame kinds in protocol.md and wire.Kind", doc_kinds, {k.name: k.value for k in Kind}
    )
    assert not problem, problem
    assert set(_ENCODERS) == set(Kind), "this test needs an encoder for every wire.Kind"
    for code, name, layout, *_ in rows:
        kind = Kind[name]
        match = re.fullmatch(r"\[(.*)\]", layout)
        assert match, f"layout of {name} must be a bracketed array, got {layout!r}"
        elements = [element.strip() for element in match.group(1).split(",")]
        assert elements[0] == code, (
            f"layout of {name} must start with its kind code {code}, got {layout!r}"
        )
        (frame,) = wire.Decoder().feed(_ENCODERS[kind]())
        assert len(elements) == len(frame), (
            f"layout of {name} in protocol.md has {len(elements)} elements, "
            f"the codec's {name} frames have {len(frame)}: {frame}"
        )


def test_constants() -> None:
    heading = "### Constants"
    rows = table(heading, ["name", "value"])
    doc = keyed(heading, [(row[0], row[1]) for row in rows])
    doc_constants = {name: integer(heading, value) for name, value in doc.items()}
    code = {
        "PROTOCOL_VERSION": wire.PROTOCOL_VERSION,
        "HEADER_BYTES": wire.HEADER_BYTES,
        "MAX_FRAME_BYTES": wire.MAX_FRAME_BYTES,
        "LEASE_HANDLE_BYTES": wire.LEASE_HANDLE_BYTES,
        "MAX_TRACEPARENT_BYTES": wire.MAX_TRACEPARENT_BYTES,
        "MAX_TRACESTATE_BYTES": wire.MAX_TRACESTATE_BYTES,
    }
    problem = disagreement("constants in protocol.md and rsclient.wire", doc_constants, code)
    assert not problem, problem


def test_task_states() -> None:
    heading = "## Task states"
    rows = table(heading, ["from", "event", "to"])
    moves = [(row[0], row[1]) for row in rows]
    doc = keyed(heading, [(move, row[2]) for move, row in zip(moves, rows, strict=True)])
    code = {(state.value, event): target.value for (state, event), target in TRANSITIONS.items()}
    problem = disagreement("task transitions in protocol.md and rsd.core.run.items", doc, code)
    assert not problem, problem
    named = {state for move in doc for state in (move[0], doc[move])}
    missing = {state.value for state in State} - named
    assert not missing, f"the table under {heading!r} never mentions the states {missing}"


def test_fsync_policies() -> None:
    heading = "## Durability"
    rows = table(heading, ["policy"])
    doc = keyed(heading, [(row[0], row[0]) for row in rows])
    missing = sorted(set(POLICIES) - doc.keys())
    extra = sorted(doc.keys() - set(POLICIES))
    assert not missing and not extra, (
        "fsync policies in protocol.md and rsd.disk.journal.POLICIES disagree:\n"
        f"  in the code but missing from protocol.md: {missing}\n"
        f"  in protocol.md but not in the code: {extra}"
    )
    default = parse_args([]).fsync
    stated = f"The default is `{default}`."
    assert stated in " ".join(doc_text().split()), (
        f"protocol.md must state the default fsync policy: {stated!r}"
    )


def test_version_and_frame_limit_as_stated() -> None:
    first = doc_text().splitlines()[0]
    match = re.fullmatch(r"# .*, version (\d+)", first)
    assert match, f"the title of protocol.md must end with ', version N', got {first!r}"
    assert int(match.group(1)) == wire.PROTOCOL_VERSION, (
        f"protocol.md is titled version {match.group(1)}, "
        f"wire.PROTOCOL_VERSION is {wire.PROTOCOL_VERSION}"
    )
    stated = f"`MAX_FRAME_BYTES` ({wire.MAX_FRAME_BYTES} bytes"
    assert stated in doc_text(), (
        f"protocol.md must state the frame limit as {stated!r} in 'Frame layout'"
    )
    assert Limits.MAX_FRAME_BYTES == wire.MAX_FRAME_BYTES, (
        "Limits.MAX_FRAME_BYTES and wire.MAX_FRAME_BYTES differ"
    )


# ---- the worked example --------------------------------------------------------------


def hex_blocks() -> list[str]:
    return re.findall(r"^```hex\n(.*?)^```", doc_text(), flags=re.M | re.S)


def _dump(data: bytes) -> str:
    pairs = [f"{byte:02x}" for byte in data]
    return "\n".join(" ".join(pairs[i : i + 16]) for i in range(0, len(pairs), 16))


def test_example_blocks_exist() -> None:
    assert len(hex_blocks()) >= 4, (
        "protocol.md must show the HELLO and CLAIM_ACQUIRE round trips in ```hex blocks"
    )


@pytest.mark.parametrize("index", range(len(hex_blocks()) if DOC.is_file() else 0))
def test_example_frame(index: int) -> None:
    block = hex_blocks()[index]
    label = f"```hex block #{index + 1} of protocol.md"
    try:
        data = bytes.fromhex(" ".join(block.split()))
    except ValueError as exc:
        pytest.fail(f"{label} is not plain hex: {exc}")
    decoder = wire.Decoder()
    try:
        frames = decoder.feed(data)
    except wire.FrameError as exc:
        pytest.fail(f"{label} does not decode: {exc.code}: {exc.message}")
    assert len(frames) == 1 and decoder.buffered == 0, (
        f"{label} must be exactly one complete frame (length prefix = body length)"
    )
    (frame,) = frames
    assert wire.encode(frame) == data, (
        f"{label} is not how the codec encodes {frame!r}; it encodes as:\n"
        f"{_dump(wire.encode(frame))}"
    )
    kind = frame[0]
    assert kind in set(Kind), f"{label} has unknown frame kind {kind!r}"
    arity = {Kind.REQUEST: 4, Kind.REPLY: 3, Kind.ERROR: 5, Kind.PUSH: 3}[Kind(kind)]
    assert len(frame) == arity, f"{label}: a {Kind(kind).name} frame has {arity} elements"
    if kind == Kind.REQUEST:
        assert type(frame[1]) is int and frame[1] >= 1, (
            f"{label} uses request id {frame[1]!r}; request ids are integers of at least 1"
        )
        assert frame[2] in set(Op), f"{label} uses unknown op {frame[2]!r}"
        if frame[2] == Op.HELLO:
            assert frame[3].get("version") == wire.PROTOCOL_VERSION, (
                f"{label}: HELLO must ask for version {wire.PROTOCOL_VERSION}"
            )
    elif kind == Kind.ERROR:
        assert frame[2] in set(ErrorCode), f"{label} uses unknown error code {frame[2]!r}"
    elif kind == Kind.PUSH:
        assert frame[1] in set(Push), f"{label} uses unknown push event {frame[1]!r}"
    elif kind == Kind.REPLY and isinstance(frame[2], dict) and "limits" in frame[2]:
        result = frame[2]
        expected = dict(result, version=wire.PROTOCOL_VERSION, limits=_ANNOUNCED)
        assert result == expected and list(result["limits"]) == list(_ANNOUNCED), (
            f"{label}, the HELLO reply, must carry version {wire.PROTOCOL_VERSION} and "
            f"exactly the announced limits in their order. "
            + disagreement("example limits and the announced limits", result["limits"], _ANNOUNCED)
            + "\nWith the current limits the frame is:\n"
            + _dump(wire.reply_frame(frame[1], expected))
        )
