/**
 * Concurrency pools: `rs.pools` defines them, `run.pool(name)` holds a slot of one.
 *
 * `await rs.pools.ensure(name, { size })` defines a pool of `size` slots shared by every run
 * of the tenant (declarative: ensuring again resizes it; a smaller size revokes no held
 * slot, it takes effect as slots free up). `run.pool(name, { leaseSeconds })` has the
 * claim's API and defaults because a slot is held exactly like a claim, under a `Lease` the
 * keeper renews: `run(fn, { wait, timeoutMs })`, `acquire(...)`, `tryAcquire()`
 * (`{ kind: 'busy', holder: null }` or `{ kind: 'acquired', lease }`). A full pool without
 * waiting throws ConflictError with code POOL_FULL; waiting is done by the server (FIFO),
 * granted by the reply the moment a slot frees or a holder's lease expires.
 */

import { Claim } from './claims.js';
import type { Connection } from './connection.js';
import { call } from './failover.js';
import { declareLost } from './leases.js';
import type { Session } from './session.js';
import { Limits, Op } from './wire.js';

/** The reason the server gives for the slots it ends when their run is cancelled. */
export const SCOPE_CANCELLED = 'scope cancelled';

/** Run `scopeId` was cancelled, answered on `own` (the connection of its shard): the
 * leases this client holds for it on other shards' connections (slots of pools homed
 * elsewhere, which their shard cannot tie to the run) are declared lost, as the server
 * declares those it ends, and released; how many. The run's own shard ends the rest
 * itself. A lone rsd, or one shard, has one connection: nothing to do. (The Python SDK's
 * `end_slots_elsewhere`, rsclient/pools.py.) */
export async function endSlotsElsewhere(session: Session, scopeId: string, own: Connection): Promise<number> {
  const ended = session.keeper.held().filter((lease) => lease.scopeId === scopeId && lease.conn !== own);
  for (const lease of ended) declareLost(lease, SCOPE_CANCELLED);
  await Promise.all(ended.map((lease) => lease.releaseQuietly()));
  return ended.length;
}

/** One holder of a slot, as `inspect()` lists it. */
export interface PoolHolder {
  holder: string;
  run: string;
  generation: number;
  expires_at: number;
}

/** A pool as the server sees it. */
export interface PoolInfo {
  name: string;
  size: number;
  held: number;
  waiters: number;
  holders: PoolHolder[];
  [field: string]: unknown;
}

export interface PoolEnsureOptions {
  /** The number of slots, at least 1. */
  size: number;
}

export class Pools {
  constructor(private readonly session: Session) {}

  /** Create the pool, or bring it to `size` slots. Idempotent. */
  ensure(name: string, options: PoolEnsureOptions): Promise<Record<string, unknown>> {
    return call(this.session.conn, Op.POOL_ENSURE, { name, size: options.size });
  }

  /** Size, slots held, waiters and up to `limit` holders (default 100). */
  inspect(name: string, options: { limit?: number } = {}): Promise<PoolInfo> {
    const limit = options.limit ?? Limits.DEFAULT_POOL_INSPECT_HOLDERS;
    return call<PoolInfo>(this.session.conn, Op.POOL_INSPECT, { name, limit });
  }
}

/** One slot of a pool, for one run: acquired, held and released like a claim. */
export class Pool extends Claim<PoolInfo> {
  protected override readonly acquireOp: number = Op.POOL_ACQUIRE;
  protected override readonly releaseOp: number = Op.POOL_RELEASE;

  constructor(
    session: Session,
    scopeId: string,
    readonly name: string,
    leaseSeconds?: number,
    releaseOnDisconnect = false,
  ) {
    super(session, scopeId, name, leaseSeconds, releaseOnDisconnect);
  }

  override toString(): string {
    return `Pool(${this.name} in ${this.scopeId})`;
  }

  /** The pool as the server sees it (see `Pools.inspect`). */
  override inspect(): Promise<PoolInfo> {
    return call<PoolInfo>(this.session.conn, Op.POOL_INSPECT, { name: this.name });
  }

  protected override target(): Record<string, string> {
    return { pool: this.name };
  }

  protected override get busyCode(): string {
    return 'POOL_FULL';
  }

  protected override what(): string {
    return `a slot of pool ${JSON.stringify(this.name)}`;
  }
}
