/**
 * Pausing from TypeScript, the twin of tests/test_a_paused_mailbox_stays_paused_through_a_kill_9.py:
 * `rs.mailboxes.pause(name)` holds a mailbox in every run and `run.mailbox(name).pause()`
 * in one run; a paused queue takes submits but delivers nothing, a parked receive is
 * served the moment it is resumed, and both pauses outlive a kill -9. No durations are
 * asserted: a parked receive is waited for by the queue's count of consumers.
 */

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { InvalidArgumentError, NotFoundError } from '../src/index.js';
import { client, sleep, startRsd } from './support.js';

test('pauses hold deliveries and survive a kill -9', async () => {
  const dataDir = mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-pause-'));
  try {
    let rsd = await startRsd({ dataDir });
    let rs = client(rsd.address, 'pause-ts');
    try {
      await rs.mailboxes.ensure('jobs');
      await rs.mailboxes.ensure('mail');
      const run = await rs.scopes.create({ id: 'r' });
      const jobs = run.mailbox('jobs');
      const mail = run.mailbox('mail');
      assert.equal((await rs.mailboxes.pause('jobs')).paused, true);
      assert.equal((await rs.mailboxes.pause('jobs')).paused, true); // idempotent
      const ticket = await jobs.submit({ n: 1 });
      assert.equal(await jobs.receive(), null);
      assert.equal((await jobs.inspect()).paused, true);
      const parked = jobs.receive({ wait: true, timeoutMs: 120_000 });
      while ((await jobs.inspect()).consumers !== 1) await sleep(10);
      assert.equal((await rs.mailboxes.resume('jobs')).paused, false);
      const delivery = await parked;
      assert.ok(delivery);
      assert.equal(delivery.taskId, ticket.id);
      await delivery.complete();
      await rs.mailboxes.pause('jobs');
      assert.equal((await mail.pause()).paused, true);
      await jobs.submit({ n: 2 });
      await mail.send('hello');
    } finally {
      await rs.close();
    }
    await rsd.kill();
    rsd = await startRsd({ dataDir, port: rsd.port });
    rs = client(rsd.address, 'pause-ts-after');
    try {
      const run = rs.scope('r');
      const jobs = run.mailbox('jobs');
      const mail = run.mailbox('mail');
      assert.equal((await jobs.inspect()).paused, true);
      assert.equal((await mail.inspect()).paused, true);
      assert.equal(await jobs.receive(), null);
      assert.equal(await mail.receive(), null);
      await rs.mailboxes.resume('jobs');
      assert.equal((await mail.resume()).paused, false);
      assert.deepEqual((await jobs.receive())?.data, { n: 2 });
      assert.equal((await mail.receive())?.data, 'hello');
      await assert.rejects(rs.mailboxes.pause('nope'), NotFoundError);
      await assert.rejects(rs.mailboxes.pause(7 as unknown as string), InvalidArgumentError);
    } finally {
      await rs.close();
      await rsd.stop();
    }
  } finally {
    rmSync(dataDir, { recursive: true, force: true });
  }
});
