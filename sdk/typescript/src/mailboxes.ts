/**
 * Mailboxes (work queues): `rs.mailboxes` defines them, `run.mailbox(name)` uses one.
 *
 * `rs.mailboxes.ensure(name, ...)` defines a queue once for every run;
 * `run.mailbox(name)` addresses it inside one run: `submit` shared tasks, `send` plain
 * messages, `receive` one delivery, or `consume` with a handler (`worker.ts`). A mailbox
 * handle is just a name inside a run: making one does no I/O.
 */

import { checkLeaseSeconds } from './claims.js';
import { type Delivery, IDLE_WAIT_MS, receive } from './deliveries.js';
import { InvalidArgumentError } from './errors.js';
import type { Session } from './session.js';
import { type TaskView, Ticket } from './tasks.js';
import { Limits, Op } from './wire.js';
import { type ConsumeOptions, type Handler, Worker } from './worker.js';

export interface EnsureOptions {
  mode?: 'WORK';
  maxAttempts?: number;
  retryBackoffMs?: number;
}

export interface MailboxInfo {
  name: string;
  mode: string;
  max_attempts: number;
  retry_backoff_ms: number;
  created: boolean;
}

export class Mailboxes {
  constructor(private readonly session: Session) {}

  /** Create the mailbox, or bring its settings to these values. Idempotent. */
  ensure(name: string, options: EnsureOptions = {}): Promise<MailboxInfo> {
    return this.session.conn.request<MailboxInfo>(Op.MAILBOX_ENSURE, {
      name,
      mode: options.mode ?? 'WORK',
      max_attempts: options.maxAttempts ?? Limits.DEFAULT_MAX_ATTEMPTS,
      retry_backoff_ms: options.retryBackoffMs ?? Limits.DEFAULT_RETRY_BACKOFF_MS,
    });
  }
}

export interface SubmitOptions {
  /** One task per (run, key): the same key and input joins the existing task. */
  key?: string;
  subscriberId?: string;
  /** ISO 8601 text, a Date, or seconds since the epoch: EXPIRED if not finished by then. */
  deadline?: string | Date | number;
}

export interface SendOptions {
  /** Deduplicates sends to this queue and run (7 days by default). */
  workKey?: string;
}

export interface SendResult {
  id: string;
  replay: boolean;
}

export interface ReceiveOptions {
  leaseSeconds?: number;
  /** Park on the server until an item is ready (up to `timeoutMs`). */
  wait?: boolean;
  timeoutMs?: number;
  signal?: AbortSignal;
}

export interface DeadLetter<T = unknown> {
  id: string;
  kind: string;
  key: string | null;
  data: T;
  attempt: number;
  reason: string;
  at: number;
}

export interface QueueInfo {
  ready: number;
  running: number;
  consumers: number;
  dead_letters: number;
}

function deadlineSeconds(value: SubmitOptions['deadline']): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value === 'number') return value;
  const date = typeof value === 'string' ? new Date(value) : value;
  if (!(date instanceof Date) || Number.isNaN(date.getTime())) {
    throw new InvalidArgumentError(`deadline must be an ISO 8601 timestamp, got ${String(value)}`);
  }
  return date.getTime() / 1000;
}

export class Mailbox {
  constructor(
    private readonly session: Session,
    readonly scopeId: string,
    readonly name: string,
  ) {}

  toString(): string {
    return `Mailbox(${this.scopeId}/${this.name})`;
  }

  private args(extra: Record<string, unknown> = {}): Record<string, unknown> {
    return { scope: this.scopeId, mailbox: this.name, ...extra };
  }

  /** Submit a shared task; the same key and input joins the existing task. */
  async submit<R = unknown>(data: unknown, options: SubmitOptions = {}): Promise<Ticket<R>> {
    const view = await this.session.conn.request<TaskView<R>>(
      Op.TASK_SUBMIT,
      this.args({
        data: data === undefined ? null : data,
        key: options.key,
        subscriber_id: options.subscriberId,
        deadline: deadlineSeconds(options.deadline),
      }),
    );
    return new Ticket<R>(this.session, this.scopeId, view.id, view);
  }

  /** Put a plain message on the queue. */
  send(data: unknown, options: SendOptions = {}): Promise<SendResult> {
    return this.session.conn.request<SendResult>(
      Op.MESSAGE_SEND,
      this.args({ data: data === undefined ? null : data, work_key: options.workKey }),
    );
  }

  /** One delivery, or null if the queue is empty. Leased for `leaseSeconds` (30) and
   * not renewed for you: call `delivery.renew()` for longer work. */
  receive<T = unknown>(options: ReceiveOptions = {}): Promise<Delivery<T> | null> {
    const leaseSeconds = options.leaseSeconds ?? Limits.DEFAULT_LEASE_SECONDS;
    checkLeaseSeconds(leaseSeconds);
    return receive<T>(this.session, {
      scopeId: this.scopeId,
      mailbox: this.name,
      leaseSeconds,
      wait: options.wait ?? false,
      timeoutMs: options.timeoutMs ?? IDLE_WAIT_MS,
      autoRenew: false,
      signal: options.signal,
    });
  }

  /** Run `handler(data, delivery)` on each delivery, `concurrency` at a time, until
   * `signal` aborts or the run is cancelled (see worker.ts). */
  async consume<T = unknown>(handler: Handler<T>, options: ConsumeOptions<T> = {}): Promise<void> {
    const concurrency = options.concurrency ?? 1;
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      throw new InvalidArgumentError(`concurrency must be a positive integer, got ${String(concurrency)}`);
    }
    const leaseSeconds = options.leaseSeconds ?? 60;
    checkLeaseSeconds(leaseSeconds);
    const shutdownTimeoutMs = options.shutdownTimeoutMs ?? 30_000;
    if (!(shutdownTimeoutMs >= 0)) {
      throw new InvalidArgumentError(`shutdownTimeoutMs must be >= 0, got ${String(shutdownTimeoutMs)}`);
    }
    const worker = new Worker<T>(
      this.session,
      this.scopeId,
      this.name,
      handler,
      concurrency,
      leaseSeconds,
      options.onError,
    );
    await worker.run(options.signal, shutdownTimeoutMs);
  }

  /** The newest dead letters, oldest first. */
  async deadLetters<T = unknown>(limit = 100): Promise<Array<DeadLetter<T>>> {
    const reply = await this.session.conn.request<{ items: Array<DeadLetter<T>> }>(
      Op.DEAD_LETTERS,
      this.args({ limit }),
    );
    return reply.items;
  }

  /** Counts as the server sees them: ready, running, consumers, dead_letters. */
  inspect(): Promise<QueueInfo> {
    return this.session.conn.request<QueueInfo>(Op.QUEUE_INSPECT, this.args());
  }
}
