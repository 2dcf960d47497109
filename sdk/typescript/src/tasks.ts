/**
 * Tickets: handles on shared tasks. A ticket is just a task id inside a run.
 *
 * `rs.scope(runId).task(taskId)` re-attaches from any process; nothing is re-run.
 * `result()` parks on the server and the view arrives the moment the task ends: it does
 * not poll; `events()` follows its progress the same way (progress.ts). A timeout
 * throws WaitTimeoutError here only; the task keeps going.
 */

import type { Args } from './connection.js';
import { UnavailableError, WaitTimeoutError } from './errors.js';
import { call } from './failover.js';
import { type Session, waitAcrossReconnects } from './session.js';
import { type TaskEvent, follow } from './progress.js';
import { now } from './util.js';
import { Limits, Op } from './wire.js';

export type TaskState =
  | 'DELAYED' | 'PENDING' | 'RUNNING' | 'WAITING' | 'SUCCEEDED' | 'FAILED' | 'CANCELLED' | 'EXPIRED'
  | 'BLOCKED';

/** What a task or message needs to start (`submit(data, { needs })`): one slot of each
 * pool named in `pools` and the amount of each quota in `quotas`, all taken at once when
 * it is delivered. The slots are held until the delivery settles or its lease ends; the
 * quota is spent. At most 8 pools and 8 quotas. */
export interface Needs {
  pools?: string[];
  quotas?: Record<string, number>;
}

/** A task as the server reports it (field names as on the wire, see protocol.md). */
export interface TaskView<R = unknown> {
  id: string;
  scope: string;
  mailbox: string;
  key: string | null;
  state: TaskState;
  attempt: number;
  outcome: R | null;
  reason: string | null;
  tombstoned: boolean;
  subscribers: string[];
  created_at: number;
  finished_at: number | null;
  deadline: number | null;
  /** While DELAYED (and after): when its delay runs out, as a timestamp; null for a
   * task submitted without a delay. */
  not_before: number | null;
  /** 0 to 9, higher delivered first. */
  priority: number;
  /** Its fair share of the queue, within its priority. */
  fairness_key: string | null;
  /** Only in a submit's reply: whether that submit created the task. */
  created?: boolean;
  /** Only for a task submitted with `needs`: what it needs (pools sorted). */
  needs?: Required<Needs>;
  /** Only for a task submitted with `needs`: while PENDING and found unable to start,
   * the one pool or quota it waits for; null otherwise. */
  waiting_for?: Required<Needs> | null;
  /** Only for a member of a task group: the group's name. */
  group?: string;
  /** Only for a task submitted with limits by key: the keys and limits it was submitted
   * with (their wire names: `concurrency_key`, `concurrency_limit`, `rate_key`,
   * `rate_limit`, `rate_period_seconds`). */
  limits?: Record<string, string | number>;
  /** Only for a task submitted with limits by key: while PENDING and held back by one,
   * that key's state (`kind`, `key`, `limit`, and `running`, or `period_seconds`,
   * `count` and `period_ends_at`); null otherwise. */
  held_by?: Record<string, string | number> | null;
  /** Only for a task submitted with `after`: its parents' ids (each once, in order) and
   * what a parent's failure does to it. */
  after?: string[];
  on_parent_failure?: 'cancel' | 'run';
  /** Only for a child (`parent`, `delivery.submitChild`): its parent's id. */
  parent?: string;
  /** Only for a task with children: how many (`ticket.children()` lists them). */
  children?: number;
}

/** One entry of `ticket.children()`. */
export interface ChildView {
  id: string;
  key: string | null;
  state: TaskState;
}

/** What `result({ outcomeOnly: true })` and `submitAndWait(data, { outcomeOnly: true })`
 * return: how the task ended and its outcome, nothing else (a smaller reply for the
 * server to build and send; `status()` reads the rest). The fields mean what
 * `TaskView`'s of those names mean; `tombstoned` is there (true) only once the task is
 * tombstoned, its outcome then null whatever it was. */
export interface TaskOutcome<R = unknown> {
  id: string;
  state: TaskState;
  outcome: R | null;
  reason: string | null;
  tombstoned?: true;
}

export interface ResultOptions {
  /** How long to wait; absent waits as long as it takes. */
  timeoutMs?: number;
  /** Abandon the wait (withdrawn on the server); rejects with the signal's reason. */
  signal?: AbortSignal;
  /** Ask for the outcome only: the answer is a `TaskOutcome` (id, state, outcome,
   * reason), not the whole view. */
  outcomeOnly?: boolean;
}

/** What `Ticket.signal` answers: the task's state now, and whether the signal woke it
 * (false: kept for its wait). */
export interface SignalReply {
  id: string;
  state: string;
  woken: boolean;
}

export class Ticket<R = unknown> {
  /** The task as last seen (a submit's reply), or undefined for a re-attached ticket. */
  view: TaskView<R> | undefined;

  constructor(
    private readonly session: Session,
    readonly scopeId: string,
    readonly id: string,
    view?: TaskView<R>,
  ) {
    this.view = view;
  }

  /** Whether the submit that made this ticket created the task (false: joined it). */
  get created(): boolean {
    return this.view?.created === true;
  }

  toString(): string {
    return `Ticket(${this.scopeId}/${this.id})`;
  }

  private args(extra: Record<string, unknown> = {}): Record<string, unknown> {
    return { scope: this.scopeId, task: this.id, ...extra };
  }

  /** The tasks submitted with this one as `parent` (`delivery.submitChild`), in submit
   * order: `{ id, key, state }` each (those forgotten left out). */
  async children(): Promise<ChildView[]> {
    const reply = await call<{ children: ChildView[] }>(
      this.session.conn, Op.TASK_CHILDREN, this.args());
    return reply.children;
  }

  /** state, attempt, outcome, reason, tombstoned, key, subscribers, timestamps. */
  status(): Promise<TaskView<R>> {
    return call<TaskView<R>>(this.session.conn, Op.TASK_STATUS, this.args());
  }

  /** Wait for the task to end; its final view, or with `outcomeOnly` just its id,
   * state, outcome and reason (a `TaskOutcome`). */
  result(options: ResultOptions & { outcomeOnly: true }): Promise<TaskOutcome<R>>;
  result(options?: ResultOptions & { outcomeOnly?: false }): Promise<TaskView<R>>;
  result(options?: ResultOptions): Promise<TaskView<R> | TaskOutcome<R>>;
  async result(options: ResultOptions = {}): Promise<TaskView<R> | TaskOutcome<R>> {
    const { timeoutMs, signal, outcomeOnly } = options;
    const limit = timeoutMs === undefined ? null : Math.max(0, Math.floor(timeoutMs));
    const waitMs = limit === null ? Limits.MAX_WAIT_TIMEOUT_MS : limit;
    const args: Args = { scope: this.scopeId, task: this.id, timeout_ms: waitMs };
    if (outcomeOnly === true) args['outcome_only'] = true;
    // The first wait is sent and awaited from here (the common case: no frame of
    // waitAcrossReconnects, no copy of the args); a failure goes on there, as if it had
    // sent it.
    const sentAt = now();
    try {
      const reply = await this.session.conn.requestWait(Op.TASK_RESULT, args, { timeoutMs: waitMs, signal });
      return reply as unknown as TaskView<R> | TaskOutcome<R>;
    } catch (error) {
      if (!(error instanceof UnavailableError || error instanceof WaitTimeoutError)) throw error;
      const { reply } = await waitAcrossReconnects(this.session, Op.TASK_RESULT, args, limit, {
        timeUp: () => new WaitTimeoutError(`task ${this.id} had not finished within ${timeoutMs} ms`),
        signal,
        first: { sentAt, error },
      });
      return reply as unknown as TaskView<R> | TaskOutcome<R>;
    }
  }

  /** The task's events past seq `after` (0: all it still keeps): the retained ones
   * first, then each as it happens, the outcome last (then the iteration ends):
   * `for await (const event of ticket.events())`. Each `TaskEvent` has `kind`
   * ("progress", "state", "outcome"), `seq`, its fields, and `missed` (events before it
   * this iteration will never see). Survives a lost connection (see progress.ts). */
  events(after = 0): AsyncGenerator<TaskEvent<R>> {
    return follow(this.session, this.scopeId, this.id, after) as AsyncGenerator<TaskEvent<R>>;
  }

  /** Record `subscriberId` (working for run `scopeId`) as interested in this task. */
  join(subscriberId: string, scopeId?: string): Promise<TaskView<R>> {
    return call<TaskView<R>>(
      this.session.conn,
      Op.TASK_JOIN,
      this.args({ subscriber_id: subscriberId, subscriber_scope: scopeId }),
    );
  }

  /** Unsubscribe. A task with no subscribers is not cancelled. */
  detach(subscriberId: string): Promise<TaskView<R>> {
    return call<TaskView<R>>(
      this.session.conn,
      Op.TASK_DETACH,
      this.args({ subscriber_id: subscriberId }),
    );
  }

  /** Signal the task: if it waits for `name` (`delivery.suspend(name)`) it is ready
   * again and its next delivery's `signalled` is `{ name, data }`; if it has not
   * suspended yet the signal is kept and its suspend on `name` is woken at once.
   * Refused (InvalidArgumentError): a task that has ended or waits for another name,
   * data over 64 KiB. Not sent again after a lost connection (UnavailableError). */
  signal(name: string, data: unknown = null): Promise<SignalReply> {
    return call<SignalReply>(this.session.conn, Op.TASK_SIGNAL, this.args({ name, data }));
  }

  /** End the task CANCELLED (nothing happens if it already ended); its view after. */
  cancel(reason?: string): Promise<TaskView<R>> {
    return call<TaskView<R>>(this.session.conn, Op.TASK_CANCEL, this.args({ reason }));
  }
}
