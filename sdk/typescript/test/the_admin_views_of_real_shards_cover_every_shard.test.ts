/**
 * The admin views of a sharded cluster cover every shard (admin.ts and fanout.ts; the
 * Python SDK's tests/test_the_admin_views_of_a_sharded_cluster_cover_every_shard.py): a
 * listing that names no run (runs, pools, quotas, mailboxes) is asked of every shard that
 * owns slots and merged, and paging through its cursor, which carries each shard's
 * position, returns every object exactly once, each naming its shard, no page holding
 * more than its `limit`; a cursor of a page of this SDK pages on in the Python SDK and
 * the other way round; a listing or a read that names a run goes to the run's shard;
 * `stats()` gives each shard's SERVER_STATS and their core counters summed. A server
 * alone, or a cluster of one shard, is asked as it always was: one request, its objects
 * and integer cursor as the server gives them.
 *
 * Two real shards of one node each on one etcd (real_shards.ts), slots 0-511 moved to s2
 * before any run exists, runs placed on each by their placement's slot; the one-shard
 * node is a fake node (fake_node.ts), which counts the requests it gets.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { type Cursor, InvalidArgumentError, type Runstate, type ShardNamed, slotOf } from '../src/index.js';
import { Op } from '../src/wire.js';
import { FakeNode } from './fake_node.js';
import { RealShards, SLOTS } from './real_shards.js';
import { client, countOps, python, startRsd } from './support.js';

const SPLIT = 511; // slots 0..SPLIT are s2's, the rest s1's
const RUNS = 3; // runs on each shard

let shards: RealShards;

before(async () => {
  shards = await RealShards.start('ts-views', ['s1', 's2']);
  await shards.move(0, SPLIT, 's1', 's2');
});

after(async () => {
  await shards?.stop();
});

/** `count` placements whose slots `shard` owns once the slots are split. */
function placements(shard: string, count: number): string[] {
  const found: string[] = [];
  for (let n = 0; found.length < count; n += 1) {
    const owner = slotOf(`p${n}`, SLOTS) <= SPLIT ? 's2' : 's1';
    if (owner === shard) found.push(`p${n}`);
  }
  return found;
}

/** Every object of a listing, page by page, each page checked to hold at most `limit`
 * and to give a merged (string) cursor. */
async function pages<T>(rs: Runstate, op: number, field: string, limit: number): Promise<Array<T & ShardNamed>> {
  const found: Array<T & ShardNamed> = [];
  let cursor: Cursor | null = 0;
  while (cursor !== null) {
    const page: { items: Array<T & ShardNamed>; next: Cursor | null } = await rs.admin.page<T>(op, field, { cursor, limit });
    assert.ok(page.items.length <= limit, `a page of ${page.items.length} for a limit of ${limit}`);
    assert.ok(page.next === null || typeof page.next === 'string', `cursor ${String(page.next)}`);
    found.push(...page.items);
    cursor = page.next;
  }
  return found;
}

async function all<T>(items: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const item of items) out.push(item);
  return out;
}

/** One page of every run through the Python SDK, from `cursor`. */
async function pythonPage(cursor: Cursor, limit: number): Promise<{ items: Array<[string, string]>; next: Cursor | null }> {
  const ran = await python('fanout_cursor.py', ['page', shards.address('s1'), JSON.stringify(cursor), String(limit)]).done;
  assert.equal(ran.code, 0, ran.stderr);
  return JSON.parse(ran.stdout.trim().split('\n').pop()!) as { items: Array<[string, string]>; next: Cursor | null };
}

describe('the admin views of real shards', { timeout: 180_000 }, () => {
  test('cover both shards: merged listings, reads of a run on its shard, stats summed', async () => {
    const rs = client(shards.address('s1'), 'views');
    try {
      await rs.mailboxes.ensure('m'); // every shard's
      const where = new Map<string, string>(); // run → its shard
      const tasks = new Map<string, string>(); // run → its task
      for (const shard of ['s1', 's2']) {
        for (const placement of placements(shard, RUNS)) {
          const scope = await rs.scopes.create({ placement });
          where.set(scope.id, shard);
          tasks.set(scope.id, (await scope.mailbox('m').submit(shard, { key: 'k' })).id);
          await scope.claim('c').tryAcquire();
        }
        const tag = placements(shard, 1)[0]!;
        await rs.pools.ensure(`{${tag}}gpu`, { size: 2 });
        await rs.quotas.ensure(`{${tag}}calls`, { limit: 5, perSeconds: 1 });
      }
      const everyRun = [...where.keys()].sort();

      // Every run of both shards, once, each naming its shard, at any page size.
      for (const limit of [1, 2, 5, 100]) {
        const runs = await pages<{ scope: string }>(rs, Op.ADMIN_SCOPES, 'scopes', limit);
        assert.deepEqual(runs.map((r) => r.scope).sort(), everyRun, `limit ${limit}`);
        for (const run of runs) assert.equal(run.shard, where.get(run.scope));
      }
      const pools = await pages<{ size: number }>(rs, Op.ADMIN_POOLS, 'pools', 1);
      assert.deepEqual(pools.map((p) => [p.shard, p.size]).sort(), [['s1', 2], ['s2', 2]]);
      const quotas = await all(rs.admin.iterQuotas({ limit: 1 }));
      assert.deepEqual(quotas.map((q) => q.shard).sort(), ['s1', 's2']);
      const boxes = await all(rs.admin.iterMailboxes());
      assert.deepEqual(boxes.map((m) => [m.shard, m.name, m.ready]).sort(), [['s1', 'm', RUNS], ['s2', 'm', RUNS]]);

      // What names a run goes to its shard.
      for (const [scope, shard] of where) {
        const listed = await all(rs.admin.iterTasks(scope));
        assert.deepEqual(listed.map((t) => [t.id, t.shard]), [[tasks.get(scope), shard]]);
        assert.deepEqual((await all(rs.admin.iterClaims(scope))).map((c) => [c.key, c.shard]), [['c', shard]]);
        assert.equal((await rs.admin.task(scope, tasks.get(scope)!)).data, shard);
        assert.deepEqual((await all(rs.admin.iterQueues(scope))).map((q) => q.mailbox), ['m']);
      }

      const stats = await rs.admin.stats();
      assert.deepEqual(Object.keys(stats.shards ?? {}).sort(), ['s1', 's2']);
      const each = Object.values(stats.shards!).map((s) => s.core?.scopes);
      assert.deepEqual(each, [RUNS, RUNS]);
      assert.equal(stats.core?.scopes, 2 * RUNS);
      const held = Object.values(stats.shards!).reduce((sum, s) => sum + (s.leases_held ?? 0), 0);
      assert.equal(stats.leases_held, held);
      assert.ok(held >= 2 * RUNS, `${held} leases held`);

      await assert.rejects(
        rs.admin.page(Op.ADMIN_SCOPES, 'scopes', { cursor: 'not-a-cursor' }),
        (error: unknown) => error instanceof InvalidArgumentError && /cursor/.test(error.message),
      );

      // A cursor of this SDK pages on in the Python SDK, and the Python SDK's here.
      const first = await rs.admin.page<{ scope: string }>(Op.ADMIN_SCOPES, 'scopes', { limit: 2 });
      assert.equal(typeof first.next, 'string');
      const second = await pythonPage(first.next!, 2);
      assert.equal(typeof second.next, 'string');
      const rest = await all(rs.admin.iterate<{ scope: string }>(Op.ADMIN_SCOPES, 'scopes', { cursor: second.next!, limit: 2 }));
      const seen = [
        ...first.items.map((r) => [r.scope, r.shard]),
        ...second.items,
        ...rest.map((r) => [r.scope, r.shard]),
      ];
      assert.deepEqual(seen.map(([scope]) => scope).sort(), everyRun);
      for (const [scope, shard] of seen) assert.equal(shard, where.get(scope!));
    } finally {
      await rs.close();
    }
  });

  test('a server alone is asked once, as it always was', async () => {
    const rsd = await startRsd();
    const rs = client(rsd.address, 'alone');
    try {
      await rs.scopes.create();
      const sent = countOps(rs);
      const page = await rs.admin.page<{ scope: string }>(Op.ADMIN_SCOPES, 'scopes', { limit: 5 });
      assert.equal(page.items.length, 1);
      assert.equal(page.next, null);
      assert.equal(page.items[0]!.shard, undefined);
      const stats = await rs.admin.stats();
      assert.equal(stats.shards, undefined);
      assert.equal(stats.core?.scopes, 1);
      assert.deepEqual([...sent], [[Op.ADMIN_SCOPES, 1], [Op.SERVER_STATS, 1]]);
    } finally {
      await rs.close();
      await rsd.stop();
    }
  });

  test('a cluster of one shard is asked once, its cursor as the server gives it', async () => {
    const node = new FakeNode('only');
    node.shard = { name: 'only', slots: SLOTS, map_epoch: 1 };
    node.handlers.set(Op.ADMIN_SCOPES, () => ({ scopes: [{ scope: 'r' }], next: 7 }));
    node.handlers.set(Op.SERVER_STATS, () => ({ core: { scopes: 1 } }));
    await node.start();
    const rs = client(node.address, 'one-shard');
    try {
      assert.deepEqual(await rs.admin.page(Op.ADMIN_SCOPES, 'scopes', { limit: 5 }), { items: [{ scope: 'r' }], next: 7 });
      assert.deepEqual(await rs.admin.stats(), { core: { scopes: 1 } });
      assert.deepEqual(node.requests.map(([op, args]) => [op, args]), [
        [Op.ADMIN_SCOPES, { limit: 5, cursor: 0 }],
        [Op.SERVER_STATS, {}],
      ]);
    } finally {
      await rs.close();
      await node.close();
    }
  });
});
