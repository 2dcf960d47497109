"""Records of files written before today's format version, brought to today's layouts by
their declarations (records.py): recovery passes each record of an older file through
``upgrade`` before applying it, so the appliers know one layout only.

Format version 3 added two things to records: the tenant each object belongs to, and
lease handles where lease ids were; later versions only appended fields with defaults
and added kinds (and renamed ITEM_ENQUEUED_NEEDS: ``ALIASES``). Files of versions 1 and
2 are still read.

What always holds:
- an object of an old file belongs to ``DEFAULT_TENANT``, the tenant every connection
  has without a tokens file (the only way rsd ran before tenants);
- an old lease id becomes an 8-byte handle (the id alone, big-endian): a lease
  recovered so is found by its records and ends as they say, but no client can
  present it (every handle on the wire has 16 bytes), so it is never renewed and lives
  out the one lease length every recovered lease gets; its holder, which spoke the
  older protocol, could not have renewed it anyway;
- a record of a kind that appeared after the file's version (tests write such files)
  has that kind's first layout;
- a field that appeared after the file's version takes its declared ``older`` value
  or its default; a field whose form changed after it is converted by the declared
  function; nothing else moves;
- ``upgrade`` is pure, and applying an upgraded record twice is as harmless as any.
"""

from __future__ import annotations

from typing import Any, Final

from .ground.tenants import DEFAULT_TENANT
from .records import FORMAT_VERSION, Rec, read
from .records.declaration import ALIASES, DECLARED, Declaration, old_handle

__all__ = ["RECORDS_VERSION", "downgrade", "old_handle", "upgrade"]

RECORDS_VERSION = FORMAT_VERSION  # a file of this version is read as it is (``read``)
assert DECLARED[Rec.SCOPE_CREATED].older["tenant"] == DEFAULT_TENANT


def upgrade(rec: list[Any], version: int = 2) -> list[Any]:
    """``rec`` (as read from a file of format ``version``) in today's layout."""
    kind = rec[0]
    as_is = _AS_IS.get((kind, version))
    if as_is is None:
        as_is = _AS_IS[(kind, version)] = _prefix_of_today(kind, version)
    if as_is:
        return list(read(rec))
    if kind in _ALIASES:
        kind, laid_out = _ALIASES[kind]
        version = max(version, laid_out)
    declaration = DECLARED.get(kind)
    if declaration is None:
        raise ValueError(f"unknown record type {rec[0]!r}")
    version = max(version, declaration.since)  # a kind is laid out as when it appeared
    names: tuple[str, ...] = declaration.type.__dict__["_fields"]
    defaults: dict[str, Any] = declaration.type.__dict__["_field_defaults"]
    out: list[Any] = [kind]
    at = 1
    for name in names[1:]:
        if declaration.field_since(name) <= version and at < len(rec):
            value = rec[at]
            at += 1
            change = declaration.changed.get(name)
            if change is not None and version < change[0]:
                value = change[1](value)
        elif name in declaration.older and declaration.field_since(name) > version:
            value = declaration.older[name]
        elif name in defaults:
            value = defaults[name]
        else:
            raise ValueError(f"record {declaration.kind.name} lacks {name}")
        out.append(value)
    if at < len(rec):
        raise ValueError(f"record {declaration.kind.name} has {len(rec)} fields, "
                         f"declared {len(names)}")
    return list(read(out))


_AS_IS: Final[dict[tuple[int, int], bool]] = {}  # (kind, version) -> ``_prefix_of_today``
# records/declaration.py is run as Python: a name imported from it is looked up at each
# use, a Final of this module's is a static (compiled).
_ALIASES: Final = ALIASES


def _prefix_of_today(kind: int, version: int) -> bool:
    """Whether a ``kind`` record of a ``version`` file is today's record cut short at
    most (``read`` fills it): no field of it changed form, or took an ``older`` value,
    after that version (versions 3 and 4 only appended fields with defaults)."""
    declaration = DECLARED.get(kind)
    if declaration is None:
        return False
    return all(v <= version for v, _ in declaration.changed.values()) and all(
        declaration.field_since(name) <= version for name in declaration.older)


def downgrade(rec: Any, version: int = 2) -> list[Any]:
    """``rec`` in the layout of format ``version`` (1 and 2: the default tenant's
    only; a handle keeps only its id): the inverse of ``upgrade``. For tests and
    benchmarks that need old files, like the encoders of logfile_v1.py; rsd never
    writes them."""
    kind = rec[0]
    declaration: Declaration = DECLARED[kind]
    version = max(version, declaration.since)  # a later kind: as when it appeared
    names: tuple[str, ...] = declaration.type.__dict__["_fields"]
    out: list[Any] = [kind]
    for name, value in zip(names[1:], list(rec)[1:], strict=True):
        if declaration.field_since(name) > version:
            assert name not in declaration.older or value == declaration.older[name], (
                f"{name} {value!r} did not exist before version {declaration.field_since(name)}")
            continue
        change = declaration.changed.get(name)
        if change is not None and version < change[0]:
            value = _old_form(value)
        out.append(value)
    return out


def _old_form(value: Any) -> Any:
    """A handle (or SNAP_ITEM's delivery) as files before version 3 held it: the id."""
    if type(value) is bytes:
        return int.from_bytes(value[:8], "big")
    if isinstance(value, list | tuple):
        return [int.from_bytes(value[0][:8], "big"), *value[1:]]
    return value
