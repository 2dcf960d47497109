/**
 * Progress from TypeScript, the twin of tests/test_task_progress_reaches_every_follower_over_the_wire.py:
 * `await delivery.progress(data)` reaches every `for await (const event of ticket.events())`
 * of the task, the retained events first, the outcome last; a follower re-attached by
 * task id gets what is retained, one whose connection is lost resumes after its last
 * seq; a settled delivery's progress throws LeaseLostError. One rsd for the file.
 */

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { InvalidArgumentError, LeaseLostError, type TaskEvent } from '../src/index.js';
import { type RsdServer, client, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

async function collect(events: AsyncIterable<TaskEvent>): Promise<TaskEvent[]> {
  const got: TaskEvent[] = [];
  for await (const event of events) got.push(event);
  return got;
}

function shape(event: TaskEvent): unknown[] {
  if (event.kind === 'progress') return ['progress', event.data];
  if (event.kind === 'state') return ['state', event.state, event.attempt];
  return ['outcome', event.state, event.outcome];
}

test('every follower gets the progress, then the outcome', async () => {
  const planner = client(rsd.address, 'planner-ts');
  const watcher = client(rsd.address, 'watcher-ts');
  const worker = client(rsd.address, 'worker-ts');
  try {
    await planner.mailboxes.ensure('jobs');
    const run = await planner.scopes.create();
    const ticket = await run.mailbox('jobs').submit({ question: 1 });
    const iterators = [ticket.events(), watcher.scope(run.id).task(ticket.id).events()];
    // Both follow before the work starts: the first event says where the task was then.
    const firsts: TaskEvent[] = [];
    for (const events of iterators) firsts.push((await events.next()).value as TaskEvent);
    const followers = iterators.map((events) => collect(events));
    const delivery = await worker.scope(run.id).mailbox('jobs').receive({ wait: true });
    assert.ok(delivery);
    const seqs = [];
    for (let n = 0; n < 3; n++) seqs.push(await delivery.progress({ step: n }));
    assert.deepEqual(seqs, [3, 4, 5]); // seq 1: PENDING when first followed, 2: RUNNING
    await assert.rejects(delivery.progress('x'.repeat(64 * 1024)), InvalidArgumentError);
    await delivery.complete({ payload: 'answer' });
    const expected = [
      ['state', 'PENDING', 0],
      ['state', 'RUNNING', 1],
      ['progress', { step: 0 }],
      ['progress', { step: 1 }],
      ['progress', { step: 2 }],
      ['outcome', 'SUCCEEDED', 'answer'],
    ];
    const results = await Promise.all(followers);
    for (const [i, rest] of results.entries()) {
      const got: TaskEvent[] = [firsts[i] as TaskEvent, ...rest];
      assert.deepEqual(got.map(shape), expected);
      assert.deepEqual(
        got.map((event) => event.missed),
        [0, 0, 0, 0, 0, 0],
      );
    }
    await assert.rejects(delivery.progress('late'), LeaseLostError);
    const later = client(rsd.address, 'later-ts');
    try {
      const again = await collect(later.scope(run.id).task(ticket.id).events(3));
      assert.deepEqual(again.map(shape), expected.slice(3));
    } finally {
      await later.close();
    }
  } finally {
    await Promise.all([planner.close(), watcher.close(), worker.close()]);
  }
});

test('a follower whose connection is lost resumes after its last seq', async () => {
  const watcher = client(rsd.address, 'watcher2-ts');
  const worker = client(rsd.address, 'worker2-ts');
  try {
    await worker.mailboxes.ensure('jobs');
    const run = await worker.scopes.create();
    const ticket = await run.mailbox('jobs').submit(null);
    const delivery = await run.mailbox('jobs').receive();
    assert.ok(delivery);
    await delivery.progress('before');
    const events = watcher.scope(run.id).task(ticket.id).events();
    const first = [(await events.next()).value as TaskEvent, (await events.next()).value as TaskEvent];
    assert.deepEqual(first.map(shape), [
      ['state', 'RUNNING', 1],
      ['progress', 'before'],
    ]);
    // The connection is lost, its subscription with it.
    (watcher as unknown as { session: { conn: { socket: { destroy(): void } | null } } }).session.conn.socket?.destroy();
    await delivery.progress('while away');
    await delivery.complete({ payload: 7 });
    const rest = await collect({ [Symbol.asyncIterator]: () => events });
    assert.deepEqual(rest.map(shape), [
      ['progress', 'while away'],
      ['outcome', 'SUCCEEDED', 7],
    ]);
    assert.deepEqual(
      rest.map((event) => event.seq),
      [3, 4],
    );
  } finally {
    await Promise.all([watcher.close(), worker.close()]);
  }
});
