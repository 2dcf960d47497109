/**
 * Quotas: `rs.quotas` defines token buckets, `run.quota(name).take()` spends from one.
 *
 * `await rs.quotas.ensure(name, { limit, perSeconds })`: a budget of `limit` that refills
 * continuously at `limit` per `perSeconds` seconds (burst `limit`); its level survives
 * server restarts. `await run.quota(name).take({ amount, wait, timeoutMs })` takes from it.
 * Waiting is done by the server, strictly first in first out (a large amount is not
 * starved by small ones behind it) and answered by the reply, never by polling; the wait
 * outlasts a reconnect for the time left. Running out of time throws WaitTimeoutError;
 * without waiting, a budget that cannot cover the amount throws ConflictError with code
 * QUOTA_EXHAUSTED; an amount above the limit throws InvalidArgumentError. Quota taken is
 * spent: nothing is refunded.
 */

import { WaitTimeoutError } from './errors.js';
import { call } from './failover.js';
import { type Session, waitAcrossReconnects } from './session.js';
import { Limits, Op } from './wire.js';

/** A quota as the server sees it. */
export interface QuotaInfo {
  name: string;
  limit: number;
  per_seconds: number;
  level: number;
  waiters: number;
  head_amount: number | null;
  [field: string]: unknown;
}

/** What a take gave: the amount, the level left after it, and how long it waited. */
export interface QuotaTaken {
  taken: number;
  level: number;
  waited_ms: number;
}

export interface QuotaEnsureOptions {
  /** The burst and the amount refilled per `perSeconds`. */
  limit: number;
  perSeconds: number;
}

export interface TakeOptions {
  /** How much to take, default 1, at most the quota's limit. */
  amount?: number;
  /** Wait in line until the budget covers it (default true). */
  wait?: boolean;
  /** How long to wait, default 30 000 ms; WaitTimeoutError after it. */
  timeoutMs?: number;
  /** Abandon the wait: it is withdrawn and the promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

export class Quotas {
  constructor(private readonly session: Session) {}

  /** Create the quota, or bring it to these settings (the level is kept, capped at the
   * new limit). Idempotent. */
  ensure(name: string, options: QuotaEnsureOptions): Promise<Record<string, unknown>> {
    return call(this.session.conn, Op.QUOTA_ENSURE, {
      name,
      limit: options.limit,
      per_seconds: options.perSeconds,
    });
  }

  /** The level, the settings and the waiters. */
  inspect(name: string): Promise<QuotaInfo> {
    return call<QuotaInfo>(this.session.conn, Op.QUOTA_INSPECT, { name });
  }
}

/** A quota as used by one run. Making one does no I/O. */
export class Quota {
  constructor(
    private readonly session: Session,
    readonly scopeId: string,
    readonly name: string,
  ) {}

  toString(): string {
    return `Quota(${this.name} in ${this.scopeId})`;
  }

  async take(options: TakeOptions = {}): Promise<QuotaTaken> {
    const { amount = 1, wait = true, timeoutMs = Limits.DEFAULT_WAIT_TIMEOUT_MS, signal } = options;
    const args = { scope: this.scopeId, quota: this.name, amount, wait, timeout_ms: timeoutMs };
    if (!wait) return call<QuotaTaken>(this.session.conn, Op.QUOTA_TAKE, args);
    const { reply } = await waitAcrossReconnects(this.session, Op.QUOTA_TAKE, args, timeoutMs, {
      timeUp: () =>
        new WaitTimeoutError(
          `quota ${JSON.stringify(this.name)} did not give ${amount} within ${timeoutMs} ms`,
        ),
      signal,
    });
    return reply as unknown as QuotaTaken;
  }

  inspect(): Promise<QuotaInfo> {
    return call<QuotaInfo>(this.session.conn, Op.QUOTA_INSPECT, { name: this.name });
  }
}
