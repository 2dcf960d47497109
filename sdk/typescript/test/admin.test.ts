/**
 * `rs.admin` (ops 80-89, 100-102) against an rsd with a tokens file: an admin token reads
 * and acts on another tenant's runs, page by page; each listing walked a small page at a
 * time finds everything made, in order; a deleted dead letter is gone and a second delete
 * of it is NotFoundError; a client token is refused every admin call.
 */

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { NotFoundError, PermissionDeniedError, type Runstate } from '../src/index.js';
import { Op } from '../src/wire.js';
import { type RsdServer, client, countOps, startRsd } from './support.js';

const ADMIN_TOKEN = 'rsd_admin-token-for-the-admin-tests';
const CLIENT_TOKEN = 'rsd_client-token-for-the-admin-tests';
const TEAM_B_TOKEN = 'rsd_team-b-token-for-the-admin-tests'; // a tenant only the listing tests fill
const digest = (token: string): string => `sha256:${createHash('sha256').update(token).digest('hex')}`;

let rsd: RsdServer;
let dir: string;
before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-admin-'));
  const tokens = path.join(dir, 'tokens');
  writeFileSync(
    tokens,
    `${digest(ADMIN_TOKEN)} ops admin\n${digest(CLIENT_TOKEN)} team-a client\n${digest(TEAM_B_TOKEN)} team-b client\n`,
  );
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

  test("each listing walked two at a time finds all of another tenant's objects, in the order made", async () => {
    const team: Runstate = client(rsd.address, 'team-b', { token: TEAM_B_TOKEN });
    const ops: Runstate = client(rsd.address, 'operator', { token: ADMIN_TOKEN });
    const made = [0, 1, 2, 3, 4]; // three pages of two
    try {
      const run = await team.scopes.create();
      for (const n of made) {
        await team.quotas.ensure(`q-${n}`, { limit: n + 1, perSeconds: 60 });
        await team.mailboxes.ensure(`box-${n}`, { maxAttempts: n + 1 });
        await run.mailbox(`box-${n}`).submit({ n }, { group: `g-${n}` });
      }
      const counted = countOps(ops);
      const page = { tenant: 'team-b', limit: 2 };

      const quotas = await all(ops.admin.iterQuotas(page));
      assert.deepEqual(
        quotas.map((q) => [q.name, q.limit]),
        made.map((n) => [`q-${n}`, n + 1]),
      );
      const mailboxes = await all(ops.admin.iterMailboxes(page));
      assert.deepEqual(
        mailboxes.map((m) => [m.name, m.max_attempts, m.ready]),
        made.map((n) => [`box-${n}`, n + 1, 1]),
      );
      const queues = await all(ops.admin.iterQueues(run.id, page));
      assert.deepEqual(
        queues.map((q) => [q.mailbox, q.ready, q.dead_letters]),
        made.map((n) => [`box-${n}`, 1, 0]),
      );
      const groups = await all(ops.admin.iterGroups(run.id, page));
      assert.deepEqual(
        groups.map((g) => [g.group, g.tasks, g.unfinished]),
        made.map((n) => [`g-${n}`, 1, 1]),
      );
      for (const op of [Op.ADMIN_QUOTAS, Op.ADMIN_MAILBOXES, Op.ADMIN_QUEUES, Op.ADMIN_GROUPS]) {
        assert.ok((counted.get(op) ?? 0) >= 3, `op ${op}: one request per page of two`);
      }
    } finally {
      await team.close();
      await ops.close();
    }
  });

  test('a deleted dead letter is gone, and deleting it again is NotFoundError', async () => {
    const team: Runstate = client(rsd.address, 'team-a', { token: CLIENT_TOKEN });
    const ops: Runstate = client(rsd.address, 'operator', { token: ADMIN_TOKEN });
    try {
      await team.mailboxes.ensure('doomed', { maxAttempts: 1 });
      const run = await team.scopes.create();
      const box = run.mailbox('doomed');
      for (const n of [1, 2]) {
        await box.submit({ n });
        await (await box.receive())!.reject('bad input'); // dead-lettered
      }
      const listed = await ops.admin.deadLetters(run.id, 'doomed', { tenant: 'team-a' });
      const [first, second] = listed.items.map((item) => item['id'] as string);
      assert.equal(listed.count, 2);

      const deleted = await ops.admin.deleteDeadLetter(run.id, 'doomed', first!, 'team-a');
      assert.deepEqual(deleted, { deleted: first, left: 1 });
      const after = await ops.admin.deadLetters(run.id, 'doomed', { tenant: 'team-a' });
      assert.deepEqual(
        after.items.map((item) => item['id']),
        [second],
      );
      assert.equal(after.count, 1);
      assert.equal((await box.inspect()).dead_letters, 1);

      const notFound = (error: unknown): boolean => error instanceof NotFoundError && error.code === 'NOT_FOUND';
      await assert.rejects(ops.admin.deleteDeadLetter(run.id, 'doomed', first!, 'team-a'), notFound);
      await assert.rejects(ops.admin.deleteDeadLetter(run.id, 'doomed', 'never-dead-lettered', 'team-a'), notFound);
      assert.equal((await ops.admin.deadLetters(run.id, 'doomed', { tenant: 'team-a' })).count, 1);
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
      await assert.rejects(all(team.admin.iterGroups(run.id)), refused);
      await assert.rejects(team.admin.deleteDeadLetter(run.id, 'jobs', 't-1'), refused);
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
