"""Every record kind is declared once, by name (rsd/core/records/__init__.py, snaprecords.py), and
each declared record comes back field for field through a journal segment and a
snapshot file, and through the layouts of every earlier format version.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.build import compiled

from rsd.core import records as records_module
from rsd.core.records import FORMAT_VERSION, Rec
from rsd.core.records.declaration import ALIASES, DECLARED, Declaration, fields_of, read
from rsd.core.records.itemrecords import ItemEnqueued, Requeued
from rsd.core.upgrade import downgrade, upgrade
from rsd.disk.logfile import (
    JOURNAL_MAGIC,
    SNAPSHOT_MAGIC,
    encode_batch,
    file_header,
    new_salt,
    scan,
)

# A value for each field type the declarations use.
if compiled(records_module):  # (the pure run of `make test` runs it: make test-pure)
    pytest.skip("compiled by mypyc, a record's NamedTuple keeps no field types to sample",
                allow_module_level=True)

_SAMPLE: dict[str, Any] = {
    "str": "s", "str | None": "n", "int": 7, "int | None": 60, "float": 1.5, "float | None": 2.5,
    "bool": True, "bytes": bytes(range(16)), "bytes | None": bytes(range(16)),
    "Any": {"x": [1, "y"]}, "list[str] | None": ["pool"], "list[str]": ["pool"],
    "list[list[Any]] | None": [["quota", 2]], "list[list[Any]]": [["quota", 2]],
    "list[Any]": [1, "a", None], "list[Any] | None": ["a", 1], "dict[str, int]": {"t": 3},
    "dict[str, str | None]": {"sub": None}, "dict[str, Any]": {"id": "t1", "data": 1},
    "dict[str, str] | None": {"traceparent": "00-1-2-01"},
}


def sample(declaration: Declaration) -> tuple[Any, ...]:
    """A record of ``declaration`` with every field set (the tenant the default one, so
    the layouts before version 3 can hold it too)."""
    cls = declaration.type
    values: list[Any] = [declaration.kind]
    for name in cls._fields[1:]:
        kind = cls.__annotations__[name]
        kind = getattr(kind, "__forward_arg__", kind)
        if name == "tenant":
            values.append("default")
        elif name == "delivery":
            values.append([bytes(range(16)), "holder", 30.0])
        else:
            assert kind in _SAMPLE, f"{declaration.kind.name}.{name}: no sample for {kind}"
            values.append(_SAMPLE[kind])
    return cls(*values)  # type: ignore[no-any-return]


RECORDS = [sample(d) for d in DECLARED.values()]
IDS = [Rec(d.kind).name for d in DECLARED.values()]


def test_every_kind_has_one_declaration_or_is_an_old_name_for_one() -> None:
    assert set(DECLARED) | set(ALIASES) == set(Rec)
    assert not set(DECLARED) & set(ALIASES)
    for declaration in DECLARED.values():
        assert declaration.type._fields[0] == "kind"
        assert 1 <= declaration.since <= FORMAT_VERSION
        for version in declaration.fields.values():
            assert declaration.since <= version <= FORMAT_VERSION


@pytest.mark.parametrize("magic", [JOURNAL_MAGIC, SNAPSHOT_MAGIC])
def test_every_declared_record_comes_back_field_for_field(tmp_path: Path, magic: bytes) -> None:
    salt = new_salt()
    path = tmp_path / "file"
    path.write_bytes(file_header(magic, 1, salt) + encode_batch(RECORDS, salt))
    result = scan(path, magic)
    assert result.damage is None and result.version == FORMAT_VERSION
    assert len(result.records) == len(RECORDS)
    written: Any
    for written, got in zip(RECORDS, result.records, strict=True):
        assert read(got) is got  # exactly its declared fields: passed on as it is
        assert dict(zip(fields_of(got[0]), got, strict=True)) == written._asdict()


@pytest.mark.parametrize("rec", RECORDS, ids=IDS)
@pytest.mark.parametrize("version", range(1, FORMAT_VERSION + 1))
def test_every_declared_record_survives_the_layout_of_each_earlier_version(
    rec: tuple[Any, ...], version: int
) -> None:
    declaration = DECLARED[rec[0]]
    if declaration.since > version:
        return  # the kind did not exist yet
    old = downgrade(rec, version)
    back = upgrade(old, version)
    for name, value in zip(declaration.type._fields, back, strict=True):
        change = declaration.changed.get(name)
        if change is not None and version < change[0]:  # a lease id then: 8 bytes now
            assert repr(value) == repr(change[1](_lease_id(getattr(rec, name)))), name
        elif declaration.field_since(name) <= version:
            assert value == getattr(rec, name), name
        else:
            assert value == declaration.type._field_defaults.get(
                name, declaration.older.get(name)), name


def _lease_id(value: Any) -> Any:
    """A handle's (or a delivery's) lease id, as files before version 3 held it."""
    if isinstance(value, bytes):
        return int.from_bytes(value[:8], "big")
    return [int.from_bytes(value[0][:8], "big"), *value[1:]]


def test_an_optional_field_left_out_takes_its_default() -> None:
    """A version 4 REQUEUED without its settlement's instant, as the first version 4
    files wrote it."""
    rec = [Rec.REQUEUED, "t1", bytes(16), "lease_expired", 1.0, "lease expired"]
    assert Requeued(*read(rec)).settled_wall is None
    with pytest.raises(ValueError, match="lacks"):
        read(rec[:4])
    with pytest.raises(ValueError, match="fields"):
        read([*rec, None, "one too many"])
    with pytest.raises(ValueError, match="unknown record type"):
        read([99, 1])


def test_an_item_with_needs_of_a_version_4_file_is_read_as_its_item_enqueued() -> None:
    """ITEM_ENQUEUED_NEEDS is no longer written, and still read, with its needs."""
    fields = ["t1", False, "run", "box", "key", b"d", {"a": 1}, 5.0, None, "default"]
    for version in (3, 4):
        got = ItemEnqueued(*upgrade([Rec.ITEM_ENQUEUED_NEEDS, *fields, ["p"], [["q", 1]]],
                                    version))
        assert got.kind == Rec.ITEM_ENQUEUED
        assert (got.pools, got.quotas) == (["p"], [["q", 1]])
        plain = ItemEnqueued(*upgrade([Rec.ITEM_ENQUEUED, *fields], version))
        assert (plain.pools, plain.quotas) == (None, None) and plain[1:11] == got[1:11]
    assert fields_of(Rec.ITEM_ENQUEUED_NEEDS) == ItemEnqueued._fields
