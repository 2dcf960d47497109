/**
 * Real shards for the TypeScript tests (tests/support/shards.py's, in short): one etcd
 * member and one rsd node per shard, each the one node of its shard (`--shard NAME`,
 * `--fsync no`, a 2 s cluster lease), under a cluster name of the test's own. The first
 * shard started makes the map (every slot its own); `move` sends SLOTS_MOVE (what `rsctl
 * slots move` sends) to the slots' owner and waits until every node's map says so.
 */

import assert from 'node:assert/strict';

import { slotOf } from '../src/index.js';
import { Op } from '../src/wire.js';
import { type EtcdServer, type RsdServer, ask, sleep, startEtcd, startRsd } from './support.js';

export const SLOTS = 1024;
export const WITHIN_MS = 30_000; // for a shard to lead, a move to be seen: generous, a loaded machine

type WireShard = { shard: string; primary: string | null; ranges: Array<[number, number]> };

export function shardsOf(map: Record<string, unknown>): WireShard[] {
  return map['shards'] as WireShard[];
}

/** Whether `map` gives every slot of `lo`..`hi` to `shard`. */
export function owns(map: Record<string, unknown>, shard: string, lo: number, hi: number): boolean {
  const entry = shardsOf(map).find((s) => s.shard === shard);
  return entry !== undefined && entry.ranges.some(([a, b]) => a <= lo && hi <= b);
}

/** A placement whose slot lies in `lo`..`hi` (with `tag` in its name, so each test's runs
 * are its own). */
export function placementIn(lo: number, hi: number, tag: string): string {
  for (let n = 0; ; n += 1) {
    const slot = slotOf(`${tag}-${n}`, SLOTS);
    if (lo <= slot && slot <= hi) return `${tag}-${n}`;
  }
}

export class RealShards {
  readonly nodes = new Map<string, RsdServer>(); // shard → its one node

  private constructor(
    readonly etcd: EtcdServer,
    readonly cluster: string,
  ) {}

  /** etcd and one node per shard of `shards`, started in order, each once it leads. */
  static async start(cluster: string, shards: string[]): Promise<RealShards> {
    const made = new RealShards(await startEtcd(), cluster);
    try {
      for (const [n, shard] of shards.entries()) {
        made.nodes.set(shard, await startRsd({ extra: made.flags(shard) }));
        const started = shards.slice(0, n + 1);
        await made.untilMaps(
          started,
          (map) => started.every((name) => shardsOf(map).some((s) => s.shard === name && s.primary !== null)),
          `${started.join(', ')} lead`,
        );
      }
    } catch (error) {
      await made.stop();
      throw error;
    }
    return made;
  }

  flags(shard: string): string[] {
    return [
      '--etcd', this.etcd.endpoint, '--cluster', this.cluster, '--shard', shard, '--node', shard,
      '--cluster-lease-seconds', '2', '--fsync', 'no',
    ];
  }

  address(shard: string): string {
    return this.nodes.get(shard)!.address;
  }

  /** The slot map as `shard`'s node answers it now (null: it does not answer one yet). */
  async mapOf(shard: string): Promise<Record<string, unknown> | null> {
    const answer = await ask(this.address(shard), Op.SLOT_MAP, {}).catch(() => null);
    return answer?.kind === 'reply' ? answer.reply : null;
  }

  /** Until `ready(map)` holds of the map every node in `shards` answers. */
  async untilMaps(shards: string[], ready: (map: Record<string, unknown>) => boolean, what: string): Promise<void> {
    const deadline = Date.now() + WITHIN_MS;
    for (;;) {
      const maps = await Promise.all(shards.map((shard) => this.mapOf(shard)));
      if (maps.every((map) => map !== null && ready(map))) return;
      if (Date.now() > deadline) {
        const logs = shards.map((shard) => `--- ${shard}\n${this.nodes.get(shard)!.log().slice(-2000)}`).join('\n');
        assert.fail(`${what}: not seen within ${WITHIN_MS} ms; maps ${JSON.stringify(maps)}\n${logs}`);
      }
      await sleep(50);
    }
  }

  /** SLOTS_MOVE of `lo`..`hi` to `to`, sent to their owner `from`; once every node's map
   * says so. */
  async move(lo: number, hi: number, from: string, to: string): Promise<void> {
    const answer = await ask(this.address(from), Op.SLOTS_MOVE, { lo, hi, to }, WITHIN_MS);
    assert.equal(answer.kind, 'reply', `SLOTS_MOVE ${lo}-${hi} to ${to}: ${JSON.stringify(answer)}`);
    await this.untilMaps([...this.nodes.keys()], (map) => owns(map, to, lo, hi), `slots ${lo}-${hi} on ${to}`);
  }

  async stop(): Promise<void> {
    await Promise.all([...this.nodes.values()].map((node) => node.stop()));
    await this.etcd.stop();
  }
}
