/**
 * Slots: how a sharded cluster spreads runs over its shards (rsproto/slots.py, the same
 * rules, tested on the same vectors).
 *
 * A cluster has a fixed number of slots. A run belongs to the slot of its id, a pool or
 * a quota to the slot of its name, a new run made with a placement to the placement's:
 * - the *hash tag* of a key is the part between its first `{` and the first `}` after
 *   it, if that part is not empty; otherwise the whole key (Redis Cluster's rule);
 * - its slot is the CRC-32 (ISO-HDLC: zlib's and PNG's) of the tag's UTF-8 bytes,
 *   modulo the number of slots. Node 20 has no `zlib.crc32`: a table-driven one here.
 *
 * A `SlotMap` is the SLOT_MAP reply read: which shard owns which slot ranges, at which
 * map epoch, and each shard's primary. `routeKey` says where a request goes (the `ROUTE`
 * table of sdkrules.ts, Python's `route_key`).
 */

import { InvalidArgumentError } from './errors.js';
import { MAX_PLACEMENT_BYTES, ROUTE, type Route } from './sdkrules.js';

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n += 1) {
    let c = n;
    for (let k = 0; k < 8; k += 1) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

/** CRC-32 (ISO-HDLC) of `bytes` from `start` to `end`. */
export function crc32(bytes: Uint8Array, start = 0, end = bytes.length): number {
  let crc = 0xffffffff;
  for (let i = start; i < end; i += 1) crc = CRC_TABLE[(crc ^ bytes[i]!) & 0xff]! ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

const OPEN = 0x7b; // '{'
const CLOSE = 0x7d; // '}'

/** [start, end) of the bytes of `raw` that decide its slot. */
function tagSpan(raw: Uint8Array): [number, number] {
  const opening = raw.indexOf(OPEN);
  if (opening >= 0) {
    const closing = raw.indexOf(CLOSE, opening + 1);
    if (closing > opening + 1) return [opening + 1, closing];
  }
  return [0, raw.length];
}

/** The UTF-8 bytes of `key` that decide its slot (see the module comment). */
export function hashTag(key: string): Uint8Array {
  const raw = Buffer.from(key, 'utf8');
  const [start, end] = tagSpan(raw);
  return raw.subarray(start, end);
}

/** The slot of a run id, a pool's or a quota's name, or a placement, of `slots`. An
 * ASCII key (a run id, most names) is its own UTF-8: hashed as it is, no bytes made. */
export function slotOf(key: string, slots: number): number {
  for (let i = 0; i < key.length; i += 1) {
    if (key.charCodeAt(i) > 0x7f) {
      const raw = Buffer.from(key, 'utf8');
      const [start, end] = tagSpan(raw);
      return crc32(raw, start, end) % slots;
    }
  }
  let start = 0;
  let end = key.length;
  const opening = key.indexOf('{');
  if (opening >= 0) {
    const closing = key.indexOf('}', opening + 1);
    if (closing > opening + 1) [start, end] = [opening + 1, closing];
  }
  let crc = 0xffffffff;
  for (let i = start; i < end; i += 1) crc = CRC_TABLE[(crc ^ key.charCodeAt(i)) & 0xff]! ^ (crc >>> 8);
  return ((crc ^ 0xffffffff) >>> 0) % slots;
}

/** Why `placement` cannot place a run (null: it can); rsproto's `placement_problem`. */
export function placementProblem(placement: unknown): string | null {
  if (typeof placement !== 'string') return 'placement must be a string';
  const size = Buffer.byteLength(placement, 'utf8');
  if (size < 1 || size > MAX_PLACEMENT_BYTES) {
    return `placement must be 1 to ${MAX_PLACEMENT_BYTES} UTF-8 bytes (got ${size})`;
  }
  if (placement.includes('{') || placement.includes('}')) return "placement must not contain '{' or '}'";
  return null;
}

/** Where `op` with `args` goes: its route and, for 'run' and 'name', the key whose slot
 * decides (null: any connection will do, e.g. SCOPE_CREATE of a fresh run). */
export function routeKey(op: number, args: Record<string, unknown>): [Route, string | null] {
  const rule = ROUTE[op];
  if (rule === undefined) return ['any', null];
  const [route, fields] = rule;
  for (const name of fields) {
    const value = args[name];
    if (typeof value === 'string') return [route, value];
  }
  return fields.length > 0 ? ['any', null] : [route, null];
}

/** One shard of a map: its name, its primary's `HOST:PORT` (null: none now, or the very
 * server of a lone rsd), its ranges. */
export interface ShardEntry {
  shard: string;
  primary: string | null;
  ranges: Array<[number, number]>;
}

/** The slot map at one epoch: sorted `[lo, hi, shard]` ranges covering every slot once,
 * and each shard's primary. */
export class SlotMap {
  constructor(
    readonly slots: number,
    readonly epoch: number,
    readonly ranges: ReadonlyArray<readonly [number, number, string]>,
    readonly primaries: ReadonlyMap<string, string | null>,
  ) {}

  /** Every slot owned by `shard`. */
  static whole(shard: string, slots: number, epoch = 0, primary: string | null = null): SlotMap {
    return new SlotMap(slots, epoch, [[0, slots - 1, shard]], new Map([[shard, primary]]));
  }

  /** The shard that owns `slot` (a binary search over the ranges). */
  owner(slot: number): string {
    const ranges = this.ranges;
    let low = 0;
    let high = ranges.length - 1;
    while (low < high) {
      const middle = (low + high + 1) >> 1;
      if (ranges[middle]![0] <= slot) low = middle;
      else high = middle - 1;
    }
    return ranges[low]![2];
  }

  /** The shard that owns the slot of `key` (a run id, a pool's name...). */
  ownerOf(key: string): string {
    return this.ranges.length === 1 ? this.ranges[0]![2] : this.owner(slotOf(key, this.slots));
  }

  /** The shards that own at least one slot, in the order of their first range. */
  owners(): string[] {
    const seen: string[] = [];
    for (const [, , shard] of this.ranges) if (!seen.includes(shard)) seen.push(shard);
    return seen;
  }

  /** A SLOT_MAP reply as a map (InvalidArgumentError when it is not one). */
  static fromWire(reply: Record<string, unknown>): SlotMap {
    const slots = num(reply['slots']);
    const epoch = num(reply['map_epoch']);
    const shards = reply['shards'];
    if (slots === null || epoch === null || !Array.isArray(shards)) {
      throw new InvalidArgumentError('a slot map has integer slots and map_epoch and a list of shards');
    }
    const spans: Array<[number, number, string]> = [];
    const primaries = new Map<string, string | null>();
    for (const entry of shards as Array<Record<string, unknown>>) {
      const name = entry?.['shard'];
      const primary = entry?.['primary'] ?? null;
      if (typeof name !== 'string' || !(primary === null || typeof primary === 'string')) {
        throw new InvalidArgumentError(`a shard of the map is malformed: ${JSON.stringify(entry)}`);
      }
      primaries.set(name, primary);
      for (const span of (entry['ranges'] ?? []) as unknown[]) {
        const lo = Array.isArray(span) ? num(span[0]) : null;
        const hi = Array.isArray(span) ? num(span[1]) : null;
        if (lo === null || hi === null) {
          throw new InvalidArgumentError(`a range of shard ${name} is malformed: ${JSON.stringify(span)}`);
        }
        spans.push([lo, hi, name]);
      }
    }
    spans.sort((a, b) => a[0] - b[0]);
    const merged: Array<[number, number, string]> = [];
    for (const [lo, hi, shard] of spans) {
      const last = merged[merged.length - 1];
      if (last !== undefined && last[2] === shard && last[1] + 1 === lo) last[1] = hi;
      else merged.push([lo, hi, shard]);
    }
    const problem = rangesProblem(merged, slots);
    if (problem !== null) throw new InvalidArgumentError(problem);
    return new SlotMap(slots, epoch, merged, primaries);
  }
}

/** Why sorted `ranges` do not cover 0..slots-1 exactly once (null: they do). */
export function rangesProblem(ranges: ReadonlyArray<readonly [number, number, string]>, slots: number): string | null {
  let expected = 0;
  for (const [lo, hi] of ranges) {
    if (lo !== expected || hi < lo) {
      return `ranges must cover every slot once, in order: [${lo}, ${hi}] after ${expected}`;
    }
    expected = hi + 1;
  }
  return expected === slots ? null : `ranges cover ${expected} slots of ${slots}`;
}

function num(value: unknown): number | null {
  if (typeof value === 'bigint') return Number(value);
  return typeof value === 'number' && Number.isInteger(value) ? value : null;
}
