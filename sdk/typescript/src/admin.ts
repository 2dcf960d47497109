/**
 * The admin calls (`rs.admin`): what `rsctl` shows, for scripts in TypeScript (ops 80-89
 * and 100-102 of protocol.md, "Admin ops").
 *
 * Every call needs a token with the admin role (else PermissionDeniedError, code
 * PERMISSION_DENIED; nothing is read or changed). Listings are paged on the server:
 * `page` returns one page and the cursor to go on from (null when done); `iter*` walks
 * every page, one request per page, so a listing of any size costs the client one page
 * of memory at a time. `tenant` names another tenant (default: the token's own).
 *
 * Of a sharded cluster (shards.ts: the map gives slots to more than one shard) the calls
 * cover every shard, as the Python SDK's do: a call that names a run (`scope`: a run's
 * claims, tasks, groups, queues, dead letters, one task) goes to the run's shard by the
 * route table, each object it lists naming that shard (`shard`); a listing that names
 * none (runs, pools, quotas, mailboxes: `FANNED_OUT`) is asked of every shard that owns
 * slots and merged, its cursor a string that carries each shard's position, and
 * `stats()` gives every shard's SERVER_STATS and their counters summed (fanout.ts). A
 * server alone, or a cluster of one shard, answers as it always did: one request, the
 * objects and the cursor as the server gives them.
 */

import type { Connection, Reply, Via } from './connection.js';
import { InvalidArgumentError } from './errors.js';
import { call, callOn } from './failover.js';
import { mergeStats, planPage, readCursor, writeCursor } from './fanout.js';
import type { GroupStatus } from './groups.js';
import type { QueueInfo } from './mailboxes.js';
import type { QuotaInfo } from './quotas.js';
import { FANNED_OUT, PAGE_DEFAULT, PAGE_MAX } from './sdkrules.js';
import type { Session } from './session.js';
import type { ServerStats } from './stats.js';
import type { TaskState } from './tasks.js';
import { Op } from './wire.js';

/** A lone rsd's cursor (an integer), or a sharded cluster's merged listing's (a string). */
export type Cursor = number | string;

/** One page of a listing and the cursor of the next (null: the listing is complete). */
export interface Page<T, C extends Cursor = Cursor> {
  items: T[];
  next: C | null;
}

export interface PageOptions {
  /** 0 starts a listing; else the `next` of the previous page. */
  cursor?: Cursor;
  /** The most objects one page holds, 1 to 1000 (server default 100). */
  limit?: number;
  tenant?: string;
}

/** What every object a listing of a sharded cluster gives carries besides its fields. */
export interface ShardNamed {
  /** The shard that holds it (only of a sharded cluster). */
  shard?: string;
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

  /** One page of a listing op: its objects (reply field `field`) and the cursor to go
   * on from. Of a sharded cluster, a listing that names no run is every shard's, merged
   * (the module comment). */
  async page<T>(
    op: number,
    field: string,
    options: PageOptions & Record<string, unknown> = {},
  ): Promise<Page<T & ShardNamed>> {
    const { cursor = 0, ...rest } = options;
    const owners = FANNED_OUT[op] !== undefined ? await this.owning() : null;
    if (owners !== null) return this.merged<T>(owners, op, field, cursor, rest);
    const via: Via = { conn: null, link: 0 };
    const reply = await call<Record<string, unknown>>(this.session.conn, op, defined({ ...rest, cursor }), via);
    const items = reply[field] as Array<T & ShardNamed>;
    const shard = via.conn?.shardName ?? null;
    if (this.session.conn.shards?.sharded === true && shard !== null) for (const item of items) item.shard = shard;
    return { items, next: (reply['next'] as Cursor | null | undefined) ?? null };
  }

  /** The shards a view of the whole cluster asks, each with its connection; null for a
   * lone rsd or a cluster of one shard (connected first if need be: the first HELLO
   * tells whether the cluster is sharded). */
  private async owning(): Promise<Array<[string, Connection]> | null> {
    const conn = this.session.conn;
    if (conn.shards === null && !conn.connected) await conn.connect();
    return conn.shards === null ? null : conn.shards.owning();
  }

  /** One merged page of every shard that owns slots (fanout.ts). */
  private async merged<T>(
    owners: Array<[string, Connection]>,
    op: number,
    field: string,
    cursor: unknown,
    rest: Record<string, unknown>,
  ): Promise<Page<T & ShardNamed>> {
    const positions = readCursor(cursor);
    const { limit = PAGE_DEFAULT, ...args } = rest;
    if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > PAGE_MAX) {
      throw new InvalidArgumentError(`limit must be an integer from 1 to ${PAGE_MAX}`);
    }
    const conns = new Map(owners);
    const asks = planPage(positions, [...conns.keys()], limit);
    const sent = defined(args);
    const answers = await Promise.allSettled(
      asks.map(([name, at, share]) =>
        callOn<Record<string, unknown>>(conns.get(name)!, op, { ...sent, cursor: at, limit: share }),
      ),
    );
    const items: Array<T & ShardNamed> = [];
    const after: Record<string, number | null> = {};
    for (const name of conns.keys()) after[name] = name in positions ? positions[name]! : 0;
    asks.forEach(([name], n) => {
      const answer = answers[n]!;
      if (answer.status === 'rejected') throw answer.reason;
      for (const item of answer.value[field] as Array<T & ShardNamed>) {
        item.shard = name;
        items.push(item);
      }
      after[name] = (answer.value['next'] as number | null | undefined) ?? null;
    });
    return { items, next: writeCursor(after) };
  }

  /** Every object of a listing, page after page. */
  async *iterate<T>(
    op: number,
    field: string,
    options: PageOptions & Record<string, unknown> = {},
  ): AsyncGenerator<T & ShardNamed> {
    let cursor: Cursor | null = options.cursor ?? 0;
    while (cursor !== null) {
      const page: Page<T & ShardNamed> = await this.page<T>(op, field, { ...options, cursor });
      yield* page.items;
      cursor = page.next;
    }
  }

  /** Every run of the tenant, oldest first. */
  iterScopes(options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminScope & ShardNamed> {
    return this.iterate<AdminScope>(Op.ADMIN_SCOPES, 'scopes', options);
  }

  /** Every claim of run `scope`, in the order they were first made. */
  iterClaims(scope: string, options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminClaim & ShardNamed> {
    return this.iterate<AdminClaim>(Op.ADMIN_CLAIMS, 'claims', { ...options, scope });
  }

  /** Every task and message of run `scope` the server holds, optionally filtered. */
  iterTasks(
    scope: string,
    options: TaskFilter & { tenant?: string; limit?: number } = {},
  ): AsyncGenerator<AdminTaskEntry & ShardNamed> {
    return this.iterate<AdminTaskEntry>(Op.ADMIN_TASKS, 'tasks', { ...options, scope });
  }

  /** Every pool of the tenant, in the order they were defined. */
  iterPools(options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminPool & ShardNamed> {
    return this.iterate<AdminPool>(Op.ADMIN_POOLS, 'pools', options);
  }

  /** Every quota of the tenant, in the order they were defined, each as `inspect()` reads it. */
  iterQuotas(options: { tenant?: string; limit?: number } = {}): AsyncGenerator<QuotaInfo & ShardNamed> {
    return this.iterate<QuotaInfo>(Op.ADMIN_QUOTAS, 'quotas', options);
  }

  /** Every mailbox of the tenant, in the order they were defined, with its depth. */
  iterMailboxes(options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminMailbox & ShardNamed> {
    return this.iterate<AdminMailbox>(Op.ADMIN_MAILBOXES, 'mailboxes', options);
  }

  /** The mailboxes that hold something in run `scope` (its `queues`), with their counts there. */
  iterQueues(scope: string, options: { tenant?: string; limit?: number } = {}): AsyncGenerator<AdminQueue & ShardNamed> {
    return this.iterate<AdminQueue>(Op.ADMIN_QUEUES, 'mailboxes', { ...options, scope });
  }

  /** Every task group of run `scope` the server knows, each as `group.status()` reads it. */
  iterGroups(scope: string, options: { tenant?: string; limit?: number } = {}): AsyncGenerator<GroupStatus & ShardNamed> {
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

  /** The server's counters (SERVER_STATS), as `rs.serverStats()`. Of a sharded cluster,
   * every shard's primary's under `shards` (shard → its counters), and the counters of
   * `STATS_SUMMED` (connections, requests, errors, leases held, tasks and messages by
   * state, the `core` tables, ...) added up over the shards (fanout.ts). */
  async stats(): Promise<ServerStats> {
    const owners = await this.owning();
    if (owners === null) return this.request<ServerStats>(Op.SERVER_STATS);
    const answers = await Promise.all(owners.map(([, conn]) => callOn<Reply>(conn, Op.SERVER_STATS, {})));
    return mergeStats(owners.map(([name], n) => [name, answers[n]!])) as ServerStats;
  }

  /** Force a snapshot; resolves once it is written: `{ snapshot, covers }`. */
  snapshot(): Promise<{ snapshot: string; covers: number }> {
    return this.request(Op.SNAPSHOT_NOW);
  }
}
