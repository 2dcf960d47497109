/**
 * One view of many shards: the admin listings and stats of a sharded cluster, merged
 * (rsproto/fanout.py, used by the Python SDK and the dashboard: the same rules, the same cursor).
 *
 * Each shard's primary answers the admin ops for what it holds alone. A client whose map
 * gives slots to more than one shard asks a listing that names no run (`FANNED_OUT`,
 * sdkrules.ts: ADMIN_SCOPES, ADMIN_POOLS, ADMIN_QUOTAS, ADMIN_MAILBOXES) of every shard
 * that owns slots, and merges the answers into one page; admin.ts does the asking, this
 * module the rules:
 *
 * - the cursor of a merged page is the client's own, an opaque string: the URL-safe
 *   base64 (padded) of the JSON `{"at": {shard: cursor or null}}`, keys sorted, no
 *   spaces, each shard's own position (its last `next`; null once its listing is
 *   complete, and a shard done is not asked again; a shard not named starts at 0: one
 *   that came to own slots since the listing began is listed whole; one that owns no slot
 *   any more is not asked: its runs went with its slots). Byte for byte the Python SDK's,
 *   so a cursor of one SDK pages on in the other;
 * - one page asks at most `limit` objects in all: the first `min(limit, shards not
 *   done)` shards in the map's order, `limit` split evenly among them (the first get one
 *   more), so a page holds at most `limit` objects and costs each shard at most its share
 *   (a page may hold fewer, even none, while the cursor is not null, as a lone rsd's
 *   pages: protocol.md's "Paging"); every object present for the whole listing comes
 *   exactly once;
 * - each object of a merged page names its shard (`shard`); a page's objects come shard
 *   by shard in the map's order, each shard's in its own order: there is no order across
 *   shards;
 * - the stats of a sharded cluster are every shard's SERVER_STATS under `shards` (shard →
 *   its primary's answer), `server` and `time` of the first shard, and the counters of
 *   `STATS_SUMMED` added up over the shards (a map's counters key by key).
 *
 * A server alone, or a cluster of one shard, is none of this: one request, as ever.
 */

import { InvalidArgumentError } from './errors.js';
import { STATS_SUMMED } from './sdkrules.js';

/** Each shard's position in a merged listing (null: its listing is complete). */
export type Positions = Record<string, number | null>;

/** The merged cursor of `positions`; null once every shard's listing is complete. */
export function writeCursor(positions: Positions): string | null {
  const names = Object.keys(positions).sort();
  if (names.every((name) => positions[name] === null)) return null;
  const at = names.map((name) => `${JSON.stringify(name)}:${JSON.stringify(positions[name])}`).join(',');
  return Buffer.from(`{"at":{${at}}}`, 'utf8').toString('base64').replace(/\+/g, '-').replace(/\//g, '_');
}

/** The positions of a merged cursor (0: a listing's start); InvalidArgumentError for
 * anything that is no cursor of a merged page. */
export function readCursor(cursor: unknown): Positions {
  if (cursor === 0) return {};
  if (typeof cursor === 'string' && /^[A-Za-z0-9_-]*={0,2}$/.test(cursor) && cursor.length % 4 === 0) {
    let found: unknown = null;
    try {
      found = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8'));
    } catch {
      found = null;
    }
    const at = isRecord(found) ? found['at'] : null;
    if (isRecord(at) && Object.values(at).every((v) => v === null || (Number.isInteger(v) && (v as number) >= 0))) {
      return { ...(at as Positions) };
    }
  }
  throw new InvalidArgumentError(
    `cursor ${JSON.stringify(cursor) ?? String(cursor)} is not one a page of this listing gave: a sharded ` +
      "cluster's listing starts at 0 and goes on from the string each page returns",
  );
}

/** The requests of one merged page: `[shard, its cursor, its limit]` for the first
 * `min(limit, shards not done)` shards not done (`shards`: those that own slots, in the
 * map's order), `limit` split evenly among them (the first get one more). */
export function planPage(positions: Positions, shards: readonly string[], limit: number): Array<[string, number, number]> {
  const going: Array<[string, number]> = [];
  for (const name of shards) {
    const at = name in positions ? positions[name]! : 0;
    if (at !== null) going.push([name, at]);
  }
  const asked = going.slice(0, limit);
  if (asked.length === 0) return [];
  const share = Math.floor(limit / asked.length);
  const extra = limit % asked.length;
  return asked.map(([name, at], n) => [name, at, share + (n < extra ? 1 : 0)]);
}

/** The stats of a sharded cluster from each shard's SERVER_STATS (`answers`, in the map's
 * order): see the module comment. */
export function mergeStats(answers: ReadonlyArray<[string, Record<string, unknown>]>): Record<string, unknown> {
  const first = answers[0]?.[1] ?? {};
  const merged: Record<string, unknown> = { server: first['server'], time: first['time'] };
  for (const key of STATS_SUMMED) {
    const values = answers.filter(([, stats]) => key in stats).map(([, stats]) => stats[key]);
    const total = sum(values);
    if (total !== undefined) merged[key] = total;
  }
  merged['shards'] = Object.fromEntries(answers.map(([name, stats]) => [name, { ...stats }]));
  return merged;
}

/** The sum of numbers, or of maps key by key (recursively); undefined if they are
 * neither (a counter some shard does not keep as the others do). */
function sum(values: unknown[]): unknown {
  if (values.length === 0) return undefined;
  if (values.every((v) => typeof v === 'number' || typeof v === 'bigint')) {
    return values.reduce<number>((total, v) => total + Number(v), 0);
  }
  if (values.every(isRecord)) {
    const keys = new Set<string>();
    for (const value of values as Array<Record<string, unknown>>) for (const key of Object.keys(value)) keys.add(key);
    const out: Record<string, unknown> = {};
    for (const key of keys) {
      const total = sum((values as Array<Record<string, unknown>>).filter((v) => key in v).map((v) => v[key]));
      if (total !== undefined) out[key] = total;
    }
    return out;
  }
  return undefined;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value) && !(value instanceof Uint8Array);
}
