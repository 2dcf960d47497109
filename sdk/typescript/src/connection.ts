/**
 * One persistent, pipelined connection to rsd, reconnected on demand with backoff.
 *
 * What always holds:
 * - every request is an entry keyed by its request id; the read side settles it by id;
 *   any number may be in flight. Request ids come from one counter that starts at 1 and
 *   is never reset, not even on reconnect;
 * - frames queued during one turn of the event loop leave in one `socket.write` (a
 *   `setImmediate` flush joins them), or sooner, as soon as `WRITE_AT_FRAMES` are
 *   queued (never one write per request); while the socket's buffer is full, new requests
 *   wait for it to drain (CANCEL and the SDK's own releases do not wait);
 * - a lost connection fails every pending request with `UnavailableError` (after a
 *   connection-level ERROR, with that error); the next request reconnects with
 *   exponential backoff and jitter (50 ms doubling to 2 s) for up to `connectTimeoutMs`;
 * - handshake refusals (UNSUPPORTED_VERSION, INVALID_ARGUMENT, UNAUTHENTICATED) are final
 *   and thrown as they are;
 * - a wait the caller abandons (its timer or its `signal`) is withdrawn with CANCEL, and
 *   a reply that arrives for it anyway goes to its `giveBack`, so a grant or delivery
 *   that raced the abandonment is returned, never leaked.
 */

import net from 'node:net';
import tls from 'node:tls';

import {
  InvalidArgumentError,
  RunstateError,
  UnavailableError,
  WaitTimeoutError,
  errorFor,
} from './errors.js';
import { Backoff, type Logger, now, sleep } from './util.js';
import { FrameDecoder, FrameError, Kind, Op, PROTOCOL_VERSION, requestFrame } from './wire.js';

export const CLIENT_NAME = 'rsclient-typescript/0.1.0';
const TIMEOUT_GRACE_MS = 250; // a wait is given this long past its limit for the server's answer
const DEFAULT_PORT = 7420;
/** Queued frames written at once rather than at the end of the event-loop turn (the
 * same policy and value as the Python SDK's, chosen by measurement there). */
export const WRITE_AT_FRAMES = 64;

export type Args = Record<string, unknown>;
export type Reply = Record<string, unknown>;

export interface Address {
  host: string;
  port: number;
  tls: boolean;
}

/** `HOST:PORT`, `[v6]:PORT` or `tls://HOST:PORT`; InvalidArgumentError otherwise. */
export function parseAddress(address: string): Address {
  let text = address.trim();
  let useTls = false;
  const scheme = /^([a-z]+):\/\//i.exec(text);
  if (scheme) {
    const name = scheme[1]!.toLowerCase();
    if (name !== 'tls' && name !== 'tcp') {
      throw new InvalidArgumentError(`address scheme must be tls:// or tcp://, got ${address}`);
    }
    useTls = name === 'tls';
    text = text.slice(scheme[0].length);
  }
  const match = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(text);
  const port = match ? Number(match[3]) : NaN;
  if (!match || port < 1 || port > 65535) {
    throw new InvalidArgumentError(
      `address must be HOST:PORT (port 1-65535, default ${DEFAULT_PORT}), got ${JSON.stringify(address)}`,
    );
  }
  return { host: (match[1] ?? match[2])!, port, tls: useTls };
}

interface Entry {
  onReply(result: Reply): void;
  onError(error: RunstateError): void;
}

const NOOP_ENTRY: Entry = { onReply: () => undefined, onError: () => undefined };

export interface ConnectionOptions {
  address: Address;
  holder: string;
  token: string | null;
  tls: tls.ConnectionOptions | null;
  connectTimeoutMs: number;
  logger: Logger;
}

export interface WaitOptions {
  /** The wait's own limit, also sent as `timeout_ms`. */
  timeoutMs: number;
  /** Gets a reply that arrived after the caller gave up (a grant to give back). */
  giveBack?: ((reply: Reply) => void) | undefined;
  /** Abandon the wait when aborted: it is withdrawn with CANCEL. */
  signal?: AbortSignal | undefined;
}

export class Connection {
  serverInfo: Reply = {};
  private socket: net.Socket | null = null;
  private ready = false;
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

  constructor(private readonly options: ConnectionOptions) {}

  get connected(): boolean {
    return this.ready;
  }

  get closed(): boolean {
    return this.isClosed;
  }

  get addressText(): string {
    const { host, port, tls: useTls } = this.options.address;
    return `${useTls ? 'tls://' : ''}${host.includes(':') ? `[${host}]` : host}:${port}`;
  }

  onPush(event: number, handler: (body: Reply) => void): void {
    this.pushHandlers.set(event, handler);
  }

  /** Send a request (connecting first if needed) and wait for its answer. */
  async request<T = Reply>(op: number, args: Args): Promise<T> {
    if (!this.ready) await this.connect();
    if (this.blocked) await this.whenWritable();
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
  async requestWait(op: number, args: Args, options: WaitOptions): Promise<Reply> {
    const { timeoutMs, giveBack, signal } = options;
    signal?.throwIfAborted();
    const limitMs = timeoutMs + TIMEOUT_GRACE_MS + timeoutMs / 20;
    if (!this.ready) {
      const started = now();
      await withTimer(this.connect(), limitMs, () =>
        new WaitTimeoutError(`no answer within ${timeoutMs} ms (could not reach rsd)`),
      );
      const spent = (now() - started) * 1000;
      args = { ...args, timeout_ms: Math.max(0, Math.floor(timeoutMs - spent)) };
    }
    if (this.blocked) await this.whenWritable();
    signal?.throwIfAborted();
    return new Promise<Reply>((resolve, reject) => {
      let done = false;
      let timer: NodeJS.Timeout | undefined;
      const finish = (): void => {
        done = true;
        if (timer !== undefined) clearTimeout(timer);
        signal?.removeEventListener('abort', onAbort);
      };
      const entry: Entry = {
        onReply: (reply) => {
          if (done) {
            giveBack?.(reply);
            return;
          }
          finish();
          resolve(reply);
        },
        onError: (error) => {
          if (done) return;
          finish();
          reject(error);
        },
      };
      const giveUp = (error: unknown): void => {
        if (done) return;
        finish();
        this.sendNow(Op.CANCEL, { request: id });
        reject(error);
      };
      const onAbort = (): void => giveUp(signal?.reason);
      const id = this.send(op, args, entry);
      timer = setTimeout(
        () =>
          giveUp(new WaitTimeoutError(`no answer within ${timeoutMs} ms (rsd did not answer in time)`)),
        limitMs,
      );
      signal?.addEventListener('abort', onAbort, { once: true });
    });
  }

  /** Connect, retrying with backoff for up to `connectTimeoutMs`. Concurrent callers
   * share one attempt and its outcome, failure included. */
  connect(): Promise<void> {
    if (this.isClosed) return Promise.reject(this.closedError());
    if (this.ready) return Promise.resolve();
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

  private async connectWithBackoff(): Promise<void> {
    const deadline = now() + this.options.connectTimeoutMs / 1000;
    const backoff = new Backoff(50, 2000);
    for (;;) {
      if (this.isClosed) throw this.closedError();
      try {
        await this.open();
        return;
      } catch (error) {
        if (!(error instanceof UnavailableError)) throw error; // a refusal: final
        if (this.isClosed) throw this.closedError();
        const pauseMs = backoff.nextPauseMs();
        if (now() + pauseMs / 1000 >= deadline) {
          throw new UnavailableError(`cannot reach rsd at ${this.addressText}: ${error.message}`);
        }
        await sleep(pauseMs);
      }
    }
  }

  private openSocket(): Promise<net.Socket> {
    const { address, tls: tlsOptions, connectTimeoutMs } = this.options;
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
        reject(new UnavailableError(`no connection within ${connectTimeoutMs} ms`));
      }, connectTimeoutMs);
      const onError = (error: Error): void => {
        clearTimeout(timer);
        socket.destroy();
        reject(new UnavailableError(error.message || String(error)));
      };
      socket.once('error', onError);
      socket.once(address.tls ? 'secureConnect' : 'connect', () => {
        clearTimeout(timer);
        socket.off('error', onError);
        resolve(socket);
      });
    });
  }

  private async open(): Promise<void> {
    const socket = await this.openSocket();
    if (this.isClosed) {
      socket.destroy();
      throw this.closedError();
    }
    socket.setNoDelay(true);
    const decoder = new FrameDecoder();
    socket.on('data', (chunk: Buffer) => {
      if (socket !== this.socket) return;
      let messages: unknown[];
      try {
        messages = decoder.feed(chunk);
      } catch (error) {
        this.options.logger.error(`rsd sent a broken frame stream: ${(error as Error).message}`);
        socket.destroy();
        return;
      }
      this.received(messages);
    });
    socket.on('error', (error) => {
      this.lastSocketError = error;
    });
    socket.on('close', () => this.lost(socket));
    socket.on('drain', () => this.wakeWriters());
    this.socket = socket;
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
        this.options.connectTimeoutMs,
        () => new UnavailableError(`no HELLO reply within ${this.options.connectTimeoutMs} ms`),
      );
      this.serverInfo = info;
    } catch (error) {
      socket.destroy();
      if (error instanceof UnavailableError) {
        throw new UnavailableError(`handshake failed: ${error.message}`);
      }
      throw error;
    }
    this.ready = true;
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

  private received(messages: unknown[]): void {
    const pending = this.pending;
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
          const error = errorFor(String(msg[2]), String(msg[3]), msg[4] as Reply | null);
          if (msg[1] === 0) {
            this.options.logger.warn(`rsd closed the connection: ${error.message}`);
            this.connError = error;
            this.failPending(error);
            continue;
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
  }

  private lost(socket: net.Socket): void {
    if (socket !== this.socket) return;
    this.socket = null;
    this.ready = false;
    this.out = [];
    this.wakeWriters();
    if (!this.isClosed) {
      const cause = this.lastSocketError?.message ?? 'closed by the peer';
      this.options.logger.info(`connection to rsd at ${this.addressText} lost: ${cause}`);
    }
    this.failPending(this.connError ?? new UnavailableError('the connection to rsd was lost'));
  }

  private failPending(error: RunstateError): void {
    const entries = [...this.pending.values()];
    this.pending.clear();
    for (const entry of entries) entry.onError(error);
  }
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
