/**
 * A client of a sharded cluster sends each request to the shard that owns it (shards.ts):
 * a run's requests to the owner of the run's slot, a pool's to the owner of its name's,
 * a lease's renewals and settlements on the connection that granted it (until its run
 * moves to another shard: then, told MOVED, on that shard's, at most MAX_REDIRECTS times
 * in a row; a STALE_CLAIM there is a loss), a mailbox declaration to every shard; a MOVED answer is followed (the map asked again) at most
 * MAX_REDIRECTS times in a row; a shard's lost connection finds its new primary from a
 * fresh map; a lone rsd, or a cluster whose map never changed, is sent everything on one
 * connection and never asked for the map. Fake nodes (fake_node.ts) play the shards:
 * each answers MOVED for a slot its shard does not own, as rsd does.
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { InvalidArgumentError, LeaseLostError, Runstate, UnavailableError, slotOf } from '../src/index.js';
import { MAX_REDIRECTS } from '../src/sdkrules.js';
import { routeKey } from '../src/slots.js';
import { Op } from '../src/wire.js';
import { type FakeNode, fakeNodes, moved } from './fake_node.js';
import { client } from './support.js';

const HANDLE = Uint8Array.from({ length: 16 }, (_, i) => i);
const OTHER_HANDLE = Uint8Array.from({ length: 16 }, (_, i) => 100 + i);
const SLOTS = 16;

/** The cluster the fake nodes serve: each slot's owner, the map's epoch, each shard's
 * primary. A node added answers HELLO with its shard, SLOT_MAP with the map, and MOVED
 * for a run or a name whose slot its shard does not own. */
class FakeCluster {
  readonly owners: string[];
  readonly primaries = new Map<string, FakeNode | null>();

  constructor(
    first: string,
    public epoch = 2,
  ) {
    this.owners = Array.from({ length: SLOTS }, () => first);
  }

  serve(shard: string, node: FakeNode): void {
    this.primaries.set(shard, node);
    node.shard = { name: shard, slots: SLOTS, map_epoch: this.epoch };
    node.handlers.set(Op.SLOT_MAP, () => this.wire());
    node.gate = (op, args) => {
      const [route, key] = routeKey(op, args);
      if (key === null || (route !== 'run' && route !== 'name')) return null;
      const slot = slotOf(key, SLOTS);
      const owner = this.owners[slot]!;
      if (owner === shard) return null;
      return moved(slot, owner, this.primaries.get(owner)?.address ?? null, this.epoch);
    };
  }

  /** Slots `lo`..`hi` to `shard`, at the next epoch. */
  move(lo: number, hi: number, shard: string): void {
    for (let slot = lo; slot <= hi; slot += 1) this.owners[slot] = shard;
    this.epoch += 1;
    for (const node of this.primaries.values()) if (node?.shard) node.shard.map_epoch = this.epoch;
  }

  wire(): Record<string, unknown> {
    const shards = new Map<string, Array<[number, number]>>();
    for (const name of this.primaries.keys()) shards.set(name, []);
    this.owners.forEach((owner, slot) => {
      const spans = shards.get(owner) ?? [];
      const last = spans[spans.length - 1];
      if (last !== undefined && last[1] + 1 === slot) last[1] = slot;
      else spans.push([slot, slot]);
      shards.set(owner, spans);
    });
    return {
      slots: SLOTS,
      map_epoch: this.epoch,
      shards: [...shards].map(([shard, ranges]) => ({
        shard,
        primary: this.primaries.get(shard)?.address ?? null,
        ranges,
      })),
    };
  }

  /** A run id (or name) whose slot `shard` owns. */
  keyOn(shard: string, prefix = 'run'): string {
    for (let n = 0; ; n += 1) {
      const key = `${prefix}-${n}`;
      if (this.owners[slotOf(key, SLOTS)] === shard) return key;
    }
  }
}

/** Shards a (node A, the seed) and b (node B), the slots split in two at epoch 2. */
async function twoShards(): Promise<{ cluster: FakeCluster; a: FakeNode; b: FakeNode; closeAll(): Promise<void> }> {
  const { nodes, closeAll } = await fakeNodes(2);
  const [a, b] = nodes as [FakeNode, FakeNode];
  const cluster = new FakeCluster('a', 1);
  cluster.serve('a', a);
  cluster.serve('b', b);
  cluster.move(SLOTS / 2, SLOTS - 1, 'b');
  return { cluster, a, b, closeAll };
}

function scopesOf(node: FakeNode, op: number): unknown[] {
  return node.requests.filter(([seen]) => seen === op).map(([, args]) => args['scope']);
}

test('each request of a run goes to the shard owning its slot, the map asked once', async () => {
  const { cluster, a, b, closeAll } = await twoShards();
  const rs = client(a.address, 'router');
  const onA = cluster.keyOn('a');
  const onB = cluster.keyOn('b');
  try {
    await rs.scope(onB).status();
    await rs.scope(onA).status();
    await rs.scope(onB).mailbox('work').submit({ n: 1 });
    await rs.scope(onA).cancel('done');
    await rs.pools.inspect(cluster.keyOn('b', 'gpu'));
    await rs.ping();
    assert.deepEqual(scopesOf(a, Op.SCOPE_STATUS), [onA]);
    assert.deepEqual(scopesOf(b, Op.SCOPE_STATUS), [onB]);
    assert.deepEqual(scopesOf(b, Op.TASK_SUBMIT), [onB]);
    assert.deepEqual(scopesOf(a, Op.SCOPE_CANCEL), [onA]);
    assert.equal(b.count(Op.POOL_INSPECT), 1);
    assert.equal(a.count(Op.PING), 1, "'any' goes to the first connection");
    assert.equal(a.count(Op.SLOT_MAP) + b.count(Op.SLOT_MAP), 1, 'the map is asked once');
    assert.deepEqual([a.hellos, b.hellos], [1, 1], 'one connection per shard');
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a request answered MOVED is sent to the owner the map names now', async () => {
  const { cluster, a, b, closeAll } = await twoShards();
  const rs = client(a.address, 'router');
  try {
    await rs.ping(); // the client reads the map of epoch 2
    const moving = cluster.keyOn('a');
    const slot = slotOf(moving, SLOTS);
    cluster.move(slot, slot, 'b'); // epoch 3: the client's map is behind
    const status = { scope: moving, state: 'open' };
    b.handlers.set(Op.SCOPE_STATUS, () => status);
    assert.deepEqual(await rs.scope(moving).status(), status);
    assert.deepEqual(scopesOf(a, Op.SCOPE_STATUS), [moving], 'A answered MOVED');
    assert.deepEqual(scopesOf(b, Op.SCOPE_STATUS), [moving]);
    assert.equal(a.count(Op.SLOT_MAP), 2, 'asked again of the node that answered MOVED');
    await rs.scope(moving).status();
    assert.equal(scopesOf(a, Op.SCOPE_STATUS).length, 1, 'the new map routes it from then on');
    // A wait answered MOVED is made on the owner, for the time left.
    const waiting = cluster.keyOn('a', 'waiting');
    const waitSlot = slotOf(waiting, SLOTS);
    cluster.move(waitSlot, waitSlot, 'b');
    b.handlers.set(Op.TASK_RESULT, (args) => ({ id: args['task'], state: 'SUCCEEDED' }));
    const view = await rs.scope(waiting).task('t1').result({ timeoutMs: 3000 });
    assert.equal(view.state, 'SUCCEEDED');
    assert.deepEqual(scopesOf(a, Op.TASK_RESULT), [waiting]);
    const sent = b.requests.filter(([op]) => op === Op.TASK_RESULT).map(([, args]) => Number(args['timeout_ms']));
    assert.equal(sent.length, 1);
    assert.ok(sent[0]! <= 3000 && sent[0]! > 2000, `made again for ${sent[0]} ms`);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('MOVED answered more than MAX_REDIRECTS times in a row is an UnavailableError with code MOVED', async () => {
  const { cluster, a, b, closeAll } = await twoShards();
  const key = cluster.keyOn('b');
  const slot = slotOf(key, SLOTS);
  // Each shard's primary says the other owns the slot: a map that keeps changing.
  const refused = new Set<number>([Op.SCOPE_STATUS, Op.CLAIM_ACQUIRE]);
  a.gate = (op) => (refused.has(op) ? moved(slot, 'b', b.address, 9) : null);
  b.gate = (op) => (refused.has(op) ? moved(slot, 'a', a.address, 9) : null);
  const rs = client(a.address, 'router');
  try {
    await assert.rejects(rs.scope(key).status(), (error: unknown) => {
      assert.ok(error instanceof UnavailableError);
      assert.equal(error.code, 'MOVED');
      // B, A, B, A: the last answer's details are kept.
      assert.deepEqual(error.details, { slot, shard: 'b', primary: b.address, map_epoch: 9 });
      assert.match(error.message, /^MOVED: slot \d+ is served by shard b \(answered MOVED 4 times in a row/);
      return true;
    });
    assert.deepEqual([b.count(Op.SCOPE_STATUS), a.count(Op.SCOPE_STATUS)], [2, 2]);
    assert.equal(MAX_REDIRECTS + 1, 4);
    // A wait is not made again after it: the error, not its own timeout.
    const waiting = rs.scope(key).claim('k').acquire({ wait: true, timeoutMs: 5000 });
    await assert.rejects(waiting, (error: unknown) => error instanceof UnavailableError && error.code === 'MOVED');
    assert.equal(a.count(Op.CLAIM_ACQUIRE) + b.count(Op.CLAIM_ACQUIRE), MAX_REDIRECTS + 1);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test("a lease is renewed, released and settled on the connection of the shard that granted it", async () => {
  const { cluster, a, b, closeAll } = await twoShards();
  const run = cluster.keyOn('b');
  b.handlers.set(Op.CLAIM_ACQUIRE, () => ({ lease: HANDLE, generation: 1, lease_seconds: 30 }));
  b.handlers.set(Op.RECEIVE, () => ({
    delivery: { id: 'd1', kind: 'task', task_id: 't1', key: null, data: 7, attempt: 1, lease: OTHER_HANDLE, lease_seconds: 30 },
  }));
  b.handlers.set(Op.DELIVERY_COMPLETE, () => ({ id: 'd1', state: 'SUCCEEDED' }));
  const rs = client(a.address, 'holder');
  try {
    const lease = await rs.scope(run).claim('k').acquire();
    await lease.renew();
    await lease.release();
    const waited = await rs.scope(run).claim('k').acquire({ wait: true, timeoutMs: 1000 });
    await waited.release();
    const delivery = await rs.scope(run).mailbox('work').receive();
    assert.ok(delivery !== null);
    await delivery.renew();
    await delivery.complete({ payload: 'ok' });
    for (const op of [Op.LEASE_RENEW, Op.CLAIM_RELEASE, Op.DELIVERY_COMPLETE, Op.CLAIM_ACQUIRE, Op.RECEIVE]) {
      assert.equal(a.count(op), 0, `op ${op} never on the other shard`);
    }
    assert.deepEqual(
      [b.count(Op.CLAIM_ACQUIRE), b.count(Op.LEASE_RENEW), b.count(Op.CLAIM_RELEASE), b.count(Op.DELIVERY_COMPLETE)],
      [2, 2, 2, 1],
    );
  } finally {
    await rs.close();
    await closeAll();
  }
});

/** `handle`'s LEASE_RENEW items answered `outcome` by `node` (others renewed). */
function renewals(node: FakeNode, handle: Uint8Array, outcome: string | null): void {
  const same = (item: unknown): boolean =>
    item instanceof Uint8Array && item.length === handle.length && item.every((byte, i) => byte === handle[i]);
  node.handlers.set(Op.LEASE_RENEW, (args) => ({
    results: (args['leases'] as unknown[]).map((item) => (same(Array.isArray(item) ? item[0] : item) ? outcome : null)),
  }));
}

test('a lease whose run moved follows it: renewed on the new shard, and a STALE_CLAIM there is its loss', async () => {
  const { cluster, a, b, closeAll } = await twoShards();
  const run = cluster.keyOn('a');
  a.handlers.set(Op.CLAIM_ACQUIRE, () => ({ lease: HANDLE, generation: 4, lease_seconds: 30 }));
  const rs = client(a.address, 'holder');
  try {
    const lease = await rs.scope(run).claim('k').acquire();
    const slot = slotOf(run, SLOTS);
    cluster.move(slot, slot, 'b'); // the run, and its lease, now b's
    renewals(a, HANDLE, 'MOVED');
    await lease.renew(); // a: "MOVED"; the map asked again; renewed on b at once
    assert.equal(lease.isLost, false);
    assert.equal(lease.generation, 4);
    assert.equal(lease.conn.shardName, 'b');
    assert.deepEqual([a.count(Op.LEASE_RENEW), b.count(Op.LEASE_RENEW)], [1, 1]);
    renewals(b, HANDLE, 'STALE_CLAIM'); // b no longer knows it: a loss, as anywhere
    await assert.rejects(lease.renew(), LeaseLostError);
    assert.equal(lease.isLost, true);
    assert.deepEqual([a.count(Op.LEASE_RENEW), b.count(Op.LEASE_RENEW)], [1, 2], 'never sent to a again');
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a release or settlement answered MOVED follows at most MAX_REDIRECTS times in a row', async () => {
  const { cluster, a, b, closeAll } = await twoShards();
  const run = cluster.keyOn('a');
  const slot = slotOf(run, SLOTS);
  a.handlers.set(Op.CLAIM_ACQUIRE, () => ({ lease: HANDLE, generation: 1, lease_seconds: 30 }));
  a.handlers.set(Op.RECEIVE, () => ({
    delivery: { id: 'd1', kind: 'task', task_id: 't1', key: null, data: 7, attempt: 1, lease: OTHER_HANDLE, lease_seconds: 30 },
  }));
  const rs = client(a.address, 'holder');
  try {
    const lease = await rs.scope(run).claim('k').acquire();
    const delivery = await rs.scope(run).mailbox('work').receive();
    assert.ok(delivery !== null);
    cluster.move(slot, slot, 'b');
    // A map in flux: each shard says the other holds the lease.
    const toB = moved(slot, 'b', b.address, cluster.epoch);
    const toA = moved(slot, 'a', a.address, cluster.epoch);
    for (const op of [Op.CLAIM_RELEASE, Op.DELIVERY_COMPLETE]) {
      a.handlers.set(op, () => toB);
      b.handlers.set(op, () => toA);
    }
    await assert.rejects(delivery.complete({ payload: 'ok' }), (error: unknown) => {
      assert.ok(error instanceof UnavailableError);
      assert.equal(error.code, 'MOVED');
      return true;
    });
    assert.equal(a.count(Op.DELIVERY_COMPLETE) + b.count(Op.DELIVERY_COMPLETE), MAX_REDIRECTS + 1);
    await lease.release(); // unanswered as released: it ends by expiry, as a release the server cannot take
    assert.equal(a.count(Op.CLAIM_RELEASE) + b.count(Op.CLAIM_RELEASE), MAX_REDIRECTS + 1);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a mailbox declaration goes to every shard that owns slots', async () => {
  const { a, b, closeAll } = await twoShards();
  const info = (created: boolean) => () => ({ name: 'work', mode: 'WORK', max_attempts: 5, retry_backoff_ms: 1000, created });
  a.handlers.set(Op.MAILBOX_ENSURE, info(false));
  b.handlers.set(Op.MAILBOX_ENSURE, info(true));
  const rs = client(a.address, 'declarer');
  try {
    const ensured = await rs.mailboxes.ensure('work');
    assert.equal(ensured.created, true, 'made on one shard at least');
    assert.deepEqual([a.count(Op.MAILBOX_ENSURE), b.count(Op.MAILBOX_ENSURE)], [1, 1]);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test("a run created with a placement is created by the shard owning the placement's slot", async () => {
  const { cluster, a, b, closeAll } = await twoShards();
  const placement = cluster.keyOn('b', 'tenant');
  b.handlers.set(Op.SCOPE_CREATE, (args) => ({ scope: `{${String(args['placement'])}}0123456789abcdef01234567`, created: true }));
  const rs = client(a.address, 'creator');
  try {
    const run = await rs.scopes.create({ placement });
    assert.equal(run.id, `{${placement}}0123456789abcdef01234567`);
    assert.deepEqual(b.requests.filter(([op]) => op === Op.SCOPE_CREATE).map(([, args]) => args), [{ placement }]);
    assert.equal(a.count(Op.SCOPE_CREATE), 0);
    await run.status(); // its id carries its tag: the same shard, no lookup
    assert.deepEqual(scopesOf(b, Op.SCOPE_STATUS), [run.id]);
    await assert.rejects(rs.scopes.create({ placement: 'a{b}' }), InvalidArgumentError);
    await assert.rejects(rs.scopes.create({ placement: 'x'.repeat(65) }), InvalidArgumentError);
    await assert.rejects(rs.scopes.create({ placement: 'acme', id: 'nightly' }), InvalidArgumentError);
    assert.equal(a.count(Op.SCOPE_CREATE) + b.count(Op.SCOPE_CREATE), 1, 'refused before any I/O');
  } finally {
    await rs.close();
    await closeAll();
  }
});

test("a shard's lost connection finds its new primary from a fresh map", async () => {
  const { nodes, closeAll } = await fakeNodes(3);
  const [a, oldB, newB] = nodes as [FakeNode, FakeNode, FakeNode];
  const cluster = new FakeCluster('a', 1);
  cluster.serve('a', a);
  cluster.serve('b', oldB);
  cluster.move(SLOTS / 2, SLOTS - 1, 'b');
  const run = cluster.keyOn('b');
  const rs = client(a.address, 'survivor'); // given only A: B's nodes come from the map
  try {
    await rs.scope(run).status();
    assert.deepEqual(scopesOf(oldB, Op.SCOPE_STATUS), [run]);
    await oldB.close(); // b's primary dies; newB takes over
    cluster.serve('b', newB);
    await rs.scope(run).status();
    assert.deepEqual(scopesOf(newB, Op.SCOPE_STATUS), [run]);
    assert.ok(a.count(Op.SLOT_MAP) >= 2, 'where b is now was asked of A');
  } finally {
    await rs.close();
    await closeAll();
  }
});

test("a node that answers HELLO for another shard is passed over as one that is not the primary", async () => {
  const { cluster, a, b, closeAll } = await twoShards();
  cluster.primaries.set('b', null); // b has no primary now, as the map says
  const rs = client(`${a.address},${b.address}`, 'seeker');
  try {
    const run = cluster.keyOn('b');
    await rs.scope(run).status(); // b's connection tries A first (shard a), then B
    assert.deepEqual(scopesOf(b, Op.SCOPE_STATUS), [run]);
    assert.deepEqual([a.hellos, b.hellos], [2, 1]);
    assert.equal(a.count(Op.SCOPE_STATUS), 0);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a lone rsd gets every request on one connection and is never asked for the map', async () => {
  const { nodes, closeAll } = await fakeNodes(1);
  const [alone] = nodes as [FakeNode];
  alone.handlers.set(Op.SCOPE_CREATE, (args) => ({ scope: `{${String(args['placement'])}}0123456789abcdef01234567` }));
  alone.handlers.set(Op.MAILBOX_ENSURE, () => ({ name: 'work', created: true }));
  const rs = client(alone.address, 'alone');
  try {
    const run = await rs.scopes.create({ placement: 'acme' });
    await run.status();
    await rs.mailboxes.ensure('work');
    await rs.scope('elsewhere').mailbox('work').submit(1);
    assert.equal(alone.hellos, 1);
    assert.equal(alone.count(Op.SLOT_MAP), 0);
    assert.deepEqual(alone.ops(), [Op.SCOPE_CREATE, Op.SCOPE_STATUS, Op.MAILBOX_ENSURE, Op.TASK_SUBMIT]);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a cluster whose map never changed (one shard, epoch 1) is never asked for the map', async () => {
  const { nodes, closeAll } = await fakeNodes(1);
  const [only] = nodes as [FakeNode];
  new FakeCluster('a', 1).serve('a', only);
  const rs: Runstate = client(only.address, 'one-shard');
  try {
    await rs.scope('run-1').status();
    await rs.scope('run-2').mailbox('work').submit(1);
    await rs.mailboxes.ensure('work');
    assert.equal(only.hellos, 1);
    assert.equal(only.count(Op.SLOT_MAP), 0);
  } finally {
    await rs.close();
    await closeAll();
  }
});
