/**
 * What becomes of a request whose answer did not come: sent again, or UnavailableError
 * (the Python SDK's `rsclient/failover.py`, the same rule and the same table).
 *
 * A request can fail before its answer in two ways, and the rule differs:
 * - answered NOT_PRIMARY (`NotExecuted`): its node is not (any more) the cluster's
 *   primary and did not execute it. The client reconnects to the primary and sends it
 *   again, whatever it is (but releases and requeues, sent once as always): nothing was
 *   done, so nothing can be done twice.
 * - lost with its connection (`LostConnection`: the node died or stepped down, the
 *   network failed): it may or may not have been executed. A client of a cluster (given
 *   several nodes, or answered NOT_PRIMARY once) sends it again on the new connection if
 *   a second execution cannot differ from one (`safeToRepeat`); otherwise, and always
 *   for a lone rsd, it throws that UnavailableError, as it always did.
 *
 * Either way a request is sent at most `MAX_SENDS` times (a request that takes down every
 * node it reaches must not take down the whole cluster), and the reconnect it needs is
 * bounded by the failover budget (two cluster leases plus the connect timeout:
 * connection.ts), so a takeover is ridden through; a client that cannot follow throws the
 * UnavailableError it got (code NOT_PRIMARY, with `details` `{ primary, epoch }`, when
 * that is what stopped it). Per operation, when its connection is lost before the answer:
 *
 * | operation | fate unknown (the connection was lost) |
 * | --- | --- |
 * | reads (ping, status, inspect, fence, dead letters, admin listings) | sent again |
 * | mailbox, pool and quota ensure | sent again (`created` is the repeat's) |
 * | scope create with an id / without | sent again / UnavailableError (a second run) |
 * | scope cancel, task join, detach and cancel, snapshot | sent again (idempotent) |
 * | submit with a key / without | sent again (the same task; `created` may say false) / UnavailableError |
 * | submitMany | sent again if every item has a key, else UnavailableError |
 * | send with a workKey / without | sent again (`replay` may say true) / UnavailableError |
 * | dead letter requeue | UnavailableError (would requeue twice) |
 * | dead letter delete | UnavailableError (a second delete of a recorded one says NOT_FOUND) |
 * | acquire (claim, pool) without waiting | UnavailableError: a grant nobody knows may exist; sent again it would meet it and say "busy" |
 * | acquire, receive, take, result, group wait, waiting | waited again for the time left (session.ts) |
 * | receive, take without waiting | UnavailableError (a delivery may be out; a take would take twice) |
 * | renewals by the keeper / `lease.renew()` | every 0.25 s until the lease's deadline / sent again |
 * | complete, retry, reject | sent again with the same handle until the lease's deadline (deliveries.ts) |
 * | requeue, release | sent once: unanswered, the lease ends by expiry |
 *
 * The table op by op is `RESEND` in sdkrules.ts, generated from rsproto/sdkrules.py,
 * the one the Python SDK follows: this module applies it.
 */

import type { Args, Connection, Reply, Via } from './connection.js';
import { LostConnection, NotExecuted, UnavailableError } from './errors.js';
import { KEYED_BY, MAX_SENDS, RESEND } from './sdkrules.js';

export { MAX_SENDS };

const given = (value: unknown): boolean => value !== undefined && value !== null;

/** Whether `args` give `field` (`items[].key`: every item of `items` its key). */
function gives(args: Args, field: string): boolean {
  const [items, key] = field.split('[].');
  if (key === undefined) return given(args[field]);
  const list = (args[items!] ?? []) as Array<Record<string, unknown>>;
  return list.every((item) => given(item[key]));
}

/** Whether executing `op` with `args` twice cannot differ from once (`RESEND`, the table
 * of rsproto/sdkrules.py that the Python SDK follows too). */
export function safeToRepeat(op: number, args: Args): boolean {
  const keyedBy = KEYED_BY[op];
  if (keyedBy !== undefined) return gives(args, keyedBy);
  const rule = RESEND[op];
  return rule === 'read' || rule === 'idempotent';
}

/** Whether a request that failed with `failure` is sent again (the module comment). */
export function maySendAgain(conn: Connection, failure: UnavailableError, op: number, args: Args): boolean {
  if (conn.closed) return false;
  if (failure instanceof NotExecuted) return true; // answered NOT_PRIMARY: not executed
  return failure instanceof LostConnection && conn.cluster && safeToRepeat(op, args);
}

/** `op` with `args` failed with `failure` before its answer: send it again (`send()`, by
 * default `conn.request(op, args)`) while the rule allows, after reconnecting; its
 * answer, or the UnavailableError that ends it. */
export async function sendAgain<T = Reply>(
  conn: Connection,
  failure: UnavailableError,
  op: number,
  args: Args,
  send?: () => Promise<T>,
  via?: Via,
): Promise<T> {
  let sends = 1;
  while (sends < MAX_SENDS && maySendAgain(conn, failure, op, args)) {
    // Cannot reach the primary: its UnavailableError ends it. (Of a sharded cluster the
    // request reconnects the connection of its shard, which may not be this one.)
    if (conn.shards === null) await conn.connect();
    sends += 1;
    try {
      return send === undefined ? await conn.request<T>(op, args, via) : await send();
    } catch (error) {
      if (!(error instanceof UnavailableError)) throw error;
      failure = error;
    }
  }
  throw failure;
}

/** `conn.request(op, args)`, then `sendAgain` if it failed before its answer; `via` is
 * told the connection that answered. */
export async function call<T = Reply>(conn: Connection, op: number, args: Args, via?: Via): Promise<T> {
  try {
    return await conn.request<T>(op, args, via);
  } catch (error) {
    if (!(error instanceof UnavailableError)) throw error;
    return sendAgain<T>(conn, error, op, args, undefined, via);
  }
}

/** `call`, on `conn` itself rather than where the op's route says: a view of the whole
 * cluster asks each shard on its own connection (admin.ts). */
export async function callOn<T = Reply>(conn: Connection, op: number, args: Args): Promise<T> {
  const send = (): Promise<T> => conn.direct<T>(op, args);
  try {
    return await send();
  } catch (error) {
    if (!(error instanceof UnavailableError)) throw error;
    return sendAgain<T>(conn, error, op, args, send);
  }
}
