/**
 * Leases: `Lease`, a held grant on a claim or a delivery, and what may happen to one.
 *
 * What always holds:
 * - a lease is *lost* the moment this client can no longer prove it live: the server
 *   said so (STALE_CLAIM, or a LEASE_LOST push), or its own deadline passed. Loss is
 *   final: the SDK never re-acquires;
 * - the deadline is the send time of the last request whose reply confirmed the lease
 *   (plus the grant's `waited_ms`), plus `leaseSeconds`, minus a safety margin
 *   (`lossMargin`: max(1 s, 10 %), at most half the lease). The server's expiry can come
 *   no sooner: it counts from when it handled that request;
 * - `isLost`, `throwIfLost()` and `signal` read the clock when asked: past the deadline
 *   the lease is lost then and there, whether or not a timer has fired;
 * - a loss is never silent: `isLost`, the aborted `signal`, the loss callbacks and a
 *   warning on the logger, all at once, through `declareLost` alone;
 * - `release()` sends its request once, however often it is called, and waits for the
 *   answer at most until the lease would have expired anyway (at least 0.5 s); the
 *   release of a lease already lost is sent but not waited for;
 * - of a sharded cluster, a lease is renewed, settled and released on the connection of
 *   the shard that holds it (`conn`). When its run moves to another shard, the lease goes
 *   with it (same handle, same generation) and the old shard answers MOVED for it: the
 *   lease follows (`follow`: rebound to the connection of its run's new shard, where the
 *   renewal or the op is sent again at once, at most MAX_REDIRECTS times in a row); it is
 *   not lost. A STALE_CLAIM there is a loss, as anywhere. A server alone never answers
 *   MOVED: nothing of this costs it anything.
 *
 * The lease keeps its handle exactly as the server sent it (a number, a bigint or a
 * 16-byte `Uint8Array`) and sends it back unchanged: clients treat it as opaque.
 */

import type { Connection, Reply } from './connection.js';
import { LeaseLostError, RunstateError, UnavailableError } from './errors.js';
import type { LeaseKeeper } from './keeper.js';
import {
  LOSS_MARGIN_FRACTION,
  LOSS_MARGIN_MIN_SECONDS,
  LOSS_MARGIN_MOST_DIVISOR,
  MAX_REDIRECTS,
  RENEWAL_DIVISOR,
} from './sdkrules.js';
import { now } from './util.js';
import { type LeaseHandle, Op, handleText } from './wire.js';


/** How long before the server could end a lease the SDK gives it up: max(1 s, 10 %),
 * never more than half the lease. It absorbs clock-rate drift between the two hosts. */
export function lossMargin(leaseSeconds: number): number {
  return Math.min(
    Math.max(LOSS_MARGIN_MIN_SECONDS, LOSS_MARGIN_FRACTION * leaseSeconds),
    leaseSeconds / LOSS_MARGIN_MOST_DIVISOR,
  );
}

export interface LeaseInit {
  scopeId: string;
  key: string;
  generation: number;
  leaseSeconds: number;
  /** Monotonic seconds no later than the server's start of the lease. */
  confirmedAt: number;
  releaseOp?: number;
  /** Granted to end with its connection: lost the moment that connection ends. */
  releaseOnDisconnect?: boolean;
  /** The connection it was granted on (default: the keeper's, the client's first). */
  conn?: Connection | null | undefined;
}

export class Lease {
  /** The lease handle exactly as the server sent it. */
  readonly handle: LeaseHandle;
  /** `token()`, computed once: the keeper's index too. */
  readonly tokenText: string;
  readonly scopeId: string;
  readonly key: string;
  /** Grows strictly with each new owner of the key (for a delivery: its attempt). */
  readonly generation: number;
  leaseSeconds: number;
  lostReason: string | null = null;
  /** Monotonic seconds: past this the lease counts as lost. */
  lostAt = 0;
  /** Monotonic seconds: the keeper renews it from here on. */
  renewAt = 0;
  private releasedFlag = false;
  private controller: AbortController | null = null;
  private watch: NodeJS.Timeout | null = null;
  private releasing: Promise<void> | null = null;
  private lossCallbacks: Array<() => void> = [];
  private readonly releaseOp: number;
  /** Whether the lease ends with the connection it was granted on (keeper.ts `bind`). */
  readonly releaseOnDisconnect: boolean;
  /** The connection it is renewed, settled and released on: the one it was granted on,
   * or (of a sharded cluster) the connection of the shard its run moved to (`follow`). */
  conn: Connection;

  constructor(
    readonly keeper: LeaseKeeper,
    handle: LeaseHandle,
    init: LeaseInit,
  ) {
    this.handle = handle;
    this.tokenText = handleText(handle);
    this.scopeId = init.scopeId;
    this.key = init.key;
    this.generation = init.generation;
    this.leaseSeconds = init.leaseSeconds;
    this.releaseOp = init.releaseOp ?? Op.CLAIM_RELEASE;
    this.releaseOnDisconnect = init.releaseOnDisconnect ?? false;
    this.conn = init.conn ?? keeper.conn;
    confirmRenewal(this, init.confirmedAt);
  }

  /** The fencing token: opaque, unique per grant; compare it for equality only. */
  token(): string {
    return this.tokenText;
  }

  /** Whether the lease is lost, by the server's word or by its own deadline (read now). */
  get isLost(): boolean {
    return this.lostReason !== null || this.pastDeadline();
  }

  get released(): boolean {
    return this.releasedFlag;
  }

  /** Aborted the moment the lease is lost (its reason is a LeaseLostError). */
  get signal(): AbortSignal {
    if (this.controller === null) {
      this.controller = new AbortController();
      if (this.isLost) this.controller.abort(this.lostError());
      else if (!this.releasedFlag) this.armWatch();
    } else {
      this.pastDeadline();
    }
    return this.controller.signal;
  }

  /** Throw LeaseLostError if the lease is lost (`isLost`), checked on the clock. */
  throwIfLost(): void {
    if (this.isLost) throw this.lostError();
  }

  /** End the lease. Idempotent. Throws LeaseLostError if the lease had been lost: the
   * caller's work may have overlapped another owner's, and that must not pass unnoticed. */
  async release(): Promise<void> {
    if (this.releasing === null) this.releasing = this.beginRelease();
    await this.releasing;
    this.throwIfLost();
  }

  /** Release, ignoring a loss: for cleanup after a loss was already reported. */
  async releaseQuietly(): Promise<void> {
    try {
      await this.release();
    } catch (error) {
      if (!(error instanceof LeaseLostError)) throw error;
    }
  }

  /** Renew now (optionally with a new length) instead of waiting for the keeper. */
  async renew(leaseSeconds?: number): Promise<void> {
    this.throwIfLost();
    if (this.releasedFlag || this.releasing !== null) {
      throw new LeaseLostError(
        `lease on ${JSON.stringify(this.key)} (generation ${this.generation}) was released`,
      );
    }
    await this.keeper.renewNow([this], leaseSeconds ?? null);
    this.throwIfLost();
  }

  /** The key whose slot decides which shard holds the lease: its pool's name for a pool
   * slot (it lives with its pool), else its run. */
  get placedBy(): string {
    return this.releaseOp === Op.POOL_RELEASE ? this.key : this.scopeId;
  }

  /** @internal: `from` answered MOVED for this lease (`details`: the answer's, if any):
   * rebound to the connection of the shard that holds it now, unless rebound already.
   * Whether it is now on another connection than `from`. */
  async follow(from: Connection, details: Reply | null = null): Promise<boolean> {
    const shards = from.shards;
    if (shards !== null && this.conn === from) this.conn = await shards.follow(from, this.placedBy, details);
    return this.conn !== from;
  }

  /** The release `send` on `from` was answered MOVED (`moved`): the lease follows
   * (`follow`) and the release is sent again there, at most MAX_REDIRECTS times in a
   * row; the last answer. */
  private async releaseMoved(
    from: Connection,
    moved: UnavailableError,
    send: (conn: Connection) => Promise<RunstateError | null>,
  ): Promise<RunstateError | null> {
    let answer: RunstateError | null = moved;
    for (let redirects = 0; isMoved(answer) && redirects < MAX_REDIRECTS; redirects += 1) {
      if (!(await this.follow(from, answer.details).catch(() => false))) break;
      from = this.conn;
      answer = await send(from);
    }
    return answer;
  }

  addLossCallback(callback: () => void): void {
    if (this.isLost) callback();
    else this.lossCallbacks.push(callback);
  }

  removeLossCallback(callback: () => void): void {
    this.lossCallbacks = this.lossCallbacks.filter((cb) => cb !== callback);
  }

  toString(): string {
    const state = this.lostReason !== null ? 'lost' : this.releasedFlag ? 'released' : 'held';
    return `Lease(${this.scopeId}/${this.key} generation=${this.generation} token=${this.tokenText} ${state})`;
  }

  // ---- internals -------------------------------------------------------------------

  private lostError(): LeaseLostError {
    return new LeaseLostError(
      `lease on ${JSON.stringify(this.key)} (generation ${this.generation}) was lost: ` +
        `${this.lostReason ?? this.deadlineReason()}`,
    );
  }

  private pastDeadline(): boolean {
    if (this.releasedFlag || this.lostReason !== null) return false;
    if (now() < this.lostAt) return false;
    declareLost(this, this.deadlineReason());
    return true;
  }

  private deadlineReason(): string {
    return (
      `no renewal was confirmed within its ${this.leaseSeconds} s lease ` +
      `(less a ${lossMargin(this.leaseSeconds)} s safety margin)`
    );
  }

  /** Wake at the deadline to abort `signal` even if nothing else looks. */
  private armWatch(): void {
    this.watch = null;
    if (this.releasedFlag || this.lostReason !== null || this.pastDeadline()) return;
    const delayMs = Math.max(0, (this.lostAt - now()) * 1000) + 1;
    // Only to abort `signal` on time: it does not keep the process alive by itself.
    this.watch = setTimeout(() => this.armWatch(), delayMs).unref();
  }

  /** @internal */
  stopWatch(): void {
    if (this.watch !== null) {
      clearTimeout(this.watch);
      this.watch = null;
    }
  }

  /** @internal: called by declareLost only. */
  markLost(reason: string): boolean {
    if (this.lostReason !== null || this.releasedFlag) return false;
    this.lostReason = reason;
    this.stopWatch();
    this.controller?.abort(this.lostError());
    const callbacks = this.lossCallbacks;
    this.lossCallbacks = [];
    for (const callback of callbacks) {
      try {
        callback();
      } catch (error) {
        this.keeper.logger.error(`a lease loss callback failed: ${String(error)}`);
      }
    }
    return true;
  }

  /** @internal: the lease ended without a loss (released, or its delivery settled). */
  markReleased(): void {
    if (this.lostReason === null) this.releasedFlag = true;
    this.stopWatch();
    this.lossCallbacks = [];
  }

  private async beginRelease(): Promise<void> {
    const keeper = this.keeper;
    keeper.forget(this);
    this.stopWatch();
    const wasLost = this.isLost;
    const args = { lease: this.handle };
    const send = (conn: Connection): Promise<RunstateError | null> =>
      new Promise<RunstateError | null>((resolve) => {
        const entry = { onReply: (_: Reply) => resolve(null), onError: resolve };
        if (!conn.sendNow(this.releaseOp, args, entry)) {
          conn.direct(this.releaseOp, args).then(
            () => resolve(null),
            (error: unknown) =>
              resolve(error instanceof RunstateError ? error : new RunstateError(String(error))),
          );
        }
      });
    const settle = (error: RunstateError | null): void => {
      // The server's answer decides here, not the clock: a release it accepted ended a
      // lease that was still live on the server, so no other owner can have overlapped.
      if (error === null) {
        this.markReleased();
      } else if (error instanceof LeaseLostError) {
        declareLost(this, `the server refused the release: ${error.message}`);
      } else if (this.lostReason === null) {
        keeper.logger.warn(`could not release lease on ${JSON.stringify(this.key)}: ${error.message}`);
        this.markReleased(); // the server is away; the lease ends by expiry
      }
    };
    const from = this.conn;
    const settled = send(from).then((error) =>
      // Answered MOVED (its run went to another shard with the lease): released there.
      isMoved(error) ? this.releaseMoved(from, error, send).then(settle) : settle(error),
    );
    if (wasLost) return;
    const waitMs = Math.max((this.lostAt - now()) * 1000, 500);
    let timer: NodeJS.Timeout | undefined;
    const expired = new Promise<void>((resolve) => {
      timer = setTimeout(() => {
        keeper.logger.warn(
          `release of lease on ${JSON.stringify(this.key)} unanswered; it ends by expiry`,
        );
        resolve();
      }, waitMs);
    });
    await Promise.race([settled, expired]);
    clearTimeout(timer);
  }
}

/** Whether `error` is a MOVED answer (a request for a slot that shard does not own). */
export function isMoved(error: unknown): error is UnavailableError {
  return error instanceof UnavailableError && error.code === 'MOVED';
}

/** Declare `lease` lost, once: flag, aborted signal, callbacks, warning. A released lease
 * cannot be lost any more. */
export function declareLost(lease: Lease, reason: string): void {
  if (!lease.markLost(reason)) return;
  lease.keeper.forget(lease);
  lease.keeper.logger.warn(
    `lease on ${JSON.stringify(lease.key)} in scope ${JSON.stringify(lease.scopeId)} ` +
      `(generation ${lease.generation}, token ${lease.tokenText}) lost: ${reason}`,
  );
}

/** The server confirmed a grant or renewal of `lease` sent at `sentAt` (monotonic s). */
export function confirmRenewal(lease: Lease, sentAt: number): void {
  const seconds = lease.leaseSeconds;
  lease.lostAt = sentAt + seconds - lossMargin(seconds);
  lease.renewAt = sentAt + seconds / RENEWAL_DIVISOR;
}
