"""msgspec writes the bytes msgpack-python wrote, and reads them back as it read them.

rsproto encodes what an rsd writes (replies, pushes, journal records) with msgspec
(``pack_from_rsd``) and what a user made with msgpack-python (``pack_body``), decodes what a
client sends as msgpack-python reads it (``unpack_checked``: by msgspec where that is the
same value, test_a_clients_request_decodes_to_what_msgpack_python_reads.py) and what an rsd
wrote with msgspec (``unpack_from_rsd``). What must hold:

- every frame of a core fed every op (requests, replies, errors, pushes), every journal
  record and snapshot record it emits, the outcome view a result wait with
  ``outcome_only`` is answered with, and the example frames of protocol.md are the same
  bytes from both libraries; a request a client encoded with msgpack-python decodes and
  re-encodes to its own bytes (extension values and timestamps included);
- any value of the protocol's domain (nil, booleans, integers from -2**63 to 2**64-1,
  floats, str, bin, arrays, tuples, maps with any scalar key, extension values,
  timestamps) encodes to msgpack-python's bytes, and both decoders read it back alike;
  what msgpack-python could not encode (an integer past 64 bits, an unknown type, nesting
  past any limit) is refused with one of ``ENCODE_ERRORS``; what msgspec alone would
  encode and msgpack-python refuses (a set, a datetime, a UUID, a dataclass) a user's
  value is still refused for (``pack_body``);
- a journal segment and a snapshot written by msgpack-python (the rsd before this one)
  read back as the records written;
- what an rsd never writes and the protocol refuses (an array used as a map key) is still
  refused by the server's decoder, and a timestamp keeps its nanoseconds and its range on
  both decoders (msgspec alone would round it to a datetime);
- a damaged stream fed to a client's decoder (``from_rsd``) decodes or is refused with
  PROTOCOL_ERROR or FRAME_TOO_LARGE: no msgspec error escapes.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import itertools
import math
import random
import re
import uuid
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import fuzz
from support.core import CoreDriver
from support.fuzz import Known

from rsd.core import DEFERRED, CoreError
from rsd.disk import logfile
from rsproto import (
    ENCODE_ERRORS,
    Decoder,
    ErrorCode,
    Ext,
    FrameError,
    Kind,
    Op,
    pack_body,
    pack_from_rsd,
    unpack_checked,
    unpack_from_rsd,
)


def _ext_type(value: Any) -> Any:
    if isinstance(value, Ext):
        return msgpack.ExtType(value.code, value.data)
    raise TypeError(f"can not serialize {type(value).__name__!r} object")


def msgpack_bytes(value: Any) -> bytes:
    """``value`` as msgpack-python writes it (an Ext as its ExtType)."""
    return msgpack.packb(value, use_bin_type=True, default=_ext_type)


def same(a: Any, b: Any) -> bool:
    """Equal values of the same types all the way down (a NaN equal to a NaN)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is list:
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def assert_written_alike(value: Any) -> bytes:
    """Both libraries write ``value`` to the same bytes; both decoders read them alike."""
    body = pack_from_rsd(value)
    assert body == msgpack_bytes(value), f"msgspec and msgpack differ on {value!r}"
    checked = unpack_checked(body)
    assert same(unpack_from_rsd(body), checked), f"the decoders differ on {value!r}"
    return body


# ---- a core fed every op: its frames and records ----------------------------------------------


def core_workload(seed: int, steps: int) -> tuple[CoreDriver, list[Any]]:
    """A core fed ``steps`` random requests (every op, right and wrong args), each sent
    as a client does (encoded by msgpack-python, decoded as the server decodes), on three
    connections; and every message it sent back (replies, errors, pushes)."""
    rng = random.Random(seed)
    core = CoreDriver(holders={}, mailbox=None, recovered=True)
    known = Known()
    rids = itertools.count(1)
    for conn in (1, 2, 3):
        core.connected(conn, f"holder-{conn}")
    requests = [(Op.MAILBOX_ENSURE, {"name": name, "max_attempts": 2}) for name in known.mailboxes]
    sent: list[Any] = []
    for step in range(steps):
        op, args = requests[step] if step < len(requests) else fuzz.request(rng, known)
        rid = next(rids)
        body = msgpack_bytes([int(Kind.REQUEST), rid, op, args])
        message = unpack_checked(body)
        assert pack_from_rsd(message) == body, "a request does not re-encode to its own bytes"
        try:
            result = core.handle(core.now, rng.choice((1, 2, 3)), rid, op, message[3])
        except CoreError as exc:
            sent.append([int(Kind.ERROR), rid, str(exc.code), exc.message, exc.details])
        else:
            if result is not DEFERRED:
                sent.append([int(Kind.REPLY), rid, result])
                known.learn(result)
        if rng.random() < 0.05:
            core.now += rng.choice((0.5, 5.0, 60.0))
            core.tick(core.now)
        sent.extend(msg for _, msg in core.drain())
    return core, sent


def test_every_frame_and_record_of_a_core_fed_every_op_is_written_alike() -> None:
    core, sent = core_workload(seed=33, steps=3000)
    kinds = {msg[0] for msg in sent}
    assert {Kind.REPLY, Kind.ERROR, Kind.PUSH} <= kinds, f"only frame kinds {kinds} were sent"
    for msg in sent:
        assert_written_alike(msg)
    records = list(core.records)
    snapshot = list(core.snapshot())
    assert len({rec[0] for rec in records}) >= 10, "too few record kinds to compare"
    for rec in records + snapshot:
        assert_written_alike(rec)
    assert_written_alike(records)  # a batch, as the journal writes them
    assert_written_alike(snapshot)


def test_a_result_answered_with_the_outcome_view_is_written_alike() -> None:
    """TASK_RESULT with ``outcome_only``: the outcome view, answered at once and pushed at
    the ending (beside a whole view to a wait on the same task), tombstoned too."""
    core = CoreDriver(retention_seconds=10.0)
    outcomes = [None, {"answer": 42, "t": 1.5}, [1, b"\x00", "x" * 40], 2**64 - 1, -1.25]
    sent: list[Any] = []
    for n, outcome in enumerate(outcomes):
        task = core.call(Op.TASK_SUBMIT, {"scope": "s", "mailbox": "jobs", "data": n})["id"]
        for rid, asked in ((1, {"outcome_only": True}), (2, {})):
            assert core.call(Op.TASK_RESULT, {"scope": "s", "task": task, **asked},
                             rid=rid) is DEFERRED
        lease = core.call(Op.RECEIVE, {"scope": "s", "mailbox": "jobs"})["delivery"]["lease"]
        core.call(Op.DELIVERY_COMPLETE, {"lease": lease, "outcome": outcome})
        sent.extend(msg for _, msg in core.drain())
        sent.append([int(Kind.REPLY), 3, core.call(
            Op.TASK_RESULT, {"scope": "s", "task": task, "outcome_only": True})])
    core.advance(11.0)
    sent.append([int(Kind.REPLY), 4, core.call(
        Op.TASK_RESULT, {"scope": "s", "task": task, "outcome_only": True})])
    shapes = {tuple(msg[2]) for msg in sent}
    assert ("id", "state", "outcome", "reason") in shapes
    assert ("id", "state", "outcome", "reason", "tombstoned") in shapes
    assert len(sent) == 2 * len(outcomes) + len(outcomes) + 1
    for msg in sent:
        assert_written_alike(msg)


def test_the_example_frames_of_protocol_md_are_written_alike() -> None:
    doc = (Path(__file__).resolve().parents[1] / "protocol.md").read_text()
    blocks = re.findall(r"^```hex\n(.*?)^```", doc, flags=re.M | re.S)
    assert len(blocks) >= 4
    for block in blocks:
        data = bytes.fromhex(" ".join(block.split()))
        (frame,) = Decoder(from_rsd=True).feed(data)
        assert assert_written_alike(frame) == data[4:]


# ---- any value of the protocol's domain -------------------------------------------------------

scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.sampled_from([0, 1, -1, 127, 128, -32, -33, 255, 256, 65535, 65536, 2**32, 2**63,
                       -(2**31) - 1, -(2**63)])
    | st.floats() | st.text(max_size=300) | st.binary(max_size=300)
)
keys = (st.text(max_size=8) | st.integers(-(2**63), 2**64 - 1) | st.binary(max_size=4)
        | st.none() | st.booleans() | st.floats(allow_nan=False))
exts = (st.builds(Ext, st.integers(0, 127), st.binary(max_size=20))
        | st.builds(msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 10**9 - 1))
        | st.builds(msgpack.Timestamp, st.integers(-(2**63), 2**63 - 1), st.integers(0, 10**9 - 1)))
values = st.recursive(
    scalars | exts,
    lambda children: st.lists(children, max_size=20) | st.tuples(children, children)
    | st.dictionaries(keys, children, max_size=20),
    max_leaves=40,
)


@fuzz.fuzz_settings(400)
@given(value=values)
def test_any_value_of_the_protocols_domain_is_written_and_read_alike(value: Any) -> None:
    assert_written_alike(value)
    assert_written_alike([int(Kind.REPLY), 1, {"data": value, "id": "t1"}])


@pytest.mark.parametrize("value", [
    2**64, -(2**63) - 1, object(), {"x": {1, 2}.__iter__()}, [msgpack.ExtType],
])
def test_what_msgpack_could_not_encode_is_refused(value: Any) -> None:
    with pytest.raises(ENCODE_ERRORS):
        msgpack_bytes(value)
    with pytest.raises(ENCODE_ERRORS):
        pack_from_rsd(value)


def test_nesting_past_any_limit_is_refused_with_an_encode_error() -> None:
    value: Any = None
    for _ in range(100_000):
        value = [value]
    with pytest.raises(ENCODE_ERRORS):
        pack_from_rsd(value)


@dataclasses.dataclass
class _Point:
    x: int


@pytest.mark.parametrize("value", [
    {1, 2}, frozenset([1]), datetime.datetime(2026, 1, 1), datetime.date(2026, 1, 1),
    uuid.UUID(int=1), decimal.Decimal("1.5"), _Point(1),
])
def test_a_users_value_that_msgpack_cannot_carry_is_refused(value: Any) -> None:
    """msgspec would encode these; a client refuses them (pack_body is msgpack-python's)."""
    with pytest.raises(TypeError):
        pack_body({"data": value})


def test_a_users_value_nested_as_deep_as_msgpack_packed_it_is_encoded() -> None:
    """msgspec recurses only as deep as Python's recursion limit allows."""
    value: Any = 1
    for _ in range(1022):
        value = [value]
    assert pack_body(value) == msgpack_bytes(value)


def test_an_extension_value_is_one_whichever_library_read_it() -> None:
    body = msgpack_bytes([msgpack.ExtType(5, b"ab"), {msgpack.ExtType(1, b"k"): 1}])
    for value in (unpack_checked(body), unpack_from_rsd(body)):
        assert value == [Ext(5, b"ab"), {Ext(1, b"k"): 1}]
        assert value == [msgpack.ExtType(5, b"ab"), {msgpack.ExtType(1, b"k"): 1}]
        assert type(value[0]) is Ext and repr(value[0]) == "Ext(code=5, data=b'ab')"
        assert pack_from_rsd(value) == body
        assert pack_body(value) == body
    reserved = b"\x92\xd4\xfe\x00\xc7\x03\x80abc"  # types -2 and -128: msgpack writes none
    for value in (unpack_checked(reserved), unpack_from_rsd(reserved)):
        assert value == [Ext(-2, b"\x00"), Ext(-128, b"abc")]
        assert pack_from_rsd(value) == reserved


# ---- what msgspec alone would change ----------------------------------------------------------


def test_a_timestamp_keeps_its_nanoseconds_and_its_range() -> None:
    """msgspec decodes a timestamp as a datetime (microseconds, years 1 to 9999)."""
    for stamp in (msgpack.Timestamp(1, 1), msgpack.Timestamp(2**40, 999_999_999),
                  msgpack.Timestamp(-(2**62), 0), msgpack.Timestamp(0, 0)):
        body = msgpack_bytes({"data": [stamp]})
        for unpack in (unpack_checked, unpack_from_rsd):
            value = unpack(body)
            assert value == {"data": [stamp]} and type(value["data"][0]) is msgpack.Timestamp
            assert pack_from_rsd(value) == body


def test_an_array_used_as_a_map_key_is_refused_by_the_servers_decoder() -> None:
    """msgspec would decode it as a tuple; the protocol refuses the frame."""
    frame = fuzz.frame(b"\x94\x00\x05\x02\x81\x91\x01\x02")
    with pytest.raises(FrameError) as refused:
        Decoder(what="request").feed(frame)
    assert refused.value.code == ErrorCode.PROTOCOL_ERROR


# ---- old files --------------------------------------------------------------------------------


def _old_file(path: Path, magic: bytes, records: list[Any]) -> None:
    """A file as the rsd before msgspec wrote it: msgpack-python's bytes, in batches."""
    salt = logfile.new_salt()
    parts = [logfile.file_header(magic, 1, salt)]
    for start in range(0, len(records), 50):
        payload = msgpack_bytes(records[start:start + 50])
        parts.append(logfile._frame(payload, salt))
    path.write_bytes(b"".join(parts))


def test_a_journal_and_a_snapshot_msgpack_wrote_read_back_as_written(tmp_path: Path) -> None:
    core, _ = core_workload(seed=7, steps=1500)
    payloads = [[1, "s", {"ext": msgpack.ExtType(3, b"x"), "at": msgpack.Timestamp(5, 6)}]]
    for magic, records in ((logfile.JOURNAL_MAGIC, list(core.records) + payloads),
                           (logfile.SNAPSHOT_MAGIC, list(core.snapshot()))):
        path = tmp_path / f"old-{magic.decode()}"
        _old_file(path, magic, records)
        got = logfile.scan(path, magic)
        assert got.damage is None, got.damage
        expected = [msgpack.unpackb(msgpack_bytes(rec), strict_map_key=False) for rec in records]
        assert got.records == expected
        written = [msgpack_bytes(rec) for rec in records]
        assert [pack_from_rsd(rec) for rec in got.records] == written


# ---- damage -----------------------------------------------------------------------------------


@fuzz.fuzz_settings(300)
@given(seed=st.integers(0, 2**64 - 1))
def test_a_clients_decoder_refuses_damage_with_a_protocol_error_only(seed: int) -> None:
    rng = random.Random(seed)
    known = Known()
    frames = [fuzz.frame(msgpack_bytes([int(Kind.REPLY), rid, {"data": fuzz.junk(rng)}]))
              for rid in range(1, 9)]
    frames += [fuzz.frame(fuzz.hostile_body(rng, known)) for _ in range(8)]
    for data in [fuzz.mutated(rng, b"".join(frames)), *(fuzz.mutated(rng, f) for f in frames)]:
        decoder = Decoder(from_rsd=True)
        try:
            decoder.feed(data)
        except FrameError as exc:
            assert exc.code in (ErrorCode.PROTOCOL_ERROR, ErrorCode.FRAME_TOO_LARGE)
