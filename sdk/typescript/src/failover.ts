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
 */

import type { Args, Connection, Reply } from './connection.js';
import { LostConnection, NotExecuted, UnavailableError } from './errors.js';
import { Op } from './wire.js';

/** Sends of one request at most, the first included. */
export const MAX_SENDS = 3;

/** Ops whose second execution cannot differ from one, whatever their arguments. */
const ALWAYS = new Set<number>([
  Op.PING, Op.SERVER_STATS, Op.SCOPE_CANCEL, Op.SCOPE_STATUS, Op.LEASE_RENEW, Op.CLAIM_INSPECT,
  Op.FENCE_CHECK, Op.MAILBOX_ENSURE, Op.DEAD_LETTERS, Op.QUEUE_INSPECT, Op.TASK_STATUS,
  Op.TASK_JOIN, Op.TASK_DETACH, Op.TASK_CANCEL, Op.GROUP_STATUS, Op.POOL_ENSURE,
  Op.POOL_INSPECT, Op.QUOTA_ENSURE, Op.QUOTA_INSPECT, Op.ADMIN_SCOPES, Op.ADMIN_CLAIMS,
  Op.ADMIN_TASKS, Op.ADMIN_TASK, Op.ADMIN_POOLS, Op.ADMIN_DEAD_LETTERS, Op.ADMIN_GROUPS,
  Op.ADMIN_QUOTAS, Op.ADMIN_MAILBOXES, Op.ADMIN_QUEUES, Op.SNAPSHOT_NOW,
]);

const given = (value: unknown): boolean => value !== undefined && value !== null;

/** Whether executing `op` with `args` twice cannot differ from once (the table above). */
export function safeToRepeat(op: number, args: Args): boolean {
  if (ALWAYS.has(op)) return true;
  if (op === Op.TASK_SUBMIT) return given(args['key']);
  if (op === Op.TASK_SUBMIT_MANY) {
    const items = (args['items'] ?? []) as Array<Record<string, unknown>>;
    return items.every((item) => given(item['key']));
  }
  if (op === Op.MESSAGE_SEND) return given(args['work_key']);
  if (op === Op.SCOPE_CREATE) return given(args['scope']);
  return false;
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
): Promise<T> {
  let sends = 1;
  while (sends < MAX_SENDS && maySendAgain(conn, failure, op, args)) {
    await conn.connect(); // cannot reach the primary: its UnavailableError ends it
    sends += 1;
    try {
      return send === undefined ? await conn.request<T>(op, args) : await send();
    } catch (error) {
      if (!(error instanceof UnavailableError)) throw error;
      failure = error;
    }
  }
  throw failure;
}

/** `conn.request(op, args)`, then `sendAgain` if it failed before its answer. */
export async function call<T = Reply>(conn: Connection, op: number, args: Args): Promise<T> {
  try {
    return await conn.request<T>(op, args);
  } catch (error) {
    if (!(error instanceof UnavailableError)) throw error;
    return sendAgain<T>(conn, error, op, args);
  }
}
