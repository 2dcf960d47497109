/**
 * `rs.admin` (ops 80-87) against an rsd with a tokens file: an admin token reads and acts
 * on another tenant's runs, page by page; a client token is refused every admin call.
 */

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { PermissionDeniedError, type Runstate } from '../src/index.js';
import { Op } from '../src/wire.js';
import { type RsdServer, client, countOps, startRsd } from './support.js';

const ADMIN_TOKEN = 'rsd_admin-token-for-the-admin-tests';
const CLIENT_TOKEN = 'rsd_client-token-for-the-admin-tests';
const digest = (token: string): string => `sha256:${createHash('sha256').update(token).digest('hex')}`;

let rsd: RsdServer;
let dir: string;
before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-admin-'));
  const tokens = path.join(dir, 'tokens');
  writeFileSync(tokens, `${digest(ADMIN_TOKEN)} ops admin\n${digest(CLIENT_TOKEN)} team-a client\n`);
  rsd = await startRsd({ extra: ['--tokens-file', tokens] });
});
after(async () => {
  await rsd.stop();
  rmSync(dir, { recursive: true, force: true });
});

async function all<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

describe('rs.admin', () => {
  test("an admin token lists and acts on another tenant's runs, a page at a time", async () => {
    const team: Runstate = client(rsd.address, 'team-a', { token: CLIENT_TOKEN });
    const ops: Runstate = client(rsd.address, 'operator', { token: ADMIN_TOKEN });
    try {
      await team.mailboxes.ensure('jobs', { maxAttempts: 1 });
      const runs = [await team.scopes.create(), await team.scopes.create(), await team.scopes.create()];
      const run = runs[0]!;
      await run.claim('k1').acquire();
      await run.claim('k2').acquire();
      const ticket = await run.mailbox('jobs').submit({ n: 1 }, { key: 'one' });
      await run.mailbox('jobs').submit({ n: 2 }, { key: 'two' });
      const delivery = await run.mailbox('jobs').receive();
      await delivery!.reject('bad input'); // dead-lettered

      const counted = countOps(ops);
      const scopes = await all(ops.admin.iterScopes({ tenant: 'team-a', limit: 1 }));
      assert.deepEqual(
        scopes.map((s) => s.scope),
        runs.map((r) => r.id),
      );
      assert.ok((counted.get(Op.ADMIN_SCOPES) ?? 0) >= 3, 'one request per page of one');
      assert.equal(scopes[0]!.claims, 2);
      const claims = await all(ops.admin.iterClaims(run.id, { tenant: 'team-a' }));
      assert.deepEqual(
        claims.map((c) => [c.key, c.held, c.holder]),
        [
          ['k1', true, 'team-a'],
          ['k2', true, 'team-a'],
        ],
      );
      const failed = await all(ops.admin.iterTasks(run.id, { tenant: 'team-a', state: 'FAILED' }));
      assert.deepEqual(
        failed.map((t) => [t.id, t.dead]),
        [[ticket.id, true]],
      );
      const full = await ops.admin.task(run.id, ticket.id, 'team-a');
      assert.deepEqual(full.data, { n: 1 });
      assert.equal(full.delivery, null);
      const dead = await ops.admin.deadLetters(run.id, 'jobs', { tenant: 'team-a' });
      assert.equal(dead.count, 1);
      const requeued = await ops.admin.requeue(run.id, 'jobs', { all: true, tenant: 'team-a' });
      assert.equal(requeued.requeued.length, 1);
      assert.equal(requeued.left, 0);
      assert.equal((await run.mailbox('jobs').inspect()).ready, 2, 'the requeued one and "two"');
      const pools = await all(ops.admin.iterPools({ tenant: 'team-a' }));
      assert.deepEqual(pools, []);
      const cancelled = await ops.admin.cancel(runs[2]!.id, 'by the operator', 'team-a');
      assert.equal(cancelled.cancelled, true);
      assert.equal((await runs[2]!.status()).reason, 'by the operator');
      assert.equal(typeof (await ops.admin.stats()).ops_total, 'number');
      const snapshot = await ops.admin.snapshot();
      assert.equal(typeof snapshot.snapshot, 'string');
      assert.equal(typeof snapshot.covers, 'number');
    } finally {
      await team.close();
      await ops.close();
    }
  });

  test('a client token is refused every admin call with PermissionDeniedError', async () => {
    const team = client(rsd.address, 'team-a', { token: CLIENT_TOKEN });
    try {
      const run = await team.scopes.create();
      const refused = (error: unknown): boolean =>
        error instanceof PermissionDeniedError && error.code === 'PERMISSION_DENIED';
      await assert.rejects(all(team.admin.iterScopes()), refused);
      await assert.rejects(all(team.admin.iterClaims(run.id)), refused);
      await assert.rejects(team.admin.snapshot(), refused);
      await assert.rejects(team.admin.stats(), refused);
      await assert.rejects(team.serverStats(), refused);
      await assert.rejects(team.admin.cancel(run.id, 'no', 'ops'), refused);
      assert.equal((await run.status()).state, 'open');
    } finally {
      await team.close();
    }
  });
});
