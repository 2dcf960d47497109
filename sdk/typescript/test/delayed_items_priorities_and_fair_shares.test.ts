/**
 * Delays, priorities and fair shares through the TypeScript SDK against a real rsd, as
 * tests/test_delayed_items_priorities_and_fair_shares_over_the_wire.py does for
 * rsclient: the new options of submit, submitAndWait, submitMany, send and retry reach
 * the server, and bad ones are refused with InvalidArgumentError, before the request
 * where rsclient checks them and by the server where it leaves them to it.
 */

import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { after, before, describe, test } from 'node:test';

import {
  ConflictError,
  type Delivery,
  InvalidArgumentError,
  type Mailbox,
  RunstateError,
  type Runstate,
  type SendOptions,
  type SubmitOptions,
  Ticket,
} from '../src/index.js';
import { Op } from '../src/wire.js';
import { type RsdServer, client, countOps, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

async function withBox(body: (box: Mailbox, rs: Runstate) => Promise<void>): Promise<void> {
  const rs = client(rsd.address, 'planner');
  try {
    await rs.mailboxes.ensure('jobs');
    const run = await rs.scopes.create();
    await body(run.mailbox('jobs'), rs);
  } finally {
    await rs.close();
  }
}

async function receiveWithin<T = unknown>(box: Mailbox, timeoutMs: number): Promise<Delivery<T>> {
  const delivery = await box.receive<T>({ wait: true, timeoutMs });
  assert.ok(delivery !== null, `nothing delivered within ${timeoutMs} ms`);
  return delivery;
}

function elapsedSeconds(since: number): number {
  return (performance.now() - since) / 1000;
}

describe('delayed items, priorities and fair shares', () => {
  test('a delayed task is not delivered before its delay has run out, and is after', async () => {
    await withBox(async (box) => {
      const started = performance.now();
      const ticket = await box.submit({ n: 1 }, { delaySeconds: 0.4 });
      assert.equal(ticket.view?.state, 'DELAYED');
      const view = await ticket.status();
      assert.equal(view.state, 'DELAYED');
      assert.ok(view.not_before !== null && view.not_before > view.created_at);
      assert.equal(view.priority, 0);
      assert.equal(view.fairness_key, null);
      assert.equal((await box.inspect()).delayed, 1);
      assert.equal(await box.receive(), null);
      const delivery = await receiveWithin<{ n: number }>(box, 5000);
      assert.ok(elapsedSeconds(started) >= 0.4, `delivered after ${elapsedSeconds(started)} s`);
      assert.deepEqual(delivery.data, { n: 1 });
      assert.equal(delivery.taskId, ticket.id);
      assert.equal((await box.inspect()).delayed, 0);
      await delivery.complete();
      assert.equal((await ticket.status()).not_before, view.not_before);
    });
  });

  test('notBefore takes the forms of deadline; send and submitAndWait take a delay', async () => {
    await withBox(async (box) => {
      const later = new Date(Date.now() + 60_000);
      const seconds = later.getTime() / 1000;
      for (const form of [later, later.toISOString(), seconds]) {
        const view = (await box.submit(String(form), { notBefore: form })).view!;
        assert.equal(view.state, 'DELAYED');
        assert.ok(Math.abs(view.not_before! - seconds) < 1e-3, `${String(view.not_before)} for ${String(form)}`);
      }
      const sent = await box.send('m', { delaySeconds: 60 });
      assert.equal(sent.replay, false);
      assert.equal((await box.inspect()).delayed, 4);

      // Keyed (submit and wait in one write) and not: both wait out the delay.
      const started = performance.now();
      const keyed = box.submitAndWait<string>('k', { key: 'waited', delaySeconds: 0.3, timeoutMs: 10_000 });
      const unkeyed = box.submitAndWait<string>('u', { notBefore: Date.now() / 1000 + 0.3, timeoutMs: 10_000 });
      assert.equal(await box.receive(), null);
      for (let i = 0; i < 2; i += 1) {
        const delivery = await receiveWithin<string>(box, 5000);
        assert.ok(elapsedSeconds(started) >= 0.29, `delivered after ${elapsedSeconds(started)} s`);
        await delivery.complete({ payload: `${delivery.data}!` });
      }
      assert.equal((await keyed).outcome, 'k!');
      assert.equal((await unkeyed).outcome, 'u!');
    });
  });

  test('higher priorities are delivered first, first-in first-out within one', async () => {
    await withBox(async (box) => {
      await box.send(['p0', 0]);
      await box.submit(['p3', 0], { priority: 3 });
      await box.send(['p9', 0], { priority: 9 });
      await box.submit(['p0', 1], { priority: 0 });
      await box.send(['p3', 1], { priority: 3 });
      await box.submitMany([{ data: ['p9', 1], priority: 9 }]);
      const got = (await box.receiveMany({ max: 10 })).map((d) => d.data);
      assert.deepEqual(got, [
        ['p9', 0],
        ['p9', 1],
        ['p3', 0],
        ['p3', 1],
        ['p0', 0],
        ['p0', 1],
      ]);
    });
  });

  test('ready items of one priority are delivered round robin across fairness keys', async () => {
    await withBox(async (box) => {
      for (let n = 0; n < 4; n += 1) await box.send(['a', n], { fairnessKey: 'a' });
      for (let n = 0; n < 2; n += 1) await box.submit(['b', n], { fairnessKey: 'b' });
      await box.send(['c', 0], { fairnessKey: 'c' });
      await box.submit(['urgent', 0], { priority: 9, fairnessKey: 'a' });
      const got = (await box.receiveMany({ max: 10 })).map((d) => d.data);
      assert.deepEqual(got, [
        ['urgent', 0],
        ['a', 0],
        ['b', 0],
        ['c', 0],
        ['a', 1],
        ['b', 1],
        ['a', 2],
        ['a', 3],
      ]);
    });
  });

  test('the status shows the priority and fairness key; another priority for a key is a conflict', async () => {
    await withBox(async (box) => {
      const ticket = await box.submit('x', { key: 'k', priority: 3, fairnessKey: 'acme' });
      const view = await ticket.status();
      assert.equal(view.state, 'PENDING');
      assert.equal(view.priority, 3);
      assert.equal(view.fairness_key, 'acme');
      assert.equal(view.not_before, null);
      assert.equal((await box.submit('x', { key: 'k', priority: 3 })).id, ticket.id);
      await assert.rejects(box.submit('x', { key: 'k', priority: 4 }), (err: unknown) => {
        assert.ok(err instanceof ConflictError);
        assert.equal(err.code, 'IDEMPOTENCY_CONFLICT');
        return true;
      });
    });
  });

  test('delaySeconds and notBefore together are refused before anything is sent', async () => {
    await withBox(async (box, rs) => {
      const ops = countOps(rs);
      const both = { delaySeconds: 1, notBefore: Date.now() / 1000 + 5 };
      const refused = (err: unknown): boolean => {
        assert.ok(err instanceof InvalidArgumentError);
        assert.equal(err.code, 'INVALID_ARGUMENT');
        assert.equal(err.message, 'INVALID_ARGUMENT: give delaySeconds or notBefore, not both');
        return true;
      };
      await assert.rejects(box.submit(1, both), refused);
      await assert.rejects(box.submit(1, { ...both, key: 'k', slim: true }), refused);
      await assert.rejects(box.submitAndWait(1, { ...both, key: 'k', timeoutMs: 1000 }), refused);
      await assert.rejects(box.submitAndWait(1, { ...both, timeoutMs: 1000 }), refused);
      await assert.rejects(box.send(1, both), refused);
      await assert.rejects(box.send(1, { ...both, workKey: 'w' }), refused);
      await assert.rejects(box.submitMany([{ data: 0 }, { data: 1, ...both }]), refused);
      for (const op of [Op.TASK_SUBMIT, Op.TASK_RESULT, Op.MESSAGE_SEND, Op.TASK_SUBMIT_MANY]) {
        assert.equal(ops.get(op) ?? 0, 0, `op ${op} was sent`);
      }
      assert.equal((await box.inspect()).delayed, 0);
    });
  });

  test('a bad delay or notBefore is refused by the client, as rsclient does; one too long by the server', async () => {
    await withBox(async (box, rs) => {
      const ops = countOps(rs);
      const cases: Array<[SubmitOptions & SendOptions, string]> = [
        [{ delaySeconds: -1 }, 'delaySeconds must be a finite number of seconds, 0 or more, got -1'],
        [{ delaySeconds: Number.NaN }, 'delaySeconds must be a finite number of seconds, 0 or more, got NaN'],
        [
          { delaySeconds: Number.POSITIVE_INFINITY },
          'delaySeconds must be a finite number of seconds, 0 or more, got Infinity',
        ],
        [
          { delaySeconds: '5' as unknown as number },
          'delaySeconds must be a finite number of seconds, 0 or more, got 5',
        ],
        [{ notBefore: 'soon' }, 'notBefore must be an ISO 8601 timestamp, got soon'],
        [{ notBefore: new Date(Number.NaN) }, 'notBefore must be an ISO 8601 timestamp, got Invalid Date'],
      ];
      for (const [options, message] of cases) {
        const refused = (err: unknown): boolean => {
          assert.ok(err instanceof InvalidArgumentError);
          assert.equal(err.message, `INVALID_ARGUMENT: ${message}`);
          return true;
        };
        await assert.rejects(box.submit(1, options), refused);
        await assert.rejects(box.send(1, options), refused);
        await assert.rejects(box.submitMany([{ data: 1, ...options }]), refused);
      }
      assert.equal(ops.get(Op.TASK_SUBMIT) ?? 0, 0);
      assert.equal(ops.get(Op.MESSAGE_SEND) ?? 0, 0);
      assert.equal(ops.get(Op.TASK_SUBMIT_MANY) ?? 0, 0);
      // Past max_delay_ms (366 days) ahead: the server's to refuse.
      for (const options of [{ delaySeconds: 1e12 }, { notBefore: Date.now() / 1000 + 1e9 }]) {
        await assert.rejects(box.submit(1, options), InvalidArgumentError);
        await assert.rejects(box.send(1, options), InvalidArgumentError);
      }
      assert.equal((await box.inspect()).delayed, 0);
    });
  });

  test('a bad priority or fairness key is refused by the server with InvalidArgumentError', async () => {
    await withBox(async (box) => {
      const bad: Array<SubmitOptions & SendOptions> = [
        { priority: 10 },
        { priority: -1 },
        { priority: 1.5 },
        { priority: 'high' as unknown as number },
        { fairnessKey: 'x'.repeat(257) },
        { fairnessKey: '' },
        { fairnessKey: 7 as unknown as string },
      ];
      for (const options of bad) {
        const refused = (err: unknown): boolean => {
          assert.ok(err instanceof InvalidArgumentError, `${JSON.stringify(options)}: ${String(err)}`);
          assert.equal(err.code, 'INVALID_ARGUMENT');
          return true;
        };
        await assert.rejects(box.submit(1, options), refused);
        await assert.rejects(box.send(1, options), refused);
        const [answer] = await box.submitMany([{ data: 1, ...options }]);
        assert.ok(answer instanceof InvalidArgumentError, `${JSON.stringify(options)}: ${String(answer)}`);
      }
      const counts = await box.inspect();
      assert.equal(counts.ready + counts.delayed, 0);
      // The bounds themselves are taken.
      await box.send('top', { priority: 9, fairnessKey: 'x'.repeat(256) });
      await box.send('bottom', { priority: 0 });
      assert.equal((await box.inspect()).ready, 2);
    });
  });

  test('retry({ delaySeconds }) puts the delivery back after that delay instead of the backoff', async () => {
    const rs = client(rsd.address, 'worker');
    try {
      // A backoff far longer than the test: only delaySeconds can bring it back in time.
      await rs.mailboxes.ensure('retries', { retryBackoffMs: 600_000 });
      const box = (await rs.scopes.create()).mailbox('retries');
      const ticket = await box.submit('again');
      const first = await receiveWithin(box, 5000);
      await assert.rejects(first.retry({ delaySeconds: 1, delayMs: 1000 }), (err: unknown) => {
        assert.ok(err instanceof InvalidArgumentError);
        assert.equal(err.message, 'INVALID_ARGUMENT: give delaySeconds or delayMs, not both');
        return true;
      });
      await assert.rejects(first.retry({ delaySeconds: -0.5 }), InvalidArgumentError);
      assert.equal(first.settled, false); // refused before sending: still ours to settle
      const started = performance.now();
      await first.retry({ delaySeconds: 0.3, reason: 'not yet' });
      assert.equal(first.state, 'PENDING');
      assert.equal(await box.receive(), null);
      const second = await receiveWithin(box, 5000);
      assert.ok(elapsedSeconds(started) >= 0.3, `redelivered after ${elapsedSeconds(started)} s`);
      assert.equal(second.taskId, ticket.id);
      assert.equal(second.attempt, 2);
      await second.retry({ delaySeconds: 0 }); // no delay: ready at once
      const third = await receiveWithin(box, 5000);
      assert.equal(third.attempt, 3);
      await third.complete({ payload: 'done' });
      assert.equal((await ticket.result({ timeoutMs: 5000 })).outcome, 'done');
    } finally {
      await rs.close();
    }
  });

  test('submitMany items take the new fields, each answered on its own', async () => {
    await withBox(async (box) => {
      const answers = await box.submitMany([
        { data: 'low' },
        { data: 'high', priority: 5, fairnessKey: 'acme' },
        { data: 'later', delaySeconds: 60 },
        { data: 'bad', priority: 10 },
        { data: 'at', notBefore: new Date(Date.now() + 60_000), key: 'at' },
        { data: 'soon', delaySeconds: 0.3, priority: 5 },
      ]);
      assert.ok(answers[3] instanceof InvalidArgumentError);
      const states = answers.map((a) => (a instanceof RunstateError ? a.code : (a as Ticket).view!.state));
      assert.deepEqual(states, ['PENDING', 'PENDING', 'DELAYED', 'INVALID_ARGUMENT', 'DELAYED', 'DELAYED']);
      const high = await (answers[1] as Ticket).status();
      assert.equal(high.priority, 5);
      assert.equal(high.fairness_key, 'acme');
      assert.ok((await (answers[4] as Ticket).status()).not_before !== null);
      assert.equal((await box.inspect()).delayed, 3);
      const first = await receiveWithin(box, 5000);
      assert.equal(first.data, 'high');
      const second = await receiveWithin(box, 5000);
      assert.equal(second.data, 'low');
      const third = await receiveWithin(box, 5000); // once its delay runs out
      assert.equal(third.data, 'soon');
      assert.equal(await box.receive(), null);
    });
  });
});

describe("the manual's TypeScript snippet", () => {
  test('delays, priorities and fair shares run as written', async () => {
    const rs = client(rsd.address, 'readme');
    const printed: unknown[][] = [];
    const console = { log: (...parts: unknown[]) => printed.push(parts) };
    try {
      await rs.mailboxes.ensure('research');
      const run = await rs.scopes.create();
      // The snippet, as written:
      const box = run.mailbox('research');
      // Delayed: DELAYED (counted in inspect().delayed), never delivered before its time.
      await box.submit({ company: 'acme' }, { key: 'recheck:acme', delaySeconds: 3600 });
      await box.send({ digest: 'daily' }, { notBefore: new Date(Date.now() + 60_000) }); // or ISO text, epoch seconds
      // Priorities 0 to 9 (higher first), and round robin between fairness keys within one.
      await box.submit({ company: 'globex' }, { priority: 9, fairnessKey: 'customer-42' });
      await box.submitMany([{ data: { company: 'initech' }, priority: 5, fairnessKey: 'customer-7' }]);
      console.log((await box.inspect()).delayed); // 2
      const delivery = await box.receive(); // globex: the highest priority
      if (delivery !== null) await delivery.retry({ delaySeconds: 30 }); // this retry only, not the backoff
      // What it did:
      assert.deepEqual(printed, [[2]]);
      assert.ok(delivery !== null);
      assert.deepEqual(delivery.data, { company: 'globex' });
      assert.equal(delivery.state, 'PENDING');
      const next = await box.receive();
      assert.deepEqual(next?.data, { company: 'initech' }); // globex waits out its 30 s
      assert.equal(await box.receive(), null);
    } finally {
      await rs.close();
    }
  });
});
