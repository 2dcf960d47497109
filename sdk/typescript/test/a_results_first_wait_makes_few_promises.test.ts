/**
 * `ticket.result()` on a ready connection sends and awaits its first wait itself: no
 * frame of `waitAcrossReconnects` (an async function: a promise of its own, and a copy
 * of the wait's arguments) between the caller and the wait's own promise, as the
 * Python SDK's `result()` (issue 33). Counted as the promises one `result()` makes (a
 * count, not a timing: the same on a loaded machine); waits across reconnects stay
 * covered by their own tests.
 */
import assert from 'node:assert/strict';
import { createHook } from 'node:async_hooks';
import { after, before, test } from 'node:test';

import { type RsdServer, client, startRsd } from './support.js';

const TASKS = 20;
// Promises per result() of a task that has ended: result's own, its wait's, and the
// awaits between them: 3, against 5 before result() awaited its first wait itself.
const MOST_PROMISES_PER_RESULT = 3;

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

test("a result's first wait is awaited by result() itself", async () => {
  const rs = client(rsd.address, 'planner');
  try {
    await rs.mailboxes.ensure('promises', { mode: 'WORK' });
    const box = (await rs.scopes.create()).mailbox('promises');
    const tickets = [];
    for (let n = 0; n < TASKS + 1; n += 1) {
      const ticket = await box.submit({ n }, { key: `task-${n}` });
      const delivery = await box.receive();
      assert.ok(delivery !== null);
      await delivery.complete({ payload: n });
      tickets.push(ticket);
    }
    await tickets[0]!.result({ timeoutMs: 10_000 }); // warm
    let promises = 0;
    const hook = createHook({ init: (_id, type) => { if (type === 'PROMISE') promises += 1; } });
    for (const ticket of tickets.slice(1)) {
      hook.enable();
      const waited = ticket.result({ timeoutMs: 10_000 });
      hook.disable();
      await waited;
    }
    assert.ok(
      promises / TASKS <= MOST_PROMISES_PER_RESULT,
      `${promises / TASKS} promises made per result() (at most ${MOST_PROMISES_PER_RESULT})`,
    );
  } finally {
    await rs.close();
  }
});
