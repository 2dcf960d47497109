/**
 * Traces across the fleet through the TypeScript SDK against a real rsd (src/tracing.ts),
 * as tests/test_a_trace_runs_from_a_planners_submit_to_the_workers_handler.py does for
 * rsclient: a planner's `submit` runs in a `submit` span whose W3C context rsd keeps with
 * the task; the worker's `consume()` runs the handler in a `handle` span whose parent is
 * that span and settles in a `complete` span under it, one trace from the submit to the
 * handler and back to the planner's result. Each client has a tracer provider of its own
 * and an in-memory exporter (the global provider is never registered).
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { SpanKind } from '@opentelemetry/api';
import {
  BasicTracerProvider,
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
} from '@opentelemetry/sdk-trace-base';

import type { Delivery, Runstate } from '../src/index.js';
import { type RsdServer, client, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

class Traced {
  readonly exporter = new InMemorySpanExporter();
  readonly provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(this.exporter)] });
  readonly rs: Runstate;

  constructor(holder: string, traced = true) {
    this.rs = client(rsd.address, holder, traced ? { tracerProvider: this.provider } : {});
  }

  spans(name: string): ReadableSpan[] {
    return this.exporter.getFinishedSpans().filter((span) => span.name === name);
  }
}

async function consumeOne(worker: Traced, scope: string, handler: (data: unknown, d: Delivery) => Promise<void>) {
  const stop = new AbortController();
  let done!: () => void;
  const handled = new Promise<void>((resolve) => (done = resolve));
  const consumer = worker.rs.scope(scope).mailbox('traced').consume(
    async (data, delivery) => {
      try {
        await handler(data, delivery);
      } finally {
        done();
      }
    },
    { signal: stop.signal },
  );
  await handled;
  stop.abort();
  await consumer;
}

describe('traces across the fleet', () => {
  test("the handler's span is a child of the submit span, in one trace", async () => {
    const planner = new Traced('planner');
    const worker = new Traced('worker');
    try {
      await planner.rs.mailboxes.ensure('traced');
      const run = await planner.rs.scopes.create();
      const ticket = await run.mailbox('traced').submit({ n: 1 }, { key: 'k1' });
      const seen: unknown[] = [];
      const working = consumeOne(worker, run.id, async (data, delivery) => {
        seen.push(delivery.trace);
        await delivery.complete({ payload: { doubled: (data as { n: number }).n * 2 } });
      });
      const view = await ticket.result({ timeoutMs: 30_000 });
      assert.deepEqual(view.outcome, { doubled: 2 }); // and back
      await working;
      const [submit] = planner.spans('submit');
      const [handle] = worker.spans('handle');
      const [complete] = worker.spans('complete');
      assert.ok(submit && handle && complete);
      assert.equal(submit.kind, SpanKind.CLIENT);
      assert.equal(handle.kind, SpanKind.CONSUMER);
      const traceId = submit.spanContext().traceId;
      assert.equal(handle.spanContext().traceId, traceId);
      assert.equal(complete.spanContext().traceId, traceId);
      assert.equal(handle.parentSpanContext?.spanId, submit.spanContext().spanId);
      assert.equal(handle.parentSpanContext?.isRemote, true);
      assert.equal(complete.parentSpanContext?.spanId, handle.spanContext().spanId);
      assert.equal(submit.attributes['messaging.message.id'], ticket.id);
      assert.equal(handle.attributes['messaging.message.id'], ticket.id);
      assert.equal(seen.length, 1);
      const given = seen[0] as { traceparent: string };
      assert.deepEqual(Object.keys(given), ['traceparent']);
      assert.match(given.traceparent, new RegExp(`^00-${traceId}-${submit.spanContext().spanId}-0[13]$`));
    } finally {
      await planner.rs.close();
      await worker.rs.close();
    }
  });

  test('an untraced submit carries no trace and the handler span is a root', async () => {
    const planner = new Traced('planner', false);
    const worker = new Traced('worker');
    try {
      await planner.rs.mailboxes.ensure('traced');
      const run = await planner.rs.scopes.create();
      await run.mailbox('traced').submit(null, { key: 'k1' });
      const seen: unknown[] = [];
      await consumeOne(worker, run.id, async (_data, delivery) => {
        seen.push(delivery.trace);
      });
      assert.deepEqual(seen, [null]);
      const [handle] = worker.spans('handle');
      assert.ok(handle);
      assert.equal(handle.parentSpanContext, undefined);
    } finally {
      await planner.rs.close();
      await worker.rs.close();
    }
  });

  test('send and submitMany carry the trace too', async () => {
    const planner = new Traced('planner');
    try {
      await planner.rs.mailboxes.ensure('traced');
      const run = await planner.rs.scopes.create();
      const box = run.mailbox('traced');
      await box.send('sent');
      await box.submitMany([{ data: 'many-1' }, { data: 'many-2' }]);
      const submits = planner.spans('submit');
      assert.equal(submits.length, 2);
      const parents: Record<string, string | undefined> = {
        sent: submits[0]?.spanContext().spanId,
        'many-1': submits[1]?.spanContext().spanId,
        'many-2': submits[1]?.spanContext().spanId,
      };
      for (let n = 0; n < 3; n += 1) {
        const delivery = await box.receive();
        assert.ok(delivery !== null && delivery.trace !== null);
        assert.equal(delivery.trace.traceparent.split('-')[2], parents[delivery.data as string]);
        await delivery.complete();
      }
    } finally {
      await planner.rs.close();
    }
  });
});
