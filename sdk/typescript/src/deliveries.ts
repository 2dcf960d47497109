/**
 * Deliveries: one leased hand-out of a task or message to a worker, and `receive`, the
 * one RECEIVE that `Mailbox.receive` and the worker loop both use.
 *
 * A delivery settles once: the first `complete`, `retry`, `reject`, `requeue` or `suspend`
 * decides, and later calls do nothing. A settlement the server refuses because the lease is no
 * longer current (it expired and the task went to another worker) throws LeaseLostError;
 * the task keeps the result of whoever completed it with a valid lease. One refused
 * because its run was cancelled (which ended the delivery) throws ScopeCancelledError
 * and is just as final: the delivery is lost and stays settled. A delivery that
 * arrives for a receive its caller gave up on is handed straight back, never kept.
 *
 * A complete, retry, reject or suspend whose connection drops before its answer (rsd may have recorded it, or
 * not) is sent again, with the same lease handle, once the client has reconnected, for
 * as long as the lease would live (`sendSettlement`): rsd answers a repeat of a
 * settlement it recorded as it answered the first (protocol.md, "Repeated
 * settlements"), so `complete()` returns normally and the result is recorded once. The
 * lease is not renewed meanwhile (the first settlement may have ended it). A requeue is
 * sent once, as in rsclient: the lease running out hands the item back anyway.
 *
 * Of a sharded cluster, a delivery is settled on the connection it came on (its shard's);
 * if its run moved to another shard meanwhile (the delivery's lease with it), the old
 * shard answers MOVED and the settlement follows the lease there (`Lease.follow`), so a
 * delivery in flight across a move completes once, on the run's new shard.
 *
 * Fewer round trips: `receiveMany` takes up to `max` deliveries in one RECEIVE, and a
 * settlement with `takeNext` takes the next deliveries of the same queue in the same
 * request (protocol.md, "Settle and receive next").
 */

import type { Connection, Reply, Via } from './connection.js';
import {
  InvalidArgumentError,
  LeaseLostError,
  RunstateError,
  ScopeCancelledError,
  UnavailableError,
  WaitTimeoutError,
} from './errors.js';
import { checkBool } from './claims.js';
import { call } from './failover.js';
import { Lease, declareLost, isMoved } from './leases.js';
import { MAX_REDIRECTS } from './sdkrules.js';
import { type Session, waitAcrossReconnects } from './session.js';
import type { TraceContext } from './tracing.js';
import type { TaskOutcome, Ticket } from './tasks.js';
import type { SubmitOptions } from './mailboxes.js';
import { Backoff, now, sleep } from './util.js';
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
  /** Up to this many deliveries (RECEIVE's `max`); absent: the single form. */
  max?: number | undefined;
  /** Each delivery's lease ends with the connection it came on (and is lost here then). */
  releaseOnDisconnect?: boolean | undefined;
}

export async function receive<T>(session: Session, a: ReceiveArgs): Promise<Delivery<T> | null> {
  const got = await receiveMany<T>(session, { ...a, max: undefined });
  return got[0] ?? null;
}

/** The delivery bodies of a RECEIVE reply, in either form. */
function bodies(reply: Reply): Reply[] {
  const many = reply['deliveries'] as Reply[] | null | undefined;
  if (many) return many;
  const body = reply['delivery'] as Reply | null | undefined;
  return body ? [body] : [];
}

function deliveriesOf<T>(
  session: Session,
  scopeId: string,
  mailbox: string,
  list: Reply[],
  sentAt: number,
  autoRenew: boolean,
  link: number | null,
  conn: Connection,
): Array<Delivery<T>> {
  return list.map((body) => {
    const waitedMs = typeof body['waited_ms'] === 'number' ? body['waited_ms'] : 0;
    return new Delivery<T>(session, scopeId, mailbox, body, sentAt + waitedMs / 1000, autoRenew, link, conn);
  });
}

export async function receiveMany<T>(session: Session, a: ReceiveArgs): Promise<Array<Delivery<T>>> {
  const args: Record<string, unknown> = {
    scope: a.scopeId,
    mailbox: a.mailbox,
    lease_seconds: a.leaseSeconds,
    wait: a.wait,
    timeout_ms: a.timeoutMs,
  };
  if (a.max !== undefined) args['max'] = a.max;
  const bound = checkBool(a.releaseOnDisconnect ?? false);
  if (bound) args['release_on_disconnect'] = true;
  const giveBack = (reply: Reply, conn: Connection): void => {
    for (const body of bodies(reply)) conn.sendNow(Op.DELIVERY_RELEASE, { lease: body['lease'] });
  };
  let reply: Reply;
  let sentAt: number;
  let link: number; // the connection the deliveries come on, and its link then
  let conn: Connection;
  try {
    if (a.wait) {
      ({ reply, sentAt, link, conn } = await waitAcrossReconnects(session, Op.RECEIVE, args, a.timeoutMs, {
        giveBack,
        stopWhenClosed: true,
        signal: a.signal,
      }));
    } else {
      sentAt = now();
      const via: Via = { conn: null, link: 0 };
      reply = await call(session.conn, Op.RECEIVE, args, via); // sent again only if not executed
      link = via.link;
      conn = via.conn ?? session.conn;
    }
  } catch (error) {
    if (error instanceof WaitTimeoutError) return []; // a parked receive found nothing
    throw error;
  }
  return deliveriesOf<T>(
    session,
    a.scopeId,
    a.mailbox,
    bodies(reply),
    sentAt,
    a.autoRenew,
    bound ? link : null,
    conn,
  );
}

export interface NextOptions {
  /** Also take up to this many next deliveries of the same queue, in the same request
   * (never waiting); they are returned, leased like this one. Default 0. */
  takeNext?: number;
}

export interface CompleteOptions extends NextOptions {
  /** Becomes the task's recorded result (`outcome`). */
  payload?: unknown;
}

export interface RetryOptions extends NextOptions {
  /** Ready again after this many seconds instead of the queue's backoff (this retry
   * only); not with `delayMs`. */
  delaySeconds?: number;
  /** Ready again after this many ms instead of the queue's backoff. */
  delayMs?: number;
  reason?: string;
}

/** `delaySeconds` as the wire's whole milliseconds (InvalidArgumentError for a
 * negative, NaN or infinite delay, or one that is not a number). */
export function delayMsOf(delaySeconds: number): number {
  if (typeof delaySeconds !== 'number' || !Number.isFinite(delaySeconds) || delaySeconds < 0) {
    throw new InvalidArgumentError(
      `delaySeconds must be a finite number of seconds, 0 or more, got ${String(delaySeconds)}`,
    );
  }
  return Math.round(delaySeconds * 1000);
}

export interface SettleReply {
  id: string;
  state: string;
  retry_in_ms?: number | null;
}

/** The signal that ended a task's wait (`Delivery.suspend`, `Ticket.signal`). */
export interface TaskSignal {
  name: string;
  data: unknown;
}

export interface SuspendOptions {
  /** How long the task waits before it is delivered again without a signal (default and
   * longest: 366 days). */
  timeoutSeconds?: number | undefined;
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
  /** The signal that woke this task's last wait (`suspend`): `{ name, data }`; null
   * before any wait and after one that timed out. (rsclient's `delivery.signal`: here
   * `signal` is the AbortSignal of the delivery's lease.) */
  readonly signalled: TaskSignal | null;
  /** Its submitter's W3C trace context (`traceparent`, `tracestate`), or null: the
   * parent of the `handle` span (tracing.ts). */
  readonly trace: TraceContext | null;
  /** A task submitted `after` others: each parent's id -> its outcome (`{ id, state,
   * outcome, reason }`; null for one forgotten); `{}` otherwise. */
  readonly parents: Record<string, TaskOutcome | null>;
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
    /** For a delivery taken with `releaseOnDisconnect`: the connection it came on. */
    link: number | null = null,
    /** The connection it came on (default: the client's first): settled there. */
    conn: Connection | null = null,
  ) {
    this.id = body['id'] as string;
    this.kind = body['kind'] as string;
    this.taskId = (body['task_id'] as string | null | undefined) ?? null;
    this.key = (body['key'] as string | null | undefined) ?? null;
    this.data = body['data'] as T;
    this.attempt = Number(body['attempt']);
    this.signalled = (body['signal'] as TaskSignal | null | undefined) ?? null;
    this.trace = (body['trace'] as TraceContext | null | undefined) ?? null;
    this.parents = (body['parents'] as Record<string, TaskOutcome | null> | undefined) ?? {};
    const keeper = session.keeper;
    this.lease = new Lease(keeper, body['lease'] as LeaseHandle, {
      scopeId,
      key: this.id,
      generation: this.attempt,
      leaseSeconds: Number(body['lease_seconds']),
      confirmedAt,
      releaseOp: Op.DELIVERY_RELEASE,
      releaseOnDisconnect: link !== null,
      conn,
    });
    if (autoRenew) keeper.track(this.lease);
    else keeper.know(this.lease); // not renewed here, but told of its loss
    if (link !== null) keeper.bind(this.lease, link);
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

  /** SUCCEEDED; `payload` becomes the recorded result. With `takeNext`: the next
   * deliveries taken in the same request (else an empty array). */
  complete(options: CompleteOptions = {}): Promise<Array<Delivery<T>>> {
    const spans = this.session.spans;
    if (spans !== null) {
      return spans.settled(
        'complete',
        () => this.settle(Op.DELIVERY_COMPLETE, { outcome: options.payload ?? null }, options.takeNext),
        this,
      );
    }
    return this.settle(Op.DELIVERY_COMPLETE, { outcome: options.payload ?? null }, options.takeNext);
  }

  /** Back on the queue with backoff (or after `delaySeconds`, or `delayMs`, instead:
   * for this retry only); FAILED at the attempt limit. */
  async retry(options: RetryOptions = {}): Promise<Array<Delivery<T>>> {
    let delayMs = options.delayMs;
    if (options.delaySeconds !== undefined) {
      if (delayMs !== undefined) throw new InvalidArgumentError('give delaySeconds or delayMs, not both');
      delayMs = delayMsOf(options.delaySeconds);
    }
    const args = { delay_ms: delayMs, reason: options.reason };
    const spans = this.session.spans;
    if (spans !== null) {
      return spans.settled('retry', () => this.settle(Op.DELIVERY_RETRY, args, options.takeNext), this);
    }
    return this.settle(Op.DELIVERY_RETRY, args, options.takeNext);
  }

  /** Dead-letter it without retry; the task becomes FAILED. */
  reject(reason?: string, options: NextOptions = {}): Promise<Array<Delivery<T>>> {
    const spans = this.session.spans;
    if (spans !== null) {
      return spans.settled('reject', () => this.settle(Op.DELIVERY_REJECT, { reason }, options.takeNext), this);
    }
    return this.settle(Op.DELIVERY_REJECT, { reason }, options.takeNext);
  }

  /** Give it back untouched, for another worker, without using an attempt. */
  async requeue(): Promise<void> {
    await this.settle(Op.DELIVERY_RELEASE, {}, 0);
  }

  /** Wait for the signal `name` without holding a worker: settled without using an
   * attempt, the task is WAITING (its lease ends), and it is delivered again when
   * `ticket.signal(name, data)` comes (then `signalled` is `{ name, data }`) or after
   * `timeoutSeconds` (`signalled` null). A signal sent before this call was kept and
   * wakes it at once (`state` is then PENDING, not WAITING). */
  /** Submit a task in this delivery's run as a child of its task (`parent`): a
   * cancellation or deadline of this task cancels it (and its own children);
   * `ticket.children()` lists it. The options are `Mailbox.submit`'s. */
  async submitChild<R = unknown>(
    mailbox: string,
    data: unknown,
    options: Omit<SubmitOptions, 'parent'> = {},
  ): Promise<Ticket<R>> {
    if (this.taskId === null) {
      throw new InvalidArgumentError("a message has no children: only a task's delivery does");
    }
    const { Mailbox } = await import('./mailboxes.js'); // (mailboxes.ts imports this module)
    return new Mailbox(this.session, this.scopeId, mailbox).submit<R>(data, {
      ...options,
      parent: this.taskId,
    });
  }

  async suspend(name: string, options: SuspendOptions = {}): Promise<void> {
    await this.settle(Op.DELIVERY_SUSPEND, { name, timeout_seconds: options.timeoutSeconds ?? null }, 0);
  }

  /** Stop renewing and settle nothing: the lease expires and the item is redelivered. */
  abandon(): void {
    this.settled = true;
    this.autoRenew = false;
    this.session.keeper.forget(this.lease);
  }

  /** Publish `data` (at most 64 KiB encoded) as a progress event of this task: every
   * follower of `ticket.events()` gets it, and late ones too while it is retained.
   * Fenced like `complete`: a delivery whose lease is lost throws LeaseLostError and
   * nothing is published. Its seq. Sent again after a lost connection while the lease
   * lasts (at least once: a repeat whose first was recorded shows as a second event). */
  async progress(data: unknown = null): Promise<number> {
    const lease = this.lease;
    if (this.settled) throw new LeaseLostError(`delivery ${this.id} is settled: no more progress`);
    try {
      const { reply } = await this.sendSettlement(Op.DELIVERY_PROGRESS, { lease: lease.handle, data });
      return (reply as unknown as Reply)['seq'] as number;
    } catch (error) {
      if (error instanceof LeaseLostError) {
        declareLost(lease, `the server refused a progress event: ${error.message}`);
      }
      throw error;
    }
  }

  private async settle(
    op: number,
    args: Record<string, unknown>,
    takeNext = 0,
  ): Promise<Array<Delivery<T>>> {
    if (this.settled) return [];
    if (!Number.isInteger(takeNext) || takeNext < 0) {
      throw new InvalidArgumentError(`takeNext must be a non-negative integer, got ${String(takeNext)}`);
    }
    this.settled = true;
    const lease = this.lease;
    const keeper = this.session.keeper;
    keeper.settling(lease);
    const request: Record<string, unknown> = { lease: lease.handle, ...args };
    const bound = lease.releaseOnDisconnect;
    if (takeNext > 0) {
      request['next'] = {
        lease_seconds: lease.leaseSeconds,
        max: takeNext,
        ...(bound ? { release_on_disconnect: true } : {}),
      };
    }
    let reply: SettleReply;
    let sentAt: number;
    let link: number;
    try {
      ({ reply, sentAt, link } = await this.sendSettlement(op, request));
      this.state = reply.state;
      lease.markReleased();
    } catch (error) {
      if (error instanceof LeaseLostError) {
        declareLost(lease, `the server refused the settlement: ${error.message}`);
        throw error;
      }
      if (error instanceof ScopeCancelledError) {
        // The run was cancelled and took the delivery with it: final, like a loss.
        declareLost(lease, error.message);
        throw error;
      }
      if (error instanceof RunstateError) {
        // Refused (a bad argument) or unanswered: nothing was decided; the delivery is
        // still ours and may be settled again.
        this.settled = false;
        if (this.autoRenew && !lease.isLost) keeper.track(lease);
      }
      throw error;
    } finally {
      keeper.settled(lease);
    }
    if (takeNext === 0) return [];
    const next = (reply as unknown as Reply)['next'] as Reply[] | null | undefined;
    return deliveriesOf<T>(
      this.session,
      this.scopeId,
      this.mailbox,
      next ?? [],
      sentAt,
      this.autoRenew,
      bound ? link : null,
      lease.conn,
    );
  }

  /** Send the settlement; if the connection fails before its answer, send a complete,
   * retry or reject again (the
   * same handle: a repeat of a recorded one is answered as the first) after the client
   * reconnects, until the lease's own deadline or the client's close, which throw the
   * last UnavailableError. Its reply, and the send time of the request that got it. */
  private async sendSettlement(
    op: number,
    request: Record<string, unknown>,
  ): Promise<{ reply: SettleReply; sentAt: number; link: number }> {
    let backoff: Backoff | null = null; // made on the first failure: most settle at once
    let failure: unknown = null;
    let redirects = 0; // MOVED answers in a row
    for (;;) {
      if (failure !== null) await this.reachBeforeDeadline(failure);
      // The connection it came on (of a sharded cluster, its shard's; its run's new
      // shard's once the lease followed it there).
      const conn = this.lease.conn;
      const sentAt = now();
      const link = conn.link;
      try {
        return { reply: await conn.direct<SettleReply>(op, request), sentAt, link };
      } catch (error) {
        // Its run moved to another shard (not executed): sent there, as a MOVED request is.
        if (isMoved(error) && redirects < MAX_REDIRECTS && (await this.lease.follow(conn, error.details))) {
          redirects += 1;
          failure = null;
          continue;
        }
        if (isMoved(error)) throw error; // the map is in flux: not sent again
        const leftMs = (this.lease.lostAt - now()) * 1000;
        if (!(error instanceof UnavailableError) || conn.closed || leftMs <= 0) throw error;
        // A requeue is sent once: resending it would hold a consumer's shutdown for the
        // delivery's whole lease while rsd is down (the lease running out requeues it too).
        if (op === Op.DELIVERY_RELEASE) throw error;
        failure = error;
        backoff ??= new Backoff(50, 1000);
        await sleep(Math.min(backoff.nextPauseMs(), leftMs));
      }
    }
  }

  /** Before a settlement is sent again: be connected while the lease's deadline is still
   * ahead, else throw `failure` (its outcome unknown). rsd answers a resent settlement as
   * the first only while it remembers it (one lease from when it was made): one that
   * reached it later could be refused (STALE_CLAIM) though it was applied. */
  private async reachBeforeDeadline(failure: unknown): Promise<void> {
    const conn = this.lease.conn;
    const pause = new Backoff(50, 1000);
    for (;;) {
      const leftMs = (this.lease.lostAt - now()) * 1000;
      if (leftMs <= 0) throw failure;
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = new Promise<'late'>((resolve) => {
        timer = setTimeout(() => resolve('late'), leftMs);
      });
      try {
        const connecting = conn.connect().then(() => 'connected' as const);
        connecting.catch(() => undefined); // (settled after the deadline: nobody awaits it)
        const outcome = await Promise.race([connecting, late]);
        if (outcome === 'late') throw failure;
      } catch (error) {
        if (error === failure) throw error;
        if (!(error instanceof UnavailableError) || conn.closed) throw error;
        failure = error; // (an attempt under way failed): again
        await sleep(Math.min(pause.nextPauseMs(), leftMs));
        continue;
      } finally {
        clearTimeout(timer);
      }
      if (now() < this.lease.lostAt) return; // connected in time: the resend goes out now
      throw failure;
    }
  }
}
