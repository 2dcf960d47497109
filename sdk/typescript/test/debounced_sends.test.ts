/**
 * Debounced sends through the TypeScript SDK against a real rsd, as
 * tests/test_a_debounced_send_replaces_the_waiting_message_over_the_wire.py does for
 * rsclient: `send(data, { debounceKey, debounceSeconds })` reaches the server, a later
 * send with the key replaces the waiting message (`replaced: true`, its id), the one
 * delivery carries the newest data, the next send after it starts a new message, and bad
 * combinations are refused.
 */

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { ConflictError, InvalidArgumentError, type SendOptions } from '../src/index.js';
import { mailboxOfAFreshRun } from './support.js';

const withBox = mailboxOfAFreshRun();

describe('debounced sends', () => {
  test('sends with one key become one delivery of the newest data', async () => {
    await withBox(async (box) => {
      const first = await box.send({ v: 1 }, { debounceKey: 'doc:7', debounceSeconds: 60 });
      assert.equal(first.replaced, false);
      const second = await box.send({ v: 2 }, { debounceKey: 'doc:7', debounceSeconds: 60 });
      assert.deepEqual(second, { id: first.id, replay: false, replaced: true });
      assert.equal((await box.inspect()).delayed, 1);
      assert.equal(await box.receive(), null);
      const last = await box.send({ v: 3 }, { debounceKey: 'doc:7', debounceSeconds: 0.05 });
      assert.equal(last.id, first.id);
      const delivery = await box.receive({ wait: true, timeoutMs: 30_000 });
      assert.ok(delivery !== null);
      assert.deepEqual(delivery.data, { v: 3 });
      await delivery.complete();
      const anew = await box.send({ v: 4 }, { debounceKey: 'doc:7', debounceSeconds: 60 });
      assert.equal(anew.replaced, false);
      assert.notEqual(anew.id, first.id);
      const plain = await box.send('plain');
      assert.equal(plain.replaced, undefined);
    });
  });

  test('bad debounce options are refused', async () => {
    await withBox(async (box) => {
      const bad: SendOptions[] = [
        { debounceKey: 'k' },
        { debounceKey: 'k', debounceSeconds: 0 },
        { debounceKey: 'k', debounceSeconds: -1 },
        { debounceKey: 'k', debounceSeconds: 1e9 },
        { debounceKey: 'k'.repeat(513), debounceSeconds: 5 },
        { debounceKey: 'k', debounceSeconds: 5, workKey: 'w' },
        { debounceKey: 'k', debounceSeconds: 5, delaySeconds: 1 },
      ];
      for (const options of bad) {
        await assert.rejects(box.send(1, options), InvalidArgumentError);
      }
      await box.send(1, { debounceKey: 'k', debounceSeconds: 60, priority: 3 });
      await assert.rejects(
        box.send(2, { debounceKey: 'k', debounceSeconds: 60 }),
        ConflictError,
      );
      assert.equal((await box.inspect()).delayed, 1);
    });
  });
});
