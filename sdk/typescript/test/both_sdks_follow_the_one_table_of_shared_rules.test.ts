/**
 * The TypeScript SDK follows the rules both SDKs share (rsproto/sdkrules.py), run on the
 * cases generated from that table (sdkrules_cases.ts) that the Python SDK is run on too
 * (tests/test_both_sdks_follow_the_one_table_of_shared_rules.py): what is sent again
 * after a lost connection, the loss margin and renewal time of a lease, the class of
 * each error code, the op numbers, the slot of a key (protocol.md's vectors), where
 * each request goes (`route_key`) and what comes before a request answered MOVED goes
 * again (`moved_pause`).
 */

import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import type { Connection } from '../src/connection.js';
import { LostConnection, NotExecuted, RunstateError, UnavailableError, errorFor } from '../src/errors.js';
import { maySendAgain } from '../src/failover.js';
import { type Lease, confirmRenewal, lossMargin } from '../src/leases.js';
import { Shards, movedPause } from '../src/shards.js';
import { SlotMap, hashTag, routeKey, slotOf } from '../src/slots.js';
import { Op } from '../src/wire.js';
import { ERROR_CLASS, LOSS_MARGIN, MOVED_PAUSE, OP_CODES, RENEWAL, ROUTES, SENT_AGAIN, SLOT_OF } from './sdkrules_cases.js';

const connection = (cluster: boolean, closed = false): Connection =>
  ({ cluster, closed }) as unknown as Connection;

describe('both SDKs follow the one table of shared rules', () => {
  it('sends again after a lost connection exactly what the table says, for a cluster', () => {
    for (const [op, args, expected] of SENT_AGAIN) {
      const lost = new LostConnection('connection lost');
      assert.equal(maySendAgain(connection(true), lost, op, args), expected, `op ${op} ${JSON.stringify(args)}`);
    }
  });

  it('sends nothing again after a lost connection to a lone rsd, everything answered NOT_PRIMARY', () => {
    for (const [op, args] of SENT_AGAIN) {
      assert.equal(maySendAgain(connection(false), new LostConnection('lost'), op, args), false);
      const notExecuted = new NotExecuted('not the primary', { primary: null, epoch: 1 });
      assert.equal(maySendAgain(connection(true), notExecuted, op, args), true);
      assert.equal(maySendAgain(connection(true, true), notExecuted, op, args), false);
    }
  });

  it('gives a lease up and renews it when the table says', () => {
    for (const [seconds, margin] of LOSS_MARGIN) assert.equal(lossMargin(seconds), margin, `${seconds} s`);
    for (const [seconds, sentAt, renewAt, lostAt] of RENEWAL) {
      const lease = { leaseSeconds: seconds, renewAt: 0, lostAt: 0 } as unknown as Lease;
      confirmRenewal(lease, sentAt);
      assert.deepEqual([lease.renewAt, lease.lostAt], [renewAt, lostAt], `${seconds} s`);
    }
  });

  it('throws the class the table names for every error code', () => {
    for (const [code, name] of ERROR_CLASS) {
      const error = errorFor(code, 'message', null);
      assert.ok(error instanceof RunstateError);
      assert.equal(error.constructor.name, name, code);
      assert.equal(error.code, code);
    }
  });

  it('numbers its ops as rsproto does', () => {
    const codes = new Map(OP_CODES);
    for (const [name, code] of Object.entries(Op)) assert.equal(codes.get(name), code, name);
  });

  it("computes the slot of every key of protocol.md's vectors", () => {
    for (const [key, slots, slot] of SLOT_OF) assert.equal(slotOf(key, slots), slot, `${key} of ${slots}`);
    assert.deepEqual(Buffer.from(hashTag('x{acme}y{other}')).toString(), 'acme');
    assert.deepEqual(Buffer.from(hashTag('{}acme')).toString(), '{}acme');
  });

  it('routes every op as route_key does', () => {
    for (const [op, args, route, key] of ROUTES) {
      assert.deepEqual(routeKey(op, args), [route, key], `op ${op} ${JSON.stringify(args)}`);
    }
  });

  it('follows a MOVED answer as the table says: the map asked first, at once, or after a pause', async () => {
    for (const [known, told, moved, pause] of MOVED_PAUSE) {
      const ms = pause === null ? null : Math.round(pause * 1000);
      const name = `map ${known}, answer's ${JSON.stringify(told)}, MOVED ${moved} in a row`;
      assert.equal(movedPause(known, told, moved), ms, name);
      // `Shards.redirected` on a stand-in: the map, its refresh, the owner and the pause.
      const asked: string[] = [];
      const paused: number[] = [];
      const target = { shardName: 'a' } as unknown as Connection;
      const owner = { shardName: 'b' } as unknown as Connection;
      const shards = Object.assign(Object.create(Shards.prototype) as Shards, {
        map: known === null ? null : { epoch: known },
        refresh: async () => void asked.push('the map'),
        pick: () => owner,
        pause: async (waited: number) => void paused.push(waited),
      }) as unknown as { redirected(...args: unknown[]): Promise<Connection> };
      const answer = new UnavailableError('slot 7 is served by shard b', 'MOVED', { slot: 7, shard: 'b', map_epoch: told });
      assert.equal(await shards.redirected(answer, target, 'run-1', moved - 1), owner, name);
      assert.deepEqual([asked, paused], ms === null ? [['the map'], []] : [[], ms > 0 ? [ms] : []], name);
    }
  });

  it('reads a slot map and finds the owner of a slot', () => {
    const map = SlotMap.fromWire({
      slots: 1024,
      map_epoch: 3,
      shards: [
        { shard: 'b', primary: '10.0.0.2:7420', ranges: [[512, 1023]] },
        { shard: 'a', primary: null, ranges: [[0, 99], [100, 511]] },
        { shard: 'c', primary: null, ranges: [] },
      ],
    });
    assert.deepEqual(map.ranges, [[0, 511, 'a'], [512, 1023, 'b']]);
    assert.deepEqual([map.owner(0), map.owner(511), map.owner(512), map.owner(1023)], ['a', 'a', 'b', 'b']);
    assert.equal(map.ownerOf('{acme}gpu'), 'b'); // slot 574
    assert.deepEqual(map.owners(), ['a', 'b']);
    assert.equal(map.primaries.get('c'), null);
    assert.throws(() => SlotMap.fromWire({ slots: 1024, map_epoch: 1, shards: [{ shard: 'a', primary: null, ranges: [[0, 10]] }] }), /ranges cover 11 slots of 1024/);
  });
});
