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
import { call } from './failover.js';
import type { Session } from './session.js';
import { Limits, Op } from './wire.js';

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
