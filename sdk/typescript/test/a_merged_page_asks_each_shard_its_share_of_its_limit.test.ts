/**
 * A merged page of a sharded cluster's listing asks each shard its share of the page's
 * `limit` and never more in all, goes on from each shard's own position, asks no shard
 * that is done, and its cursor, the client's own, round-trips and is the Python SDK's
 * byte for byte (a cursor of one SDK pages on in the other); the stats of several shards
 * sum their counters key by key (fanout.ts, the rules, on the cases of the Python SDK's
 * tests/test_a_merged_page_asks_each_shard_its_share_of_its_limit.py; the real shards are
 * the_admin_views_of_real_shards_cover_every_shard.test.ts).
 */

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { InvalidArgumentError } from '../src/index.js';
import { type Positions, mergeStats, planPage, readCursor, writeCursor } from '../src/fanout.js';
import { python } from './support.js';

const SHARDS = ['a', 'b', 'c'];

describe('a merged page', () => {
  for (const limit of [1, 2, 3, 4, 7, 100, 1000]) {
    it(`asks at most its limit, split evenly (limit ${limit})`, () => {
      const asks = planPage({}, SHARDS, limit);
      const shares = asks.map(([, , share]) => share);
      assert.equal(shares.reduce((a, b) => a + b, 0), limit);
      assert.ok(Math.max(...shares) - Math.min(...shares) <= 1);
      assert.deepEqual(asks.map(([name]) => name), SHARDS.slice(0, limit));
      assert.ok(asks.every(([, at]) => at === 0));
    });
  }

  it("goes on from each shard's position and skips the done", () => {
    assert.deepEqual(planPage({ a: null, b: 40 }, SHARDS, 10), [['b', 40, 5], ['c', 0, 5]]);
    assert.deepEqual(planPage({ a: null, b: null, c: null }, SHARDS, 10), []);
  });

  it('has a cursor that round-trips and ends when every shard is done', () => {
    const positions: Positions = { a: null, b: 7 };
    const cursor = writeCursor(positions);
    assert.equal(typeof cursor, 'string');
    assert.deepEqual(readCursor(cursor), positions);
    assert.deepEqual(readCursor(0), {});
    assert.equal(writeCursor({ a: null, b: null }), null);
    for (const wrong of ['x', 3, true, String(writeCursor({ a: 1 })).slice(0, -2), 'eyJhdCI6IHsiYSI6IC0xfX0=']) {
      assert.throws(() => readCursor(wrong), (error: unknown) => error instanceof InvalidArgumentError && /cursor/.test(error.message));
    }
  });

  it("has the Python SDK's cursor, byte for byte, both ways", async () => {
    const written: Positions[] = [{ a: null, b: 7 }, { s2: 0, s1: 120, 'shard-3': null }, { only: 999999 }];
    const ours = written.map(writeCursor);
    const ran = python('fanout_cursor.py', ['cursors', JSON.stringify({ write: written, read: ours })]);
    const result = await ran.done;
    assert.equal(result.code, 0, result.stderr);
    const theirs = JSON.parse(result.stdout.trim().split('\n').pop()!) as { written: string[]; read: unknown[] };
    assert.deepEqual(theirs.written, ours);
    assert.deepEqual(theirs.read, written);
    assert.deepEqual(theirs.written.map(readCursor), written);
  });

  it('of shards, gives stats that sum their counters', () => {
    const merged = mergeStats([
      ['a', { server: 'rsd a', time: 1.0, connections: 2, core: { scopes: 3 }, ops: { PING: { ok: 1 } }, journal: { segment: 4 } }],
      [
        'b',
        { server: 'rsd b', time: 2.0, connections: 5, core: { scopes: 1, claims: 2 }, ops: { PING: { ok: 2, errors: 1 } }, journal: null },
      ],
    ]);
    assert.deepEqual([merged['server'], merged['time'], merged['connections']], ['rsd a', 1.0, 7]);
    assert.deepEqual(merged['core'], { scopes: 4, claims: 2 });
    assert.deepEqual(merged['ops'], { PING: { ok: 3, errors: 1 } });
    assert.ok(!('journal' in merged));
    assert.equal((merged['shards'] as Record<string, Record<string, unknown>>)['b']!['journal'], null);
  });
});
