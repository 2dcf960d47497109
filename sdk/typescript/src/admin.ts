/**
 * The admin calls (`rs.admin`): what `rsctl` shows, for scripts in TypeScript (ops 80-89
 * and 100-102 of protocol.md, "Admin ops").
 *
 * Every call needs a token with the admin role (else PermissionDeniedError, code
 * PERMISSION_DENIED; nothing is read or changed). Listings are paged on the server:
 * `*Page` returns one page and the cursor to go on from (null when done); `iter*` walks
 * every page, one request per page, so a listing of any size costs the client one page
 * of memory at a time. `tenant` names another tenant (default: the token's own).
 */

import type { Reply } from './connection.js';
import { call } from './failover.js';
import type { GroupStatus } from './groups.js';
import type { QueueInfo } from './mailboxes.js';
import type { QuotaInfo } from './quotas.js';
import type { Session } from './session.js';
import type { ServerStats } from './stats.js';
import type { TaskState } from './tasks.js';
import { Op } from './wire.js';

/** One page of a listing and the cursor of the next (null: the listing is complete). */
export interface Page<T> {
  items: T[];
  next: number | null;
}

export interface PageOptions {
  /** 0 starts a listing; else the `next` of the previous page. */
  cursor?: number;
  /** The most objects one page holds, 1 to 1000 (server default 100). */
  limit?: number;
  tenant?: string;
}

export interface AdminScope {
  scope: string;
  created_at: number | null;
  /** The cancellation reason, once cancelled. */
  cancelled: string | null;
  claims: number;
  tasks: number;
  unfinished: number;
  queues: number;
}

export interface AdminClaim {
  key: string;
  generation: number;
  held: boolean;
  holder: string | null;
  lease_seconds: number | null;
  expires_in: number | null;
  waiters: number;
}

export interface AdminTaskEntry {
  id: string;
  kind: 'task' | 'message';
  mailbox: string;
  key: string | null;
  state: TaskState;
  attempt: number;
  reason: string | null;
  dead: boolean;
  created_at: number;
  finished_at: number | null;
}

export interface AdminTask extends AdminTaskEntry {
  data: unknown;
  outcome: unknown;
  subscribers: string[];
  deadline: number | null;
  tombstoned: boolean;
  delivery: { holder: string; lease_seconds: number; expires_in: number } | null;
}

export interface AdminPool {
  name: string;
  size: number;
  held: number;
  waiters: number;
  generation: number;
}

/** A mailbox of the tenant: its settings and its depth over all runs. */
export interface AdminMailbox {
  name: string;
  mode: string;
  max_attempts: number;
  retry_backoff_ms: number;
  /** Items ready for delivery, over all runs. */
  ready: number;
  /** Deliveries under a lease, over all runs. */
  running: number;
}

/** A mailbox that holds something in a run, with `inspect()`'s counts in that run. */
export interface AdminQueue extends QueueInfo {
  mailbox: string;
}

export interface TaskFilter {
  /** Only tasks and messages in this state. */
  state?: TaskState;
  /** Only those of this mailbox. */
  mailbox?: string;
}

export interface RequeueOptions {
  /** The dead letter to requeue; or `all` for the oldest `limit` of them. */
  id?: string;
  all?: boolean;
  /** 1 to 1000 (server default 100). */
  limit?: number;
  tenant?: string;
}

export interface RequeueResult {
  requeued: Array<{ id: string; new: string }>;
  left: number;
}

/** Arguments without their undefined fields (the server's defaults apply). */
function defined(args: Record<string, unknown>): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(args)) if (value !== undefined) out[key] = value;
  return out;
}

export class Admin {
  constructor(private readonly session: Session) {}

  /** One admin request; arguments that are undefined are left out. */
  request<T = Reply>(op: number, args: Record<string, unknown> = {}): Promise<T> {
    return call<T>(this.session.conn, op, defined(args));
  }

  /** One page of a listing op: its objects (reply field `field`) and the next cursor. */
  async page<T>(op: number, field: string, options: PageOptions & Record<string, unknown> = {}): Promise<Page<T>> {
    const { cursor = 0, ...rest } = options;
    const reply = await this.request<Record<string, unknown>>(op, { ...rest, cursor });
    return { items: reply[field] as T[], next: (reply['next'] as number | null | undefined) ?? null };
  }

  /** Every object of a listing, page after page. */
  async *iterate<T>(op: number, field: string, options: PageOptions & Record<string, unknown> = {}): AsyncGenerator<T> {
    let cursor: number | null = options.cursor ?? 0;
    while (cursor !== null) {
      const page: Page<T> = await this.page<T>(op, field, { ...options, cursor });
      yield* page.items;
      cursor = page.next;
    }
  }

  /** Every run of the tenant, oldest first. */
  iterScopes(options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminScope> {
    return this.iterate<AdminScope>(Op.ADMIN_SCOPES, 'scopes', options);
  }

  /** Every claim of run `scope`, in the order they were first made. */
  iterClaims(scope: string, options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminClaim> {
    return this.iterate<AdminClaim>(Op.ADMIN_CLAIMS, 'claims', { ...options, scope });
  }

  /** Every task and message of run `scope` the server holds, optionally filtered. */
  iterTasks(
    scope: string,
    options: TaskFilter & { tenant?: string; limit?: number } = {},
  ): AsyncGenerator<AdminTaskEntry> {
    return this.iterate<AdminTaskEntry>(Op.ADMIN_TASKS, 'tasks', { ...options, scope });
  }

  /** Every pool of the tenant, in the order they were defined. */
  iterPools(options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminPool> {
    return this.iterate<AdminPool>(Op.ADMIN_POOLS, 'pools', options);
  }

  /** Every quota of the tenant, in the order they were defined, each as `inspect()` reads it. */
  iterQuotas(options: { tenant?: string; limit?: number } = {}): AsyncGenerator<QuotaInfo> {
    return this.iterate<QuotaInfo>(Op.ADMIN_QUOTAS, 'quotas', options);
  }

  /** Every mailbox of the tenant, in the order they were defined, with its depth. */
  iterMailboxes(options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminMailbox> {
    return this.iterate<AdminMailbox>(Op.ADMIN_MAILBOXES, 'mailboxes', options);
  }

  /** The mailboxes that hold something in run `scope` (its `queues`), with their counts there. */
  iterQueues(scope: string, options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminQueue> {
    return this.iterate<AdminQueue>(Op.ADMIN_QUEUES, 'mailboxes', { ...options, scope });
  }

  /** Every task group of run `scope` the server knows, each as `group.status()` reads it. */
  iterGroups(scope: string, options: { tenant?: string; limit?: number } = {}): AsyncGenerator<GroupStatus> {
    return this.iterate<GroupStatus>(Op.ADMIN_GROUPS, 'groups', { ...options, scope });
  }

  /** One task or message in full: data, outcome, current delivery. */
  task(scope: string, taskId: string, tenant?: string): Promise<AdminTask> {
    return this.request<AdminTask>(Op.ADMIN_TASK, { scope, task: taskId, tenant });
  }

  /** A mailbox's newest dead letters in a run, as many as fit one reply; `count`: all. */
  deadLetters(
    scope: string,
    mailbox: string,
    options: { limit?: number; tenant?: string } = {},
  ): Promise<{ items: Array<Record<string, unknown>>; truncated: boolean; count: number }> {
    return this.request(Op.ADMIN_DEAD_LETTERS, { scope, mailbox, limit: options.limit ?? 1000, tenant: options.tenant });
  }

  /** Put one dead letter (`id`) or the oldest `limit` (`all`) back on the queue. */
  requeue(scope: string, mailbox: string, options: RequeueOptions): Promise<RequeueResult> {
    return this.request<RequeueResult>(Op.DEAD_LETTER_REQUEUE, {
      scope,
      mailbox,
      id: options.id,
      all: options.all === true ? true : undefined,
      limit: options.limit,
      tenant: options.tenant,
    });
  }

  /** Delete one dead letter for good. NotFoundError if it is not on the list, a second
   * delete of it included (a delete whose answer was lost is not sent again: failover.ts). */
  deleteDeadLetter(
    scope: string,
    mailbox: string,
    id: string,
    tenant?: string,
  ): Promise<{ deleted: string; left: number }> {
    return this.request(Op.DEAD_LETTER_DELETE, { scope, mailbox, id, tenant });
  }

  /** Cancel a run (another tenant's with `tenant`). */
  cancel(
    scope: string,
    reason?: string,
    tenant?: string,
  ): Promise<{ scope: string; cancelled: boolean; tasks: number; claims: number; slots: number }> {
    return this.request(Op.SCOPE_CANCEL, { scope, reason, tenant });
  }

  /** The server's counters (SERVER_STATS), as `rs.serverStats()`. */
  stats(): Promise<ServerStats> {
    return this.request<ServerStats>(Op.SERVER_STATS);
  }

  /** Force a snapshot; resolves once it is written: `{ snapshot, covers }`. */
  snapshot(): Promise<{ snapshot: string; covers: number }> {
    return this.request(Op.SNAPSHOT_NOW);
  }
}
