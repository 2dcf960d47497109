/**
 * A lease follows its run across a slot move (leases.ts, keeper.ts, deliveries.ts; the
 * server's side is protocol.md's "Leases follow their run"): when the slot of a run moves
 * to another shard, the run's leases go with it under the same handles, and the old
 * shard answers MOVED for them (a renewal item `"MOVED"`, a handle op the error). The
 * client then rebinds each lease to the connection of the run's new shard and renews,
 * releases or settles it there; it is not lost.
 *
 * - a claim held across a move of its run's slot stays held: no loss, the same
 *   generation, renewed past its grant's deadline by the new shard alone, which holds it;
 *   the old shard still answers its handle MOVED (not STALE_CLAIM) meanwhile, and a
 *   handle it never had STALE_CLAIM;
 * - a claim renewed (`renew()`) or released right after the move, before the keeper
 *   renewed it, is renewed or released on the new shard (its LEASE_RENEW item or its
 *   CLAIM_RELEASE answered MOVED by the old one, then sent there);
 * - a consume() worker's delivery in flight during the move completes after it, and its
 *   result is recorded once, on the new shard (the planner's parked result wait follows
 *   the run too).
 *
 * Real shards (real_shards.ts): two one-node shards, every slot s1's at first; each test
 * moves the slot of its own run (and nothing else) to s2. The clients are given s1 alone.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { type Delivery, type Lease, slotOf } from '../src/index.js';
import { now } from '../src/util.js';
import { Op } from '../src/wire.js';
import { RealShards, SLOTS, WITHIN_MS } from './real_shards.js';
import { type Answer, ask, client, sleep } from './support.js';

// Renewed every 2.7 s, lost by the client 7 s after its last renewal: a move (well under
// a second on loopback, its requests held meanwhile) fits with room on a loaded machine.
const LEASE_SECONDS = 8;

let shards: RealShards;

before(async () => {
  shards = await RealShards.start('ts-follow', ['s1', 's2']);
});

after(async () => {
  await shards?.stop();
});

/** The slot of `run` moved from s1 to s2 (the move is over when every node's map says so). */
async function moveRun(run: string): Promise<void> {
  const slot = slotOf(run, SLOTS);
  await shards.move(slot, slot, 's1', 's2');
}

/** LEASE_RENEW of `lease`'s handle sent to `shard`'s node on a connection of its own
 * (the same tenant): that item's outcome (null: renewed). */
async function renewalAt(shard: string, lease: Lease): Promise<unknown> {
  const answer = await ask(shards.address(shard), Op.LEASE_RENEW, { leases: [lease.handle] });
  assert.ok(answer.kind === 'reply', JSON.stringify(answer));
  return (answer.reply['results'] as unknown[])[0];
}

function reply(answer: Answer): Record<string, unknown> {
  assert.ok(answer.kind === 'reply', JSON.stringify(answer));
  return answer.reply;
}

describe('a lease follows its run across a slot move', { timeout: 120_000 }, () => {
  test('a claim held across a move stays held, renewed on the new shard', async () => {
    const rs = client(shards.address('s1'), 'holder');
    try {
      const run = await rs.scopes.create({ placement: 'follow-claim' });
      const lease = await run.claim('leader', { leaseSeconds: LEASE_SECONDS }).acquire();
      const firstDeadline = lease.lostAt;
      await moveRun(run.id);
      assert.equal(reply(await ask(shards.address('s2'), Op.SCOPE_STATUS, { scope: run.id }))['scope'], run.id);

      // Past the deadline of its grant: only renewals the new shard confirmed keep it.
      while (now() <= firstDeadline + 0.5) {
        lease.throwIfLost();
        await sleep(100);
      }
      lease.throwIfLost();
      assert.equal(lease.conn.shardName, 's2', 'renewed on the connection of the run\'s new shard');
      const held = reply(await ask(shards.address('s2'), Op.CLAIM_INSPECT, { scope: run.id, key: 'leader' }));
      assert.equal(held['held'], true);
      assert.equal(Number(held['generation']), lease.generation);

      // The old shard answers its handle MOVED (it remembers it for a lease length), a
      // handle it never had STALE_CLAIM; the new shard renews it (any connection of its
      // tenant may).
      assert.equal(await renewalAt('s1', lease), 'MOVED');
      const other = await rs.scopes.create({ placement: 'follow-claim' }); // s2's, by the map
      const never = await other.claim('elsewhere', { leaseSeconds: LEASE_SECONDS }).acquire();
      assert.equal(never.conn.shardName, 's2');
      assert.equal(await renewalAt('s1', never), 'STALE_CLAIM');
      assert.equal(await renewalAt('s2', lease), null);

      await lease.release();
      await never.release();
      const freed = reply(await ask(shards.address('s2'), Op.CLAIM_INSPECT, { scope: run.id, key: 'leader' }));
      assert.equal(freed['held'], false);
    } finally {
      await rs.close();
    }
  });

  test('a claim renewed or released right after a move is so on the new shard', async () => {
    const rs = client(shards.address('s1'), 'releaser');
    try {
      const run = await rs.scopes.create({ placement: 'follow-release' });
      // 30 s leases: the keeper renews neither before the calls below.
      const renewed = await run.claim('renewed', { leaseSeconds: 30 }).acquire();
      const lease = await run.claim('once', { leaseSeconds: 30 }).acquire();
      await moveRun(run.id);
      await renewed.renew(20); // its item answered "MOVED" by s1, renewed on s2
      assert.equal(renewed.conn.shardName, 's2');
      assert.equal(renewed.leaseSeconds, 20);
      const kept = reply(await ask(shards.address('s2'), Op.CLAIM_INSPECT, { scope: run.id, key: 'renewed' }));
      assert.equal(kept['held'], true);
      assert.equal(lease.conn.shardName, 's1', 'each lease follows when told');
      await lease.release(); // answered MOVED by s1, sent to s2
      const freed = reply(await ask(shards.address('s2'), Op.CLAIM_INSPECT, { scope: run.id, key: 'once' }));
      assert.equal(freed['held'], false, 'released on the new shard (not left to expire there)');
      assert.equal(lease.released, true);
      assert.equal(lease.isLost, false);
      assert.equal(lease.conn.shardName, 's2');
      await renewed.release();
    } finally {
      await rs.close();
    }
  });

  test('a consume() delivery in flight during a move completes after it, recorded once', async () => {
    const planner = client(shards.address('s1'), 'planner');
    const worker = client(shards.address('s1'), 'worker');
    const stop = new AbortController();
    let calls = 0;
    let started!: (delivery: Delivery<{ n: number }>) => void;
    const running = new Promise<Delivery<{ n: number }>>((resolve) => {
      started = resolve;
    });
    let moved!: () => void;
    const afterMove = new Promise<void>((resolve) => {
      moved = resolve;
    });
    try {
      await planner.mailboxes.ensure('follow-jobs', { mode: 'WORK' });
      const run = await planner.scopes.create({ placement: 'follow-task' });
      const consuming = worker.scope(run.id).mailbox('follow-jobs').consume<{ n: number }>(
        async (data, delivery) => {
          calls += 1;
          started(delivery);
          await afterMove; // the move happens while this delivery is in flight
          await delivery.complete({ payload: { doubled: data.n * 2 } }); // s1 answers MOVED
        },
        { leaseSeconds: LEASE_SECONDS, signal: stop.signal },
      );
      const ticket = await run.mailbox('follow-jobs').submit({ n: 21 }, { key: 'job' });
      const result = ticket.result({ timeoutMs: WITHIN_MS }); // parked on s1, follows the run
      const delivery = await running;
      assert.equal(delivery.lease.conn.shardName, 's1');
      await moveRun(run.id);
      moved(); // the handler completes the delivery now

      const view = await result;
      assert.equal(view.state, 'SUCCEEDED', JSON.stringify(view));
      assert.deepEqual(view.outcome, { doubled: 42 });
      assert.equal(view.attempt, 1);
      assert.equal(calls, 1, 'the work ran once');
      assert.equal(delivery.isLost, false);
      assert.equal(delivery.lease.conn.shardName, 's2');
      const there = reply(await ask(shards.address('s2'), Op.TASK_STATUS, { scope: run.id, task: ticket.id }));
      assert.equal(there['state'], 'SUCCEEDED');
      assert.equal(Number(there['attempt']), 1);
      assert.deepEqual(there['outcome'], { doubled: 42 });
      const old = await ask(shards.address('s1'), Op.TASK_STATUS, { scope: run.id, task: ticket.id });
      assert.ok(old.kind === 'error' && old.code === 'MOVED', JSON.stringify(old));
      stop.abort();
      await consuming;
    } finally {
      stop.abort();
      await worker.close();
      await planner.close();
    }
  });
});
