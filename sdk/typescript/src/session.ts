/**
 * The session: what every handle of a client (scope, claim, mailbox, ticket, delivery)
 * uses of it: the connection, the lease keeper and the logger; and
 * `waitAcrossReconnects`, the one way a wait outlasts a dropped connection.
 *
 * What always holds for `waitAcrossReconnects`: a wait parked on the server dies with its
 * connection (the server forgets it); it is made again on the next connection for the
 * time that is left, never for longer than the caller asked in total. It returns the
 * reply and the send time (monotonic seconds) of the request that got it, from which a
 * grant or delivery is dated, and the connection that answered with its `link` then (of
 * a sharded cluster, the shard's: a lease granted is renewed there). `timeoutMs` null waits as long as it takes, as a chain of
 * the longest waits the server allows. A wait answered MOVED more often than the
 * redirects allowed (shards.ts) is not made again: the cluster's map is in flux.
 */

import type { Args, Connection, Reply, Via } from './connection.js';
import { UnavailableError, WaitTimeoutError } from './errors.js';
import type { LeaseKeeper } from './keeper.js';
import type { Spans } from './tracing.js';
import { type Logger, now } from './util.js';
import { Limits } from './wire.js';

export interface Session {
  conn: Connection;
  keeper: LeaseKeeper;
  logger: Logger;
  /** OpenTelemetry's spans (tracing.ts), or null: no call on the task path. */
  spans: Spans | null;
}

export interface WaitAcross {
  giveBack?: ((reply: Reply, conn: Connection) => void) | undefined;
  timeUp?: (() => Error) | undefined;
  stopWhenClosed?: boolean;
  signal?: AbortSignal | undefined;
  /** The caller sent the first wait itself (at `sentAt`, monotonic seconds, with `args`)
   * and it failed with `error`: handled as if this had sent it, the limit counted from
   * then (`Ticket.result` awaits its first wait itself: no frame of this per result). */
  first?: { sentAt: number; error: unknown } | undefined;
}

export async function waitAcrossReconnects(
  session: Session,
  op: number,
  args: Args,
  timeoutMs: number | null,
  options: WaitAcross = {},
): Promise<{ reply: Reply; sentAt: number; link: number; conn: Connection }> {
  let first = options.first;
  const deadline = timeoutMs === null ? null : (first?.sentAt ?? now()) + timeoutMs / 1000;
  let waitMs = timeoutMs === null ? Limits.MAX_WAIT_TIMEOUT_MS : timeoutMs;
  for (;;) {
    const sentAt = now();
    const via: Via = { conn: null, link: 0 }; // the connection the reply comes on
    try {
      if (first !== undefined) {
        const failed = first.error;
        first = undefined;
        throw failed; // the caller's own first send: handled as if made here
      }
      const reply = await session.conn.requestWait(
        op,
        { ...args, timeout_ms: waitMs },
        { timeoutMs: waitMs, giveBack: options.giveBack, signal: options.signal, via },
      );
      return { reply, sentAt, link: via.link, conn: via.conn ?? session.conn };
    } catch (error) {
      if (error instanceof WaitTimeoutError) {
        if (deadline !== null) throw error;
        continue; // an endless wait: one link of the chain ended
      }
      if (!(error instanceof UnavailableError)) throw error;
      if (error.code === 'MOVED') throw error; // redirected as often as allowed: final
      if (session.conn.closed && (options.stopWhenClosed || deadline === null)) throw error;
      if (deadline === null) continue;
      const left = deadline - now();
      if (left <= 0 || (options.stopWhenClosed && session.conn.closed)) {
        if (options.timeUp === undefined) throw error;
        throw options.timeUp();
      }
      waitMs = Math.floor(left * 1000);
    }
  }
}
