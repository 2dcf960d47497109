"""How a record kind is declared (records.py, snaprecords.py) and how a record read
from a file is brought to its declaration: the one place that knows what a layout is.

What always holds: see records.py; ``read`` returns a record of exactly its declared
fields, in order, or raises ValueError, and costs one dict lookup and a length check
for a record that already has them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .kinds import Rec

__all__ = [
    "ALIASES", "DECLARED", "WIDTH", "Declaration", "declared", "fields_of", "old_delivery",
    "old_handle", "read",
]


def old_handle(lease_id: Any) -> Any:
    """The handle of a lease recorded by id in files before version 3 (upgrade.py)."""
    return lease_id.to_bytes(8, "big") if type(lease_id) is int and lease_id >= 0 else lease_id


def old_delivery(delivery: Any) -> Any:
    """SNAP_ITEM's delivery as files before version 3 wrote it: (lease id, holder,
    lease seconds) | None."""
    return None if delivery is None else [old_handle(delivery[0]), *delivery[1:]]


@dataclass(frozen=True, slots=True)
class Declaration:
    """What is declared of one record kind besides its fields (see the module docstring)."""

    kind: Rec
    type: type[Any]  # its NamedTuple
    since: int  # the format version in which the kind appeared
    fields: Mapping[str, int] = field(default_factory=dict)  # later fields: version
    changed: Mapping[str, tuple[int, Callable[[Any], Any]]] = field(default_factory=dict)
    older: Mapping[str, Any] = field(default_factory=dict)  # absent before: this value

    def field_since(self, name: str) -> int:
        return self.fields.get(name, self.since)


DECLARED: dict[int, Declaration] = {}
# Kinds that older files wrote and rsd reads as another (their fields a prefix or the
# same): the number stays in ``Rec`` so it is never reused.
ALIASES: dict[int, tuple[Rec, int]] = {}  # old kind -> (kind read as, version of its fields)
WIDTH: dict[int, int] = {}  # kind -> how many fields it has
_T = TypeVar("_T", bound=tuple[Any, ...])


def declared(
    kind: Rec,
    since: int = 1,
    fields: Mapping[str, int] | None = None,
    changed: Mapping[str, tuple[int, Callable[[Any], Any]]] | None = None,
    older: Mapping[str, Any] | None = None,
) -> Callable[[type[_T]], type[_T]]:
    """Register a record kind's declaration (one per kind: a second is an error)."""

    def register(cls: type[_T]) -> type[_T]:
        assert kind not in DECLARED, f"record {kind.name} declared twice"
        names = cls.__dict__["_fields"]
        for name in (*(fields or {}), *(changed or {}), *(older or {})):
            assert name in names, f"{kind.name} has no field {name!r}"
        WIDTH[kind] = len(names)
        DECLARED[kind] = Declaration(
            kind, cls, since, dict(fields or {}), dict(changed or {}), dict(older or {})
        )
        return cls

    return register


def fields_of(kind: int) -> tuple[str, ...]:
    """The field names of a record kind (an old alias: those of the kind it is read as),
    its kind first; ``()`` for a kind no declaration knows."""
    kind = ALIASES.get(kind, (kind, 0))[0]
    declaration = DECLARED.get(kind)
    return () if declaration is None else declaration.type.__dict__["_fields"]


def _defaults(declaration: Declaration) -> dict[str, Any]:
    return dict(declaration.type.__dict__["_field_defaults"])


def read(rec: Any) -> Any:
    """``rec`` (a record of today's format, as decoded from a file, or as built) with its
    declared fields: as it is when it has exactly those (the common case, kept cheap),
    else its missing optional fields filled with their defaults and an old kind read as
    the kind it stands for. ValueError for an unknown kind or a record that does not
    fit its declaration."""
    kind = rec[0]
    width = WIDTH.get(kind)
    if width is not None and len(rec) == width:
        return rec
    return _fill(rec)


def _fill(rec: Any) -> Any:
    kind = rec[0]
    if kind in ALIASES:
        rec = [ALIASES[kind][0], *rec[1:]]
        kind = rec[0]
    declaration = DECLARED.get(kind)
    if declaration is None:
        raise ValueError(f"unknown record type {kind!r}")
    names: tuple[str, ...] = declaration.type.__dict__["_fields"]
    if len(rec) > len(names):
        raise ValueError(f"record {declaration.kind.name} has {len(rec)} fields, "
                         f"declared {len(names)}")
    defaults = _defaults(declaration)
    missing = [name for name in names[len(rec):] if name not in defaults]
    if missing:
        raise ValueError(f"record {declaration.kind.name} lacks {', '.join(missing)}")
    return [*rec, *(defaults[name] for name in names[len(rec):])]
