/**
 * A push read in the same turn as the subscribe's answer is not lost: the twin of
 * tests/test_a_push_read_with_the_subscribes_answer_is_not_lost.py. The answer resolves
 * the request's promise, but the iterator resumes only after the push's frame was
 * handled; the push used to be passed over (its events lost). A stand-in connection
 * delivers the push synchronously right after resolving the answer.
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import type { Connection, Reply } from '../src/connection.js';
import { follow, type TaskEvent } from '../src/progress.js';
import type { Session } from '../src/session.js';
import { Push } from '../src/wire.js';

function standIn(answer: Reply, pushed: Reply): Session {
  let push: ((body: Reply) => void) | null = null;
  const conn = {
    closed: false,
    onPush(event: number, handler: (body: Reply) => void): void {
      if (event === Push.TASK_EVENTS) push = handler;
    },
    onLinkLost(): void {},
    hold(): () => void {
      return () => undefined;
    },
    request(): Promise<Reply> {
      const reply = Promise.resolve(answer); // the answer's frame, read first...
      push?.(pushed); // ...then the push's, in the same turn
      return reply;
    },
  };
  return { conn: conn as unknown as Connection } as Session;
}

async function gathered(events: AsyncIterable<TaskEvent>): Promise<Array<[number, string]>> {
  const got: Array<[number, string]> = [];
  const all = (async () => {
    for await (const event of events) got.push([event.seq, event.kind]);
  })();
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`lost: ${JSON.stringify(got)}`)), 10_000);
  });
  try {
    await Promise.race([all, late]);
  } finally {
    clearTimeout(timer);
  }
  return got;
}

test('a push read in the turn of the answer is taken after it', async () => {
  const answer = { events: [{ seq: 1, kind: 'state', state: 'RUNNING', attempt: 1 }], missed: 0, done: false };
  const pushed = {
    task: 't',
    events: [
      { seq: 2, kind: 'progress', data: { step: 'greeting' } },
      { seq: 3, kind: 'outcome', state: 'SUCCEEDED' },
    ],
    missed: 0,
    done: true,
  };
  assert.deepEqual(await gathered(follow(standIn(answer, pushed), 's', 't')), [
    [1, 'state'],
    [2, 'progress'],
    [3, 'outcome'],
  ]);
});

test('a held push the answer already holds is taken once', async () => {
  const both = [
    { seq: 1, kind: 'state', state: 'RUNNING', attempt: 1 },
    { seq: 2, kind: 'progress', data: 1 },
  ];
  const answer = { events: both, missed: 0, done: false };
  const pushed = { task: 't', events: [both[1], { seq: 3, kind: 'outcome', state: 'FAILED' }], missed: 0, done: true };
  assert.deepEqual(await gathered(follow(standIn(answer, pushed), 's', 't')), [
    [1, 'state'],
    [2, 'progress'],
    [3, 'outcome'],
  ]);
});
