/**
 * Deliveries: one leased hand-out of a task or message to a worker, and `receive`, the
 * one RECEIVE that `Mailbox.receive` and the worker loop both use.
 *
 * A delivery settles once: the first `complete`, `retry`, `reject` or `requeue` decides,
 * and later calls do nothing. A settlement the server refuses because the lease is no
 * longer current (it expired and the task went to another worker) throws LeaseLostError;
 * the task keeps the result of whoever completed it with a valid lease. A delivery that
 * arrives for a receive its caller gave up on is handed straight back, never kept.
 */

import type { Reply } from './connection.js';
import { LeaseLostError, RunstateError, WaitTimeoutError } from './errors.js';
import { Lease, declareLost } from './leases.js';
import { type Session, waitAcrossReconnects } from './session.js';
import { now } from './util.js';
import { type LeaseHandle, Op } from './wire.js';

export const IDLE_WAIT_MS = 30_000; // how long one parked receive lasts before it is made again

export interface ReceiveArgs {
  scopeId: string;
  mailbox: string;
  leaseSeconds: number;
  wait: boolean;
  timeoutMs: number;
  autoRenew: boolean;
  signal?: AbortSignal | undefined;
}

export async function receive<T>(session: Session, a: ReceiveArgs): Promise<Delivery<T> | null> {
  const args = {
    scope: a.scopeId,
    mailbox: a.mailbox,
    lease_seconds: a.leaseSeconds,
    wait: a.wait,
    timeout_ms: a.timeoutMs,
  };
  const giveBack = (reply: Reply): void => {
    const body = reply['delivery'] as Reply | null | undefined;
    if (body) session.conn.sendNow(Op.DELIVERY_RELEASE, { lease: body['lease'] });
  };
  let reply: Reply;
  let sentAt: number;
  try {
    if (a.wait) {
      ({ reply, sentAt } = await waitAcrossReconnects(session, Op.RECEIVE, args, a.timeoutMs, {
        giveBack,
        stopWhenClosed: true,
        signal: a.signal,
      }));
    } else {
      sentAt = now();
      reply = await session.conn.request(Op.RECEIVE, args);
    }
  } catch (error) {
    if (error instanceof WaitTimeoutError) return null; // a parked receive found nothing
    throw error;
  }
  const body = reply['delivery'] as Reply | null | undefined;
  if (!body) return null;
  const waitedMs = typeof body['waited_ms'] === 'number' ? body['waited_ms'] : 0;
  return new Delivery<T>(session, a.scopeId, a.mailbox, body, sentAt + waitedMs / 1000, a.autoRenew);
}

export interface CompleteOptions {
  /** Becomes the task's recorded result (`outcome`). */
  payload?: unknown;
}

export interface RetryOptions {
  /** Ready again after this many ms instead of the queue's backoff. */
  delayMs?: number;
  reason?: string;
}

export interface SettleReply {
  id: string;
  state: string;
  retry_in_ms?: number | null;
}

export class Delivery<T = unknown> {
  readonly id: string;
  /** `'task'` or `'message'`. */
  readonly kind: string;
  readonly taskId: string | null;
  readonly key: string | null;
  readonly data: T;
  /** This delivery's attempt number, from 1. */
  readonly attempt: number;
  readonly lease: Lease;
  settled = false;
  /** The item's state after settlement. */
  state: string | null = null;

  constructor(
    private readonly session: Session,
    readonly scopeId: string,
    readonly mailbox: string,
    body: Reply,
    confirmedAt: number,
    private autoRenew: boolean,
  ) {
    this.id = body['id'] as string;
    this.kind = body['kind'] as string;
    this.taskId = (body['task_id'] as string | null | undefined) ?? null;
    this.key = (body['key'] as string | null | undefined) ?? null;
    this.data = body['data'] as T;
    this.attempt = Number(body['attempt']);
    const keeper = session.keeper;
    this.lease = new Lease(keeper, body['lease'] as LeaseHandle, {
      scopeId,
      key: this.id,
      generation: this.attempt,
      leaseSeconds: Number(body['lease_seconds']),
      confirmedAt,
      releaseOp: Op.DELIVERY_RELEASE,
    });
    if (autoRenew) keeper.track(this.lease);
    else keeper.know(this.lease); // not renewed here, but told of its loss
  }

  toString(): string {
    return `Delivery(${this.kind} ${this.id} attempt=${this.attempt})`;
  }

  /** The delivery's fencing token (its lease's). */
  token(): string {
    return this.lease.token();
  }

  get isLost(): boolean {
    return this.lease.isLost;
  }

  /** Aborted when the delivery's lease is lost. */
  get signal(): AbortSignal {
    return this.lease.signal;
  }

  /** Extend the lease to `seconds` from now (default: its current length). */
  renew(seconds?: number): Promise<void> {
    return this.lease.renew(seconds);
  }

  /** SUCCEEDED; `payload` becomes the recorded result. */
  async complete(options: CompleteOptions = {}): Promise<void> {
    await this.settle(Op.DELIVERY_COMPLETE, { outcome: options.payload ?? null });
  }

  /** Back on the queue with backoff (or after `delayMs`); FAILED at the attempt limit. */
  async retry(options: RetryOptions = {}): Promise<void> {
    await this.settle(Op.DELIVERY_RETRY, { delay_ms: options.delayMs, reason: options.reason });
  }

  /** Dead-letter it without retry; the task becomes FAILED. */
  async reject(reason?: string): Promise<void> {
    await this.settle(Op.DELIVERY_REJECT, { reason });
  }

  /** Give it back untouched, for another worker, without using an attempt. */
  async requeue(): Promise<void> {
    await this.settle(Op.DELIVERY_RELEASE, {});
  }

  /** Stop renewing and settle nothing: the lease expires and the item is redelivered. */
  abandon(): void {
    this.settled = true;
    this.autoRenew = false;
    this.session.keeper.forget(this.lease);
  }

  private async settle(op: number, args: Record<string, unknown>): Promise<void> {
    if (this.settled) return;
    this.settled = true;
    const lease = this.lease;
    const keeper = this.session.keeper;
    keeper.forget(lease);
    let reply: SettleReply;
    try {
      reply = await this.session.conn.request<SettleReply>(op, { lease: lease.handle, ...args });
    } catch (error) {
      if (error instanceof LeaseLostError) {
        declareLost(lease, `the server refused the settlement: ${error.message}`);
        throw error;
      }
      if (error instanceof RunstateError) {
        // Refused (a bad argument) or unanswered: nothing was decided; the delivery is
        // still ours and may be settled again.
        this.settled = false;
        if (this.autoRenew && !lease.isLost) keeper.track(lease);
      }
      throw error;
    }
    this.state = reply.state;
    lease.markReleased();
  }
}
