"""A lease keeper on no server, for the SDK's lease rules shown without a connection
(leases made, held, renewed by hand or declared lost in the test itself)."""

from __future__ import annotations

from typing import Any

from rsclient.keeper import LeaseKeeper

__all__ = ["keeper_on_no_server"]


class _NoServer:
    """A connection the keeper can be built on; nothing here may reach it."""

    server_info: dict[str, Any] = {}

    def on_push(self, event: int, handler: Any) -> None:
        pass

    def on_link_lost(self, handler: Any) -> None:
        pass

    async def request(self, op: int, args: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("no request expected")


def keeper_on_no_server() -> LeaseKeeper:
    """A ``LeaseKeeper`` whose connection takes its handlers and never calls them."""
    return LeaseKeeper(_NoServer())  # type: ignore[arg-type]
