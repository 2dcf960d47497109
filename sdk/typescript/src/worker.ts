/**
 * The worker loop behind `Mailbox.consume()`.
 *
 * What always holds, per delivery: its lease is renewed while the handler runs; a
 * handler that returns completes the delivery (unless it settled it itself); one that
 * throws goes to `onError` and the delivery is retried with backoff. A handler is never
 * interrupted: on loss its `delivery.signal` is aborted, and whatever it returns is left
 * to the new owner (nothing is settled). Idle slots park on the server (no polling).
 * When `signal` aborts: no new work (parked receives are withdrawn with CANCEL), running
 * handlers get `shutdownTimeoutMs` to finish and settle, whatever is still unsettled is
 * handed back (DELIVERY_RELEASE). A cancelled run ends consume() quietly;
 * authentication, permission, configuration and not-found errors are thrown; anything
 * else is retried with backoff.
 *
 * Round trips: never more than `concurrency` deliveries are held at once. One receiver
 * fills every free slot with one batched RECEIVE (`max` = the free slots, parked while
 * none is ready); a slot whose handler is done settles with `takeNext: 1`, so a busy
 * queue costs one request per task, and goes back to the receiver only when that found
 * nothing.
 */

import {
  AuthenticationError,
  InvalidArgumentError,
  LeaseLostError,
  NotFoundError,
  PermissionDeniedError,
  RunstateError,
  ScopeCancelledError,
  UnavailableError,
} from './errors.js';
import { type Delivery, IDLE_WAIT_MS, receiveMany } from './deliveries.js';
import { declareLost } from './leases.js';
import type { Session } from './session.js';
import { Backoff, clipUtf8 } from './util.js';
import { Limits } from './wire.js';

export type Handler<T> = (data: T, delivery: Delivery<T>) => unknown;

export interface ConsumeOptions<T> {
  /** Handlers running at once in this process (default 1). */
  concurrency?: number;
  /** Each delivery's lease, renewed while its handler runs (default 60). */
  leaseSeconds?: number;
  /** Abort to stop: take no new work, drain, requeue the rest. */
  signal?: AbortSignal;
  /** Called with the error and the delivery when a handler throws. */
  onError?: (error: unknown, delivery: Delivery<T>) => unknown;
  /** How long running handlers get to finish once stopped (default 30 000 ms). */
  shutdownTimeoutMs?: number;
  /** Each delivery's lease ends the moment this client's connection closes (a killed
   * worker's tasks go back to the queue at once); its handler's `lease.signal` aborts
   * then, as for any lost lease. Default false. */
  releaseOnDisconnect?: boolean;
}

const FATAL = [AuthenticationError, PermissionDeniedError, InvalidArgumentError, NotFoundError];

export class Worker<T> {
  private stopping = false;
  private failure: unknown = null;
  private readonly receiving = new Set<AbortController>();
  private readonly running = new Set<Delivery<T>>();
  private readonly slots = new Set<Promise<void>>(); // one per held delivery
  private slotFreed: (() => void) | null = null; // wakes a receiver waiting for a free slot
  private idleWaiters: Array<() => void> = [];
  private stopped!: () => void;
  private readonly whenStopped = new Promise<void>((resolve) => {
    this.stopped = resolve;
  });

  constructor(
    private readonly session: Session,
    private readonly scopeId: string,
    private readonly mailbox: string,
    private readonly handler: Handler<T>,
    private readonly concurrency: number,
    private readonly leaseSeconds: number,
    private readonly onError: ConsumeOptions<T>['onError'],
    private readonly releaseOnDisconnect = false,
  ) {}

  async run(signal: AbortSignal | undefined, shutdownTimeoutMs: number): Promise<void> {
    if (signal?.aborted) return;
    const onAbort = (): void => this.stop();
    signal?.addEventListener('abort', onAbort, { once: true });
    const unhold = this.session.conn.hold(); // a running consumer keeps the process alive
    const receiver = this.receiver();
    try {
      await this.whenStopped;
    } finally {
      signal?.removeEventListener('abort', onAbort);
      await this.shutdown(receiver, shutdownTimeoutMs);
      unhold();
    }
    if (this.failure !== null) throw this.failure;
  }

  private stop(failure: unknown = null): void {
    if (failure !== null && this.failure === null) this.failure = failure;
    this.stopping = true;
    for (const ctl of this.receiving) ctl.abort();
    this.wakeReceiver();
    this.stopped();
  }

  private wakeReceiver(): void {
    const wake = this.slotFreed;
    this.slotFreed = null;
    if (wake !== null) wake();
  }

  private async shutdown(receiver: Promise<void>, timeoutMs: number): Promise<void> {
    this.stopping = true;
    for (const ctl of this.receiving) ctl.abort();
    this.wakeReceiver();
    await receiver;
    if (this.running.size > 0) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        new Promise<void>((resolve) => this.idleWaiters.push(resolve)),
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, timeoutMs);
        }),
      ]);
      clearTimeout(timer);
    }
    const unfinished = [...this.running];
    await Promise.all(unfinished.map((delivery) => this.giveBack(delivery, true)));
    // Slots that are idle end now; those whose handler still runs end when it returns.
    if (unfinished.length === 0) await Promise.allSettled([...this.slots]);
  }

  /** Fill the free slots, all of them in one RECEIVE, parked while none is ready. */
  private async receiver(): Promise<void> {
    const backoff = new Backoff(100, 5000);
    while (!this.stopping) {
      const free = this.concurrency - this.slots.size;
      if (free <= 0) {
        await new Promise<void>((resolve) => {
          this.slotFreed = resolve;
        });
        continue;
      }
      const ctl = new AbortController();
      this.receiving.add(ctl);
      let deliveries: Array<Delivery<T>>;
      try {
        deliveries = await receiveMany<T>(this.session, {
          scopeId: this.scopeId,
          mailbox: this.mailbox,
          leaseSeconds: this.leaseSeconds,
          wait: true,
          timeoutMs: IDLE_WAIT_MS,
          autoRenew: true,
          releaseOnDisconnect: this.releaseOnDisconnect,
          signal: ctl.signal,
          max: Math.min(free, Limits.MAX_RECEIVE_BATCH),
        });
      } catch (error) {
        if (this.stopping) return;
        if (error instanceof ScopeCancelledError) {
          this.stop();
          return;
        }
        if (FATAL.some((cls) => error instanceof cls)) {
          this.stop(error);
          return;
        }
        if (this.session.conn.closed) {
          this.stop();
          return;
        }
        this.session.logger.warn(`consume on ${this.mailbox}: receive failed, retrying: ${message(error)}`);
        await backoff.sleep();
        continue;
      } finally {
        this.receiving.delete(ctl);
      }
      backoff.reset();
      for (const delivery of deliveries) this.startSlot(delivery);
    }
  }

  private startSlot(delivery: Delivery<T>): void {
    const slot: Promise<void> = this.slot(delivery)
      .catch((error: unknown) => {
        this.session.logger.error(`consume on ${this.mailbox}: a slot failed: ${message(error)}`);
      })
      .finally(() => {
        this.slots.delete(slot);
        this.wakeReceiver();
      });
    this.slots.add(slot);
  }

  /** Handle `delivery`, then each next one its settlement brought, until none. */
  private async slot(first: Delivery<T>): Promise<void> {
    let delivery: Delivery<T> | null = first;
    while (delivery !== null) {
      if (this.stopping) {
        await this.giveBack(delivery);
        return;
      }
      const spans = this.session.spans;
      const handled: Delivery<T> = delivery;
      // in a `handle` span, the submitter's its parent (tracing.ts)
      delivery = spans === null ? await this.handle(handled) : await spans.handled(handled, () => this.handle(handled));
    }
  }

  /** Run the handler and settle; the next delivery the settlement brought, if any. */
  private async handle(delivery: Delivery<T>): Promise<Delivery<T> | null> {
    this.running.add(delivery);
    try {
      let failed = false;
      let caught: unknown;
      try {
        await this.handler(delivery.data, delivery);
      } catch (error) {
        failed = true;
        caught = error;
      }
      if (delivery.settled) return null;
      if (delivery.isLost) {
        this.session.logger.warn(
          `consume on ${this.mailbox}: lost the lease on ${delivery}; left to its new owner`,
        );
        return null;
      }
      if (failed) return await this.failed(caught, delivery);
      return await this.settle(delivery, () => delivery.complete({ takeNext: this.takeNext() }));
    } finally {
      this.running.delete(delivery);
      if (this.running.size === 0) {
        const waiters = this.idleWaiters;
        this.idleWaiters = [];
        for (const wake of waiters) wake();
      }
    }
  }

  /** How many next deliveries a settlement asks for: this slot's one, unless stopping. */
  private takeNext(): number {
    return this.stopping ? 0 : 1;
  }

  /** Settle, retrying through connection trouble while the lease is ours; the next
   * delivery the settlement brought, if any. */
  private async settle(
    delivery: Delivery<T>,
    settle: () => Promise<Array<Delivery<T>>>,
  ): Promise<Delivery<T> | null> {
    let backoff: Backoff | null = null;
    for (;;) {
      try {
        const got = await settle();
        for (const extra of got.slice(1)) this.startSlot(extra); // only if more were asked for
        return got[0] ?? null;
      } catch (error) {
        if (error instanceof LeaseLostError) {
          this.session.logger.warn(
            `consume on ${this.mailbox}: settling ${delivery} refused, the lease had been lost`,
          );
          return null;
        }
        if (error instanceof ScopeCancelledError) {
          this.session.logger.info(
            `consume on ${this.mailbox}: the run was cancelled; ${delivery} ended with it`,
          );
          delivery.abandon();
          this.stop(); // nothing more to consume in a cancelled run
          return null;
        }
        if (error instanceof UnavailableError) {
          if (delivery.isLost || this.session.conn.closed) return null;
          backoff ??= new Backoff(50, 2000);
          await backoff.sleep();
          continue;
        }
        this.session.logger.error(`consume on ${this.mailbox}: settling ${delivery} refused: ${message(error)}`);
        delivery.abandon();
        return null;
      }
    }
  }

  private async failed(error: unknown, delivery: Delivery<T>): Promise<Delivery<T> | null> {
    if (this.onError !== undefined) {
      try {
        await this.onError(error, delivery);
      } catch (inner) {
        this.session.logger.error(`consume on ${this.mailbox}: onError threw: ${message(inner)}`);
      }
    } else {
      this.session.logger.warn(`consume on ${this.mailbox}: handler failed on ${delivery}: ${message(error)}`);
    }
    if (delivery.settled || delivery.isLost) return null;
    const reason = clipUtf8(describe(error), Limits.MAX_REASON_BYTES);
    return this.settle(delivery, () => delivery.retry({ reason, takeNext: this.takeNext() }));
  }

  /** Hand a delivery back for another worker; if even that fails, let its lease expire. */
  private async giveBack(delivery: Delivery<T>, handlerRunning = false): Promise<void> {
    if (delivery.settled) return;
    if (handlerRunning) {
      // Its handler is still running: tell it, through its signal, that it is not ours.
      declareLost(delivery.lease, 'consume() stopped and handed the delivery back');
    }
    try {
      await delivery.requeue();
    } catch (error) {
      if (error instanceof RunstateError) delivery.abandon();
      else throw error;
    }
  }
}

function message(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

function describe(error: unknown): string {
  if (error instanceof Error) return `${error.name}: ${error.message}` || error.name;
  return String(error) || 'error';
}
