"""A slot move under a fault, for the tests that kill a primary (or etcd's leader) while
slots move between shards (rsd/wire/slotmoves.py, slotimport.py).

``Seam`` is one of a move's test seams (rsd/disk/failpoints.py: ``slots.send_part.hold``,
``slots.import_part.hold``, ``slots.before_switch.hold``): the nodes started with its
``env`` stop their event loop at that step of a move while the seam is armed, and the
test sees it reached (a file the point writes), does its fault there, and lets go. No
timing: the fault lands at that step whatever the machine's load.

``ask_move`` sends SLOTS_MOVE to a node and returns its answer or what ended it (a move
whose source is killed never answers); ``move_until_done`` asks the owner again until a
move is done (a rolled-back move is tried again once the shards have primaries). The
slot map's history: ``map_versions`` reads every version etcd kept of the map's key
(one read per version, back from the last through each one's previous revision),
``etcd_leader`` the member etcd's own status names its leader.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rsclient import wire
from rsproto.slots import SlotMap

from .etcd import EtcdCluster
from .history import MapVersion
from .raw import raw_connect
from .shards import slot_map

__all__ = ["Seam", "ask_move", "etcd_leader", "map_versions", "move_until_done"]


class Seam:
    """A ``slots.*.hold`` failpoint (``point``, ``:N`` for its N-th visit on) that holds
    a move on the nodes started with ``env``, while armed."""

    def __init__(self, root: Path, point: str) -> None:
        self.point = point
        self.file = root / f"{point.partition(':')[0]}.hold"

    @property
    def env(self) -> dict[str, str]:
        return {"RSD_FAILPOINTS": self.point, "RSD_FAILPOINTS_HOLD_FILE": str(self.file)}

    def arm(self) -> None:
        self.file.write_text("")

    async def reached(self, alive: Callable[[], bool], timeout: float = 30.0) -> None:
        """Until a node waits at the point (it wrote ``<file>.reached``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        marker = Path(f"{self.file}.reached")
        while not marker.exists():
            assert alive() and loop.time() < deadline, f"the move never reached {self.point}"
            await asyncio.sleep(0.01)

    def release(self) -> None:
        """Every node waiting at the point goes on; none waits there again."""
        self.file.unlink(missing_ok=True)


async def ask_move(address: str, lo: int, hi: int, to: str,
                   timeout: float = 30.0) -> tuple[bool, Any]:
    """SLOTS_MOVE of ``lo``..``hi`` to ``to``, sent to ``address``: ``(True, reply)``,
    ``(False, [code, message])`` if refused, ``(False, why)`` if no answer came."""
    try:
        conn = await raw_connect(address)
    except OSError as exc:
        return False, f"not reached: {exc}"
    try:
        await conn.hello("mover")
        answer = await conn.call(wire.Op.SLOTS_MOVE, {"lo": lo, "hi": hi, "to": to}, timeout)
    except (EOFError, OSError, TimeoutError, AssertionError) as exc:  # (a HELLO refused)
        return False, f"no answer: {type(exc).__name__} {exc}"
    finally:
        conn.close()
    if answer[0] == wire.Kind.REPLY:
        return True, answer[2]
    return False, answer[2:4]


async def move_until_done(primaries: Callable[[], dict[str, str]], lo: int, hi: int,
                          to: str, timeout: float = 30.0) -> SlotMap:
    """Slots ``lo``..``hi`` given to ``to``: asked of their owner by the map its primary
    holds (``primaries()``: shard -> its primary's address now), again while a move is
    refused as not possible now (no primary yet, the target not reached); the map as the
    target's primary holds it after."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    tried: list[Any] = []
    while True:
        assert loop.time() < deadline, f"slots {lo}-{hi} never moved to {to}: {tried[-3:]}"
        now = primaries()
        try:
            seen = await slot_map(now[to])
        except (OSError, EOFError, TimeoutError, AssertionError) as exc:  # not primary
            tried.append(f"no map from {to}'s primary {now[to]}: {exc!r}")
        else:
            owner = seen.owner(lo)
            if owner == to and seen.owner(hi) == to:
                return seen
            done, answer = await ask_move(now[owner], lo, hi, to, timeout)
            tried.append(answer)
            if done:
                continue  # read back from the target's primary
        await asyncio.sleep(0.2)


def _post(endpoint: str, path: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(f"http://{endpoint}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5.0) as reply:
        return json.loads(reply.read())


def _live(etcd: EtcdCluster) -> list[str]:
    return [member.endpoint for member in etcd.members if member.running()]


def map_versions(etcd: EtcdCluster, cluster: str) -> list[MapVersion]:
    """Every version etcd kept of cluster ``cluster``'s slot map, oldest first."""
    endpoint = _live(etcd)[0]
    key = base64.b64encode(f"/rsd/{cluster}/slotmap".encode()).decode()
    versions: list[MapVersion] = []
    revision = 0  # 0: the latest
    while True:
        body: dict[str, Any] = {"key": key}
        if revision:
            body["revision"] = revision
        found = _post(endpoint, "/v3/kv/range", body).get("kvs") or []
        if not found:
            return versions[::-1]
        kv = found[0]
        written = int(kv["mod_revision"])
        versions.append(MapVersion(written, json.loads(base64.b64decode(kv["value"]))))
        revision = written - 1


def etcd_leader(etcd: EtcdCluster) -> int:
    """The index of the member that leads etcd now (as a live member's status says)."""
    for endpoint in _live(etcd):
        with contextlib.suppress(OSError, ValueError):
            leader = _post(endpoint, "/v3/maintenance/status", {}).get("leader")
            for n, member in enumerate(etcd.members):
                if not member.running():
                    continue
                status = _post(member.endpoint, "/v3/maintenance/status", {})
                if status["header"]["member_id"] == leader:
                    return n
    raise AssertionError(f"no etcd member names a live leader: {etcd.logs()}")
