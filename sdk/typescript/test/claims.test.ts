import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
  ConflictError,
  InvalidArgumentError,
  LeaseLostError,
  NotFoundError,
  WaitTimeoutError,
} from '../src/index.js';
import { Op } from '../src/wire.js';
import { type RsdServer, client, countOps, sleep, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

describe('claims', () => {
  test('a held key is refused with CLAIM_HELD and tryAcquire reports busy with the holder', async () => {
    const a = client(rsd.address, 'holder-a');
    const b = client(rsd.address, 'holder-b');
    try {
      const run = await a.scopes.create();
      const lease = await run.claim('k').acquire();
      assert.ok(lease.generation >= 1);
      assert.equal(typeof lease.token(), 'string');
      await assert.rejects(b.scope(run.id).claim('k').acquire(), (err: unknown) => {
        assert.ok(err instanceof ConflictError);
        assert.equal(err.code, 'CLAIM_HELD');
        assert.equal(err.details['holder'], 'holder-a');
        return true;
      });
      const attempt = await b.scope(run.id).claim('k').tryAcquire();
      assert.deepEqual(attempt, { kind: 'busy', holder: 'holder-a' });
      await lease.release();
      const second = await b.scope(run.id).claim('k').tryAcquire();
      assert.equal(second.kind, 'acquired');
      if (second.kind === 'acquired') {
        assert.ok(second.lease.generation > lease.generation, 'a new owner has a larger generation');
        assert.notEqual(second.lease.token(), lease.token());
        await second.lease.release();
      }
    } finally {
      await a.close();
      await b.close();
    }
  });

  test('run() with wait gets the key the moment it is released, and releases after', async () => {
    const a = client(rsd.address, 'a');
    const b = client(rsd.address, 'b');
    try {
      const run = await a.scopes.create();
      const lease = await run.claim('k').acquire();
      const waiting = b.scope(run.id).claim('k').run(async (l) => l.generation, { wait: true, timeoutMs: 10_000 });
      while ((await run.claim('k').inspect()).waiters === 0) await sleep(5);
      await lease.release();
      const generation = await waiting;
      assert.ok(generation > lease.generation);
      const info = await run.claim('k').inspect();
      assert.equal(info.held, false, 'run() released the claim when the function returned');
    } finally {
      await a.close();
      await b.close();
    }
  });

  test('a wait that runs out throws WaitTimeoutError and leaves no waiter behind', async () => {
    const a = client(rsd.address, 'a');
    try {
      const run = await a.scopes.create();
      const lease = await run.claim('k').acquire();
      await assert.rejects(run.claim('k').acquire({ wait: true, timeoutMs: 200 }), WaitTimeoutError);
      assert.equal((await run.claim('k').inspect()).waiters, 0);
      await lease.release();
    } finally {
      await a.close();
    }
  });

  test('an abandoned wait is withdrawn with CANCEL and a racing grant is given back', async () => {
    const a = client(rsd.address, 'a');
    const b = client(rsd.address, 'b');
    try {
      const run = await a.scopes.create();
      const lease = await run.claim('k').acquire();
      const ctl = new AbortController();
      const counts = countOps(b);
      const waiting = b.scope(run.id).claim('k').acquire({ wait: true, timeoutMs: 10_000, signal: ctl.signal });
      while ((await run.claim('k').inspect()).waiters === 0) await sleep(5);
      ctl.abort(new Error('gave up'));
      await assert.rejects(waiting, /gave up/);
      for (let i = 0; i < 100 && (await run.claim('k').inspect()).waiters !== 0; i += 1) await sleep(10);
      assert.equal(counts.get(Op.CANCEL), 1);
      assert.equal((await run.claim('k').inspect()).waiters, 0, 'the wait was withdrawn');
      // A grant racing the abandonment: release and abandon in the same turn.
      const ctl2 = new AbortController();
      const waiting2 = b.scope(run.id).claim('k').acquire({ wait: true, timeoutMs: 10_000, signal: ctl2.signal });
      while ((await run.claim('k').inspect()).waiters === 0) await sleep(5);
      const refused = assert.rejects(waiting2, /gave up again/);
      const released = lease.release();
      ctl2.abort(new Error('gave up again'));
      await released;
      await refused;
      for (let i = 0; i < 200 && (await run.claim('k').inspect()).held; i += 1) await sleep(10);
      assert.equal((await run.claim('k').inspect()).held, false, 'nothing is left held');
    } finally {
      await a.close();
      await b.close();
    }
  });

  test('every held lease is renewed in one LEASE_RENEW per round and stays held past its length', async () => {
    const a = client(rsd.address, 'a');
    try {
      const run = await a.scopes.create();
      const counts = countOps(a);
      const leases = await Promise.all(
        Array.from({ length: 50 }, (_, i) => run.claim(`k${i}`, { leaseSeconds: 5 }).acquire()),
      );
      await sleep(6500);
      for (const lease of leases) assert.equal(lease.isLost, false);
      const renewals = counts.get(Op.LEASE_RENEW) ?? 0;
      assert.ok(renewals >= 3 && renewals <= 5, `50 leases of 5 s over 6.5 s: ${renewals} LEASE_RENEW`);
      const info = await run.claim('k7').inspect();
      assert.equal(info.held, true);
      await Promise.all(leases.map((lease) => lease.release()));
    } finally {
      await a.close();
    }
  });

  test('a lost lease aborts its signal, sets isLost, and run() reports it when the function returns', async () => {
    const a = client(rsd.address, 'a');
    try {
      const run = await a.scopes.create();
      let sawAbort = false;
      let ranToEnd = false;
      await assert.rejects(
        run.claim('k').run(async (lease) => {
          lease.signal.addEventListener('abort', () => {
            sawAbort = true;
          });
          await run.cancel('stop'); // ends the claim: LEASE_LOST "scope cancelled"
          for (let i = 0; i < 100 && !lease.isLost; i += 1) await sleep(10);
          assert.equal(lease.isLost, true);
          ranToEnd = true; // not interrupted
          return 'done';
        }),
        (err: unknown) => err instanceof LeaseLostError && err.code === 'STALE_CLAIM',
      );
      assert.ok(sawAbort && ranToEnd);
    } finally {
      await a.close();
    }
  });

  test("a lease over 600 is refused before anything is sent; a short one is the server's to refuse", async () => {
    const a = client(rsd.address, 'a');
    try {
      assert.throws(() => a.scope('s').claim('k', { leaseSeconds: 601 }), InvalidArgumentError);
      const run = await a.scopes.create();
      await assert.rejects(
        run.claim('k', { leaseSeconds: 4 }).acquire(), // the server's least: 5 s
        (err: unknown) => err instanceof InvalidArgumentError && /lease_seconds/.test(err.message),
      );
    } finally {
      await a.close();
    }
  });
});

describe('runs and fencing', () => {
  test('a run never created is NOT_FOUND; create({ id }) makes it once, idempotently', async () => {
    const rs = client(rsd.address, 'runs');
    try {
      const id = `ts-nightly-${Date.now()}`;
      await assert.rejects(rs.scope(id).claim('k').acquire(), (err: unknown) => {
        assert.ok(err instanceof NotFoundError);
        assert.match(err.message, /does not exist/);
        return true;
      });
      const made = await rs.scopes.create({ id });
      assert.equal(made.id, id);
      assert.equal(made.created, true);
      assert.equal((await rs.scopes.create({ id })).created, false);
      const lease = await rs.scope(id).claim('k').acquire();
      await lease.release();
    } finally {
      await rs.close();
    }
  });

  test('fence.check is true for the current grant and false for a released one', async () => {
    const a = client(rsd.address, 'fence-a');
    const b = client(rsd.address, 'fence-b');
    try {
      const run = await a.scopes.create();
      const first = await run.claim('k').acquire();
      assert.equal(await b.fence.check(run.id, 'k', first.token()), true);
      const token = first.token();
      await first.release();
      const second = await b.scope(run.id).claim('k').acquire();
      assert.equal(await b.fence.check(run, 'k', token), false);
      const status = await b.fence.status(run, 'k', second.token());
      assert.deepEqual(status, { current: true, generation: second.generation });
      await second.release();
    } finally {
      await a.close();
      await b.close();
    }
  });
});
