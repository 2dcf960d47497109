"""The sync client's calls are the async client's, written once: every sync method that
mirrors an async one has its parameters, defaults and docstring (``help()`` and
``inspect.signature`` show them), ``Runstate`` takes ``AsyncRunstate``'s arguments, and a
public async method is either in the sync client or named here as async-only. The few
sync methods written by hand (their behaviour differs in threads) keep the async
parameter names and defaults. A derived call runs the async object's own method, so a
pool's ``inspect`` (an override of the claim's) is the pool's.
"""

from __future__ import annotations

import inspect
import pydoc
from typing import Any

import pytest

import rsclient.sync as sync
from rsclient import claims, deliveries, fence, groups, leases, mailboxes, pools, quotas, tasks
from rsclient import client as aclient
from rsclient.sync import client as sclient

PAIRS: list[tuple[type[Any], type[Any]]] = [
    (sync.Runstate, aclient.AsyncRunstate),
    (sync.Scopes, aclient.Scopes),
    (sync.Scope, aclient.Scope),
    (sclient.Fence, fence.Fence),
    (sync.Mailboxes, mailboxes.Mailboxes),
    (sync.TaskGroup, groups.TaskGroup),
    (sync.Claim, claims.Claim),
    (sync.Lease, leases.Lease),
    (sync.Ticket, tasks.Ticket),
    (sync.Delivery, deliveries.Delivery),
    (sync.Mailbox, mailboxes.Mailbox),
    (sync.Pools, pools.Pools),
    (sync.Quotas, quotas.Quotas),
    (sync.Quota, quotas.Quota),
]

# Public async calls the sync client does not have (yet), and why.
ASYNC_ONLY = {
    "AsyncRunstate.connection_events",  # an async iterator; sync code uses on_connection_event
    "Lease.add_loss_callback",  # callbacks on the loop's thread: sync code has lost_event
    "Lease.remove_loss_callback",
    "Lease.release_quietly",  # the sync with-block and run() use it internally
    "Lease.released",
    "Delivery.abandon",
    "Ticket.events",  # an async iterator, as connection_events; sync code polls status
}

# Written by hand in the sync client, because in threads they behave otherwise (see each
# docstring); their parameters must still be the async ones (renamed where listed).
BY_HAND = {
    "AsyncRunstate.close": {},
    "Claim.try_acquire": {},
    "Claim.run": {},
    "Lease.lost_event": {},
    "Mailbox.submit_many": {},
    "Mailbox.consume": {"stop_event": "stop"},  # a threading.Event, not an asyncio one
}


def _public(cls: type[Any]) -> list[str]:
    return [
        name for name, member in vars(cls).items()
        if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
    ]


def _params(fn: Any, renames: dict[str, str] | None = None) -> list[tuple[str, Any, Any]]:
    renames = renames or {}
    return [
        (renames.get(p.name, p.name), p.kind, p.default)
        for p in inspect.signature(fn).parameters.values()
    ]


def _function(member: Any) -> Any:
    return member.fget if isinstance(member, property) else member


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=lambda c: c.__qualname__)
def test_each_public_async_call_is_in_the_sync_client_or_named_async_only(
    sync_cls: type[Any], async_cls: type[Any]
) -> None:
    missing = [
        f"{async_cls.__name__}.{name}" for name in _public(async_cls)
        if not hasattr(sync_cls, name)
    ]
    assert set(missing) <= ASYNC_ONLY, missing


@pytest.mark.parametrize(("sync_cls", "async_cls"), PAIRS, ids=lambda c: c.__qualname__)
def test_a_mirrored_call_has_the_async_parameters_defaults_and_docstring(
    sync_cls: type[Any], async_cls: type[Any]
) -> None:
    for name in _public(async_cls):
        if not hasattr(sync_cls, name):
            continue
        qualified = f"{async_cls.__name__}.{name}"
        ours = _function(inspect.getattr_static(sync_cls, name))
        theirs = _function(inspect.getattr_static(async_cls, name))
        if qualified in BY_HAND:
            if callable(ours) and not isinstance(inspect.getattr_static(sync_cls, name), property):
                assert _params(ours) == _params(theirs, BY_HAND[qualified]), qualified
            continue
        if not callable(theirs) or isinstance(inspect.getattr_static(async_cls, name), property):
            assert inspect.getdoc(ours) == inspect.getdoc(theirs), qualified
            continue
        assert _params(ours) == _params(theirs), qualified
        assert (inspect.getdoc(ours) or "").startswith(inspect.getdoc(theirs) or "?"), qualified


def test_runstate_takes_the_async_clients_arguments_and_help_shows_them() -> None:
    assert _params(sync.Runstate) == _params(aclient.AsyncRunstate)
    assert "tls" in inspect.signature(sync.Runstate).parameters
    page = pydoc.render_doc(sync.Mailbox, renderer=pydoc.plaintext)
    assert "submit(self, data: 'Any', *, key: 'str | None' = None" in page
    assert "receive_many(self, max: 'int', *, lease_seconds" in page
    assert "-> 'list[Delivery]'" in page  # the sync return type, not the async one
    assert inspect.getdoc(mailboxes.Mailbox.submit) in (inspect.getdoc(sync.Mailbox.submit) or "")


def test_a_derived_method_refuses_the_wrong_kind_of_function_at_import() -> None:
    from rsclient.sync import _derive

    with pytest.raises(TypeError, match="coroutine function"):
        _derive.blocking(leases.Lease.token)
    with pytest.raises(TypeError, match="plain function"):
        _derive.direct(leases.Lease.renew)
    with pytest.raises(TypeError, match="property"):
        _derive.attribute(leases.Lease.token)


def test_a_sync_pool_slot_inspects_the_pool_not_a_claim(rsd: Any) -> None:
    with sync.Runstate(holder="derived", address=rsd.address) as rs:
        rs.pools.ensure("derived-pool", size=2)
        run = rs.scopes.create()
        with run.pool("derived-pool").acquire():
            seen = run.pool("derived-pool").inspect()
        assert (seen["name"], seen["size"], seen["held"]) == ("derived-pool", 2, 1)
        assert run.claim("k").inspect()["held"] is False
        with run.claim("k").acquire() as lease:  # a sync run handle is a fence's Run
            assert rs.fence.check(run, "k", lease.token()) is True
