/**
 * Schedules: `run.schedules` submits a task into a mailbox of the run at fire times.
 *
 * `await run.schedules.ensure('nightly', { mailbox: 'reports', cron: '0 3 * * *',
 * timezone: 'Europe/Berlin', data })` or `{ mailbox, everySeconds: 60 }`: each fire
 * submits the task keyed `schedule:<name>:<fire time>` (ISO 8601 UTC) into that mailbox,
 * so a fire happens once per fire time across restarts and takeovers (the key makes a
 * repeat a join). Fire times missed while the server was down follow `catchUp`:
 * 'latest' (one fire, the most recent), 'all' (each, at most the 100 most recent) or
 * 'none'. `list()`, `get(name)` (with its next fire times), `pause`, `resume` and
 * `delete` do what they say. The server lists schedules a page at a time, as every
 * listing: `page()` is one page and the cursor to go on from (null when done), `iter()`
 * walks every page, `list()` returns them all by name; a page of schedules with large
 * data holds a few of them only, so that it fits a frame. Bad definitions throw
 * InvalidArgumentError naming what is wrong; past the server's bounds (100 per run, 1000
 * per tenant) ResourceExhaustedError.
 */

import type { Page } from './admin.js';
import { call } from './failover.js';
import type { Session } from './session.js';
import { Op } from './wire.js';

/** A schedule as the server reports it (times are Unix seconds). */
export interface ScheduleInfo {
  name: string;
  scope: string;
  mailbox: string;
  every_seconds: number | null;
  cron: string | null;
  timezone: string;
  catch_up: 'latest' | 'all' | 'none';
  data: unknown;
  paused: boolean;
  next_fire: number | null;
  last_fire: number | null;
  fires: number;
  /** SCHEDULE_GET: the next fire times. */
  next_fires?: number[];
  [field: string]: unknown;
}

export interface ScheduleEnsureOptions {
  /** The mailbox of the run each fire's task is submitted into. */
  mailbox: string;
  /** Fire at the multiples of this many seconds since the Unix epoch (at least 1). */
  everySeconds?: number;
  /** A cron expression: 5 fields, or 6 with seconds first (one of the two with `everySeconds`). */
  cron?: string;
  /** Each fire's task data. */
  data?: unknown;
  /** The IANA time zone the cron expression is read in, default 'UTC'. */
  timezone?: string;
  /** Fire times missed while the server was down: 'latest' (default), 'all' or 'none'. */
  catchUp?: 'latest' | 'all' | 'none';
}

/** How a listing of schedules walks: `limit` schedules at most a page (1 to 1000, server
 * default 100), the newest first with `newestFirst`. */
export interface ScheduleListOptions {
  limit?: number;
  newestFirst?: boolean;
}

/** `run.schedules`: the schedules of one run. Making one does no I/O. */
export class Schedules {
  constructor(
    private readonly session: Session,
    readonly scopeId: string,
  ) {}

  /** Create the schedule `name`, or bring it to this definition (the same again changes
   * nothing); the schedule and `created`. */
  ensure(name: string, options: ScheduleEnsureOptions): Promise<ScheduleInfo & { created: boolean }> {
    const args: Record<string, unknown> = {
      scope: this.scopeId,
      name,
      mailbox: options.mailbox,
      data: options.data ?? null,
      timezone: options.timezone ?? 'UTC',
      catch_up: options.catchUp ?? 'latest',
    };
    if (options.everySeconds !== undefined) args['every_seconds'] = options.everySeconds;
    if (options.cron !== undefined) args['cron'] = options.cron;
    return call(this.session.conn, Op.SCHEDULE_ENSURE, args);
  }

  /** The run's schedules, by name (at most 100), read page after page. */
  async list(): Promise<ScheduleInfo[]> {
    const found: ScheduleInfo[] = [];
    for await (const schedule of this.iter()) found.push(schedule);
    return found.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  /** One page of the run's schedules, in the order they were ensured (newest first with
   * `newestFirst`), and the cursor to go on from (null once the listing is complete).
   * `limit`: 1 to 1000 schedules (server default 100); a page also stops before its
   * schedules' data would pass the frame limit. */
  async page(options: ScheduleListOptions & { cursor?: number } = {}): Promise<Page<ScheduleInfo, number>> {
    const args: Record<string, unknown> = { scope: this.scopeId, cursor: options.cursor ?? 0 };
    if (options.limit !== undefined) args['limit'] = options.limit;
    if (options.newestFirst) args['newest_first'] = true;
    const reply = await call<{ schedules: ScheduleInfo[]; next?: number | null }>(
      this.session.conn, Op.SCHEDULE_LIST, args);
    return { items: reply.schedules, next: reply.next ?? null };
  }

  /** Every schedule of the run, page after page (`page`'s order and `limit`). */
  async *iter(options: ScheduleListOptions = {}): AsyncGenerator<ScheduleInfo> {
    let cursor: number | null = 0;
    while (cursor !== null) {
      const page: Page<ScheduleInfo, number> = await this.page({ ...options, cursor });
      yield* page.items;
      cursor = page.next;
    }
  }

  /** The schedule with `next_fires`, its next `next` fire times (1 to 10, default 5). */
  get(name: string, options: { next?: number } = {}): Promise<ScheduleInfo> {
    return call(this.session.conn, Op.SCHEDULE_GET, { scope: this.scopeId, name, next: options.next ?? 5 });
  }

  /** Stop it firing until `resume`. */
  pause(name: string): Promise<ScheduleInfo> {
    return call(this.session.conn, Op.SCHEDULE_PAUSE, { scope: this.scopeId, name });
  }

  /** Fire again from its next fire time after now (none missed while paused). */
  resume(name: string): Promise<ScheduleInfo> {
    return call(this.session.conn, Op.SCHEDULE_RESUME, { scope: this.scopeId, name });
  }

  /** Delete it (the tasks it submitted stay). */
  async delete(name: string): Promise<boolean> {
    const reply = await call<{ deleted: boolean }>(this.session.conn, Op.SCHEDULE_DELETE, {
      scope: this.scopeId,
      name,
    });
    return reply.deleted;
  }
}
