import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { ConflictError, type Delivery, LeaseLostError, NotFoundError } from '../src/index.js';
import { type RsdServer, client, sleep, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

describe('tasks and queues', () => {
  test('callers of one key share one task and its one result; other input conflicts', async () => {
    const rs = client(rsd.address, 'planner');
    try {
      await rs.mailboxes.ensure('m1', { mode: 'WORK' });
      const run = await rs.scopes.create();
      const box = run.mailbox('m1');
      const first = await box.submit({ company: 'acme' }, { key: 'k', subscriberId: 'p1' });
      const second = await box.submit({ company: 'acme' }, { key: 'k', subscriberId: 'p2' });
      assert.equal(first.id, second.id);
      assert.equal(first.created, true);
      assert.equal(second.created, false);
      await assert.rejects(box.submit({ company: 'other' }, { key: 'k' }), (err: unknown) => {
        assert.ok(err instanceof ConflictError);
        assert.equal(err.code, 'IDEMPOTENCY_CONFLICT');
        assert.equal(err.details['task'], first.id);
        return true;
      });
      const results = Promise.all([first.result({ timeoutMs: 10_000 }), second.result({ timeoutMs: 10_000 })]);
      const delivery = await box.receive<{ company: string }>();
      assert.ok(delivery !== null);
      assert.equal(delivery.data.company, 'acme');
      assert.equal(delivery.attempt, 1);
      await delivery.complete({ payload: { report: 'ok' } });
      await delivery.complete({ payload: 'ignored' }); // settles once: does nothing
      const [a, b] = await results;
      assert.equal(a.state, 'SUCCEEDED');
      assert.deepEqual(a.outcome, { report: 'ok' });
      assert.deepEqual(b, a);
      const view = await run.task(first.id).status();
      assert.deepEqual(view.subscribers, ['p1', 'p2']);
      assert.equal(view.attempt, 1);
      await run.task(first.id).detach('p1');
      assert.deepEqual((await run.task(first.id).join('p3', run.id)).subscribers, ['p2', 'p3']);
      await assert.rejects(run.task('t-nope').status(), NotFoundError);
    } finally {
      await rs.close();
    }
  });

  test('submitAndWait sends the keyed submit and its wait together: the final view, a conflict leaves no wait', async () => {
    const rs = client(rsd.address, 'planner');
    try {
      await rs.mailboxes.ensure('m-together', { mode: 'WORK' });
      const run = await rs.scopes.create();
      const box = run.mailbox('m-together');
      const waited = box.submitAndWait<{ got: number }>({ n: 1 }, { key: 'k', timeoutMs: 10_000 });
      let delivery: Delivery | null = null;
      while (delivery === null) delivery = await box.receive({ wait: true });
      await delivery.complete({ payload: { got: 1 } });
      const view = await waited;
      assert.equal(view.state, 'SUCCEEDED');
      assert.deepEqual(view.outcome, { got: 1 });
      assert.equal(view.id, delivery.taskId);
      const again = await box.submitAndWait({ n: 1 }, { key: 'k', timeoutMs: 0 });
      assert.equal(again.id, view.id);
      await assert.rejects(box.submitAndWait({ n: 2 }, { key: 'k', timeoutMs: 60_000 }), ConflictError);
      let waits = -1;
      for (let i = 0; i < 50 && waits !== 0; i += 1) {
        waits = (await rs.serverStats()).core?.waits ?? -1;
        if (waits !== 0) await sleep(20);
      }
      assert.equal(waits, 0);
    } finally {
      await rs.close();
    }
  });

  test('result and submitAndWait with outcomeOnly answer id, state, outcome and reason only; without it the whole view', async () => {
    const rs = client(rsd.address, 'planner');
    try {
      await rs.mailboxes.ensure('m-outcome', { mode: 'WORK' });
      const run = await rs.scopes.create();
      const box = run.mailbox('m-outcome');
      const ticket = await box.submit({ n: 1 }, { key: 'a' });
      const results = [
        ticket.result({ timeoutMs: 10_000, outcomeOnly: true }),
        box.submitAndWait({ n: 2 }, { key: 'b', timeoutMs: 10_000, outcomeOnly: true }),
        box.submitAndWait({ n: 3 }, { timeoutMs: 10_000, outcomeOnly: true }),
      ];
      for (let done = 0; done < 3; ) {
        const delivery = await box.receive<{ n: number }>({ wait: true });
        if (delivery === null) continue;
        await delivery.complete({ payload: { got: delivery.data.n } });
        done += 1;
      }
      const [slim, keyed, unkeyed] = await Promise.all(results);
      assert.deepEqual(slim, { id: ticket.id, state: 'SUCCEEDED', outcome: { got: 1 }, reason: null });
      assert.deepEqual(Object.keys(slim!), ['id', 'state', 'outcome', 'reason']);
      assert.deepEqual(Object.keys(keyed!), ['id', 'state', 'outcome', 'reason']);
      assert.deepEqual(keyed!.outcome, { got: 2 });
      assert.equal(keyed!.id, (await box.submit({ n: 2 }, { key: 'b' })).id);
      assert.deepEqual(Object.keys(unkeyed!), ['id', 'state', 'outcome', 'reason']);
      assert.deepEqual(unkeyed!.outcome, { got: 3 });
      // Asked without it: the whole view, as always.
      const whole = await ticket.result({ timeoutMs: 0 });
      assert.equal(whole.attempt, 1);
      assert.deepEqual(whole, await ticket.status());
      const again = await box.submitAndWait({ n: 2 }, { key: 'b', timeoutMs: 0 });
      assert.deepEqual(again, await run.task(keyed!.id).status());
    } finally {
      await rs.close();
    }
  });

  test('retry puts a delivery back with attempt + 1; reject fails it; renew extends it', async () => {
    const rs = client(rsd.address, 'w');
    try {
      await rs.mailboxes.ensure('m2', { mode: 'WORK', retryBackoffMs: 0 });
      const run = await rs.scopes.create();
      const box = run.mailbox('m2');
      const ticket = await box.submit('x');
      const d1 = await box.receive();
      assert.ok(d1 !== null);
      await d1.renew(120);
      await d1.retry({ reason: 'flaky' });
      const d2 = await box.receive({ wait: true, timeoutMs: 5000 });
      assert.ok(d2 !== null);
      assert.equal(d2.attempt, 2);
      await d2.reject('bad input');
      const view = await ticket.result({ timeoutMs: 5000 });
      assert.equal(view.state, 'FAILED');
      assert.equal(view.reason, 'rejected: bad input');
      const letters = await box.deadLetters();
      assert.equal(letters.length, 1);
      assert.equal(letters[0]!.id, ticket.id);
      assert.equal(await box.receive(), null);
    } finally {
      await rs.close();
    }
  });

  test('send with a workKey replays a duplicate and refuses other data under the same key', async () => {
    const rs = client(rsd.address, 's');
    try {
      await rs.mailboxes.ensure('m3');
      const run = await rs.scopes.create();
      const box = run.mailbox('m3');
      const sent = await box.send({ company: 'acme' }, { workKey: 'crawl:acme' });
      assert.equal(sent.replay, false);
      const again = await box.send({ company: 'acme' }, { workKey: 'crawl:acme' });
      assert.deepEqual(again, { id: sent.id, replay: true });
      await assert.rejects(box.send({ company: 'x' }, { workKey: 'crawl:acme' }), ConflictError);
      assert.equal((await box.inspect()).ready, 1);
    } finally {
      await rs.close();
    }
  });

  test('consume completes on return, retries on throw through onError, and stops on abort', async () => {
    const rs = client(rsd.address, 'c');
    try {
      await rs.mailboxes.ensure('m4', { retryBackoffMs: 0 });
      const run = await rs.scopes.create();
      const box = run.mailbox('m4');
      const tickets = await Promise.all([1, 2, 3, 4, 5, 6].map((n) => box.submit<number>({ n })));
      const errors: number[] = [];
      const ctl = new AbortController();
      let running = 0;
      let peak = 0;
      const consuming = box.consume<{ n: number }>(
        async (data, delivery) => {
          running += 1;
          peak = Math.max(peak, running);
          await sleep(20);
          running -= 1;
          if (data.n === 3 && delivery.attempt === 1) throw new Error('first try fails');
          if (data.n === 4) await delivery.complete({ payload: 40 });
        },
        {
          concurrency: 2,
          leaseSeconds: 10,
          signal: ctl.signal,
          onError: (_err, delivery) => errors.push(delivery.attempt),
        },
      );
      const views = await Promise.all(tickets.map((t) => t.result({ timeoutMs: 10_000 })));
      ctl.abort();
      await consuming;
      assert.deepEqual(views.map((v) => v.state), Array(6).fill('SUCCEEDED'));
      assert.equal(views[3]!.outcome, 40);
      assert.equal(views[0]!.outcome, null);
      assert.equal(views[2]!.attempt, 2);
      assert.deepEqual(errors, [1]);
      assert.equal(peak, 2, 'two handlers at once');
      assert.equal((await box.inspect()).consumers, 0, 'parked receives were withdrawn');
    } finally {
      await rs.close();
    }
  });

  test('stopping consume requeues what its handlers did not finish within shutdownTimeoutMs', async () => {
    const rs = client(rsd.address, 'c');
    try {
      await rs.mailboxes.ensure('m5');
      const run = await rs.scopes.create();
      const box = run.mailbox('m5');
      const ticket = await box.submit('slow');
      const ctl = new AbortController();
      let seen: Delivery<string> | null = null;
      let release!: () => void;
      const gate = new Promise<void>((resolve) => {
        release = resolve;
      });
      const consuming = box.consume<string>(
        async (_data, delivery) => {
          seen = delivery;
          await gate;
        },
        { signal: ctl.signal, shutdownTimeoutMs: 100 },
      );
      while (seen === null) await sleep(5);
      ctl.abort();
      await consuming;
      assert.equal((seen as Delivery<string>).signal.aborted, true, 'the running handler was told');
      const view = await ticket.status();
      assert.equal(view.state, 'PENDING');
      assert.equal(view.attempt, 0, 'handed back without using an attempt');
      release();
    } finally {
      await rs.close();
    }
  });

  test('consume ends quietly when the run is cancelled and throws NotFoundError for an unknown mailbox', async () => {
    const rs = client(rsd.address, 'c');
    try {
      await rs.mailboxes.ensure('m6');
      const run = await rs.scopes.create();
      const consuming = run.mailbox('m6').consume(async () => undefined);
      while ((await run.mailbox('m6').inspect()).consumers === 0) await sleep(5);
      await run.cancel('done');
      await consuming;
      await assert.rejects(run.mailbox('never-ensured').consume(async () => undefined), NotFoundError);
    } finally {
      await rs.close();
    }
  });

  test('a late completion after the lease expired is refused with STALE_CLAIM and changes nothing', async () => {
    const rs = client(rsd.address, 'late');
    try {
      await rs.mailboxes.ensure('m7');
      const run = await rs.scopes.create();
      const box = run.mailbox('m7');
      const ticket = await box.submit('x');
      const delivery = await box.receive({ leaseSeconds: 5 });
      assert.ok(delivery !== null);
      await ticket.cancel('stop it'); // ends the delivery's lease at once
      await assert.rejects(delivery.complete({ payload: 'late' }), (err: unknown) => {
        return err instanceof LeaseLostError && err.code === 'STALE_CLAIM';
      });
      assert.equal(delivery.isLost, true);
      const view = await ticket.status();
      assert.equal(view.state, 'CANCELLED');
      assert.equal(view.outcome, null);
    } finally {
      await rs.close();
    }
  });
});
