/**
 * Limits by key through the TypeScript SDK against a real rsd, as
 * tests/test_a_tasks_key_limits_hold_over_the_wire_and_through_a_kill_9.py does for
 * rsclient: `submit(data, { concurrencyKey, concurrencyLimit })` and `{ rateKey,
 * rateLimit, ratePeriodSeconds }` reach the server (also as `submitMany` items), a held
 * task shows the key holding it (`held_by`), other keys are not held back, and bad
 * combinations are refused.
 */

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { InvalidArgumentError, type SubmitOptions } from '../src/index.js';
import { mailboxOfAFreshRun } from './support.js';

const withBox = mailboxOfAFreshRun();

describe('limits by key', () => {
  test('a full key holds back its own tasks only', async () => {
    await withBox(async (box) => {
      await box.submit('a0', { concurrencyKey: 'user:42', concurrencyLimit: 1 });
      const held = await box.submit('a1', { concurrencyKey: 'user:42', concurrencyLimit: 1 });
      const many = await box.submitMany([
        { data: 'b0', rateKey: 'api', rateLimit: 1, ratePeriodSeconds: 3600 },
        { data: 'b1', rateKey: 'api', rateLimit: 1, ratePeriodSeconds: 3600 },
      ]);
      assert.equal(many.length, 2);
      const first = await box.receive();
      const second = await box.receive();
      assert.ok(first !== null && second !== null);
      assert.deepEqual([first.data, second.data], ['a0', 'b0']);
      assert.equal(await box.receive(), null);
      const view = await held.status();
      assert.deepEqual(view.limits, { concurrency_key: 'user:42', concurrency_limit: 1 });
      assert.deepEqual(view.held_by, { kind: 'concurrency', key: 'user:42', limit: 1, running: 1 });
      await first.complete();
      const next = await box.receive();
      assert.ok(next !== null);
      assert.equal(next.data, 'a1');
    });
  });

  test('bad combinations are refused', async () => {
    await withBox(async (box) => {
      const bad: SubmitOptions[] = [
        { concurrencyKey: 'k' },
        { concurrencyLimit: 1 },
        { concurrencyKey: 'k', concurrencyLimit: 0 },
        { rateKey: 'r' },
        { rateLimit: 3 },
        { rateKey: 'r', rateLimit: 1, ratePeriodSeconds: 0 },
      ];
      for (const options of bad) {
        await assert.rejects(box.submit(1, options), InvalidArgumentError);
      }
    });
  });
});
