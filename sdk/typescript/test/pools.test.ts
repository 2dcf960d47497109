/**
 * Pools and quotas from TypeScript: a slot is held like a claim (same Lease, renewed,
 * released), a full pool is POOL_FULL / busy, waiters are granted in order when a slot
 * frees; a quota is a token bucket taken from with QUOTA_EXHAUSTED without waiting and
 * INVALID_ARGUMENT above its limit; both interoperate with the Python SDK's view of them.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { ConflictError, InvalidArgumentError, NotFoundError, WaitTimeoutError } from '../src/index.js';
import { type RsdServer, client, sleep } from './support.js';
import { startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

describe('pools', () => {
  test('N slots: the N+1th is POOL_FULL, tryAcquire says busy, a waiter gets the freed slot', async () => {
    const a = client(rsd.address, 'pool-a');
    const b = client(rsd.address, 'pool-b');
    try {
      await a.pools.ensure('gpu-ts', { size: 2 });
      const run = await a.scopes.create();
      const one = await run.pool('gpu-ts').acquire();
      const two = await run.pool('gpu-ts').acquire();
      await assert.rejects(b.scope(run.id).pool('gpu-ts').acquire(), (err: unknown) => {
        assert.ok(err instanceof ConflictError);
        assert.equal(err.code, 'POOL_FULL');
        return true;
      });
      assert.deepEqual(await b.scope(run.id).pool('gpu-ts').tryAcquire(), { kind: 'busy', holder: null });
      const info = await a.pools.inspect('gpu-ts');
      assert.equal(info.size, 2);
      assert.equal(info.held, 2);
      assert.deepEqual(info.holders.map((h) => h.holder).sort(), ['pool-a', 'pool-a']);
      const waiting = b
        .scope(run.id)
        .pool('gpu-ts')
        .run(async (lease) => lease.generation, { wait: true, timeoutMs: 10_000 });
      while ((await a.pools.inspect('gpu-ts')).waiters === 0) await sleep(5);
      await one.release();
      assert.ok((await waiting) >= 1);
      await two.release();
      assert.equal((await a.pools.inspect('gpu-ts')).held, 0, 'run() released its slot');
    } finally {
      await a.close();
      await b.close();
    }
  });

  test('a wait for a full pool ends with WaitTimeoutError and leaves no waiter behind', async () => {
    const rs = client(rsd.address, 'pool-t');
    try {
      await rs.pools.ensure('one-ts', { size: 1 });
      const run = await rs.scopes.create();
      const held = await run.pool('one-ts').acquire();
      await assert.rejects(
        run.pool('one-ts').acquire({ wait: true, timeoutMs: 200 }),
        (err: unknown) => err instanceof WaitTimeoutError,
      );
      assert.equal((await rs.pools.inspect('one-ts')).waiters, 0);
      await held.release();
    } finally {
      await rs.close();
    }
  });

  test('an unknown pool is NOT_FOUND and a bad size INVALID_ARGUMENT', async () => {
    const rs = client(rsd.address, 'pool-bad');
    try {
      const run = await rs.scopes.create();
      await assert.rejects(run.pool('no-such-pool').acquire(), (err: unknown) => err instanceof NotFoundError);
      await assert.rejects(rs.pools.ensure('p', { size: 0 }), (err: unknown) => err instanceof InvalidArgumentError);
    } finally {
      await rs.close();
    }
  });
});

describe('quotas', () => {
  test('takes spend the bucket; empty without waiting is QUOTA_EXHAUSTED; over the limit is INVALID_ARGUMENT', async () => {
    const rs = client(rsd.address, 'quota-a');
    try {
      await rs.quotas.ensure('api-ts', { limit: 3, perSeconds: 3600 });
      const run = await rs.scopes.create();
      const first = await run.quota('api-ts').take({ amount: 2 });
      assert.equal(first.taken, 2);
      assert.ok(first.level < 1.01);
      await assert.rejects(run.quota('api-ts').take({ amount: 2, wait: false }), (err: unknown) => {
        assert.ok(err instanceof ConflictError);
        assert.equal(err.code, 'QUOTA_EXHAUSTED');
        return true;
      });
      await assert.rejects(run.quota('api-ts').take({ amount: 4 }), (err: unknown) => err instanceof InvalidArgumentError);
      const info = await rs.quotas.inspect('api-ts');
      assert.equal(info.limit, 3);
      assert.ok(info.level >= 1 && info.level < 1.01);
    } finally {
      await rs.close();
    }
  });

  test('a waiting take is served by the refill, pushed, in time', async () => {
    const rs = client(rsd.address, 'quota-w');
    try {
      await rs.quotas.ensure('fast-ts', { limit: 10, perSeconds: 1 });
      const run = await rs.scopes.create();
      await run.quota('fast-ts').take({ amount: 10 });
      const started = Date.now();
      const got = await run.quota('fast-ts').take({ amount: 5, timeoutMs: 5000 });
      const waited = Date.now() - started;
      assert.equal(got.taken, 5);
      assert.ok(waited >= 300 && waited < 3000, `waited ${waited} ms for a 0.5 s refill`);
    } finally {
      await rs.close();
    }
  });
});
