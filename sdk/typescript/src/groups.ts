/**
 * Task groups: `run.group(name)`, waiting until enough of its tasks have succeeded.
 *
 * A task joins a group when it is submitted with `{ group }`. `wait()` parks on the server
 * (GROUP_WAIT) and is answered the moment the `need`-th task succeeds: nothing polls.
 * When `need` can no longer be reached (too many tasks ended otherwise) it resolves at
 * once with `reached: false` and the counts instead of waiting for a timeout: check
 * `result.reached`. A timeout rejects with WaitTimeoutError; the tasks keep going. Like
 * `ticket.result()`, a wait outlasts a dropped connection: it is made again on the next
 * one for the time that is left, never for longer than asked in total.
 */

import { InvalidArgumentError, WaitTimeoutError } from './errors.js';
import { call } from './failover.js';
import { type Session, waitAcrossReconnects } from './session.js';
import type { TaskState } from './tasks.js';
import { utf8Length } from './util.js';
import { Limits, Op } from './wire.js';

/** A group's tasks counted by state (field names as on the wire). */
export interface GroupStatus {
  group: string;
  /** Tasks of the group the server knows. */
  tasks: number;
  /** State name → number of the group's tasks in it; states with none left out. */
  counts: Partial<Record<TaskState, number>>;
  succeeded: number;
  /** PENDING and RUNNING tasks. */
  unfinished: number;
  /** Pending GROUP_WAITs on the group. */
  waiters: number;
}

/** One succeeded task of a group; `outcome` unless waited for with `outcomes: false`. */
export interface GroupDone<R = unknown> {
  id: string;
  key: string | null;
  outcome?: R | null;
}

/** GROUP_WAIT's answer: the group's counts (after any `cancelRest`) and the outcome. */
export interface GroupWaitResult<R = unknown> extends GroupStatus {
  /** Whether `need` successes were reached. */
  reached: boolean;
  /** The need the wait was for (the default made explicit). */
  need: number;
  /** Reached: the first `need` succeeded tasks, in the order they succeeded; else empty. */
  done: Array<GroupDone<R>>;
  /** Tasks `cancelRest` ended. */
  cancelled: number;
  /** Only when not reached: how many can still succeed, and why. */
  why?: string;
}

export interface GroupWaitOptions {
  /** Successes to wait for, 1 to 10 000 (default: the group's task count when the
   * server gets the wait). */
  need?: number;
  /** Once the need is met, cancel the group's unfinished tasks. */
  cancelRest?: boolean;
  /** How long to wait; absent waits as long as it takes. */
  timeoutMs?: number;
  /** `false`: `done` carries ids and keys only (for large outcomes). Default true. */
  outcomes?: boolean;
  /** Abandon the wait (withdrawn on the server); rejects with the signal's reason. */
  signal?: AbortSignal;
}

export class TaskGroup<R = unknown> {
  constructor(
    private readonly session: Session,
    readonly scopeId: string,
    readonly name: string,
  ) {
    if (typeof name !== 'string' || name.length === 0) {
      throw new InvalidArgumentError('a group name must be a non-empty string');
    }
    if (utf8Length(name) > Limits.MAX_GROUP_NAME_BYTES) {
      throw new InvalidArgumentError(`a group name may be at most ${Limits.MAX_GROUP_NAME_BYTES} bytes`);
    }
  }

  toString(): string {
    return `TaskGroup(${this.scopeId}/${this.name})`;
  }

  /** The group's tasks counted by state, as the server sees them now. */
  status(): Promise<GroupStatus> {
    return call<GroupStatus>(this.session.conn, Op.GROUP_STATUS, { scope: this.scopeId, group: this.name });
  }

  /** Wait until `need` tasks of the group have SUCCEEDED (see the module comment). */
  async wait(options: GroupWaitOptions = {}): Promise<GroupWaitResult<R>> {
    const { need, timeoutMs, signal } = options;
    if (
      need !== undefined &&
      (!Number.isInteger(need) || need < 1 || need > Limits.MAX_GROUP_TASKS)
    ) {
      throw new InvalidArgumentError(
        `need must be an integer from 1 to ${Limits.MAX_GROUP_TASKS}, got ${String(need)}`,
      );
    }
    if (timeoutMs !== undefined && !(timeoutMs >= 0)) {
      throw new InvalidArgumentError(`timeoutMs must be >= 0, got ${String(timeoutMs)}`);
    }
    const args = {
      scope: this.scopeId,
      group: this.name,
      need: need ?? null,
      cancel_rest: options.cancelRest === true,
      outcomes: options.outcomes !== false,
    };
    const limit = timeoutMs === undefined ? null : Math.floor(timeoutMs);
    const { reply } = await waitAcrossReconnects(this.session, Op.GROUP_WAIT, args, limit, {
      timeUp: () =>
        new WaitTimeoutError(`group ${JSON.stringify(this.name)} had not reached its need within ${timeoutMs} ms`),
      signal,
    });
    return reply as unknown as GroupWaitResult<R>;
  }
}
