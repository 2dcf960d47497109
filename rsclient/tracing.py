"""OpenTelemetry spans and the W3C trace context, from a task's submit to its handler.

With ``opentelemetry-api`` installed (``pip install rsclient[otel]``) and a tracer
provider set (or given as ``AsyncRunstate(tracer_provider=...)``), ``submit`` (and
``submit_many``, ``send``) runs in a ``submit`` span (client kind) and puts that span's
context in the request's ``trace`` (``traceparent``, and ``tracestate`` if any); rsd
keeps it with the task and gives it back with each delivery (protocol.md, "Trace
context"); ``consume()`` runs the handler in a ``handle`` span (consumer kind) whose
parent is that context; a delivery's ``complete`` (``retry``, ``reject``) runs in a span
of that name, under the ``handle`` span when consume() settles it.
So one trace runs from the planner's submit to the worker's handler and back.

What always holds: without ``opentelemetry-api``, or with it and no tracer provider,
the task path makes no call of this module: a client's ``Session.spans`` is None
(decided once, when the client is made), and each path tests only that attribute.
The API is imported only when a client is made, never by ``import rsclient``, and only
if a provider is given or the process imported the API already (who else would have
set a provider?).
"""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .deliveries import Delivery

__all__ = ["Spans", "spans_for"]

T = TypeVar("T")
_NOT_INSTALLED = False  # set once an import of opentelemetry failed: not tried again


class Spans:
    """rsclient's spans, made by one OpenTelemetry tracer; the W3C propagator."""

    def __init__(self, tracer: Any, trace_api: Any, propagator: Any) -> None:
        self._tracer = tracer
        self._api = trace_api
        self._propagator = propagator

    @contextmanager
    def submit(self, scope: str, mailbox: str, args: dict[str, Any]) -> Iterator[Any]:
        """A ``submit`` span (client kind) around a submit or send, its context put in
        ``args["trace"]`` (or, for TASK_SUBMIT_MANY's ``items``, in each item's)."""
        with self._tracer.start_as_current_span(
            "submit", kind=self._api.SpanKind.CLIENT,
            attributes={"messaging.system": "rsd", "messaging.destination.name": mailbox,
                        "rsd.scope": scope},
        ) as span:
            carrier: dict[str, str] = {}
            self._propagator.inject(carrier)
            if carrier:
                items = args.get("items")
                if items is None:
                    args["trace"] = carrier
                else:
                    for item in items:
                        item.setdefault("trace", carrier)
            yield span

    async def submitted(
        self, scope: str, mailbox: str, args: dict[str, Any], send: Callable[[], Awaitable[T]]
    ) -> T:
        """``send()`` (the request made of ``args``) in a ``submit`` span; the task's id
        set on the span when the answer names one."""
        with self.submit(scope, mailbox, args) as span:
            reply = await send()
            answer: Any = getattr(reply, "id", None) or (
                reply.get("id") if isinstance(reply, dict) else None)
            if isinstance(answer, str):
                span.set_attribute("messaging.message.id", answer)
            return reply

    async def handled(
        self, delivery: Delivery, handle: Callable[[], Awaitable[T]]
    ) -> T:
        """``handle()`` (the handler and the settlement of ``delivery``) in a ``handle``
        span (consumer kind), a child of the submitter's span when the delivery carries
        its trace."""
        parent = None
        if delivery.trace is not None:
            parent = self._propagator.extract(carrier=delivery.trace)
        with self._tracer.start_as_current_span(
            "handle", context=parent, kind=self._api.SpanKind.CONSUMER,
            attributes={"messaging.system": "rsd",
                        "messaging.destination.name": delivery.mailbox,
                        "messaging.message.id": delivery.id, "rsd.scope": delivery.scope_id,
                        "rsd.attempt": delivery.attempt},
        ):
            return await handle()

    async def settled(self, name: str, settle: Callable[[], Awaitable[T]]) -> T:
        """``settle()`` in a span named ``name`` (``complete``, ``retry``, ``reject``), a
        child of the current one (in consume(), the delivery's ``handle`` span)."""
        with self._tracer.start_as_current_span(name):
            return await settle()


def spans_for(provider: Any = None) -> Spans | None:
    """rsclient's spans: made by ``provider``'s tracer if given, else from the global tracer
    provider if one was set; None when opentelemetry-api is not installed or no
    provider is (the task path then makes no call here)."""
    global _NOT_INSTALLED
    if provider is None and (_NOT_INSTALLED or "opentelemetry.trace" not in sys.modules):
        # No provider can have been set in a process that never imported the API: it
        # is not imported here either (its objects would make the collector's passes
        # longer, about 1 % more instructions per task: bench.client_path, callgrind).
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import (
            TraceContextTextMapPropagator,
        )
    except ImportError:
        _NOT_INSTALLED = True
        return None
    if provider is None:
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
            return None  # none set: no spans to make
    return Spans(provider.get_tracer("rsclient"), trace, TraceContextTextMapPropagator())
