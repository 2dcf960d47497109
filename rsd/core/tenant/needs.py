"""What a task or message needs to start: one slot of each named pool and quota amounts.

What always holds:
- a ``Needs`` is canonical: pool names sorted and distinct, quota names sorted and
  distinct, every amount from 1 to ``Limits.MAX_QUOTA_LIMIT``; two requests that name the
  same capacity in another order need the same thing (and so have the same idempotency
  salt, ``salt``);
- ``parse_needs`` is the one check of a request's ``needs`` argument: a map with
  ``pools`` (an array of at most ``max_needs_pools`` names) and ``quotas`` (a map of at
  most ``max_needs_quotas`` names to amounts); every pool and quota must exist in the
  caller's tenant (else NOT_FOUND, as for POOL_ACQUIRE and QUOTA_TAKE) and every amount
  must be within its quota's limit (else INVALID_ARGUMENT naming the limit: it could never
  be taken). An absent, nil or empty ``needs`` is no needs at all;
- in a sharded cluster (``homes``: whether a name's slot is this shard's) the names of
  another shard are not checked here (their shard checks them when asked for a grant:
  work/grants.py), and needs name this shard's pools and quotas alone or other shards'
  alone (INVALID_ARGUMENT for a mix); a name of another shard that this shard still
  knows (a pool or quota left behind by a slot move) is INVALID_ARGUMENT too: pools
  and quotas do not move with slots yet; needs of another shard are served for the
  default tenant only (the shard asks for them with the cluster token, whose tenant
  that is: wire/remoteneeds.py);
- the needs of an item are fixed when it is made (ITEM_ENQUEUED's and SNAP_ITEM's
  pools and quotas fields carry them in ``as_record``'s layout; older files' own
  records, ITEM_ENQUEUED_NEEDS and SNAP_ITEM_NEEDS, are still read), so a replay knows
  which pools a delivery holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rsproto import ErrorCode, Limits

from ..ground.errors import CoreError
from ..ground.tenants import DEFAULT_TENANT
from ..ground.validate import check_number, invalid

if TYPE_CHECKING:
    from .pool import Pool
    from .quota import Quota

__all__ = ["Needs", "parse_needs"]


class Needs:
    """The capacity one item needs for each delivery: immutable once made."""

    __slots__ = ("pools", "quotas")

    def __init__(self, pools: tuple[str, ...], quotas: tuple[tuple[str, int], ...]) -> None:
        self.pools = pools
        self.quotas = quotas

    @classmethod
    def from_record(cls, pools: Any, quotas: Any) -> Needs:
        return cls(tuple(pools), tuple((name, amount) for name, amount in quotas))

    def as_record(self) -> tuple[list[str], list[list[Any]]]:
        """The (pools, quotas) fields of ITEM_ENQUEUED and SNAP_ITEM (records.py)."""
        return list(self.pools), [[name, amount] for name, amount in self.quotas]

    def view(self) -> dict[str, Any]:
        return {"pools": list(self.pools), "quotas": dict(self.quotas)}

    def salt(self) -> str:
        """Mixed into the input digest: the same data with other needs is other input."""
        quotas = ",".join(f"{name}={amount}" for name, amount in self.quotas)
        return "\x00needs\x00" + "\x00".join(self.pools) + "\x00|" + quotas


def _name(value: Any, what: str, max_bytes: int) -> str:
    if type(value) is not str or not value:
        raise invalid(f"each {what} name in needs must be a non-empty string")
    if len(value.encode()) > max_bytes:
        raise invalid(f"a {what} name in needs is over {max_bytes} bytes")
    return value


def _everywhere(name: str) -> bool:
    return True


def parse_needs(
    args: dict[str, Any], tenant: str, pools: Mapping[tuple[str, str], Pool],
    quotas: Mapping[tuple[str, str], Quota], homes: Callable[[str], bool] = _everywhere,
) -> Needs | None:
    """The request's ``needs``, checked against the tenant's pools and quotas (those
    ``homes`` says are this shard's). O(needs)."""
    raw = args.get("needs")
    if raw is None:
        return None
    pool_names, quota_amounts = _shape(raw)
    here: set[bool] = set()  # whether each name is this shard's
    names = _needed_pools(pool_names, tenant, pools, homes, here)
    amounts = _needed_quotas(quota_amounts, tenant, quotas, homes, here)
    if not names and not amounts:
        return None
    if len(here) > 1:
        raise invalid(
            "needs name pools or quotas of this shard and of another: a task's needs are "
            "all of its run's shard or all of one other shard; give them one {tag}"
        )
    if here == {False} and tenant != DEFAULT_TENANT:
        raise invalid(
            f"needs of another shard are served for the tenant {DEFAULT_TENANT!r} only (its "
            "shard asks for them with the cluster token): place this tenant's runs with its "
            "pools and quotas, giving them one {tag}"
        )
    return Needs(tuple(sorted(names)), tuple(sorted(amounts)))


def _shape(raw: Any) -> tuple[list[Any], dict[Any, Any]]:
    """``needs``' pool names and quota amounts, their types and counts checked."""
    if type(raw) is not dict or not set(raw) <= {"pools", "quotas"}:
        raise invalid('needs must be a map with "pools" (an array) and "quotas" (a map)')
    pool_names = raw.get("pools") or []
    quota_amounts = raw.get("quotas") or {}
    if type(pool_names) is not list:
        raise invalid("needs.pools must be an array of pool names")
    if type(quota_amounts) is not dict:
        raise invalid("needs.quotas must be a map of quota names to amounts")
    if len(pool_names) > Limits.MAX_NEEDS_POOLS:
        raise invalid(
            f"needs names {len(pool_names)} pools; the limit is {Limits.MAX_NEEDS_POOLS}"
        )
    if len(quota_amounts) > Limits.MAX_NEEDS_QUOTAS:
        raise invalid(
            f"needs names {len(quota_amounts)} quotas; the limit is {Limits.MAX_NEEDS_QUOTAS}"
        )
    return pool_names, quota_amounts


def _needed_pools(
    pool_names: list[Any], tenant: str, pools: Mapping[tuple[str, str], Pool],
    homes: Callable[[str], bool], here: set[bool],
) -> list[str]:
    """The pools named, each once, each this shard's and existing or another's (whether
    each is this shard's added to ``here``)."""
    names = [_name(name, "pool", Limits.MAX_POOL_NAME_BYTES) for name in pool_names]
    if len(set(names)) != len(names):
        raise invalid("needs.pools names a pool twice; a task holds one slot of each pool")
    for name in names:
        home = homes(name)
        here.add(home)
        if not home:
            _not_left_behind(name, "pool", (tenant, name) in pools)
        elif (tenant, name) not in pools:
            raise CoreError(ErrorCode.NOT_FOUND, f"pool {name!r} does not exist: ensure it first")
    return names


def _needed_quotas(
    quota_amounts: dict[Any, Any], tenant: str, quotas: Mapping[tuple[str, str], Quota],
    homes: Callable[[str], bool], here: set[bool],
) -> list[tuple[str, int]]:
    """The quotas named with their amounts, each amount one the quota could give (a
    quota of this shard) or checked there (another's; whether each is this shard's added
    to ``here``)."""
    amounts: list[tuple[str, int]] = []
    for name, amount in quota_amounts.items():
        name = _name(name, "quota", Limits.MAX_QUOTA_NAME_BYTES)
        if type(amount) is not int:
            raise invalid(f"needs.quotas[{name!r}] must be an integer amount")
        check_number(amount, f"needs.quotas[{name!r}]", 1, Limits.MAX_QUOTA_LIMIT)
        home = homes(name)
        here.add(home)
        if not home:
            _not_left_behind(name, "quota", (tenant, name) in quotas)
            amounts.append((name, amount))
            continue
        quota = quotas.get((tenant, name))
        if quota is None:
            raise CoreError(ErrorCode.NOT_FOUND, f"quota {name!r} does not exist: ensure it first")
        if amount > quota.limit:
            raise invalid(
                f"needs.quotas[{name!r}] is {amount}, above the limit of quota {name!r}, "
                f"{quota.limit}: it could never be taken"
            )
        amounts.append((name, amount))
    return amounts


def _not_left_behind(name: str, what: str, known: bool) -> None:
    """A name of another shard that this shard's book still holds: refused (see the
    module docstring), so that an item's needs are elsewhere exactly when this shard
    does not know them (blocked.py's ``elsewhere``)."""
    if known:
        raise invalid(
            f"{what} {name!r} belongs to another shard by the slot map, but this shard still "
            f"holds it (a slot move left it here): a {what} does not move with its slot yet"
        )
