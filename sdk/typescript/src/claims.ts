/**
 * Claims: `run.claim(key, { leaseSeconds })` and the ways to hold it.
 *
 * - `await claim.run(async (lease) => ..., { wait, timeoutMs })`: acquire, keep the lease
 *   renewed while the function runs, release when it returns or throws. The function is
 *   never interrupted: on loss `lease.signal` is aborted and `lease.isLost` set, and the
 *   loss is reported (LeaseLostError) when the function returns;
 * - `await claim.tryAcquire()`: `{ kind: 'busy', holder }` or `{ kind: 'acquired', lease }`;
 *   the caller releases;
 * - `await claim.acquire({ wait, timeoutMs, signal })`: a Lease.
 *
 * `run.claim(key, { releaseOnDisconnect: true })`: each grant ends the moment the connection
 * it came on closes (a killed holder's key goes to its waiter at once), and the lease is
 * lost here the moment that connection drops; by default a lease outlives its connection.
 *
 * Waiting is done by the server: the acquire stays parked in the key's FIFO line and its
 * reply arrives the moment the key is ours. A wait given up (timeout or `signal`) is
 * withdrawn with CANCEL, and a grant that raced it is released, never leaked.
 */

import type { Connection, Reply, Via } from './connection.js';
import { ConflictError, InvalidArgumentError, WaitTimeoutError } from './errors.js';
import { call } from './failover.js';
import { Lease } from './leases.js';
import { type Session, waitAcrossReconnects } from './session.js';
import { now } from './util.js';
import { type LeaseHandle, Limits, Op } from './wire.js';

export interface AcquireOptions {
  /** Queue until the key is free instead of throwing ConflictError (CLAIM_HELD). */
  wait?: boolean;
  /** How long to wait, default 30 000 ms; WaitTimeoutError after it. */
  timeoutMs?: number;
  /** Abandon the wait: it is withdrawn and the promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

export type TryAcquireResult =
  | { kind: 'busy'; holder: string | null }
  | { kind: 'acquired'; lease: Lease };

export interface ClaimInfo {
  held: boolean;
  generation: number;
  holder: string | null;
  waiters: number;
}

/** `value` if it is a boolean, else InvalidArgumentError naming `name`. */
export function checkBool(value: unknown, name = 'releaseOnDisconnect'): boolean {
  if (typeof value !== 'boolean') {
    throw new InvalidArgumentError(`${name} must be a boolean, got ${typeof value}`);
  }
  return value;
}

/** A lease length of at most MAX_LEASE_SECONDS, else InvalidArgumentError naming `name`.
 * The least is the server's: HELLO announces it (the protocol's 5 s, unless a test server
 * lowered it), and the grant or RECEIVE refuses a shorter one (InvalidArgumentError), as
 * the Python SDK leaves it to the server too. */
export function checkLeaseSeconds(leaseSeconds: number, name = 'leaseSeconds'): void {
  if (typeof leaseSeconds !== 'number' || !(leaseSeconds > 0 && leaseSeconds <= Limits.MAX_LEASE_SECONDS)) {
    throw new InvalidArgumentError(
      `${name} must be above 0 and at most ${Limits.MAX_LEASE_SECONDS}, got ${String(leaseSeconds)}`,
    );
  }
}

/** `Info` is what `inspect()` answers: a claim's state, or a pool's for a slot. */
export class Claim<Info = ClaimInfo> {
  /** The ops of this kind of lease; a pool slot (pools.ts) has its own. */
  protected readonly acquireOp: number = Op.CLAIM_ACQUIRE;
  protected readonly releaseOp: number = Op.CLAIM_RELEASE;

  constructor(
    protected readonly session: Session,
    readonly scopeId: string,
    readonly key: string,
    readonly leaseSeconds: number = Limits.DEFAULT_LEASE_SECONDS,
    /** Each grant ends the moment the connection it came on closes. */
    readonly releaseOnDisconnect: boolean = false,
  ) {
    checkLeaseSeconds(leaseSeconds);
    checkBool(releaseOnDisconnect);
  }

  toString(): string {
    return `Claim(${this.scopeId}/${this.key})`;
  }

  /** Acquire the claim; ConflictError (CLAIM_HELD) or WaitTimeoutError if we cannot. */
  async acquire(options: AcquireOptions = {}): Promise<Lease> {
    const { wait = false, timeoutMs = Limits.DEFAULT_WAIT_TIMEOUT_MS, signal } = options;
    const args = {
      scope: this.scopeId,
      ...this.target(),
      lease_seconds: this.leaseSeconds,
      wait,
      timeout_ms: timeoutMs,
      ...(this.releaseOnDisconnect ? { release_on_disconnect: true } : {}),
    };
    if (!wait) {
      const sentAt = now();
      const via: Via = { conn: null, link: 0 }; // the connection the grant comes on
      const reply = await call(this.session.conn, this.acquireOp, args, via);
      return this.lease(reply, sentAt, via.link, via.conn);
    }
    const { reply, sentAt, link, conn } = await waitAcrossReconnects(
      this.session,
      this.acquireOp,
      args,
      timeoutMs,
      {
        giveBack: (grant, on) => this.releaseOrphan(grant, on),
        timeUp: () =>
          new WaitTimeoutError(`${this.what()} was not granted within ${timeoutMs} ms`),
        signal,
      },
    );
    return this.lease(reply, sentAt, link, conn);
  }

  /** Acquire without waiting and without throwing on a held key. */
  async tryAcquire(): Promise<TryAcquireResult> {
    try {
      return { kind: 'acquired', lease: await this.acquire({ wait: false }) };
    } catch (error) {
      if (error instanceof ConflictError && error.code === this.busyCode) {
        return { kind: 'busy', holder: (error.details['holder'] as string | undefined) ?? null };
      }
      throw error;
    }
  }

  /** Run `fn(lease)` while holding the claim; release after. See the module comment. */
  async run<R>(fn: (lease: Lease) => Promise<R> | R, options: AcquireOptions = {}): Promise<R> {
    const lease = await this.acquire(options);
    let result: R;
    try {
      result = await fn(lease);
    } catch (error) {
      await lease.releaseQuietly().catch(() => undefined);
      throw error;
    }
    await lease.release(); // throws LeaseLostError if the lease turned out lost
    return result;
  }

  /** The claim as the server sees it: held, generation, holder, waiters. */
  inspect(): Promise<Info> {
    return call<Info>(this.session.conn, Op.CLAIM_INSPECT, {
      scope: this.scopeId,
      key: this.key,
    });
  }

  /** The field naming what is acquired, what "busy" is called, and how to say what. */
  protected target(): Record<string, string> {
    return { key: this.key };
  }

  protected get busyCode(): string {
    return 'CLAIM_HELD';
  }

  protected what(): string {
    return `claim ${JSON.stringify(this.key)}`;
  }

  private releaseOrphan(grant: Reply, conn: Connection): void {
    conn.sendNow(this.releaseOp, { lease: grant['lease'] });
  }

  /** The lease of a grant that came on `conn` (its `link` then). */
  private lease(reply: Reply, sentAt: number, link: number, conn: Connection | null): Lease {
    const keeper = this.session.keeper;
    const waitedMs = typeof reply['waited_ms'] === 'number' ? reply['waited_ms'] : 0;
    const lease = new Lease(keeper, reply['lease'] as LeaseHandle, {
      scopeId: this.scopeId,
      key: this.key,
      generation: Number(reply['generation']),
      leaseSeconds: Number(reply['lease_seconds'] ?? this.leaseSeconds),
      confirmedAt: sentAt + waitedMs / 1000, // the grant came no sooner than this
      releaseOp: this.releaseOp,
      releaseOnDisconnect: this.releaseOnDisconnect,
      conn,
    });
    keeper.track(lease);
    if (this.releaseOnDisconnect) keeper.bind(lease, link);
    return lease;
  }
}
