"""Task groups: ``run.group(name)``, waiting until enough of its tasks have succeeded.

A task joins a group when it is submitted with ``group=``. ``wait()`` parks on the
server (GROUP_WAIT) and is answered the moment the ``need``-th task succeeds: nothing
polls. When ``need`` can no longer be reached (too many tasks ended otherwise) it
returns at once with ``reached`` False and the counts, instead of waiting for a timeout:
check ``result["reached"]``. A timeout raises WaitTimeoutError; the tasks keep going.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypedDict, cast

from .errors import InvalidArgumentError, WaitTimeoutError
from .retry import wait_across_reconnects
from .wire import Limits, Op

if TYPE_CHECKING:
    from .session import Session

__all__ = ["GroupDone", "GroupStatus", "GroupWaitResult", "TaskGroup"]


class GroupStatus(TypedDict):
    """A group's tasks counted by state (``counts``: state name -> number)."""

    group: str
    tasks: int
    counts: dict[str, int]
    succeeded: int
    unfinished: int
    waiters: int


class GroupDone(TypedDict, total=False):
    """One succeeded task of a group: ``outcome`` unless asked without outcomes."""

    id: str
    key: str | None
    outcome: Any


class GroupWaitResult(GroupStatus, total=False):
    """``reached``: whether ``need`` successes were reached; ``done``: the first
    ``need`` succeeded tasks in the order they succeeded (empty if not reached);
    ``cancelled``: tasks ``cancel_rest`` ended; ``why``: set when not reached."""

    reached: bool
    need: int
    done: list[GroupDone]
    cancelled: int
    why: str


class TaskGroup:
    """The task group ``name`` of one run (no I/O until used)."""

    def __init__(self, session: Session, scope: str, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError("a group name must be a non-empty string")
        if len(name.encode()) > Limits.MAX_GROUP_NAME_BYTES:
            raise InvalidArgumentError(
                f"a group name may be at most {Limits.MAX_GROUP_NAME_BYTES} bytes"
            )
        self._session = session
        self.scope_id = scope
        self.name = name

    def __repr__(self) -> str:
        return f"<TaskGroup {self.scope_id}/{self.name}>"

    async def status(self) -> GroupStatus:
        """The group's tasks counted by state, as the server sees them now."""
        reply = await self._session.call(
            Op.GROUP_STATUS, {"scope": self.scope_id, "group": self.name}
        )
        return cast("GroupStatus", reply)

    async def wait(
        self,
        need: int | None = None,
        *,
        cancel_rest: bool = False,
        timeout_ms: int | None = None,
        outcomes: bool = True,
    ) -> GroupWaitResult:
        """Wait until ``need`` tasks of the group have SUCCEEDED (default: all the
        group's tasks when the server gets the wait). With ``cancel_rest`` the group's
        unfinished tasks are then cancelled. Returns at once with ``reached`` False when
        ``need`` can no longer be reached. ``timeout_ms=None`` waits as long as it
        takes; ``outcomes=False`` returns ids only (for large outcomes)."""
        if need is not None and (
            isinstance(need, bool) or not isinstance(need, int)
            or not 1 <= need <= Limits.MAX_GROUP_TASKS
        ):
            raise InvalidArgumentError(
                f"need must be an integer from 1 to {Limits.MAX_GROUP_TASKS}, got {need!r}"
            )
        args: dict[str, Any] = {
            "scope": self.scope_id, "group": self.name, "need": need,
            "cancel_rest": bool(cancel_rest), "outcomes": bool(outcomes),
        }
        reply, _ = await wait_across_reconnects(
            self._session, Op.GROUP_WAIT, args,
            None if timeout_ms is None else max(0, int(timeout_ms)),
            time_up=lambda: WaitTimeoutError(
                f"group {self.name!r} had not reached its need within {timeout_ms} ms"
            ),
        )
        return cast("GroupWaitResult", reply)
