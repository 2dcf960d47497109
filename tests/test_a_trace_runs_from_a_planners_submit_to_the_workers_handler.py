"""Traces across the fleet (rsclient/tracing.py, protocol.md "Trace context"): a planner's
``submit`` runs in a ``submit`` span whose W3C context rsd keeps with the task, and the
worker's ``consume()`` runs the handler in a ``handle`` span whose parent is that span,
then settles in a ``complete`` span under it: one trace from the submit to the handler
and back to the planner's result. Each client has its own tracer provider and in-memory
exporter (two processes' worth; the global provider is never set, so the other tests of
a worker process see no tracing). Against a real rsd, shared by the module: each test
works in runs of its own. The core's side (kept in the journal, snapshots and a moved
run; bad shapes refused) is test_core_a_task_keeps_its_submitters_trace_context.py's."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from support.process import Rsd

from rsclient import AsyncRunstate, Delivery, InvalidArgumentError
from rsclient.wire import Op

pytestmark = pytest.mark.rsd_per_module


class Traced:
    """A client with a tracer provider of its own and the spans it finished."""

    def __init__(self, rsd: Rsd, holder: str, traced: bool = True) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.rs = AsyncRunstate(holder=holder, address=rsd.address,
                                tracer_provider=self.provider if traced else None)

    def spans(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.exporter.get_finished_spans() if span.name == name]


@pytest.fixture
async def traced(rsd: Rsd) -> AsyncIterator[Callable[..., Traced]]:
    made: list[Traced] = []

    def make(holder: str, traced: bool = True) -> Traced:
        made.append(Traced(rsd, holder, traced))
        return made[-1]

    yield make
    for each in made:
        await each.rs.close()
        each.provider.shutdown()


async def consume_one(worker: Traced, scope: str, handler: Callable[..., Any]) -> None:
    """Run ``worker``'s consume() on mailbox ``traced`` of ``scope`` until one task is done."""
    done = asyncio.Event()

    async def handle(data: Any, delivery: Delivery) -> Any:
        try:
            return await handler(data, delivery)
        finally:
            done.set()

    stop = asyncio.Event()
    consumer = asyncio.ensure_future(worker.rs.scope(scope).mailbox("traced").consume(
        handle, stop_event=stop))
    await asyncio.wait_for(done.wait(), 30)
    stop.set()
    await asyncio.wait_for(consumer, 30)


async def test_the_handlers_span_is_a_child_of_the_submit_span(
    traced: Callable[..., Traced],
) -> None:
    planner, worker = traced("planner"), traced("worker")
    await planner.rs.mailboxes.ensure("traced", mode="WORK")
    run = await planner.rs.scopes.create()
    tracer = planner.provider.get_tracer("the planner's own code")
    with tracer.start_as_current_span("plan"):
        ticket = await run.mailbox("traced").submit({"n": 1}, key="k1")
    seen: list[Any] = []

    async def handler(data: Any, delivery: Delivery) -> None:
        seen.append(delivery.trace)
        with worker.provider.get_tracer("the worker's own code").start_as_current_span("work"):
            await delivery.complete({"payload": {"doubled": data["n"] * 2}})

    worker_side = asyncio.ensure_future(consume_one(worker, run.id, handler))
    view = await ticket.result(30_000)
    assert view["outcome"] == {"doubled": 2}  # and back
    await worker_side

    (plan,), (submit,) = planner.spans("plan"), planner.spans("submit")
    (handle,), (work,), (complete,) = (
        worker.spans("handle"), worker.spans("work"), worker.spans("complete"))
    assert submit.kind is SpanKind.CLIENT and handle.kind is SpanKind.CONSUMER
    assert submit.parent is not None and submit.parent.span_id == plan.context.span_id
    trace_id = plan.context.trace_id
    assert {span.context.trace_id for span in (submit, handle, work, complete)} == {trace_id}
    assert handle.parent is not None and handle.parent.span_id == submit.context.span_id
    assert handle.parent.is_remote
    assert work.parent is not None and work.parent.span_id == handle.context.span_id
    assert complete.parent is not None and complete.parent.span_id == work.context.span_id
    assert submit.attributes is not None and handle.attributes is not None
    assert submit.attributes["messaging.message.id"] == ticket.id
    assert handle.attributes["messaging.message.id"] == ticket.id
    assert handle.attributes["messaging.destination.name"] == "traced"
    (given,) = seen  # the submit span's context, as W3C writes it (the flags: sampled)
    assert set(given) == {"traceparent"}
    assert given["traceparent"].startswith(f"00-{trace_id:032x}-{submit.context.span_id:016x}-")


async def test_an_untraced_submit_carries_no_trace_and_the_handler_span_is_a_root(
    traced: Callable[..., Traced],
) -> None:
    planner, worker = traced("planner", traced=False), traced("worker")
    await planner.rs.mailboxes.ensure("traced", mode="WORK")
    run = await planner.rs.scopes.create()
    await run.mailbox("traced").submit(None, key="k1")
    seen: list[Any] = []

    async def handler(data: Any, delivery: Delivery) -> None:
        seen.append(delivery.trace)

    await consume_one(worker, run.id, handler)
    assert seen == [None]
    (handle,) = worker.spans("handle")
    assert handle.parent is None


async def test_send_and_submit_many_carry_the_trace_too(traced: Callable[..., Traced]) -> None:
    planner = traced("planner")
    await planner.rs.mailboxes.ensure("traced", mode="WORK")
    run = await planner.rs.scopes.create()
    mailbox = run.mailbox("traced")
    await mailbox.send("sent")
    await mailbox.submit_many([{"data": "many-1"}, {"data": "many-2"}])
    submits = planner.spans("submit")
    assert len(submits) == 2
    parents = {
        "sent": submits[0].context.span_id, "many-1": submits[1].context.span_id,
        "many-2": submits[1].context.span_id,
    }
    for _ in range(3):
        delivery = await mailbox.receive()
        assert delivery is not None and delivery.trace is not None
        assert delivery.trace["traceparent"].split("-")[2] == f"{parents[delivery.data]:016x}"
        await delivery.complete()


async def test_a_bad_trace_is_refused_with_invalid_argument(
    clients: Callable[..., AsyncRunstate],
) -> None:
    rs = clients("planner")
    await rs.mailboxes.ensure("traced", mode="WORK")
    run = await rs.scopes.create()
    for trace in ("00-abc", {"traceparent": "x" * 129}, {"traceparent": "p", "baggage": "b"}):
        with pytest.raises(InvalidArgumentError, match="trace"):
            await rs._session.request(Op.TASK_SUBMIT, {
                "scope": run.id, "mailbox": "traced", "data": None, "trace": trace})
