/**
 * The least lease is the server's (claims.ts `checkLeaseSeconds`), as in the Python SDK
 * (commit 69e7052): a server that announces a lower minimum (the test-only
 * `--test-min-lease-seconds`) grants a claim, a pool slot and a worker's delivery a lease
 * that short, and a server of the protocol's 5 s refuses a shorter one with
 * InvalidArgumentError (which ends consume()). Before, the SDK checked the protocol's
 * fixed 5 s itself and refused what the server would have granted. A lease over 600 s, or
 * not above 0, is refused before anything is sent.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { InvalidArgumentError } from '../src/index.js';
import { type RsdServer, client, startRsd } from './support.js';

const SHORT_LEASE = 1; // the least the short-lease server allows
const ASKED = 2 * SHORT_LEASE; // under the protocol's 5 s

let short: RsdServer;
let plain: RsdServer;
before(async () => {
  short = await startRsd({
    extra: ['--test-min-lease-seconds', String(SHORT_LEASE)],
    env: { RSD_TEST_ONLY_OPTIONS: '1' }, // (rsd refuses the test-only option otherwise)
  });
  plain = await startRsd();
});
after(async () => {
  await Promise.all([short?.stop(), plain?.stop()]);
});

describe('the least lease is the server\'s', () => {
  test('a server that allows shorter leases grants them: a claim, a pool slot, a worker\'s delivery', async () => {
    const rs = client(short.address, 'short');
    const stop = new AbortController();
    try {
      const run = await rs.scopes.create();
      const lease = await run.claim('k', { leaseSeconds: ASKED }).acquire();
      assert.equal(lease.leaseSeconds, ASKED);
      await lease.release();
      await rs.pools.ensure('p', { size: 1 });
      const slot = await run.pool('p', { leaseSeconds: ASKED }).acquire();
      assert.equal(slot.leaseSeconds, ASKED);
      await slot.release();

      await rs.mailboxes.ensure('jobs', { mode: 'WORK' });
      const ticket = await run.mailbox('jobs').submit({ n: 1 }, { key: 'one' });
      const leases: number[] = [];
      await run.mailbox('jobs').consume<{ n: number }>(
        async (data, delivery) => {
          leases.push(delivery.lease.leaseSeconds);
          await delivery.complete({ payload: data.n });
          stop.abort();
        },
        { leaseSeconds: ASKED, signal: stop.signal },
      );
      assert.deepEqual(leases, [ASKED]);
      assert.equal((await ticket.result({ timeoutMs: 5000 })).outcome, 1);
    } finally {
      stop.abort();
      await rs.close();
    }
  });

  test("a server of the protocol's minimum refuses a shorter lease; over 600 is refused at once", async () => {
    const rs = client(plain.address, 'plain');
    try {
      const run = await rs.scopes.create();
      const refused = (err: unknown): boolean =>
        err instanceof InvalidArgumentError && err.code === 'INVALID_ARGUMENT' && /lease_seconds/.test(err.message);
      await assert.rejects(run.claim('k', { leaseSeconds: ASKED }).acquire(), refused);
      await rs.mailboxes.ensure('jobs', { mode: 'WORK' });
      await assert.rejects(run.mailbox('jobs').receive({ leaseSeconds: ASKED }), refused);
      await assert.rejects(
        run.mailbox('jobs').consume(() => assert.fail('never called'), { leaseSeconds: ASKED }),
        refused,
      );
      for (const wrong of [0, -1, 601, Number.NaN]) {
        assert.throws(() => run.claim('k', { leaseSeconds: wrong }), InvalidArgumentError);
      }
    } finally {
      await rs.close();
    }
  });
});
