/**
 * Tasks after tasks and children through the TypeScript SDK against a real rsd, as
 * tests/test_blocked_tasks_and_children_survive_a_kill_9.py does for rsclient:
 * `submit(data, { after })` is BLOCKED until its parents end and its delivery carries
 * their outcomes (`parents`), `delivery.submitChild` makes children that
 * `ticket.children()` lists and that a parent's cancellation cancels, and bad links are
 * refused with the server's codes.
 */

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { InvalidArgumentError, NotFoundError } from '../src/index.js';
import { mailboxOfAFreshRun } from './support.js';

const withBox = mailboxOfAFreshRun();

describe('tasks after tasks, and children', () => {
  test('a task after its parents waits for them and sees their outcomes', async () => {
    await withBox(async (box) => {
      const plan = await box.submit('plan');
      const delivery = await box.receive();
      assert.ok(delivery !== null && delivery.id === plan.id);
      const search = await delivery.submitChild('jobs', 'search');
      const summary = await box.submit('summary', { after: [plan, search.id] });
      assert.equal(summary.view?.state, 'BLOCKED');
      assert.deepEqual(summary.view?.after, [plan.id, search.id]);
      assert.equal((await box.inspect()).blocked_by_parents, 1);
      await delivery.complete({ payload: 'planned' });
      const children = await plan.children();
      assert.deepEqual(children.map((child) => child.id), [search.id]);
      const found = await box.receive();
      assert.ok(found !== null && found.id === search.id);
      assert.deepEqual(found.parents, {});
      await found.complete({ payload: 'notes' });
      const last = await box.receive();
      assert.ok(last !== null && last.id === summary.id);
      assert.equal(last.parents[plan.id]?.outcome, 'planned');
      assert.equal(last.parents[search.id]?.outcome, 'notes');
      await last.complete();
    });
  });

  test("a cancelled parent cancels its children and the tasks after it", async () => {
    await withBox(async (box) => {
      const parent = await box.submit('parent');
      const kid = await box.submit('kid', { parent });
      const next = await box.submit('next', { after: [parent.id] });
      const anyway = await box.submit('anyway', { after: [parent], onParentFailure: 'run' });
      await parent.cancel();
      assert.equal((await kid.status()).reason, `parent ${parent.id} ended CANCELLED`);
      assert.equal((await next.status()).state, 'CANCELLED');
      assert.equal((await anyway.status()).state, 'PENDING');
    });
  });

  test('bad links are refused', async () => {
    await withBox(async (box) => {
      await assert.rejects(box.submit(1, { after: ['t-999999'] }), NotFoundError);
      const ok = await box.submit(1);
      await assert.rejects(box.submit(1, { after: Array(65).fill(ok.id) }), InvalidArgumentError);
      await assert.rejects(box.submit(1, { onParentFailure: 'run' }), InvalidArgumentError);
    });
  });
});
