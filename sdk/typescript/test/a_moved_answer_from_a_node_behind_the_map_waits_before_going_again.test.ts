/**
 * A request answered MOVED by a node whose slot map is older than the client's goes
 * again, to the owner by the client's map, only after a pause (LAGGING_NODE_PAUSE_MS,
 * doubled with each MOVED in a row: `movedPause`, rsproto/sdkrules.py's `moved_pause`,
 * the rule both SDKs follow; the Python twin is this file's name under tests/). During a
 * slot move the source lets its held requests go to the target once it has the new map,
 * while the target adopts it only when its etcd watch says so, answering MOVED back to
 * the source meanwhile: a client that asked the lagging target for its map (the older
 * one, ignored) and followed the source it named went back and forth and used up its
 * MAX_REDIRECTS at once ("answered MOVED 4 times in a row"). Fake nodes (fake_node.ts)
 * play the two shards; the pause is a stand-in that records it (no wall-clock time).
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import type { Connection } from '../src/connection.js';
import { slotOf } from '../src/index.js';
import { LAGGING_NODE_PAUSE_MS, MAX_REDIRECTS } from '../src/sdkrules.js';
import type { Shards } from '../src/shards.js';
import { routeKey } from '../src/slots.js';
import { Op } from '../src/wire.js';
import { type FakeNode, fakeNodes, moved } from './fake_node.js';
import { client } from './support.js';

const SLOTS = 16;

/** Each slot's owner: the first half a's, the second b's, `also` b's as well. */
function owners(also: number | null): string[] {
  return Array.from({ length: SLOTS }, (_, slot) => (slot >= SLOTS / 2 || slot === also ? 'b' : 'a'));
}

function wire(epoch: number, owner: string[], nodes: Map<string, FakeNode>): Record<string, unknown> {
  return {
    slots: SLOTS,
    map_epoch: epoch,
    shards: [...nodes].map(([shard, node]) => ({
      shard,
      primary: node.address,
      ranges: owner.flatMap((name, slot) => (name === shard ? [[slot, slot]] : [])),
    })),
  };
}

/** `node` serves shard `shard` by the map `view()` gives ([epoch, each slot's owner]):
 * HELLO tells its epoch, SLOT_MAP answers it, a request for a slot of another shard is
 * answered MOVED with it. */
function serve(node: FakeNode, shard: string, nodes: Map<string, FakeNode>, view: () => [number, string[]]): void {
  node.shard = { name: shard, slots: SLOTS, map_epoch: view()[0] };
  node.handlers.set(Op.SLOT_MAP, () => wire(...view(), nodes));
  node.gate = (op, args) => {
    const [route, key] = routeKey(op, args);
    if (key === null || (route !== 'run' && route !== 'name')) return null;
    const [epoch, owner] = view();
    const slot = slotOf(key, SLOTS);
    if (owner[slot] === shard) return null;
    return moved(slot, owner[slot]!, nodes.get(owner[slot]!)!.address, epoch);
  };
}

test('a MOVED answer from a node behind the map is sent there again after a pause, not back', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [a, b] = nodes as [FakeNode, FakeNode];
  const byShard = new Map([['a', a], ['b', b]]);
  const run = Array.from({ length: 100 }, (_, n) => `run-${n}`).find((key) => slotOf(key, SLOTS) < SLOTS / 2)!;
  const slot = slotOf(run, SLOTS);
  // The slot moved from a to b at epoch 3: a (the source) knows it, b (the target) still
  // holds epoch 2, where the slot is a's, for its next MAX_REDIRECTS answers.
  const moved3 = owners(slot);
  let lagging = MAX_REDIRECTS;
  serve(a, 'a', byShard, () => [3, moved3]);
  serve(b, 'b', byShard, () => (lagging > 0 ? [2, owners(null)] : [3, moved3]));
  const gate = b.gate!;
  b.gate = (op, args) => {
    const answer = gate(op, args);
    if (answer !== null) lagging -= 1;
    return answer;
  };
  const status = { scope: run, state: 'open' };
  b.handlers.set(Op.SCOPE_STATUS, () => status);
  const rs = client(a.address, 'lagging');
  try {
    await rs.ping(); // the client reads the map of epoch 3 from a
    const conn = (rs as unknown as { session: { conn: Connection } }).session.conn;
    const shards = conn.shards as Shards;
    const paused: number[] = [];
    shards.pause = async (ms) => {
      paused.push(ms);
    };
    assert.deepEqual(await rs.scope(run).status(), status);
    assert.equal(a.count(Op.SCOPE_STATUS), 0, 'never sent back to the source the older map names');
    assert.equal(b.count(Op.SCOPE_STATUS), MAX_REDIRECTS + 1, 'sent to the target until it caught up');
    assert.equal(b.count(Op.SLOT_MAP), 0, 'the lagging node is not asked for its older map');
    assert.deepEqual(paused, [LAGGING_NODE_PAUSE_MS, 2 * LAGGING_NODE_PAUSE_MS, 4 * LAGGING_NODE_PAUSE_MS]);
  } finally {
    await rs.close();
    await closeAll();
  }
});
