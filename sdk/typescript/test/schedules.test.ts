/**
 * Schedules from TypeScript: `run.schedules.ensure(name, { mailbox, everySeconds | cron })`
 * fires one task per fire time, keyed `schedule:<name>:<fire time>`; list, get (with the
 * next fire times), pause, resume and delete; a bad definition is InvalidArgumentError
 * naming what is wrong; the server's pages of schedules (each under the frame limit,
 * whatever their data) walked by `list()`, `page()` and `iter()`. No durations are
 * asserted: fires are waited for by receive.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { InvalidArgumentError, NotFoundError } from '../src/index.js';
import { type RsdServer, client, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

describe('schedules', () => {
  test('each fire is one task keyed by its fire time', async () => {
    const rs = client(rsd.address, 'sched-ts');
    try {
      await rs.mailboxes.ensure('ts-ticks');
      const run = await rs.scopes.create();
      const made = await run.schedules.ensure('tick', { mailbox: 'ts-ticks', everySeconds: 1, data: { n: 1 } });
      assert.equal(made.created, true);
      const keys: string[] = [];
      while (keys.length < 2) {
        const delivery = await run.mailbox('ts-ticks').receive({ wait: true, timeoutMs: 20_000 });
        assert.ok(delivery, 'no fire within 20 s');
        keys.push(String(delivery.key));
        assert.deepEqual(delivery.data, { n: 1 });
        await delivery.complete();
      }
      assert.ok(keys.every((k) => /^schedule:tick:\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/.test(k)));
      assert.equal(new Set(keys).size, 2);
      const info = await run.schedules.get('tick', { next: 3 });
      assert.equal(info.next_fires?.length, 3);
      assert.deepEqual((await run.schedules.list()).map((s) => s.name), ['tick']);
      assert.equal((await run.schedules.pause('tick')).paused, true);
      assert.equal((await run.schedules.resume('tick')).paused, false);
      assert.equal(await run.schedules.delete('tick'), true);
      await assert.rejects(run.schedules.get('tick'), NotFoundError);
    } finally {
      await rs.close();
    }
  });

  test('cron in a time zone, and bad definitions refused naming what is wrong', async () => {
    const rs = client(rsd.address, 'sched-ts-cron');
    try {
      await rs.mailboxes.ensure('ts-cron');
      const run = await rs.scopes.create();
      const made = await run.schedules.ensure('nightly', {
        mailbox: 'ts-cron',
        cron: '0 3 * * *',
        timezone: 'Europe/Berlin',
        catchUp: 'none',
      });
      assert.equal(made.cron, '0 3 * * *');
      assert.equal(made.catch_up, 'none');
      await assert.rejects(
        run.schedules.ensure('bad', { mailbox: 'ts-cron', cron: 'never' }),
        (err: unknown) => err instanceof InvalidArgumentError && /cron/.test(err.message),
      );
      await assert.rejects(
        run.schedules.ensure('bad', { mailbox: 'ts-cron', everySeconds: 5, cron: '* * * * *' }),
        (err: unknown) => err instanceof InvalidArgumentError && /exactly one/.test(err.message),
      );
      await assert.rejects(
        run.schedules.ensure('bad', { mailbox: 'ts-cron', cron: '* * * * *', timezone: 'Moon/Base' }),
        (err: unknown) => err instanceof InvalidArgumentError && /time zone/.test(err.message),
      );
    } finally {
      await rs.close();
    }
  });

  test('large schedules are listed page by page, each page under the frame limit', async () => {
    const rs = client(rsd.address, 'sched-ts-pages');
    try {
      await rs.mailboxes.ensure('ts-big');
      const run = await rs.scopes.create();
      const big = 'x'.repeat(200_000);
      const names = ['big-3', 'big-1', 'big-5', 'big-0', 'big-4', 'big-2']; // ensured so
      for (const name of names) {
        await run.schedules.ensure(name, { mailbox: 'ts-big', cron: '0 3 * * *', data: big });
      }
      const listed = await run.schedules.list(); // one reply of all: over the frame limit
      assert.deepEqual(listed.map((s) => s.name), [...names].sort());
      assert.ok(listed.every((s) => s.data === big));
      const first = await run.schedules.page();
      assert.ok(first.items.length >= 1 && first.items.length < names.length && first.next !== null);
      assert.deepEqual(first.items.map((s) => s.name), names.slice(0, first.items.length));
      const newest = await run.schedules.page({ limit: 2, newestFirst: true });
      assert.deepEqual(newest.items.map((s) => s.name), [...names].reverse().slice(0, 2));
      const walked: string[] = [];
      for await (const schedule of run.schedules.iter({ limit: 1 })) walked.push(schedule.name);
      assert.deepEqual(walked, names);
    } finally {
      await rs.close();
    }
  });
});
