/**
 * One persistent, pipelined connection to rsd, reconnected on demand with backoff, to
 * the primary of a cluster when given several nodes.
 *
 * What always holds:
 * - every request is an entry keyed by its request id; the read side settles it by id;
 *   any number may be in flight. Request ids come from one counter that starts at 1 and
 *   is never reset, not even on reconnect;
 * - frames queued during one turn of the event loop leave in one `socket.write` (a
 *   `setImmediate` flush joins them), or sooner, as soon as `WRITE_AT_FRAMES` are
 *   queued (never one write per request); while the socket's buffer is full, new requests
 *   wait for it to drain (CANCEL and the SDK's own releases do not wait);
 * - a lost connection fails every pending request with `LostConnection` (an
 *   UnavailableError: the outcome is unknown; after a connection-level ERROR, with that
 *   error); the next request reconnects with exponential backoff and jitter (50 ms
 *   doubling to 2 s) for up to `connectTimeoutMs` (each attempt, handshake included,
 *   within what is left), then gives up with the one message of reach.ts;
 * - several nodes (`'h1:7420,h2:7420'`, nodes.ts): a connect goes through them in the
 *   order of a `Route` (the last primary first, then the list), with no pause between
 *   the nodes of a round and the backoff between rounds; a HELLO answered NOT_PRIMARY
 *   naming the primary goes there next (a few redirects in a row at most), one naming
 *   none goes on to the next node; the node whose connection was just lost is tried
 *   last. Each attempt gets the budget's share of one node of the list, at least
 *   `MIN_ATTEMPT_MS` and at most `NODE_ANSWER_MS` (what a live node needs to answer a
 *   HELLO, with room: a node that accepts TCP and answers nothing, a paused process,
 *   cannot use up the budget; the node whose connection was lost gets `MIN_ATTEMPT_MS`,
 *   and a redirect to it waits for its place at the end of the round). Given up, the UnavailableError has code NOT_PRIMARY (the
 *   last such answer's details) if a node answered so, else UNAVAILABLE. One node
 *   given: exactly one node, as it always was;
 * - the budget of a connect is `connectTimeoutMs`, but a client of a cluster that was
 *   connected reconnects for as long as a takeover may take (`failoverBudgetMs`): two
 *   cluster leases (HELLO's `cluster.lease_seconds`; `DEFAULT_CLUSTER_LEASE_MS` from a
 *   node that does not tell) plus `connectTimeoutMs`, so that a call in flight across a
 *   takeover is answered by the new primary with the default options; its rounds pause
 *   at most `FAILOVER_PAUSE_MS`;
 * - a request answered NOT_PRIMARY (its node stepped down; not executed) fails with
 *   `NotExecuted` (code NOT_PRIMARY); the replies read with it are delivered, then the
 *   connection is given up as lost (every other pending request fails with
 *   LostConnection) and the next connect starts at the primary it named. A
 *   connection-level NOT_PRIMARY does the same. What is sent again after either is
 *   failover.ts's rule;
 * - a HELLO answered UNAVAILABLE with `retry_after_ms` (rsd slowing this address down)
 *   is tried again after that pause: within `connectTimeoutMs` on a first connect, for
 *   as long as it takes on a reconnect; other handshake refusals (UNSUPPORTED_VERSION,
 *   INVALID_ARGUMENT, UNAUTHENTICATED) are final and thrown as they are, and a token
 *   refused (UNAUTHENTICATED) is never sent again: every later connect throws that error;
 * - a server certificate that cannot be verified is final for a lone node; a node of
 *   several is passed over, its cause named if no node can be reached;
 * - the socket keeps the process alive only while a request is in flight or a `hold()`
 *   is taken (a lease held, a consumer running): an idle client lets Node exit;
 * - a wait the caller abandons (its timer or its `signal`) is withdrawn with CANCEL, and
 *   a reply that arrives for it anyway goes to its `giveBack`, so a grant or delivery
 *   that raced the abandonment is returned, never leaked;
 * - of a sharded cluster (shards.ts), a connection serves one shard: the shard its first
 *   HELLO named, or the one it was made for. A node that answers HELLO for another shard
 *   is passed over as a NOT_PRIMARY refusal naming none would be, and a reconnect asks
 *   `locate` (a fresh slot map) where the shard's primary is now. `request` and
 *   `requestWait` go where the request's route says (`shards`, once a HELLO named a
 *   shard); `direct` and `directWait` send on this very connection.
 */

import net from 'node:net';
import tls from 'node:tls';

import {
  AuthenticationError,
  InvalidArgumentError,
  LostConnection,
  NotExecuted,
  RunstateError,
  UnavailableError,
  WaitTimeoutError,
  errorFor,
} from './errors.js';
import { Route, resolve, sameNode } from './nodes.js';
import {
  type Address,
  AttemptFailed,
  HANDSHAKE_TIMED_OUT,
  handshakeLost,
  hostPort,
  isCertificateError,
  looksLikeTls,
  notPrimaryWords,
  socketFailure,
  throttlePauseMs,
  throttled,
  throttledFor,
  unreachable,
  unreachableNodes,
  untrusted,
} from './reach.js';
import { Backoff, type Logger, now } from './util.js';
import {
  DEFAULT_CLUSTER_LEASE_MS,
  FAILOVER_PAUSE_MS,
  MIN_ATTEMPT_MS,
  NODE_ANSWER_MS,
  RECONNECT_BACKOFF_FIRST_MS,
  RECONNECT_BACKOFF_MOST_MS,
  SILENCE_MS,
  WAIT_GRACE_DIVISOR,
  WAIT_GRACE_MS,
  WRITE_AT_FRAMES,
} from './sdkrules.js';
import type { Shards } from './shards.js';
import { FrameDecoder, FrameError, Kind, Op, PROTOCOL_VERSION, requestFrame } from './wire.js';

export const CLIENT_NAME = 'rsclient-typescript/0.1.0';
// The values both SDKs share come from sdkrules.ts (generated from rsproto/sdkrules.py).
/** Queued frames written at once rather than at the end of the event-loop turn (the
 * same policy and value as the Python SDK's, chosen by measurement there). */
export { WRITE_AT_FRAMES };
/** The least time one attempt at one node of several gets (ms): more than rsd's longest
 * wait before it answers a HELLO it slowed down (0.5 s), so a wrong token is told as one. */
export { MIN_ATTEMPT_MS };
/** The most one attempt at one node of several takes (ms), TCP, TLS and the HELLO's answer
 * together, whatever the budget: a live node answers at once, and one that accepts TCP
 * and answers nothing (a paused process) must not hold a client that has other nodes. */
export { NODE_ANSWER_MS };
/** The cluster lease assumed of a node that does not tell it in HELLO (rsd's default). */
export { DEFAULT_CLUSTER_LEASE_MS };
/** The longest pause between rounds of the nodes while reconnecting to a cluster (2 s
 * otherwise): a takeover ends at a moment no client knows. */
export { FAILOVER_PAUSE_MS };

/** How long a client of a cluster that was connected keeps reconnecting: two cluster
 * leases (the longest a takeover should take) and then a connect's own timeout. */
export function failoverBudgetMs(clusterLeaseMs: number, connectTimeoutMs: number): number {
  return 2 * clusterLeaseMs + connectTimeoutMs;
}
const LOST = 'the connection to rsd was lost';
/** A cluster client's connection that brought nothing for this long is probed with a PING;
 * nothing for as long again, and it is given up for another node: a paused or cut-off
 * primary closes no socket (the same rule as the Python SDK's). */
export { SILENCE_MS };

export type Args = Record<string, unknown>;
export type Reply = Record<string, unknown>;

interface Entry {
  onReply(result: Reply): void;
  onError(error: RunstateError): void;
}

const NOOP_ENTRY: Entry = { onReply: () => undefined, onError: () => undefined };

/** Filled in by a request: the connection that sent the request that got the answer,
 * and its `link` then (a lease granted there is renewed and settled there). */
export interface Via {
  conn: Connection | null;
  link: number;
}

/** HELLO's `shard`, from a node of a cluster: its shard, the slots, the map's epoch. */
export interface ShardTold {
  name: string;
  slots: number;
  mapEpoch: number;
}

export interface ConnectionOptions {
  /** The nodes given (one, or a cluster's), in order; never empty. */
  nodes: Address[];
  holder: string;
  token: string | null;
  tls: tls.ConnectionOptions | null;
  connectTimeoutMs: number;
  logger: Logger;
  /** The shard this connection serves (a HELLO naming another is passed over); absent:
   * the shard its first HELLO names, if any. */
  shard?: string | null;
  /** Where the shard's primary is now (a fresh slot map), asked before each round of a
   * reconnect; null: not known. */
  locate?: ((conn: Connection) => Promise<Address | null>) | undefined;
  /** Called with each HELLO that names a shard. */
  onShard?: ((conn: Connection, told: ShardTold) => void) | undefined;
}

export interface WaitOptions {
  /** The wait's own limit, also sent as `timeout_ms`. */
  timeoutMs: number;
  /** Gets a reply that arrived after the caller gave up (a grant to give back on the
   * connection it came on). */
  giveBack?: ((reply: Reply, conn: Connection) => void) | undefined;
  /** Abandon the wait when aborted: it is withdrawn with CANCEL. */
  signal?: AbortSignal | undefined;
  /** Told the connection the wait was sent on (see `Via`). */
  via?: Via | undefined;
}

export class Connection {
  serverInfo: Reply = {};
  private socket: net.Socket | null = null;
  private ready = false;
  /**
   * Ready connections that ended so far (lost, or closed by `close()`): a reply read
   * while it had one value came on a connection that is gone once it has another. The
   * handlers of `onLinkLost` hear each end at once (the keeper declares the leases bound
   * to that connection lost there).
   */
  link = 0;
  private readonly linkLost: Array<() => void> = [];
  private connecting: Promise<void> | null = null;
  private nextId = 1;
  private readonly pending = new Map<number, Entry>();
  private out: Buffer[] = [];
  private flushScheduled = false;
  private blocked = false;
  private drainWaiters: Array<() => void> = [];
  private readonly pushHandlers = new Map<number, (body: Reply) => void>();
  private isClosed = false;
  private connError: RunstateError | null = null;
  private lastSocketError: Error | null = null;
  private wasConnected = false; // a connect now is a reconnect
  private wakePause: (() => void) | null = null; // ends a backoff pause early (close)
  private refused: AuthenticationError | null = null; // our token was refused: final
  private holds = 0; // what keeps the process alive besides requests (see hold())
  private refd = true; // whether the socket keeps the process alive
  private current: Address; // the node reached, or last tried
  private primary: Address | null = null; // the node last known as the primary
  private left: Address | null = null; // the node whose ready connection was lost last
  /** The cluster's lease (ms), as a node told it in HELLO (null: not told, or alone). */
  clusterLeaseMs: number | null = null;
  /** Several nodes, or a node that answered NOT_PRIMARY: a cluster, whose requests lost
   * with a primary may be sent again (failover.ts). A lone rsd never is one. */
  cluster: boolean;
  /** The client's shards, once a HELLO named a shard (null: a lone rsd, or not yet
   * connected): `request` and `requestWait` are routed through it. */
  shards: Shards | null = null;
  /** The shard this connection serves (null: a lone rsd, or not yet known). */
  shardName: string | null;

  constructor(readonly options: ConnectionOptions) {
    this.current = options.nodes[0]!;
    this.cluster = options.nodes.length > 1;
    this.shardName = options.shard ?? null;
  }

  get connected(): boolean {
    return this.ready;
  }

  get closed(): boolean {
    return this.isClosed;
  }

  /** The node reached (or last tried), as an address. */
  get addressText(): string {
    return `${this.current.tls ? 'tls://' : ''}${hostPort(this.current)}`;
  }

  /**
   * Keep the process alive until the returned function is called: a lease held, a
   * consumer running. Without a hold or a request in flight, the connection does not
   * keep Node running (an idle client lets the process exit, `close()` or not).
   */
  hold(): () => void {
    let held = true;
    this.holds += 1;
    this.refresh();
    return () => {
      if (!held) return;
      held = false;
      this.holds -= 1;
      this.refresh();
    };
  }

  onPush(event: number, handler: (body: Reply) => void): void {
    this.pushHandlers.set(event, handler);
  }

  /** Call `handler()` the moment a ready connection ends (`link` grows). */
  onLinkLost(handler: () => void): void {
    this.linkLost.push(handler);
  }

  private linkEnded(): void {
    this.link += 1;
    for (const handler of this.linkLost) {
      try {
        handler();
      } catch (error) {
        this.options.logger.error(`connection loss handler failed: ${String(error)}`);
      }
    }
  }

  /** Send a request where its route says (connecting first if needed) and wait for its
   * answer; `via` is told the connection that answered. */
  request<T = Reply>(op: number, args: Args, via?: Via): Promise<T> {
    const shards = this.shards;
    if (shards !== null) return shards.request<T>(this, op, args, via);
    return this.direct<T>(op, args, via, true);
  }

  /** Send a request on this connection (connecting first if needed) and wait for its
   * answer. `route`: a connect that finds a sharded cluster routes it instead. */
  direct<T = Reply>(op: number, args: Args, via?: Via, route = false): Promise<T> {
    if (!this.ready || this.blocked) return this.directLater<T>(op, args, via, route);
    return this.sent<T>(op, args, via);
  }

  /** `direct` that first connects, or waits for the socket to drain. */
  private async directLater<T>(op: number, args: Args, via: Via | undefined, route: boolean): Promise<T> {
    if (!this.ready) {
      await this.connect();
      if (route && this.shards !== null) return this.shards.request<T>(this, op, args, via);
    }
    if (this.blocked) await this.whenWritable();
    return this.sent<T>(op, args, via);
  }

  /** The answer to `op` sent now (the promise of its entry, keyed by request id). */
  private sent<T>(op: number, args: Args, via: Via | undefined): Promise<T> {
    if (via !== undefined) {
      via.conn = this;
      via.link = this.link;
    }
    return new Promise<T>((resolve, reject) => {
      this.send(op, args, {
        onReply: resolve as (reply: Reply) => void,
        onError: reject,
      });
    });
  }

  /**
   * Send on the current connection without connecting; `entry` gets the answer.
   * False if there is no connection (nothing was sent).
   */
  sendNow(op: number, args: Args, entry: Entry = NOOP_ENTRY): boolean {
    if (!this.ready) return false;
    try {
      this.send(op, args, entry);
    } catch {
      return false;
    }
    return true;
  }

  /**
   * A request that parks on the server (a wait). If the caller gives up first (its own
   * timer, a little longer than the wait, or its `signal`), the wait is withdrawn with
   * CANCEL and a reply that comes anyway is handed to `giveBack`.
   */
  requestWait(op: number, args: Args, options: WaitOptions): Promise<Reply> {
    const shards = this.shards;
    if (shards !== null) return shards.requestWait(this, op, args, options);
    return this.directWait(op, args, options, true);
  }

  /** `requestWait` on this connection. `route`: a connect that finds a sharded cluster
   * routes it instead. */
  directWait(op: number, args: Args, options: WaitOptions, route = false): Promise<Reply> {
    const signal = options.signal;
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (!this.ready || this.blocked) return this.directWaitLater(op, args, options, route);
    return this.parked(op, args, options);
  }

  /** `directWait` that first connects, or waits for the socket to drain. */
  private async directWaitLater(op: number, args: Args, options: WaitOptions, route: boolean): Promise<Reply> {
    const { timeoutMs, signal } = options;
    const limitMs = timeoutMs + WAIT_GRACE_MS + timeoutMs / WAIT_GRACE_DIVISOR;
    if (!this.ready) {
      const started = now();
      await withTimer(this.connect(), limitMs, () =>
        new WaitTimeoutError(`no answer within ${timeoutMs} ms (could not reach rsd)`),
      );
      const spent = (now() - started) * 1000;
      const leftMs = Math.max(0, Math.floor(timeoutMs - spent));
      args = { ...args, timeout_ms: leftMs };
      if (route && this.shards !== null) {
        return this.shards.requestWait(this, op, args, { ...options, timeoutMs: leftMs });
      }
    }
    if (this.blocked) await this.whenWritable();
    signal?.throwIfAborted();
    return this.parked(op, args, options);
  }

  /** The wait sent now: its entry (keyed by request id) settles the promise, or its
   * timer or signal gives it up (CANCEL sent; a reply after that goes to `giveBack`). */
  private parked(op: number, args: Args, options: WaitOptions): Promise<Reply> {
    const via = options.via;
    if (via !== undefined) {
      via.conn = this;
      via.link = this.link;
    }
    return new Promise<Reply>((resolve, reject) => {
      const wait = new ParkedWait(this, options, resolve, reject);
      wait.id = this.send(op, args, wait);
      wait.arm();
    });
  }

  /** Connect, retrying with backoff for up to `connectTimeoutMs`. Concurrent callers
   * share one attempt and its outcome, failure included. */
  connect(): Promise<void> {
    if (this.isClosed) return Promise.reject(this.closedError());
    if (this.ready) return Promise.resolve();
    if (this.refused !== null) return Promise.reject(this.refused); // never tried again
    if (this.connecting === null) {
      this.connecting = this.connectWithBackoff().finally(() => {
        this.connecting = null;
      });
    }
    return this.connecting;
  }

  /** Close the connection; returns within about half a second even if rsd stopped reading. */
  async close(): Promise<void> {
    this.isClosed = true;
    if (this.ready) {
      this.ready = false;
      this.linkEnded();
    }
    this.wakePause?.();
    const socket = this.socket;
    if (socket !== null && !socket.destroyed) {
      this.flush();
      await new Promise<void>((resolve) => {
        const timer = setTimeout(() => {
          socket.destroy();
          resolve();
        }, 500);
        socket.once('close', () => {
          clearTimeout(timer);
          resolve();
        });
        socket.end();
      });
    }
    this.failPending(this.closedError());
  }

  // ---- internals -------------------------------------------------------------------

  private closedError(): UnavailableError {
    return new UnavailableError('the client is closed');
  }

  private whenWritable(): Promise<void> {
    return new Promise((resolve) => this.drainWaiters.push(resolve));
  }

  private wakeWriters(): void {
    this.blocked = false;
    const waiters = this.drainWaiters;
    this.drainWaiters = [];
    for (const wake of waiters) wake();
  }

  /** How long this connect may take (ms): `connectTimeoutMs`, or a failover's budget for
   * a client of a cluster that was connected (the module comment). */
  private budgetMs(): number {
    const { connectTimeoutMs } = this.options;
    if (!(this.cluster && this.wasConnected)) return connectTimeoutMs;
    return failoverBudgetMs(this.clusterLeaseMs ?? DEFAULT_CLUSTER_LEASE_MS, connectTimeoutMs);
  }

  private async connectWithBackoff(): Promise<void> {
    const { nodes, connectTimeoutMs: timeoutMs } = this.options;
    const budgetMs = this.budgetMs();
    let deadline = now() + budgetMs / 1000;
    const backoff = new Backoff(
      RECONNECT_BACKOFF_FIRST_MS,
      budgetMs > timeoutMs ? FAILOVER_PAUSE_MS : RECONNECT_BACKOFF_MOST_MS,
    );
    // A reconnect that knows no primary but the node it lost asks where its shard's is.
    const named = this.primary !== null && (this.left === null || !sameNode(this.primary, this.left));
    if (this.wasConnected && !named) this.primary = await this.locatePrimary(this.primary, deadline);
    const route = new Route(nodes, this.primary, this.left);
    const causes = new Map<string, string>(); // each node's last failure, first tried first
    let refusal: Record<string, unknown> | null = null; // the last NOT_PRIMARY's details
    // One node's share of the budget, no more than a live node needs to answer: a node
    // that drops packets or answers nothing cannot eat it all.
    const shareMs =
      nodes.length === 1
        ? budgetMs
        : Math.max(Math.min(budgetMs / nodes.length, NODE_ANSWER_MS), Math.min(MIN_ATTEMPT_MS, budgetMs));
    try {
      for (;;) {
        if (this.isClosed) throw this.closedError();
        const node = route.next();
        if (node === null) {
          // The round is over: back off, then the next round.
          const pauseMs = backoff.nextPauseMs();
          if (now() + pauseMs / 1000 >= deadline) throw this.gaveUp(causes, refusal, budgetMs);
          await this.pause(pauseMs);
          if (this.isClosed) throw this.closedError();
          route.primary = await this.locatePrimary(route.primary, deadline);
          route.newRound();
          continue;
        }
        if (causes.size > 0 && now() >= deadline) throw this.gaveUp(causes, refusal, budgetMs);
        const key = hostPort(node);
        // The node given up on gets the least: a live node answers at once.
        const givenUpOn = route.last !== null && sameNode(node, route.last);
        const boundMs = givenUpOn ? Math.min(shareMs, MIN_ATTEMPT_MS) : shareMs;
        try {
          await this.open(node, Math.max(1, Math.min((deadline - now()) * 1000, boundMs)));
          this.wasConnected = true;
          route.primary = node;
          this.left = null;
          return;
        } catch (error) {
          if (error instanceof AuthenticationError) this.refused = error;
          if (!(error instanceof AttemptFailed)) throw error; // a refusal: final
          if (this.isClosed) throw this.closedError();
          if (error.notPrimary !== null) {
            this.cluster = true;
            refusal = error.notPrimary;
            causes.set(key, error.why);
            route.redirect(node, error.notPrimary['primary']);
            continue;
          }
          route.failed();
          if (error.final !== null) {
            if (nodes.length === 1) throw new UnavailableError(error.final); // the same every time
            causes.set(key, error.why); // one node of several: passed over
            continue;
          }
          // A timed-out attempt often had little time left: an earlier cause says more.
          if (!error.timedOut || !causes.has(key)) causes.set(key, error.why);
          const slowed = error.retryAfterMs;
          if (slowed === null) continue; // the next node of the round
          const pauseMs = throttlePauseMs(slowed);
          // A client that was connected before waits out a throttled HELLO for as long as
          // it takes (contract 1); anything else gives up within the connect timeout.
          if (this.wasConnected) {
            this.options.logger.info(`rsd at ${this.addressText} is slowing us down: ${error.why}`);
            deadline = Math.max(deadline, now() + (pauseMs + timeoutMs) / 1000);
          } else if (now() + pauseMs / 1000 >= deadline) {
            throw this.gaveUp(causes, refusal, budgetMs);
          }
          await this.pause(pauseMs);
          route.again(node);
        }
      }
    } finally {
      this.primary = route.primary; // where the next connect starts
    }
  }

  /** A shard's connection reconnecting: where its shard's primary is now (`locate`, a
   * fresh slot map through another connection), asked for at most NODE_ANSWER_MS and
   * within the connect's `deadline`; `known` when it cannot say. */
  private async locatePrimary(known: Address | null, deadline: number): Promise<Address | null> {
    const locate = this.options.locate;
    if (locate === undefined || this.shardName === null || this.isClosed) return known;
    const leftMs = Math.min(NODE_ANSWER_MS, (deadline - now()) * 1000);
    if (leftMs <= 0) return known;
    try {
      return (await withTimer(locate(this), leftMs, () => new Error('no slot map in time'))) ?? known;
    } catch {
      return known;
    }
  }

  /** The error of a connect that gave up: UNAVAILABLE, or NOT_PRIMARY (with the last such
   * answer's details) if a node answered so. */
  private gaveUp(
    causes: Map<string, string>,
    refusal: Record<string, unknown> | null,
    withinMs: number,
  ): UnavailableError {
    const { nodes } = this.options;
    const message =
      nodes.length === 1 && causes.size === 1
        ? unreachable(nodes[0]!, withinMs, [...causes.values()][0]!)
        : unreachableNodes(nodes, causes, withinMs);
    return refusal === null ? new UnavailableError(message) : new UnavailableError(message, 'NOT_PRIMARY', refusal);
  }

  /** Sleep `ms`, or less if the client is closed meanwhile. */
  private pause(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.wakePause = null;
        resolve();
      }, ms);
      this.wakePause = () => {
        clearTimeout(timer);
        this.wakePause = null;
        resolve();
      };
    });
  }

  /** A socket to `address`, connected (and for TLS, its handshake done) within `leftMs`;
   * rejects with AttemptFailed (`final` for an untrusted certificate). */
  private openSocket(address: Address, leftMs: number): Promise<net.Socket> {
    const { tls: tlsOptions } = this.options;
    return new Promise((resolve, reject) => {
      const socket = address.tls
        ? tls.connect({
            host: address.host,
            port: address.port,
            ...(net.isIP(address.host) ? {} : { servername: address.host }),
            ...(tlsOptions ?? {}),
          })
        : net.connect({ host: address.host, port: address.port });
      const timer = setTimeout(() => {
        socket.destroy();
        reject(new AttemptFailed('timed out', null, true));
      }, leftMs);
      const onError = (error: Error): void => {
        clearTimeout(timer);
        socket.destroy();
        reject(
          isCertificateError(error)
            ? new AttemptFailed(`TLS: the certificate cannot be trusted: ${error.message}`, null, false, null, untrusted(address, error))
            : new AttemptFailed(socketFailure(error, address.tls)),
        );
      };
      socket.once('error', onError);
      socket.once(address.tls ? 'secureConnect' : 'connect', () => {
        clearTimeout(timer);
        socket.off('error', onError);
        resolve(socket);
      });
    });
  }

  private async open(node: Address, leftMs: number): Promise<void> {
    const started = now();
    this.current = node;
    const socket = await this.openSocket(node, leftMs);
    if (this.isClosed) {
      socket.destroy();
      throw this.closedError();
    }
    socket.setNoDelay(true);
    const useTls = node.tls;
    const decoder = new FrameDecoder();
    let answeredTls = false; // a plain connection's first bytes were a TLS record
    let brokenStream: string | null = null;
    const silence = { heard: false, probing: false };
    socket.on('data', (chunk: Buffer) => {
      if (socket !== this.socket) return;
      silence.heard = true;
      if (!this.ready && !useTls && looksLikeTls(chunk)) {
        answeredTls = true;
        socket.destroy();
        return;
      }
      let messages: unknown[];
      try {
        messages = decoder.feed(chunk);
      } catch (error) {
        brokenStream = (error as Error).message;
        if (this.ready) this.options.logger.error(`rsd sent a broken frame stream: ${brokenStream}`);
        socket.destroy();
        return;
      }
      this.received(messages, socket);
    });
    socket.on('error', (error) => {
      this.lastSocketError = error;
    });
    socket.on('close', () => this.lost(socket));
    socket.on('drain', () => this.wakeWriters());
    this.socket = socket;
    this.refd = true; // as every new socket is; the HELLO's answer re-decides
    this.connError = null;
    this.lastSocketError = null;
    const hello = {
      version: PROTOCOL_VERSION,
      holder: this.options.holder,
      client: CLIENT_NAME,
      token: this.options.token,
    };
    try {
      const info = await withTimer(
        new Promise<Reply>((resolve, reject) =>
          this.send(Op.HELLO, hello, { onReply: resolve, onError: reject }),
        ),
        Math.max(1, leftMs - (now() - started) * 1000),
        () => new AttemptFailed(HANDSHAKE_TIMED_OUT, null, true),
      );
      const told = toldShard(info);
      if (this.shardName !== null && told?.name !== this.shardName) {
        // A node of another shard (or a lone rsd): not this shard's primary.
        const what = told === null ? 'no shard' : `shard ${told.name}`;
        throw new AttemptFailed(`it serves ${what}, not shard ${this.shardName}`, null, false, { primary: null });
      }
      this.serverInfo = info;
      this.clusterLeaseMs = toldLeaseMs(info) ?? this.clusterLeaseMs;
      if (told !== null) {
        this.shardName = told.name;
        this.options.onShard?.(this, told);
      }
    } catch (error) {
      socket.destroy();
      if (error instanceof AttemptFailed) throw error;
      if (error instanceof UnavailableError) {
        if (error.code === 'NOT_PRIMARY') {
          // A standby: where to go is in the details.
          throw new AttemptFailed(notPrimaryWords(error.details), null, false, error.details);
        }
        const slowed = throttledFor(error);
        if (slowed !== null) throw new AttemptFailed(throttled(slowed), slowed);
        if (error.message.includes(LOST)) {
          if (brokenStream !== null) {
            throw new AttemptFailed(`it answered with bytes that are not rsd's protocol (${brokenStream})`);
          }
          throw new AttemptFailed(handshakeLost(useTls, answeredTls, this.lastSocketError));
        }
        throw new AttemptFailed(`the handshake failed: ${error.message}`);
      }
      throw error;
    }
    this.ready = true;
    if (this.cluster) this.watchSilence(socket, silence);
  }

  /** Every SILENCE_MS while `socket` is the connection: nothing came, a PING; nothing came
   * since the PING either, the connection is given up (what was in flight is lost with
   * it, as on any lost connection) and the next attempt tries the other nodes. */
  private watchSilence(socket: net.Socket, silence: { heard: boolean; probing: boolean }): void {
    const check = (): void => {
      if (socket !== this.socket || this.isClosed) return;
      if (silence.heard) {
        silence.heard = false;
        silence.probing = false;
      } else if (silence.probing) {
        this.lost(socket, `it answered nothing for ${(2 * SILENCE_MS) / 1000} s (a node paused or cut off)`);
        socket.destroy();
        return;
      } else {
        silence.probing = true;
        this.send(Op.PING, {}, NOOP_ENTRY);
      }
      setTimeout(check, SILENCE_MS).unref();
    };
    setTimeout(check, SILENCE_MS).unref();
  }

  private send(op: number, args: Args, entry: Entry): number {
    const socket = this.socket;
    if (socket === null || socket.destroyed) {
      throw new UnavailableError('not connected to rsd');
    }
    let frame: Buffer;
    const id = this.nextId;
    try {
      frame = requestFrame(id, op, args);
    } catch (error) {
      if (error instanceof FrameError) throw new InvalidArgumentError(error.message);
      throw error;
    }
    this.nextId = id + 1;
    this.pending.set(id, entry);
    if (!this.refd) this.refresh();
    const out = this.out;
    out.push(frame);
    if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(this.flush);
    } else if (out.length >= WRITE_AT_FRAMES) {
      this.writeOut();
    }
    return id;
  }

  private readonly flush = (): void => {
    this.flushScheduled = false;
    this.writeOut();
  };

  /** Write the queued frames in one `socket.write` and empty the queue. */
  private writeOut(): void {
    const out = this.out;
    if (out.length === 0) return;
    this.out = [];
    const socket = this.socket;
    if (socket === null || socket.destroyed) return;
    if (!socket.write(out.length === 1 ? out[0]! : Buffer.concat(out))) this.blocked = true;
  }

  private received(messages: unknown[], socket: net.Socket): void {
    const pending = this.pending;
    let steppedDown: string | null = null; // a request was answered NOT_PRIMARY: why
    for (const msg of messages) {
      try {
        if (!Array.isArray(msg)) continue;
        const kind = msg[0];
        if (kind === Kind.REPLY) {
          const entry = pending.get(msg[1] as number);
          if (entry === undefined) continue;
          pending.delete(msg[1] as number);
          entry.onReply(msg[2] as Reply);
        } else if (kind === Kind.ERROR) {
          const code = String(msg[2]);
          const details = msg[4] as Reply | null;
          if (msg[1] === 0) {
            let error = errorFor(code, String(msg[3]), details);
            // During the handshake the HELLO's own answer says it (and is what is thrown).
            const log = this.ready ? this.options.logger.warn : this.options.logger.info;
            log.call(this.options.logger, `rsd closed the connection: ${error.message}`);
            if (code === 'NOT_PRIMARY' && this.ready) {
              // Stepped down: what was pending may have been executed.
              this.follow(details);
              error = new LostConnection(`${LOST}: ${this.steppedDown(String(msg[3]))}`);
            }
            this.connError = error;
            this.failPending(error);
            continue;
          }
          let error: RunstateError;
          if (code === 'NOT_PRIMARY' && this.ready) {
            steppedDown = this.steppedDown(String(msg[3]));
            this.follow(details);
            error = new NotExecuted(String(msg[3]), details);
          } else {
            error = errorFor(code, String(msg[3]), details);
          }
          const entry = pending.get(msg[1] as number);
          if (entry === undefined) continue;
          pending.delete(msg[1] as number);
          entry.onError(error);
        } else if (kind === Kind.PUSH) {
          this.pushHandlers.get(msg[1] as number)?.(msg[2] as Reply);
        }
      } catch (error) {
        this.options.logger.error(`cannot handle a message from rsd: ${String(error)}`);
      }
    }
    if (steppedDown !== null && socket === this.socket) {
      // Every answer read with it was delivered above; the rest is lost with the node.
      this.lost(socket, steppedDown);
      socket.destroy();
      return;
    }
    if (pending.size === 0) this.refresh();
  }

  private steppedDown(message: string): string {
    return `rsd at ${hostPort(this.current)} is no longer the primary (${message})`;
  }

  /** The node said NOT_PRIMARY: a cluster, and the next connect starts at the primary it
   * named (none: at the list). */
  private follow(details: Reply | null): void {
    this.cluster = true;
    this.primary = resolve(this.options.nodes, this.current, details?.['primary']);
  }

  /** The socket keeps the process alive exactly while a request is in flight (a wait
   * parked on the server is one) or something holds it (`hold()`). */
  private refresh(): void {
    const want = this.pending.size > 0 || this.holds > 0;
    if (want === this.refd) return;
    this.refd = want;
    const socket = this.socket;
    if (socket === null) return;
    if (want) socket.ref();
    else socket.unref();
  }

  private lost(socket: net.Socket, cause: string | null = null): void {
    if (socket !== this.socket) return;
    const wasReady = this.ready;
    this.socket = null;
    this.ready = false;
    this.out = [];
    this.wakeWriters();
    if (!this.isClosed) {
      const why = cause ?? this.lastSocketError?.message ?? 'closed by the peer';
      this.options.logger.info(`connection to rsd at ${this.addressText} lost: ${why}`);
    }
    if (wasReady) {
      this.left = this.current; // given up on: the next connect tries it last (nodes.ts)
      this.linkEnded();
    }
    this.failPending(this.connError ?? new LostConnection(cause === null ? LOST : `${LOST}: ${cause}`));
  }

  private failPending(error: RunstateError): void {
    const entries = [...this.pending.values()];
    this.pending.clear();
    this.refresh();
    for (const entry of entries) entry.onError(error);
  }
}

/** A wait in flight (`directWait`): the entry its answer settles, with the timer and the
 * signal that give it up; one object, its callbacks made only for a signal. */
class ParkedWait implements Entry {
  id = 0;
  private done = false;
  private timer: NodeJS.Timeout | undefined;
  private onAbort: (() => void) | undefined;

  constructor(
    private readonly conn: Connection,
    readonly options: WaitOptions,
    private readonly resolve: (reply: Reply) => void,
    private readonly reject: (error: unknown) => void,
  ) {}

  /** Its timer (a little longer than the wait), and its signal's listener. */
  arm(): void {
    const { timeoutMs, signal } = this.options;
    const limitMs = timeoutMs + WAIT_GRACE_MS + timeoutMs / WAIT_GRACE_DIVISOR;
    this.timer = setTimeout(waitTimedOut, limitMs, this);
    if (signal !== undefined) {
      this.onAbort = () => this.giveUp(signal.reason);
      signal.addEventListener('abort', this.onAbort, { once: true });
    }
  }

  onReply(reply: Reply): void {
    if (this.done) {
      this.options.giveBack?.(reply, this.conn);
      return;
    }
    this.finish();
    this.resolve(reply);
  }

  onError(error: RunstateError): void {
    if (this.done) return;
    this.finish();
    this.reject(error);
  }

  giveUp(error: unknown): void {
    if (this.done) return;
    this.finish();
    this.conn.sendNow(Op.CANCEL, { request: this.id });
    this.reject(error);
  }

  private finish(): void {
    this.done = true;
    if (this.timer !== undefined) clearTimeout(this.timer);
    if (this.onAbort !== undefined) this.options.signal?.removeEventListener('abort', this.onAbort);
  }
}

function waitTimedOut(wait: ParkedWait): void {
  const timeoutMs = wait.options.timeoutMs;
  wait.giveUp(new WaitTimeoutError(`no answer within ${timeoutMs} ms (rsd did not answer in time)`));
}

/** The cluster lease a HELLO reply tells (`cluster.lease_seconds`), in ms; null if none. */
function toldLeaseMs(info: Reply): number | null {
  const cluster = info['cluster'];
  if (typeof cluster !== 'object' || cluster === null) return null;
  const raw = (cluster as Record<string, unknown>)['lease_seconds'];
  const seconds = typeof raw === 'bigint' ? Number(raw) : raw;
  return typeof seconds === 'number' && seconds > 0 && seconds <= 3600 ? seconds * 1000 : null;
}

/** HELLO's `shard` (a node of a cluster); null if none (a lone rsd). */
function toldShard(info: Reply): ShardTold | null {
  const shard = info['shard'];
  if (typeof shard !== 'object' || shard === null) return null;
  const fields = shard as Record<string, unknown>;
  const name = fields['name'];
  if (typeof name !== 'string') return null;
  return { name, slots: Number(fields['slots'] ?? 0), mapEpoch: Number(fields['map_epoch'] ?? 0) };
}

/** `promise`, or `makeError()` thrown after `ms` milliseconds. */
export function withTimer<T>(promise: Promise<T>, ms: number, makeError: () => Error): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(() => reject(makeError()), ms);
    promise.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}
