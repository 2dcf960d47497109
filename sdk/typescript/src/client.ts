/**
 * `Runstate`: the client object, and the scope (run) handles it gives out.
 *
 * One client holds one persistent connection (opened on first use), one lease keeper and
 * the session that lends both to its handles. Constructing it does no I/O.
 */

import os from 'node:os';
import type tls from 'node:tls';

import { Admin } from './admin.js';
import { Claim, checkLeaseSeconds } from './claims.js';
import { Connection, type Reply, type Via } from './connection.js';
import { InvalidArgumentError } from './errors.js';
import { call } from './failover.js';
import { LeaseKeeper } from './keeper.js';
import { parseAddresses } from './nodes.js';
import { declareLost } from './leases.js';
import { Mailbox, Mailboxes } from './mailboxes.js';
import { Pool, Pools, endSlotsElsewhere } from './pools.js';
import { Quota, Quotas } from './quotas.js';
import { Schedules } from './schedules.js';
import { CONNECT_TIMEOUT_MS } from './sdkrules.js';
import type { Session } from './session.js';
import { Shards } from './shards.js';
import { placementProblem } from './slots.js';
import { TaskGroup } from './groups.js';
import type { ServerStats } from './stats.js';
import { type TaskState, Ticket } from './tasks.js';
import { type TracerProviderLike, spansFor } from './tracing.js';
import { type Logger, consoleLogger, utf8Length } from './util.js';
import { Limits, Op } from './wire.js';

export const DEFAULT_ADDRESS = '127.0.0.1:7420';
/** The same default as the Python SDK's `connect_timeout=2.0` (sdkrules.ts). */
export const DEFAULT_CONNECT_TIMEOUT_MS = CONNECT_TIMEOUT_MS;

export interface RunstateOptions {
  /** Who this client is, shown to others (default `hostname:pid`). */
  holder?: string;
  /** `HOST:PORT` or `tls://HOST:PORT`, or a comma-separated list of them, every node of a
   * cluster (`'h1:7420,h2:7420,h3:7420'`: the client follows the primary); default
   * `$RUNSTATE_ADDRESS` (the same forms), then 127.0.0.1:7420. */
  address?: string;
  /** Sent in HELLO; default `$RUNSTATE_TOKEN`. */
  token?: string;
  /** Use TLS for every node (also implied by a `tls://` address); an object adds
   * `tls.connect` options. */
  tls?: boolean | tls.ConnectionOptions;
  /** How long to keep trying to connect before UnavailableError (default 2000); a client
   * that was connected to a cluster reconnects for two cluster leases more (a takeover). */
  connectTimeoutMs?: number;
  /** Where losses and failed renewals are reported (default: console). */
  logger?: Logger;
  /** The OpenTelemetry tracer provider of the client's spans (default: the registered
   * global one, if any by then; tracing.ts). */
  tracerProvider?: TracerProviderLike;
}

export interface ScopeCancelResult {
  scope: string;
  /** Always true. */
  cancelled: boolean;
  /** Tasks and messages this call ended. */
  tasks: number;
  /** Held claims this call ended. */
  claims: number;
  /** Pool slots held by the run's acquires that this call ended. */
  slots: number;
}

/** SCOPE_STATUS: the run as the server counts it now (every figure a kept counter). */
export interface ScopeStatus {
  scope: string;
  state: 'open' | 'cancelled';
  /** The cancellation's reason; null while open. */
  reason: string | null;
  /** When it was created (seconds since the epoch); null for a run only used by id. */
  created_at: number | null;
  /** The run's tasks by state; states with none left out. Messages are not counted. */
  tasks: Partial<Record<TaskState, number>>;
  /** Claim leases held in the run. */
  claims: number;
  /** Pool slots held by acquires made for the run. */
  slots: number;
}

export class Runstate {
  readonly holder: string;
  readonly address: string;
  readonly scopes: Scopes;
  readonly mailboxes: Mailboxes;
  readonly pools: Pools;
  readonly quotas: Quotas;
  readonly fence: Fence;
  /** The admin calls rsctl makes (an admin token's connection). */
  readonly admin: Admin;
  private readonly session: Session;
  /** Of a sharded cluster: each shard's connection, and where each request goes. */
  private readonly shards: Shards;

  constructor(options: RunstateOptions = {}) {
    const holder = options.holder ?? `${os.hostname()}:${process.pid}`;
    if (typeof holder !== 'string' || holder.length === 0 || utf8Length(holder) > 256) {
      throw new InvalidArgumentError('holder must be a non-empty string of at most 256 UTF-8 bytes');
    }
    this.holder = holder;
    this.address = options.address ?? process.env['RUNSTATE_ADDRESS'] ?? DEFAULT_ADDRESS;
    const nodes = parseAddresses(this.address);
    if (options.tls) for (const node of nodes) node.tls = true;
    const token = options.token ?? process.env['RUNSTATE_TOKEN'] ?? null;
    const logger = options.logger ?? consoleLogger;
    const connectTimeoutMs = options.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS;
    if (!(connectTimeoutMs > 0)) {
      throw new InvalidArgumentError(`connectTimeoutMs must be positive, got ${String(connectTimeoutMs)}`);
    }
    const conn = new Connection({
      nodes,
      holder,
      token: token === '' ? null : token,
      tls: typeof options.tls === 'object' ? options.tls : null,
      connectTimeoutMs,
      logger,
    });
    const keeper = new LeaseKeeper(conn, logger);
    this.shards = new Shards(conn);
    this.shards.onConnection = (shardConn) => keeper.watch(shardConn);
    this.session = { conn, keeper, logger, spans: spansFor(options.tracerProvider) };
    this.scopes = new Scopes(this.session);
    this.mailboxes = new Mailboxes(this.session);
    this.pools = new Pools(this.session);
    this.quotas = new Quotas(this.session);
    this.fence = new Fence(this.session);
    this.admin = new Admin(this.session);
  }

  toString(): string {
    return `Runstate(holder=${this.holder} address=${this.address})`;
  }

  /** Connect now rather than on first use (optional). */
  connect(): Promise<void> {
    return this.session.conn.connect();
  }

  /** The HELLO reply of the current connection (server, limits), `{}` before connecting. */
  get serverInfo(): Reply {
    return this.session.conn.serverInfo;
  }

  /** End every lease still held (code working under one sees it lost), release them,
   * then close the connection. */
  async close(): Promise<void> {
    const held = this.session.keeper.held();
    for (const lease of held) declareLost(lease, 'the client was closed');
    await Promise.allSettled(held.map((lease) => lease.releaseQuietly()));
    this.session.keeper.close();
    await Promise.all([this.shards.close(), this.session.conn.close()]);
  }

  ping(): Promise<{ time: number }> {
    return call(this.session.conn, Op.PING, {});
  }

  /** The server's counters (an admin operation): connections, core tables, journal
   * writes and fsyncs, ops and errors, tasks by state, queue depths. Informational. */
  serverStats(): Promise<ServerStats> {
    return call<ServerStats>(this.session.conn, Op.SERVER_STATS, {});
  }

  /** The run `scopeId` (made by `scopes.create()`, maybe in another process). No I/O: a
   * run never created is a NotFoundError at the first request naming it. */
  scope(scopeId: string): Scope {
    return new Scope(this.session, scopeId);
  }
}

export interface CreateScopeOptions {
  /** A chosen id (`'nightly-2026-12-01'`): the run of that id, made if it does not exist
   * yet. Idempotent, so every process of a job may create it. */
  id?: string;
  /** A new run (no `id`) in the slot of this string (1 to 64 UTF-8 bytes, no `{` or
   * `}`): its id is `{placement}` and 24 hex digits, so runs of one placement (a tenant,
   * say) share a shard of a sharded cluster, with the pools and quotas named
   * `{placement}...`. A lone rsd takes it the same way. */
  placement?: string;
}

export class Scopes {
  constructor(private readonly session: Session) {}

  /** A new run with a fresh id (with `{ placement }`, in that placement's slot), or with
   * `{ id }` the run of that chosen id (made if it does not exist yet; `scope.created`
   * says whether this call made it). */
  async create(options: CreateScopeOptions = {}): Promise<Scope> {
    const args: Record<string, unknown> = {};
    if (options.id !== undefined) {
      new Scope(this.session, options.id); // checks the id before any I/O
      args['scope'] = options.id;
    }
    if (options.placement !== undefined) {
      if (options.id !== undefined) {
        throw new InvalidArgumentError('give a placement or an id, not both (a chosen id has its own slot)');
      }
      const problem = placementProblem(options.placement);
      if (problem !== null) throw new InvalidArgumentError(problem);
      args['placement'] = options.placement;
    }
    const reply = await call<{ scope: string; created?: boolean }>(
      this.session.conn,
      Op.SCOPE_CREATE,
      args,
    );
    const scope = new Scope(this.session, reply.scope);
    scope.created = reply.created ?? true;
    return scope;
  }

  /** Cancel the run `scopeId`, as `rs.scope(scopeId).cancel(reason)`. */
  cancel(scopeId: string, reason?: string): Promise<ScopeCancelResult> {
    return new Scope(this.session, scopeId).cancel(reason);
  }
}

/** The FENCE_CHECK reply: whether the token is current, and the key's generation now. */
export interface FenceStatus {
  current: boolean;
  generation: number;
}

/** `rs.fence`: whether a fencing token is still its key's current grant. A token turns
 * stale for good once its lease ends (released, expired without renewal, run cancelled). */
export class Fence {
  constructor(private readonly session: Session) {}

  /** `{ current, generation }` for `token` (`lease.token()`) on `key` in run `scope`. */
  async status(scope: Scope | string, key: string, token: string | Uint8Array): Promise<FenceStatus> {
    const scopeId = typeof scope === 'string' ? scope : scope.id;
    return call<FenceStatus>(this.session.conn, Op.FENCE_CHECK, {
      scope: scopeId,
      key,
      token: tokenBytes(token),
    });
  }

  /** True while `token` is the current grant of `key` in run `scope`. */
  async check(scope: Scope | string, key: string, token: string | Uint8Array): Promise<boolean> {
    return (await this.status(scope, key, token)).current;
  }
}

function tokenBytes(token: string | Uint8Array): Uint8Array {
  const bytes =
    typeof token === 'string' && /^([0-9a-f]{2})*$/i.test(token) ? Uint8Array.from(Buffer.from(token, 'hex')) : token;
  if (!(bytes instanceof Uint8Array) || bytes.length !== 16) {
    throw new InvalidArgumentError('token must be lease.token(), the hex of a 16-byte lease handle');
  }
  return bytes;
}

export interface ClaimOptions {
  /** The lease length, the server's least (5 s) to 600 (default 30); renewed at about a
   * third of it. A shorter one than the server's is refused by the server. */
  leaseSeconds?: number;
  /**
   * Each grant ends the moment the connection it came on closes (a killed holder's claim
   * or slot goes to its waiter at once), and is lost here the moment that connection drops.
   * Default false: the lease outlives its connection and is renewed from the next one.
   */
  releaseOnDisconnect?: boolean;
}

/** A run: the namespace of the claims, tasks and queues its workers share. */
export class Scope {
  /** Whether `scopes.create` made this run; undefined for a handle from `rs.scope(id)`. */
  created: boolean | undefined = undefined;
  /** The run's schedules: `ensure`, `list`, `get`, `pause`, `resume`, `delete`. */
  readonly schedules: Schedules;

  constructor(
    private readonly session: Session,
    readonly id: string,
  ) {
    if (typeof id !== 'string' || id.length === 0) {
      throw new InvalidArgumentError('a scope id must be a non-empty string');
    }
    if (utf8Length(id) > Limits.MAX_SCOPE_ID_BYTES) {
      throw new InvalidArgumentError(`a scope id may be at most ${Limits.MAX_SCOPE_ID_BYTES} bytes`);
    }
    this.schedules = new Schedules(session, id);
  }

  toString(): string {
    return `Scope(${this.id})`;
  }

  claim(key: string, options: ClaimOptions = {}): Claim {
    const leaseSeconds = options.leaseSeconds ?? Limits.DEFAULT_LEASE_SECONDS;
    checkLeaseSeconds(leaseSeconds);
    return new Claim(this.session, this.id, key, leaseSeconds, options.releaseOnDisconnect ?? false);
  }

  /** A slot of the pool `name` for this run, held like a claim. */
  pool(name: string, options: ClaimOptions = {}): Pool {
    const leaseSeconds = options.leaseSeconds ?? Limits.DEFAULT_LEASE_SECONDS;
    checkLeaseSeconds(leaseSeconds);
    return new Pool(this.session, this.id, name, leaseSeconds, options.releaseOnDisconnect ?? false);
  }

  /** The quota `name`, taken from by this run. */
  quota(name: string): Quota {
    return new Quota(this.session, this.id, name);
  }

  mailbox(name: string): Mailbox {
    return new Mailbox(this.session, this.id, name);
  }

  /** Re-attach to a task by id (from any process); nothing is re-run. */
  task<R = unknown>(taskId: string): Ticket<R> {
    return new Ticket<R>(this.session, this.id, taskId);
  }

  /** The task group `name` of this run (tasks join it by `submit(data, { group })`). */
  group<R = unknown>(name: string): TaskGroup<R> {
    return new TaskGroup<R>(this.session, this.id, name);
  }

  /** Cancel the run: its tasks end CANCELLED (result waiters told, running workers lose
   * their deliveries), its claims and pool slots end, its waits are refused, and new
   * work in it is refused with ScopeCancelledError. Cancelling again changes nothing. */
  async cancel(reason?: string): Promise<ScopeCancelResult> {
    const via: Via = { conn: null, link: 0 };
    const reply = await call<ScopeCancelResult>(this.session.conn, Op.SCOPE_CANCEL, { scope: this.id, reason }, via);
    await endSlotsElsewhere(this.session, this.id, via.conn ?? this.session.conn); // other shards' pools
    return reply;
  }

  /** Open or cancelled (and why), tasks by state, claims and pool slots held. */
  status(): Promise<ScopeStatus> {
    return call<ScopeStatus>(this.session.conn, Op.SCOPE_STATUS, { scope: this.id });
  }
}
