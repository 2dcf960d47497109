/**
 * A task's events, followed: `for await (const event of ticket.events())`.
 *
 * The server keeps a task's last events (its progress, the state changes between, see
 * protocol.md "Task events") and pushes each new one to the connections that follow the
 * task (TASK_EVENTS); the outcome is the last event, then the iteration ends.
 *
 * What always holds (as the Python SDK's rsclient/progress.py):
 * - one subscription per task and connection on the server, however many iterators the
 *   client runs: each iterator gets every event once, in seq order, retained ones first;
 * - after a lost connection every iterator not ended subscribes again with `after` the
 *   last seq it gave, and `missed` on its next event says how many it cannot have;
 * - an iterator's queue holds at most `MAX_QUEUED` events (the oldest dropped, counted
 *   in `missed`); an iterator left (`break`) ends its task's subscription when it was
 *   the last of that task (`stop`);
 * - while an iterator runs, the client keeps Node running (as a consumer does).
 */

import type { Connection, Reply } from './connection.js';
import { UnavailableError } from './errors.js';
import { call } from './failover.js';
import type { Session } from './session.js';
import type { TaskState } from './tasks.js';
import { Backoff, sleep } from './util.js';
import { Op, Push } from './wire.js';

export const MAX_QUEUED = 1000;

/** One event of a task: `kind` "progress" (`data`, published at `at`), "state"
 * (`state`, `attempt`) or "outcome" (`state`, `outcome`, `reason`: the last); `seq`
 * numbers the task's events; `missed`: events before this one this iterator will
 * never see. */
export interface TaskEvent<R = unknown> {
  seq: number;
  kind: 'progress' | 'state' | 'outcome';
  data?: unknown;
  at?: number;
  state?: TaskState;
  attempt?: number;
  outcome?: R | null;
  reason?: string | null;
  tombstoned?: boolean;
  missed: number;
}

class Follower {
  queue: TaskEvent[] = [];
  missed = 0;
  done = false;
  resubscribe = true;
  // While its subscribe's answer is awaited, pushes are held and taken after the answer
  // (caughtUp): a push sent after the answer can reach the router before this iterator
  // has resumed with it; passed over, its events were lost.
  subscribing = false;
  held: Array<[Reply[], number, boolean]> = [];
  wake: (() => void) | null = null;

  constructor(
    readonly scope: string,
    readonly task: string,
    public last: number,
  ) {}

  take(events: Reply[], missed: number, done: boolean): void {
    this.missed += missed;
    for (const event of events) {
      const seq = event['seq'] as number;
      if (seq <= this.last && event['kind'] !== 'outcome') continue; // seen already
      this.last = seq;
      if (this.queue.length >= MAX_QUEUED) {
        const dropped = this.queue.shift() as TaskEvent;
        this.missed += dropped.missed + 1;
      }
      this.queue.push({ ...(event as unknown as TaskEvent), missed: this.missed });
      this.missed = 0;
      if (event['kind'] === 'outcome') this.done = true;
    }
    if (done) this.done = true;
    this.poke();
  }

  /** A subscribe's answer, then the pushes held while it was awaited (those it already
   * holds are skipped by seq, their `missed` with them). */
  caughtUp(reply: Reply): void {
    this.take(reply['events'] as Reply[], reply['missed'] as number, reply['done'] === true);
    const held = this.held;
    this.held = [];
    for (const [events, missed, done] of held) {
      const fresh = events.some((event) => (event['seq'] as number) > this.last || event['kind'] === 'outcome');
      this.take(events, fresh ? missed : 0, done);
    }
  }

  poke(): void {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }
}

/** The TASK_EVENTS pushes of a client's connections, to the iterators of each task. */
export class TaskEventRouter {
  private readonly followers = new Map<string, Set<Follower>>();
  private readonly attached = new WeakSet<Connection>();

  attach(conn: Connection): void {
    if (this.attached.has(conn)) return;
    this.attached.add(conn);
    conn.onPush(Push.TASK_EVENTS, (body) => this.pushed(body));
    conn.onLinkLost(() => this.lost());
  }

  private pushed(body: Reply): void {
    const task = body['task'] as string;
    const followers = this.followers.get(task);
    if (followers === undefined) return;
    const done = body['done'] === true;
    for (const follower of [...followers]) {
      const events = body['events'] as Reply[];
      const missed = body['missed'] as number;
      if (follower.subscribing) follower.held.push([events, missed, done]);
      else follower.take(events, missed, done);
    }
    if (done) this.followers.delete(task); // the server ended the subscription
  }

  private lost(): void {
    for (const followers of this.followers.values()) {
      for (const follower of followers) {
        follower.resubscribe = true;
        follower.poke();
      }
    }
  }

  add(follower: Follower): void {
    let followers = this.followers.get(follower.task);
    if (followers === undefined) this.followers.set(follower.task, (followers = new Set()));
    followers.add(follower);
  }

  remove(follower: Follower, conn: Connection): void {
    const followers = this.followers.get(follower.task);
    if (followers === undefined) return;
    followers.delete(follower);
    if (followers.size > 0) return;
    this.followers.delete(follower.task);
    if (!follower.done && !conn.closed) {
      conn.request(Op.TASK_EVENTS, { scope: follower.scope, task: follower.task, stop: true }).catch(() => undefined);
    }
  }
}

const routers = new WeakMap<Connection, TaskEventRouter>();

function routerOf(conn: Connection): TaskEventRouter {
  let router = routers.get(conn);
  if (router === undefined) {
    router = new TaskEventRouter();
    routers.set(conn, router);
    router.attach(conn);
  }
  return router;
}

/** The events of `task` past seq `after` (see the module comment). */
export async function* follow(session: Session, scope: string, task: string, after = 0): AsyncGenerator<TaskEvent> {
  const conn = session.conn;
  const router = routerOf(conn);
  const follower = new Follower(scope, task, after);
  router.add(follower);
  const unhold = conn.hold();
  try {
    for (;;) {
      const event = follower.queue.shift();
      if (event !== undefined) {
        yield event;
        if (event.kind === 'outcome') return;
        continue;
      }
      if (follower.done) return;
      if (follower.resubscribe) {
        follower.resubscribe = false;
        const reply = await subscribe(router, conn, follower);
        router.add(follower); // (a done push may have dropped it)
        follower.caughtUp(reply);
        continue;
      }
      await new Promise<void>((resolve) => {
        follower.wake = resolve;
      });
    }
  } finally {
    unhold();
    router.remove(follower, conn);
  }
}

/** TASK_EVENTS for `follower` (`after` its last seq), sent again after a lost
 * connection, with backoff, until answered or the client is closed; an error answer is
 * thrown. Of a sharded cluster, the shard that answers is heard too. */
async function subscribe(router: TaskEventRouter, conn: Connection, follower: Follower): Promise<Reply> {
  const backoff = new Backoff(50, 2000);
  follower.subscribing = true;
  try {
    for (;;) {
      const via = { conn: null as Connection | null, link: 0 };
      try {
        const reply = await call<Reply>(
          conn,
          Op.TASK_EVENTS,
          { scope: follower.scope, task: follower.task, after: follower.last },
          via,
        );
        if (via.conn !== null) router.attach(via.conn);
        return reply;
      } catch (error) {
        if (!(error instanceof UnavailableError) || conn.closed) throw error;
        await sleep(backoff.nextPauseMs());
      }
    }
  } finally {
    follower.subscribing = false;
  }
}
