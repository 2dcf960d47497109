/**
 * Runs and what depends on them: task groups (GROUP_WAIT, GROUP_STATUS), tasks that need
 * capacity, run status and cancellation (and what a cancellation does to deliveries and
 * consume()), and the typed SERVER_STATS.
 */

import assert from 'node:assert/strict';
import type net from 'node:net';
import { after, before, describe, test } from 'node:test';

import {
  ConflictError,
  InvalidArgumentError,
  NotFoundError,
  type Runstate,
  ScopeCancelledError,
  WaitTimeoutError,
} from '../src/index.js';
import { Push } from '../src/wire.js';
import { MemoryLogger, type RsdServer, client, sleep, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

/** Polls `check` for up to 5 s; fails naming `what` if it never holds. */
async function eventually(check: () => Promise<boolean>, what: string): Promise<void> {
  const until = Date.now() + 5000;
  while (!(await check())) {
    assert.ok(Date.now() < until, `never ${what}`);
    await sleep(10);
  }
}

function dropConnection(rs: Runstate): void {
  const conn = (rs as unknown as { session: { conn: { socket: net.Socket | null } } }).session.conn;
  conn.socket!.destroy();
}

describe('task groups', () => {
  test('wait resolves at the need-th success with the first outcomes and cancels the rest', async () => {
    const rs = client(rsd.address, 'planner');
    const ctl = new AbortController();
    try {
      await rs.mailboxes.ensure('g1');
      const run = await rs.scopes.create();
      const box = run.mailbox('g1');
      const tickets = [];
      for (let n = 0; n < 5; n++) tickets.push(await box.submit({ n }, { key: `k${n}`, group: 'fanout' }));
      assert.equal((await tickets[0]!.status()).group, 'fanout');
      const group = run.group<{ double: number }>('fanout');
      assert.deepEqual(await group.status(), {
        group: 'fanout',
        tasks: 5,
        counts: { PENDING: 5 },
        succeeded: 0,
        unfinished: 5,
        waiters: 0,
      });
      const waiting = group.wait({ need: 2, cancelRest: true, timeoutMs: 10_000 });
      let handled = 0;
      const consuming = box.consume<{ n: number }>(
        async (data, delivery) => {
          handled += 1;
          if (handled <= 2) await delivery.complete({ payload: { double: data.n * 2 } });
          else await new Promise((resolve) => delivery.signal.addEventListener('abort', resolve)); // until cancelled
        },
        { concurrency: 1, signal: ctl.signal, shutdownTimeoutMs: 100 },
      );
      const result = await waiting;
      assert.equal(result.reached, true);
      assert.equal(result.need, 2);
      assert.equal(result.done.length, 2);
      assert.deepEqual(
        result.done.map((d) => d.outcome),
        [{ double: 0 }, { double: 2 }],
      );
      assert.equal(result.cancelled, 3, 'the three unfinished tasks were cancelled');
      assert.equal(result.succeeded, 2);
      assert.equal(result.counts.CANCELLED, 3);
      assert.equal((await tickets[4]!.status()).state, 'CANCELLED');
      ctl.abort();
      await consuming;
    } finally {
      await rs.close();
    }
  });

  test('an unreachable need answers at once with reached false; a timeout is WaitTimeoutError', async () => {
    const rs = client(rsd.address, 'planner');
    try {
      await rs.mailboxes.ensure('g2');
      const run = await rs.scopes.create();
      const box = run.mailbox('g2');
      const ticket = await box.submit(1, { group: 'g' });
      await box.submit(2, { group: 'g' });
      const impossible = await run.group('g').wait({ need: 3, timeoutMs: 10_000 });
      assert.equal(impossible.reached, false);
      assert.deepEqual(impossible.done, []);
      assert.match(impossible.why ?? '', /2/);
      const started = Date.now();
      await assert.rejects(run.group('g').wait({ need: 2, timeoutMs: 300 }), WaitTimeoutError);
      assert.ok(Date.now() - started < 3000);
      assert.equal((await run.group('g').status()).waiters, 0, 'the timed-out wait was withdrawn');
      await ticket.cancel('no longer needed');
      const failed = await run.group('g').wait({ need: 2, timeoutMs: 10_000 });
      assert.equal(failed.reached, false, 'one of two cancelled: a need of 2 is out of reach');
      const unknown = await run.group('nobody-submitted-here').wait();
      assert.equal(unknown.reached, true, 'an empty group with need left out is reached');
      assert.equal(unknown.need, 0);
    } finally {
      await rs.close();
    }
  });

  test('a parked wait chains across a dropped connection; bad arguments are refused before I/O', async () => {
    const rs = client(rsd.address, 'planner');
    const worker = client(rsd.address, 'worker');
    try {
      await rs.mailboxes.ensure('g3');
      const run = await rs.scopes.create();
      await run.mailbox('g3').submit({ n: 1 }, { group: 'g' });
      const waiting = run.group('g').wait(); // need: every task of the group, no timeout
      await sleep(100);
      dropConnection(rs);
      await sleep(300);
      const delivery = await worker.scope(run.id).mailbox('g3').receive({ wait: true, timeoutMs: 5000 });
      await delivery!.complete({ payload: 'ok' });
      const result = await waiting;
      assert.equal(result.reached, true);
      assert.equal(result.done[0]!.outcome, 'ok');
      await run.mailbox('g3').submit({ n: 2 }, { group: 'h' });
      const ctl = new AbortController();
      const abandoned = run.group('h').wait({ signal: ctl.signal });
      await eventually(async () => (await run.group('h').status()).waiters === 1, 'parked');
      ctl.abort(new Error('no longer needed'));
      await assert.rejects(abandoned, /no longer needed/);
      await eventually(async () => (await run.group('h').status()).waiters === 0, 'withdrawn (CANCEL)');
      const noOutcomes = await run.group('g').wait({ outcomes: false });
      assert.equal('outcome' in noOutcomes.done[0]!, false);
      for (const need of [0, 10_001, 1.5]) {
        await assert.rejects(run.group('g').wait({ need }), InvalidArgumentError);
      }
      assert.throws(() => run.group(''), InvalidArgumentError);
      assert.throws(() => run.group('x'.repeat(129)), InvalidArgumentError);
      await assert.rejects(rs.scope('never-made').group('g').status(), NotFoundError);
    } finally {
      await rs.close();
      await worker.close();
    }
  });
});

describe('tasks that need capacity', () => {
  test('a task with needs waits for its pool, its view says what for; other needs conflict', async () => {
    const rs = client(rsd.address, 'planner');
    try {
      await rs.mailboxes.ensure('n1');
      await rs.pools.ensure('gpu', { size: 1 });
      const run = await rs.scopes.create();
      const box = run.mailbox('n1');
      const slot = await run.pool('gpu').acquire();
      const ticket = await box.submit({ job: 1 }, { key: 'train', needs: { pools: ['gpu'] } });
      assert.deepEqual(ticket.view!.needs, { pools: ['gpu'], quotas: {} });
      assert.equal(await box.receive(), null, 'the only slot is taken');
      assert.deepEqual((await ticket.status()).waiting_for, { pools: ['gpu'], quotas: {} });
      await assert.rejects(box.submit({ job: 1 }, { key: 'train' }), ConflictError);
      await slot.release();
      const delivery = await box.receive({ wait: true, timeoutMs: 5000 });
      assert.equal(delivery!.taskId, ticket.id);
      assert.equal((await ticket.status()).waiting_for, null);
      const sent = await box.send({ m: 1 }, { workKey: 'w', needs: { pools: ['gpu'] } });
      assert.equal(sent.replay, false);
      assert.equal(await box.receive(), null, 'the task holds the slot the message needs');
      await delivery!.complete();
      const message = await box.receive({ wait: true, timeoutMs: 5000 });
      assert.equal(message!.kind, 'message');
      await message!.complete();
      await assert.rejects(box.submit(1, { needs: { pools: ['no-such-pool'] } }), NotFoundError);
      const nine = Array.from({ length: 9 }, (_, i) => `p${i}`);
      await assert.rejects(box.submit(1, { needs: { pools: nine } }), (err: unknown) => {
        return err instanceof InvalidArgumentError && /8/.test(err.message);
      });
      await assert.rejects(box.submit(1, { group: 'x'.repeat(129) }), InvalidArgumentError);
      const [tooMany] = await box.submitMany([{ data: 1, needs: { pools: nine } }]);
      assert.ok(tooMany instanceof InvalidArgumentError, 'a bad item is refused on its own');
    } finally {
      await rs.close();
    }
  });
});

describe('runs', () => {
  test('status counts a run; scopes.cancel ends it, with its reason', async () => {
    const rs = client(rsd.address, 'planner');
    try {
      await rs.mailboxes.ensure('s1');
      const run = await rs.scopes.create();
      await run.mailbox('s1').submit(1);
      await run.mailbox('s1').submit(2);
      await run.claim('k').acquire();
      const open = await run.status();
      assert.equal(open.scope, run.id);
      assert.equal(open.state, 'open');
      assert.equal(open.reason, null);
      assert.equal(typeof open.created_at, 'number');
      assert.deepEqual(open.tasks, { PENDING: 2 });
      assert.equal(open.claims, 1);
      assert.equal(open.slots, 0);
      const cancelled = await rs.scopes.cancel(run.id, 'budget spent');
      assert.deepEqual(cancelled, { scope: run.id, cancelled: true, tasks: 2, claims: 1, slots: 0 });
      const after = await run.status();
      assert.equal(after.state, 'cancelled');
      assert.equal(after.reason, 'budget spent');
      assert.deepEqual(after.tasks, { CANCELLED: 2 });
      await assert.rejects(run.mailbox('s1').submit(3), ScopeCancelledError);
      assert.deepEqual(
        await rs.scopes.cancel(run.id),
        { scope: run.id, cancelled: true, tasks: 0, claims: 0, slots: 0 },
        'cancelling again changes nothing',
      );
      await assert.rejects(rs.scope('never-made').status(), NotFoundError);
    } finally {
      await rs.close();
    }
  });

  test('a settlement refused with SCOPE_CANCELLED ends that delivery for good', async () => {
    const rs = client(rsd.address, 'worker');
    try {
      await rs.mailboxes.ensure('s2');
      const run = await rs.scopes.create();
      const ticket = await run.mailbox('s2').submit({ n: 1 });
      const delivery = await run.mailbox('s2').receive();
      await run.cancel('stop');
      await assert.rejects(delivery!.complete({ payload: 'late' }), ScopeCancelledError);
      assert.equal(delivery!.isLost, true);
      assert.equal(delivery!.signal.aborted, true);
      assert.deepEqual(await delivery!.complete({ payload: 'again' }), [], 'settled: nothing is sent');
      const view = await ticket.status();
      assert.equal(view.state, 'CANCELLED');
      assert.equal(view.outcome, null);
    } finally {
      await rs.close();
    }
  });

  test('consume() stops quietly when its run is cancelled', async () => {
    const logger = new MemoryLogger();
    const worker = client(rsd.address, 'worker', { logger });
    const planner = client(rsd.address, 'planner');
    try {
      await planner.mailboxes.ensure('s3');
      const run = await planner.scopes.create();
      for (let n = 0; n < 4; n++) await run.mailbox('s3').submit({ n });
      let handled = 0;
      const consuming = worker.scope(run.id).mailbox('s3').consume<{ n: number }>(
        async () => {
          handled += 1;
          if (handled === 2) await planner.scopes.cancel(run.id, 'enough');
        },
        { concurrency: 1, shutdownTimeoutMs: 1000 },
      );
      let timer: NodeJS.Timeout | undefined;
      const ended = await Promise.race([
        consuming.then(() => 'ended'),
        new Promise((resolve) => {
          timer = setTimeout(() => resolve('still running'), 10_000);
        }),
      ]);
      clearTimeout(timer);
      assert.equal(ended, 'ended');
      assert.equal(handled, 2);
      assert.deepEqual(
        logger.lines.filter((line) => line.startsWith('ERROR')),
        [],
        'nothing was logged as an error',
      );
      const status = await run.status();
      assert.deepEqual(status.tasks, { SUCCEEDED: 1, CANCELLED: 3 });
    } finally {
      await worker.close();
      await planner.close();
    }
  });
});

describe('runs, when the settlement is what reports the cancellation', () => {
  test('consume() stops quietly when completing is refused with SCOPE_CANCELLED', async () => {
    const logger = new MemoryLogger();
    const worker = client(rsd.address, 'worker', { logger });
    const planner = client(rsd.address, 'planner');
    // Withhold LEASE_LOST pushes from this worker, as if they were still on their way.
    const conn = (worker as unknown as { session: { conn: { onPush(e: number, h: () => void): void } } }).session
      .conn;
    try {
      await worker.connect();
      conn.onPush(Push.LEASE_LOST, () => undefined);
      await planner.mailboxes.ensure('s4');
      const run = await planner.scopes.create();
      for (let n = 0; n < 3; n++) await run.mailbox('s4').submit({ n });
      let handled = 0;
      await worker.scope(run.id).mailbox('s4').consume(
        async () => {
          handled += 1;
          await planner.scopes.cancel(run.id, 'enough');
        },
        { concurrency: 1, shutdownTimeoutMs: 1000 },
      );
      assert.equal(handled, 1);
      assert.deepEqual(logger.lines.filter((line) => line.startsWith('ERROR')), []);
      assert.ok(logger.lines.some((line) => /the run was cancelled/.test(line)));
      assert.deepEqual((await run.status()).tasks, { CANCELLED: 3 });
    } finally {
      await worker.close();
      await planner.close();
    }
  });
});

describe('server stats', () => {
  test('serverStats() carries the fields protocol.md lists, typed', async () => {
    const rs = client(rsd.address, 'operator');
    try {
      await rs.scopes.create();
      const stats = await rs.serverStats();
      assert.match(stats.server ?? '', /rsd/);
      assert.ok((stats.connections ?? 0) >= 1);
      assert.ok((stats.core?.scopes ?? -1) >= 0);
      assert.equal(stats.journal?.fsync, 'always');
      assert.ok((stats.ops?.['SCOPE_CREATE']?.ok ?? 0) >= 1);
      assert.equal(typeof stats.tasks?.PENDING, 'number');
      assert.ok(Array.isArray(stats.queue_depths?.mailboxes));
      assert.equal(typeof stats.fsync_ms?.count, 'number');
      assert.equal(typeof stats.uptime_seconds, 'number');
      assert.equal(typeof stats.loop?.stalls, 'number');
    } finally {
      await rs.close();
    }
  });
});

describe("the manual's TypeScript snippet", () => {
  test('groups, run cancellation and needs run as written', async () => {
    const rs = client(rsd.address, 'readme');
    const printed: unknown[][] = [];
    const console = { log: (...parts: unknown[]) => printed.push(parts) };
    try {
      await rs.mailboxes.ensure('search');
      const run = await rs.scopes.create();
      const box = run.mailbox('search');
      for (let n = 0; n < 6; n++) await box.submit({ query: n }, { key: `q${n}`, group: 'batch-1' });
      const worker = box.consume<{ query: number }>(
        async (data, delivery) => {
          await delivery.complete({ payload: `hit for ${data.query}` });
        },
        { concurrency: 2 },
      );

      // Resolves the moment the 2nd task succeeds (pushed, not polled), then cancels the rest.
      const first = await run.group('batch-1').wait({ need: 2, cancelRest: true, timeoutMs: 30_000 });
      if (first.reached) console.log(first.done.map((d) => d.outcome), first.cancelled, 'cancelled');
      else console.log('cannot get 2 successes:', first.why, first.counts);
      console.log(await run.group('batch-1').status()); // { group, tasks, counts, succeeded, unfinished, waiters }

      await run.cancel('enough results'); // or rs.scopes.cancel(run.id, 'enough results')
      await worker; // consume() resolves: the run was cancelled
      const status = await run.status();
      console.log(status.state, status.reason, status.tasks); // cancelled enough results { SUCCEEDED: 2, ... }

      // Capacity: delivered only when a gpu slot and 2 units of openai are free, all taken at once.
      await rs.pools.ensure('gpu', { size: 1 });
      await rs.quotas.ensure('openai', { limit: 60, perSeconds: 60 });
      const renders = (await rs.scopes.create()).mailbox('search');
      const render = await renders.submit({ scene: 1 }, { needs: { pools: ['gpu'], quotas: { openai: 2 } } });
      console.log(render.view?.needs, (await render.status()).waiting_for); // waiting_for: null, or what it waits for
      assert.equal(printed.length, 4, JSON.stringify(printed));
      const firstTwo = printed[0]![0] as string[];
      assert.equal(firstTwo.length, 2);
      assert.ok(firstTwo.every((hit) => /^hit for [0-5]$/.test(hit)), JSON.stringify(firstTwo));
      assert.equal((printed[1]![0] as { group: string }).group, 'batch-1');
      assert.deepEqual(printed[2]!.slice(0, 2), ['cancelled', 'enough results']);
      assert.equal((printed[2]![2] as Record<string, number>)['SUCCEEDED']! >= 2, true);
      assert.deepEqual(printed[3], [{ pools: ['gpu'], quotas: { openai: 2 } }, null]);
    } finally {
      await rs.close();
    }
  });
});
