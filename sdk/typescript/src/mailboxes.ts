/**
 * Mailboxes (work queues): `rs.mailboxes` defines them, `run.mailbox(name)` uses one.
 *
 * `rs.mailboxes.ensure(name, ...)` defines a queue once for every run;
 * `run.mailbox(name)` addresses it inside one run: `submit` shared tasks (or `submitMany`
 * in one request), `send` plain messages, `receive` one delivery (or `receiveMany`), or
 * `consume` with a handler (`worker.ts`). A mailbox handle is just a name inside a run:
 * making one does no I/O.
 */

import { checkBool, checkLeaseSeconds } from './claims.js';
import { type Delivery, IDLE_WAIT_MS, delayMsOf, receive, receiveMany } from './deliveries.js';
import {
  type Details,
  InvalidArgumentError,
  type RunstateError,
  UnavailableError,
  WaitTimeoutError,
  errorFor,
} from './errors.js';
import { call } from './failover.js';
import type { Session } from './session.js';
import { now } from './util.js';
import { type Needs, type TaskOutcome, type TaskView, Ticket } from './tasks.js';
import { Limits, MAX_FRAME_BYTES, Op, encode } from './wire.js';
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
  /** Paused in every run (`rs.mailboxes.pause`). */
  paused: boolean;
  /** `ensure`'s: whether this call created it (absent from `pause`'s answer). */
  created: boolean;
}

export class Mailboxes {
  constructor(private readonly session: Session) {}

  /** Create the mailbox, or bring its settings to these values. Idempotent. */
  ensure(name: string, options: EnsureOptions = {}): Promise<MailboxInfo> {
    return call<MailboxInfo>(this.session.conn, Op.MAILBOX_ENSURE, {
      name,
      mode: options.mode ?? 'WORK',
      max_attempts: options.maxAttempts ?? Limits.DEFAULT_MAX_ATTEMPTS,
      retry_backoff_ms: options.retryBackoffMs ?? Limits.DEFAULT_RETRY_BACKOFF_MS,
    });
  }

  /** Pause the mailbox in every run of this tenant: it takes submits and sends but
   * delivers nothing until `resume`; running deliveries finish. Durable; idempotent;
   * NotFoundError for a mailbox never ensured. */
  pause(name: string): Promise<MailboxInfo> {
    return call<MailboxInfo>(this.session.conn, Op.MAILBOX_PAUSE, { name, paused: true });
  }

  /** Deliver again from the mailbox in every run (parked receives are served at once);
   * a pause in one run (`run.mailbox(name).pause()`) still holds that one. */
  resume(name: string): Promise<MailboxInfo> {
    return call<MailboxInfo>(this.session.conn, Op.MAILBOX_PAUSE, { name, paused: false });
  }
}

/** ISO 8601 text, a Date, or seconds since the epoch. */
export type Instant = string | Date | number;

/** When and in what order an item is delivered: `submit`'s, `submitMany` items' and
 * `send`'s options (protocol.md, "Delayed items, priorities and fair shares"). */
export interface OrderOptions {
  /** DELAYED, not delivered, for this many seconds (0 or more); not with `notBefore`. */
  delaySeconds?: number;
  /** DELAYED until then (the forms of `deadline`); not with `delaySeconds`. */
  notBefore?: Instant;
  /** 0 (the default) to 9, higher delivered first, first-in first-out within one.
   * Part of the input: the same key with another priority is IDEMPOTENCY_CONFLICT. */
  priority?: number;
  /** Within one priority, ready items of different fairness keys (a customer id, say)
   * are delivered round robin; 1 to 256 UTF-8 bytes. */
  fairnessKey?: string;
}

/** What a task depends on (protocol.md, "Tasks after tasks, and children"). */
export interface LinkOptions {
  /** Tasks of this run (tickets or ids, at most 64) it waits for: BLOCKED until each has
   * ended; it runs if they all SUCCEEDED, and ends CANCELLED naming the parent
   * otherwise, unless `onParentFailure: 'run'`. Its deliveries carry `parents`. */
  after?: Array<Ticket<unknown> | string>;
  /** With `after`: `'cancel'` (the default) or `'run'`. */
  onParentFailure?: 'cancel' | 'run';
  /** A task of this run it is a child of: cancelled with it (`ticket.children()`). */
  parent?: Ticket<unknown> | string;
}

/** Limits by key, made on the fly (protocol.md, "Limits by key"): `submit`'s and
 * `submitMany` items' options. The newest submit states a key's limit; a task held
 * back by its key does not hold back tasks of other keys. */
export interface KeyLimitOptions {
  /** With `concurrencyLimit`: at most that many tasks with this key run at once in
   * this mailbox of the run; 1 to 512 UTF-8 bytes. */
  concurrencyKey?: string;
  /** 1 to `max_concurrency_limit` (10000); with `concurrencyKey`. */
  concurrencyLimit?: number;
  /** With `rateLimit`: at most that many deliveries of tasks with this key per period
   * in this mailbox of the run; 1 to 512 UTF-8 bytes. */
  rateKey?: string;
  /** 1 to `max_rate_limit` (1000000); with `rateKey`. */
  rateLimit?: number;
  /** The period in seconds, 0.01 to 86400 (1 by default); with `rateKey`. */
  ratePeriodSeconds?: number;
}

/** `args` with the task's limits by key (only the fields given); the server checks them
 * (INVALID_ARGUMENT naming the field), as in rsclient. */
function keyLimits(args: Record<string, unknown>, options: KeyLimitOptions): Record<string, unknown> {
  const { concurrencyKey, concurrencyLimit, rateKey, rateLimit, ratePeriodSeconds } = options;
  if (concurrencyKey !== undefined) args['concurrency_key'] = concurrencyKey;
  if (concurrencyLimit !== undefined) args['concurrency_limit'] = concurrencyLimit;
  if (rateKey !== undefined) args['rate_key'] = rateKey;
  if (rateLimit !== undefined) args['rate_limit'] = rateLimit;
  if (ratePeriodSeconds !== undefined) args['rate_period_seconds'] = ratePeriodSeconds;
  return args;
}

export interface SubmitOptions extends OrderOptions, LinkOptions, KeyLimitOptions {
  /** One task per (run, key): the same key and input joins the existing task. */
  key?: string;
  subscriberId?: string;
  /** ISO 8601 text, a Date, or seconds since the epoch: EXPIRED if not finished by then. */
  deadline?: Instant;
  /** Deliver it only when this capacity is free, taken at once (see `Needs`). Part of
   * the input: the same key with other needs is IDEMPOTENCY_CONFLICT. */
  needs?: Needs;
  /** Put the new task in this task group of the run (`run.group(name)`); 1 to 128
   * UTF-8 bytes. */
  group?: string;
  /** The server answers with id, state and `created` only (a smaller reply); the
   * ticket's `view` then holds just those. */
  slim?: boolean;
}

/** `submitAndWait`'s options: `submit`'s, and `result`'s `timeoutMs` and `outcomeOnly`. */
export interface SubmitAndWaitOptions extends SubmitOptions {
  /** How long to wait; absent waits as long as it takes. */
  timeoutMs?: number;
  /** Ask for the outcome only: the answer is a `TaskOutcome`, not the whole view. */
  outcomeOnly?: boolean;
}

/** One task of `submitMany`: `submit`'s data and options. */
export interface SubmitItem extends OrderOptions, LinkOptions, KeyLimitOptions {
  data: unknown;
  key?: string;
  subscriberId?: string;
  deadline?: Instant;
  needs?: Needs;
  group?: string;
}

export interface ReceiveManyOptions extends ReceiveOptions {
  /** Up to this many deliveries (1 to `max_receive_batch`, 256). */
  max: number;
}

export interface SendOptions extends OrderOptions {
  /** Deduplicates sends to this queue and run (7 days by default); the priority is
   * part of its input too. */
  workKey?: string;
  /** Deliver it only when this capacity is free, as for `submit`. */
  needs?: Needs;
  /** With `debounceSeconds`: while a message sent with this key waits undelivered in
   * this queue, a send replaces its data and moves its due time to now + the window
   * (`replaced: true`, its id); otherwise a new message is made, due at now + the
   * window. Once delivered, the next send starts a new one. Not with `workKey`, `needs`
   * or a delay (protocol.md, "Debounced sends"). */
  debounceKey?: string;
  /** The debounce window in seconds: more than 0, at most `max_debounce_seconds`. */
  debounceSeconds?: number;
}

export interface SendResult {
  id: string;
  replay: boolean;
  /** Only for a send with `debounceKey`: whether it replaced the waiting message's data. */
  replaced?: boolean;
}

export interface ReceiveOptions {
  leaseSeconds?: number;
  /** Park on the server until an item is ready (up to `timeoutMs`). */
  wait?: boolean;
  timeoutMs?: number;
  signal?: AbortSignal;
  /** The delivery's lease ends the moment this client's connection closes (its task goes
   * back to the queue at once), and is lost here then. Default false. */
  releaseOnDisconnect?: boolean;
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
  /** Submitted or sent with a delay that has not yet run out. */
  delayed: number;
  /** Tasks suspended until a signal or their timeout (`delivery.suspend`). */
  waiting: number;
  consumers: number;
  dead_letters: number;
  /** Delivers nothing: paused in this run or in every run. */
  paused: boolean;
  /** BLOCKED tasks: submitted `after` tasks that have not all ended. */
  blocked_by_parents: number;
}

function deadlineSeconds(value: Instant | undefined, name = 'deadline'): number | undefined {
  if (value === undefined) return undefined;
  if (typeof value === 'number') return value;
  const date = typeof value === 'string' ? new Date(value) : value;
  if (!(date instanceof Date) || Number.isNaN(date.getTime())) {
    throw new InvalidArgumentError(`${name} must be an ISO 8601 timestamp, got ${String(value)}`);
  }
  return date.getTime() / 1000;
}

/** `args` with the item's delay and place (only the fields given); the server checks
 * priority and fairnessKey (INVALID_ARGUMENT naming the field), as in rsclient. */
function order(args: Record<string, unknown>, options: OrderOptions): Record<string, unknown> {
  const { delaySeconds, notBefore, priority, fairnessKey } = options;
  if (delaySeconds !== undefined && notBefore !== undefined) {
    throw new InvalidArgumentError('give delaySeconds or notBefore, not both');
  }
  if (delaySeconds !== undefined) args['delay_ms'] = delayMsOf(delaySeconds);
  if (notBefore !== undefined) args['not_before'] = deadlineSeconds(notBefore, 'notBefore');
  if (priority !== undefined) args['priority'] = priority;
  if (fairnessKey !== undefined) args['fairness_key'] = fairnessKey;
  return args;
}

/** `args` with the task's links (only those given): tickets as their ids. */
function links(args: Record<string, unknown>, options: LinkOptions): Record<string, unknown> {
  const { after, onParentFailure, parent } = options;
  const idOf = (task: Ticket<unknown> | string): string => (typeof task === 'string' ? task : task.id);
  if (after !== undefined) {
    if (!Array.isArray(after)) throw new InvalidArgumentError('after must be an array of tickets or task ids');
    args['after'] = after.map(idOf);
  }
  if (onParentFailure !== undefined) args['on_parent_failure'] = onParentFailure;
  if (parent !== undefined) args['parent'] = idOf(parent);
  return args;
}

/** Items cut into requests of at most MAX_SUBMIT_BATCH items and, unless one item alone
 * is larger, at most half a frame of encoded items. */
function chunks(items: Array<Record<string, unknown>>): Array<Array<Record<string, unknown>>> {
  const budget = MAX_FRAME_BYTES / 2;
  const out: Array<Array<Record<string, unknown>>> = [];
  let current: Array<Record<string, unknown>> = [];
  let size = 0;
  for (const item of items) {
    let n = 0;
    try {
      n = encode(item).length;
    } catch {
      n = 0; // the request refuses it, naming why
    }
    if (current.length > 0 && (current.length >= Limits.MAX_SUBMIT_BATCH || size + n > budget)) {
      out.push(current);
      current = [];
      size = 0;
    }
    current.push(item);
    size += n;
  }
  if (current.length > 0) out.push(current);
  return out;
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

  /** Submit a shared task; the same key and input (data, needs and priority) joins the
   * existing task. `delaySeconds` or `notBefore` (the forms of `deadline`; not both):
   * DELAYED, never delivered before then. `priority`: 0 (default) to 9, higher first.
   * `fairnessKey`: ready tasks of one priority are delivered round robin between keys.
   * `concurrencyKey` with `concurrencyLimit`, `rateKey` with `rateLimit` (and
   * `ratePeriodSeconds`): limits by key (see `KeyLimitOptions`). */
  async submit<R = unknown>(data: unknown, options: SubmitOptions = {}): Promise<Ticket<R>> {
    const args = keyLimits(order(
      this.args({
        data: data === undefined ? null : data,
        key: options.key,
        subscriber_id: options.subscriberId,
        deadline: deadlineSeconds(options.deadline),
        needs: options.needs,
        group: options.group,
        slim: options.slim === true ? true : undefined,
      }),
      options,
    ), options);
    if (options.after !== undefined || options.onParentFailure !== undefined || options.parent !== undefined) {
      links(args, options);
    }
    const spans = this.session.spans;
    const view =
      spans === null
        ? await call<TaskView<R>>(this.session.conn, Op.TASK_SUBMIT, args)
        : await spans.submitted(this.scopeId, this.name, args, () =>
            call<TaskView<R>>(this.session.conn, Op.TASK_SUBMIT, args),
          );
    return new Ticket<R>(this.session, this.scopeId, view.id, view);
  }

  /** `submit(data, options)` then `ticket.result({ timeoutMs, outcomeOnly })`, for a
   * caller that awaits the result right after submitting: with a `key`, both requests go
   * in one write (the wait names the task by key, protocol.md "Submit and wait in one
   * write"), one round trip instead of two. The task's final view (its `id` included),
   * or with `outcomeOnly` just its id, state, outcome and reason (a `TaskOutcome`); a
   * timeout throws WaitTimeoutError and the task keeps going, as `result()`. */
  submitAndWait<R = unknown>(
    data: unknown,
    options: SubmitAndWaitOptions & { outcomeOnly: true },
  ): Promise<TaskOutcome<R>>;
  submitAndWait<R = unknown>(
    data: unknown,
    options?: SubmitAndWaitOptions & { outcomeOnly?: false },
  ): Promise<TaskView<R>>;
  submitAndWait<R = unknown>(
    data: unknown,
    options?: SubmitAndWaitOptions,
  ): Promise<TaskView<R> | TaskOutcome<R>>;
  async submitAndWait<R = unknown>(
    data: unknown,
    options: SubmitAndWaitOptions = {},
  ): Promise<TaskView<R> | TaskOutcome<R>> {
    const { timeoutMs, outcomeOnly, slim: _slim, ...submitOptions } = options;
    const limit = timeoutMs === undefined ? null : Math.max(0, Math.floor(timeoutMs));
    const key = submitOptions.key;
    const only = outcomeOnly === true;
    if (key === undefined) {
      const ticket = await this.submit<R>(data, { ...submitOptions, slim: true });
      return ticket.result(limit === null ? { outcomeOnly: only } : { timeoutMs: limit, outcomeOnly: only });
    }
    const conn = this.session.conn;
    const started = now();
    const left = (): { timeoutMs?: number; outcomeOnly: boolean } =>
      limit === null
        ? { outcomeOnly: only }
        : { timeoutMs: Math.max(0, limit - Math.floor((now() - started) * 1000)), outcomeOnly: only };
    const waitMs = limit === null ? Limits.MAX_WAIT_TIMEOUT_MS : limit;
    // On a ready connection both are sent in this turn, in order: one write.
    const withdraw = new AbortController();
    const submitArgs = keyLimits(order(
      this.args({
        data: data === undefined ? null : data,
        key,
        subscriber_id: submitOptions.subscriberId,
        deadline: deadlineSeconds(submitOptions.deadline),
        needs: submitOptions.needs,
        group: submitOptions.group,
        slim: true,
      }),
      submitOptions,
    ), submitOptions);
    links(submitArgs, submitOptions);
    const waitArgs = { scope: this.scopeId, key, timeout_ms: waitMs };
    const submitted = conn.request<TaskView<R>>(Op.TASK_SUBMIT, submitArgs);
    const waited = conn.requestWait(
      Op.TASK_RESULT,
      only ? { ...waitArgs, outcome_only: true } : waitArgs,
      { timeoutMs: waitMs, signal: withdraw.signal },
    );
    waited.catch(() => undefined); // read below, or withdrawn
    let view: TaskView<R>;
    try {
      view = await submitted;
    } catch (error) {
      withdraw.abort(error); // the wait is withdrawn with CANCEL
      if (!(error instanceof UnavailableError)) throw error;
      // Lost on the way: a keyed submit is sent again safely (it joins its task).
      return (await this.submit<R>(data, { ...submitOptions, slim: true })).result(left());
    }
    let outcome: TaskView<R> | TaskOutcome<R>;
    try {
      outcome = (await waited) as unknown as TaskView<R> | TaskOutcome<R>;
    } catch (error) {
      const endless = error instanceof WaitTimeoutError && limit === null;
      if (!(error instanceof UnavailableError) && !endless) throw error;
      return new Ticket<R>(this.session, this.scopeId, view.id, view).result(left());
    }
    if (outcome.id !== view.id) {
      // The key named another task by then: wait for the one submitted.
      return new Ticket<R>(this.session, this.scopeId, view.id, view).result(left());
    }
    return outcome;
  }

  /** Submit many tasks in as few requests as `max_submit_batch` (256 items) and the
   * frame limit allow (a request holds at most half a frame of items). One answer per
   * item, in order: a Ticket (its `view` holds id, state and `created`), or the error
   * that item alone was refused with; a refused item changes nothing and does not stop
   * the others. An item too large for a frame of its own is answered with
   * InvalidArgumentError and never sent. */
  async submitMany<R = unknown>(items: Iterable<SubmitItem>): Promise<Array<Ticket<R> | RunstateError>> {
    const wire: Array<Record<string, unknown>> = [];
    let index = 0;
    for (const item of items) {
      if (item === null || typeof item !== 'object' || !('data' in item)) {
        throw new InvalidArgumentError(`items[${index}] must be an object with 'data'`);
      }
      wire.push(
        keyLimits(order(
          {
            data: item.data === undefined ? null : item.data,
            key: item.key,
            subscriber_id: item.subscriberId,
            deadline: deadlineSeconds(item.deadline),
            needs: item.needs,
            group: item.group,
          },
          item,
        ), item),
      );
      links(wire[wire.length - 1]!, item);
      index += 1;
    }
    const spans = this.session.spans;
    if (spans === null) return this.submitEach<R>(wire);
    // one submit span, its context in every item (tracing.ts)
    return spans.submitted(this.scopeId, this.name, { items: wire }, () => this.submitEach<R>(wire));
  }

  private async submitEach<R>(wire: Array<Record<string, unknown>>): Promise<Array<Ticket<R> | RunstateError>> {
    const answers: Array<Ticket<R> | RunstateError> = [];
    for (const chunk of chunks(wire)) {
      let reply: { results: Array<Record<string, unknown>> };
      try {
        reply = await call(this.session.conn, Op.TASK_SUBMIT_MANY, this.args({ items: chunk }));
      } catch (error) {
        if (chunk.length > 1 || !(error instanceof InvalidArgumentError)) throw error;
        answers.push(error); // one item over the frame limit: never sent
        continue;
      }
      for (const result of reply.results) {
        const error = result['error'] as { code: string; message: string; details: Details | null } | undefined;
        if (error) answers.push(errorFor(error.code, error.message, error.details));
        else {
          const view = result as unknown as TaskView<R>;
          answers.push(new Ticket<R>(this.session, this.scopeId, view.id, view));
        }
      }
    }
    return answers;
  }

  /** Put a plain message on the queue. `needs`, `delaySeconds`, `notBefore`, `priority`
   * and `fairnessKey` as for `submit`; `debounceKey` and `debounceSeconds` fold sends
   * into one waiting message (see `SendOptions`). */
  async send(data: unknown, options: SendOptions = {}): Promise<SendResult> {
    const args = order(
      this.args({
        data: data === undefined ? null : data,
        work_key: options.workKey,
        needs: options.needs,
      }),
      options,
    );
    if (options.debounceKey !== undefined || options.debounceSeconds !== undefined) {
      args['debounce_key'] = options.debounceKey ?? null;
      args['debounce_seconds'] = options.debounceSeconds ?? null;
    }
    const spans = this.session.spans;
    if (spans === null) return call<SendResult>(this.session.conn, Op.MESSAGE_SEND, args);
    return spans.submitted(this.scopeId, this.name, args, () =>
      call<SendResult>(this.session.conn, Op.MESSAGE_SEND, args),
    );
  }

  /** One delivery, or null if the queue is empty. Leased for `leaseSeconds` (30) and
   * not renewed for you: call `delivery.renew()` for longer work. */
  receive<T = unknown>(options: ReceiveOptions = {}): Promise<Delivery<T> | null> {
    return receive<T>(this.session, this.receiveArgs(options));
  }

  /** Up to `max` deliveries in one request, in queue order; empty if none is ready
   * (`wait`: parks until one is). Each is leased on its own, not renewed for you. */
  receiveMany<T = unknown>(options: ReceiveManyOptions): Promise<Array<Delivery<T>>> {
    const max = options.max;
    if (!Number.isInteger(max) || max < 1 || max > Limits.MAX_RECEIVE_BATCH) {
      throw new InvalidArgumentError(
        `max must be an integer from 1 to ${Limits.MAX_RECEIVE_BATCH}, got ${String(max)}`,
      );
    }
    return receiveMany<T>(this.session, { ...this.receiveArgs(options), max });
  }

  /** A manual receive's arguments (one place for their defaults and checks): leased for
   * `leaseSeconds` (30), not renewed for you. */
  private receiveArgs(options: ReceiveOptions) {
    const leaseSeconds = options.leaseSeconds ?? Limits.DEFAULT_LEASE_SECONDS;
    checkLeaseSeconds(leaseSeconds);
    return {
      scopeId: this.scopeId,
      mailbox: this.name,
      leaseSeconds,
      wait: options.wait ?? false,
      timeoutMs: options.timeoutMs ?? IDLE_WAIT_MS,
      autoRenew: false,
      signal: options.signal,
      releaseOnDisconnect: checkBool(options.releaseOnDisconnect ?? false),
    };
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
      checkBool(options.releaseOnDisconnect ?? false),
    );
    await worker.run(options.signal, shutdownTimeoutMs);
  }

  /** The newest dead letters, oldest first. */
  async deadLetters<T = unknown>(limit = 100): Promise<Array<DeadLetter<T>>> {
    const reply = await call<{ items: Array<DeadLetter<T>> }>(
      this.session.conn,
      Op.DEAD_LETTERS,
      this.args({ limit }),
    );
    return reply.items;
  }

  /** Counts as the server sees them: ready, running, delayed, consumers, dead_letters. */
  inspect(): Promise<QueueInfo> {
    return call<QueueInfo>(this.session.conn, Op.QUEUE_INSPECT, this.args());
  }

  /** Pause this mailbox in this run alone: it takes submits and sends but delivers
   * nothing until `resume`; running deliveries finish. Durable; idempotent. */
  pause(): Promise<QueueInfo> {
    return call<QueueInfo>(this.session.conn, Op.QUEUE_PAUSE, this.args({ paused: true }));
  }

  /** Deliver again in this run (parked receives are served at once), unless the mailbox
   * is paused in every run (`rs.mailboxes.pause`). */
  resume(): Promise<QueueInfo> {
    return call<QueueInfo>(this.session.conn, Op.QUEUE_PAUSE, this.args({ paused: false }));
  }
}
