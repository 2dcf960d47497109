/**
 * The TypeScript client against real shards: one etcd member and two rsd nodes, each the
 * one node of its shard (`--shard s1`, `--shard s2`, `--fsync no`, a 2 s cluster lease),
 * slots 512-1023 moved to s2 before any run exists (SLOTS_MOVE, what `rsctl slots move`
 * sends). The fake nodes of a_client_of_a_sharded_cluster_sends_each_request_to_its_shard
 * play the routing's every corner; this shows the same routing against rsd itself, where
 * a wrong route is not a scripted answer but a node that does not know the run:
 *
 * - a run created with a placement lands on the shard owning the placement's slot: that
 *   node answers its SCOPE_STATUS, the other answers MOVED naming the owner;
 * - a task is submitted, consumed by a TypeScript worker (`consume`) and its result read,
 *   on each shard; a claim is held past its first deadline (renewed on the connection of
 *   its shard) and released, on each shard; a mailbox ensured once serves both shards; a
 *   pool named with a run's tag lives on the run's shard, its slot waited for there;
 * - all of it with the client given both nodes, and again given one node only (it finds
 *   the other shard's primary in the map);
 * - a client whose map is stale (slots moved since it read it) is answered MOVED by the
 *   node it asks and sends the request to the new owner, once, reading the map again.
 */

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { type Runstate, type Scope, slotOf } from '../src/index.js';
import { now } from '../src/util.js';
import { Op } from '../src/wire.js';
import { RealShards, SLOTS, WITHIN_MS, placementIn } from './real_shards.js';
import { type Answer, ask, client, countOps, sleep } from './support.js';

const MOVED_FIRST = [512, 1023] as const; // s1's slots given to s2 before any run exists
const MOVED_LATER = [500, 511] as const; // s1's slots given to s2 by the last test, empty
const LEASE_SECONDS = 5; // the least the server allows (MIN_LEASE_SECONDS)

let shards: RealShards;

function address(shard: string): string {
  return shards.address(shard);
}

function move(lo: number, hi: number, from: string, to: string): Promise<void> {
  return shards.move(lo, hi, from, to);
}

/** What the shard owning the run answers, and what the other says. */
async function statusAt(shard: string, run: string): Promise<Answer> {
  return ask(address(shard), Op.SCOPE_STATUS, { scope: run });
}

/** `run` lives on `owner`: its node answers SCOPE_STATUS, the other node answers MOVED
 * (the request not executed) naming `owner`, its primary's address and the run's slot. */
async function assertLivesOn(run: string, owner: string): Promise<void> {
  const other = owner === 's1' ? 's2' : 's1';
  const there = await statusAt(owner, run);
  assert.equal(there.kind, 'reply', `${run} on ${owner}: ${JSON.stringify(there)}`);
  const elsewhere = await statusAt(other, run);
  assert.ok(elsewhere.kind === 'error', `${run} asked of ${other}: ${JSON.stringify(elsewhere)}`);
  assert.equal(elsewhere.code, 'MOVED');
  assert.equal(elsewhere.details?.['shard'], owner);
  assert.equal(elsewhere.details?.['primary'], address(owner));
  assert.equal(elsewhere.details?.['slot'], slotOf(run, SLOTS));
}

/** The connection of a client (its seed), to see what it asked and what map it holds. */
function seedOf(rs: Runstate): { shards: { map: { epoch: number } | null } | null } {
  return (rs as unknown as { session: { conn: { shards: { map: { epoch: number } | null } | null } } }).session.conn;
}

before(async () => {
  // s1 first: the first node of a new cluster makes the map, every slot its own.
  shards = await RealShards.start('ts-shards', ['s1', 's2']);
  await move(MOVED_FIRST[0], MOVED_FIRST[1], 's1', 's2');
});

after(async () => {
  await shards?.stop();
});

/** Everything a client does with runs, on each shard, through `rs` (and a worker given
 * the same address): a run per shard by placement, a task consumed and its result read,
 * a claim held past its first deadline and released, one mailbox ensured once for both,
 * a pool's slot held and waited for. */
async function exercise(rsAddress: string, tag: string): Promise<void> {
  const rs = client(rsAddress, `${tag}-planner`);
  const worker = client(rsAddress, `${tag}-worker`);
  const stop = new AbortController();
  const consuming: Array<Promise<void>> = [];
  try {
    const placements = {
      s1: placementIn(0, MOVED_LATER[0] - 1, `${tag}-s1`),
      s2: placementIn(MOVED_FIRST[0], MOVED_FIRST[1], `${tag}-s2`),
    };
    const runs = new Map<string, Scope>();
    for (const [shard, placement] of Object.entries(placements)) {
      const run = await rs.scopes.create({ placement });
      assert.ok(run.id.startsWith(`{${placement}}`), run.id);
      await assertLivesOn(run.id, shard);
      runs.set(shard, run);
    }

    // One declaration, sent to every shard: each node knows the mailbox.
    const mailbox = `${tag}-jobs`;
    await rs.mailboxes.ensure(mailbox, { mode: 'WORK' });
    for (const shard of shards.nodes.keys()) {
      const listed = await ask(address(shard), Op.ADMIN_MAILBOXES, {});
      assert.ok(listed.kind === 'reply', JSON.stringify(listed));
      const names = (listed.reply['mailboxes'] as Array<{ name: string }>).map((m) => m.name);
      assert.ok(names.includes(mailbox), `${shard} knows ${JSON.stringify(names)}`);
    }

    // A task on each shard, consumed by a TypeScript worker, its result read.
    for (const [shard, run] of runs) {
      consuming.push(
        worker.scope(run.id).mailbox(mailbox).consume<{ n: string }>(
          async (data, delivery) => {
            await delivery.complete({ payload: { done: data.n } });
          },
          { signal: stop.signal },
        ),
      );
      const task = await run.mailbox(mailbox).submit({ n: shard }, { key: `job-${shard}` });
      const view = await task.result({ timeoutMs: WITHIN_MS });
      assert.equal(view.state, 'SUCCEEDED', JSON.stringify(view));
      assert.deepEqual(view.outcome, { done: shard });
      const there = await ask(address(shard), Op.TASK_STATUS, { scope: run.id, task: task.id });
      assert.ok(there.kind === 'reply' && there.reply['state'] === 'SUCCEEDED', JSON.stringify(there));
    }

    // A claim on each shard, held past the deadline of its grant: only renewals that its
    // shard confirmed keep it (the other shard does not know its handle), then released.
    await Promise.all(
      [...runs].map(async ([shard, run]) => {
        const lease = await run.claim('leader', { leaseSeconds: LEASE_SECONDS }).acquire();
        const firstDeadline = lease.lostAt;
        while (now() <= firstDeadline) {
          lease.throwIfLost();
          await sleep(100);
        }
        lease.throwIfLost();
        const held = await ask(address(shard), Op.CLAIM_INSPECT, { scope: run.id, key: 'leader' });
        assert.ok(held.kind === 'reply', JSON.stringify(held));
        assert.equal(held.reply['held'], true);
        assert.equal(Number(held.reply['generation']), lease.generation);
        await lease.release();
        const freed = await ask(address(shard), Op.CLAIM_INSPECT, { scope: run.id, key: 'leader' });
        assert.ok(freed.kind === 'reply' && freed.reply['held'] === false, JSON.stringify(freed));
      }),
    );

    // A pool on each shard, named with its runs' tag (so it lives in their slot): a slot
    // held by one client, waited for by another (the wait parked on that shard), granted
    // when the first releases.
    await Promise.all(
      [...runs].map(async ([shard, run]) => {
        const pool = `{${placements[shard as 's1' | 's2']}}gpu`;
        await rs.pools.ensure(pool, { size: 1 });
        const first = await run.pool(pool).acquire();
        const waiting = worker.scope(run.id).pool(pool).acquire({ wait: true, timeoutMs: WITHIN_MS });
        for (;;) {
          const seen = await ask(address(shard), Op.POOL_INSPECT, { name: pool });
          assert.ok(seen.kind === 'reply', `${pool} asked of ${shard}: ${JSON.stringify(seen)}`);
          if (Number(seen.reply['waiters']) === 1) break;
          await sleep(20);
        }
        const elsewhere = await ask(address(shard === 's1' ? 's2' : 's1'), Op.POOL_INSPECT, { name: pool });
        assert.ok(elsewhere.kind === 'error' && elsewhere.code === 'MOVED', JSON.stringify(elsewhere));
        await first.release();
        const second = await waiting;
        await second.release();
        const freed = await ask(address(shard), Op.POOL_INSPECT, { name: pool });
        assert.ok(freed.kind === 'reply' && Number(freed.reply['held']) === 0, JSON.stringify(freed));
      }),
    );
  } finally {
    stop.abort();
    await Promise.allSettled(consuming);
    await worker.close();
    await rs.close();
  }
}

describe('a client of real shards', { timeout: 180_000 }, () => {
  test('given both nodes: each run, task, claim on its shard, a mailbox ensured once on both', async () => {
    await exercise(`${address('s1')},${address('s2')}`, 'both');
  });

  test("given one node: it finds the other shard's primary in the slot map", async () => {
    await exercise(address('s1'), 'one');
  });

  test("a cancelled run gives back its slot of another shard's pool", async () => {
    const rs = client(`${address('s1')},${address('s2')}`, 'cancelling');
    try {
      const gpu = placementIn(0, MOVED_LATER[0] - 1, 'far-gpu'); // the pool lives on s1
      await rs.pools.ensure(gpu, { size: 1 });
      const far = await rs.scopes.create({ placement: placementIn(MOVED_FIRST[0], MOVED_FIRST[1], 'far-run') });
      const near = await rs.scopes.create({ placement: placementIn(0, MOVED_LATER[0] - 1, 'near-run') });
      await assertLivesOn(far.id, 's2');
      const held = await far.pool(gpu).acquire();
      const waiting = near.pool(gpu).acquire({ wait: true, timeoutMs: WITHIN_MS });
      await far.cancel('done with it');
      // s2 cannot end a slot of s1's pool: the client declares it lost and gives it back.
      assert.equal(held.isLost, true);
      assert.equal(held.signal.aborted, true);
      const mine = await waiting;
      assert.equal((await rs.pools.inspect(gpu)).holders.map((row) => row.run).join(), near.id);
      await mine.release();
    } finally {
      await rs.close();
    }
  });

  test('a request sent by a stale map is answered MOVED and sent to the new owner', async () => {
    const rs = client(address('s1'), 'stale');
    try {
      // The client reads the map (epoch 2: s2 owns 512-1023) by using a run of s2.
      const known = await rs.scopes.create({ placement: placementIn(MOVED_FIRST[0], MOVED_FIRST[1], 'stale-s2') });
      await assertLivesOn(known.id, 's2');
      const epochBefore = seedOf(rs).shards!.map!.epoch;
      // Slots of s1 (holding no run: every run here is placed elsewhere) go to s2; the
      // client's map still gives them to s1.
      await move(MOVED_LATER[0], MOVED_LATER[1], 's1', 's2');
      const sent = countOps(rs);
      const placement = placementIn(MOVED_LATER[0], MOVED_LATER[1], 'stale-moved');
      const run = await rs.scopes.create({ placement });
      await assertLivesOn(run.id, 's2');
      // s1 answered MOVED (the request was not executed there), the client asked s1 for
      // the map once, and sent the request to s2.
      assert.equal(sent.get(Op.SLOT_MAP), 1, `ops on the seed: ${JSON.stringify([...sent])}`);
      assert.equal(sent.get(Op.SCOPE_CREATE), 1, `ops on the seed: ${JSON.stringify([...sent])}`);
      assert.equal(seedOf(rs).shards!.map!.epoch, epochBefore + 1);
      const status = await run.status(); // and from then on, straight to s2
      assert.equal(status.scope, run.id);
      assert.equal(status.state, 'open');
      assert.equal(sent.get(Op.SCOPE_STATUS), undefined, 'no request of s2\'s run on s1 since');
    } finally {
      await rs.close();
    }
  });
});
