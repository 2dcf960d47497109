/**
 * The lease keeper: one per client, it renews every lease the client holds, in batches.
 *
 * What always holds:
 * - a lease is renewed at about a third of its length; when the timer fires, every lease
 *   due within a sixth of its length of now rides in the same LEASE_RENEW, so a thousand
 *   leases cost one request per renewal round; a round larger than the server's
 *   `max_renew_batch` is split;
 * - one timer, armed at the earliest deadline in a heap, drives every renewal: nothing
 *   polls, and tracking or rescheduling a lease is O(log n);
 * - the keeper declares a lease lost when the server says STALE_CLAIM or pushes
 *   LEASE_LOST for it, or when its timer finds the lease past its deadline; never
 *   re-acquires;
 * - a renewal that could not be answered (no connection) is tried again every 0.25 s on
 *   the next connection, until the lease's own deadline;
 * - while it renews any lease, the keeper keeps the process alive (a hold on the
 *   connection, and its timer); with none, neither does;
 * - a lease granted with `releaseOnDisconnect` (`bind`) is declared lost the moment the
 *   connection it was granted on ends (the server ends it then), so it is never renewed
 *   from another connection; one whose connection ended before it was bound is lost at once;
 * - of a sharded cluster, a lease is renewed on the connection it was granted on (its
 *   shard's: `lease.conn`), a round's LEASE_RENEW split by connection; every connection's
 *   LEASE_LOST pushes and ends are heard (`watch`). A renewal item answered `"MOVED"`
 *   (the lease's run moved to another shard, and the lease with it) is no loss: the lease
 *   follows its run (`Lease.follow`: rebound to the connection of the run's new shard)
 *   and is renewed there at once (`renew()`'s own renewal too, at most MAX_REDIRECTS
 *   times in a row); a STALE_CLAIM there is a loss as anywhere.
 */

import type { Connection, Reply } from './connection.js';
import { RunstateError } from './errors.js';
import { call } from './failover.js';
import { type Lease, confirmRenewal, declareLost } from './leases.js';
import { MAX_REDIRECTS, RENEWAL_BATCH_DIVISOR, RENEWAL_RETRY_SECONDS } from './sdkrules.js';
import { type Logger, now } from './util.js';
import { Limits, Op, Push, handleText, type LeaseHandle } from './wire.js';

const UNBOUND =
  'its connection to rsd ended, and the server ends a lease granted with ' +
  'releaseOnDisconnect with it';

type HeapEntry = [when: number, seq: number, lease: Lease];

export class LeaseKeeper {
  private readonly leases = new Map<string, Lease>();
  private readonly armed = new Map<string, number>();
  private readonly heap: HeapEntry[] = [];
  private seq = 0;
  private timer: NodeJS.Timeout | null = null;
  private timerAt: number | null = null;
  private readonly inFlight = new Set<string>();
  private unhold: (() => void) | null = null; // taken while any lease is renewed
  private readonly known = new Map<string, WeakRef<Lease>>();
  /** Deliveries being settled (`settling`): no longer renewed, their loss still heard. */
  private readonly settlingNow = new Map<string, Lease>();
  private readonly bound = new Map<string, WeakRef<Lease>>(); // end with the connection
  private readonly forgetKnown = new FinalizationRegistry<string>((token) => {
    const ref = this.known.get(token);
    if (ref !== undefined && ref.deref() === undefined) this.known.delete(token);
  });

  constructor(
    readonly conn: Connection,
    readonly logger: Logger,
  ) {
    this.watch(conn);
  }

  /** Hear `conn`'s LEASE_LOST pushes and its ends (a shard's connection, as it is made). */
  watch(conn: Connection): void {
    conn.onPush(Push.LEASE_LOST, (body) => this.onLostPush(body));
    conn.onLinkLost(() => this.linkLost(conn));
  }

  /**
   * `lease` was granted with `releaseOnDisconnect` on the connection whose `link` number
   * was `link` (read when its request was sent): lost when that connection ends, or at
   * once if it has ended already.
   */
  bind(lease: Lease, link: number): void {
    if (link !== lease.conn.link) declareLost(lease, UNBOUND);
    else this.bound.set(lease.tokenText, new WeakRef(lease));
  }

  private linkLost(conn: Connection): void {
    for (const [token, ref] of [...this.bound]) {
      const lease = ref.deref();
      if (lease !== undefined && lease.conn !== conn) continue;
      this.bound.delete(token);
      if (lease !== undefined) declareLost(lease, UNBOUND);
    }
  }

  get size(): number {
    return this.leases.size;
  }

  /** Renew `lease` from now on, until it is forgotten or lost. (Its loss is heard while
   * it is renewed: `leases` has it; `forget` makes it `know`n.) */
  track(lease: Lease): void {
    this.leases.set(lease.tokenText, lease);
    if (this.unhold === null) {
      this.unhold = this.conn.hold();
      this.timer?.ref();
    }
    this.schedule(lease);
  }

  /** Stop renewing `lease` (released, settled, lost or abandoned); while it is neither
   * released nor lost, its loss is still heard (`know`). */
  forget(lease: Lease): void {
    this.untrack(lease);
    if (!lease.released && lease.lostReason === null) this.know(lease);
  }

  /** `lease`'s delivery is being settled: renewed no more, its loss still heard until
   * `settled` (without `know`'s weak reference, which every delivery would pay for:
   * the settlement's answer ends the lease, or hands it back to `settled`). */
  settling(lease: Lease): void {
    this.untrack(lease);
    this.settlingNow.set(lease.tokenText, lease);
  }

  /** The settlement `settling` began is answered or failed: a lease neither released nor
   * lost nor renewed again is still heard of (`know`). */
  settled(lease: Lease): void {
    if (this.settlingNow.get(lease.tokenText) === lease) this.settlingNow.delete(lease.tokenText);
    if (!lease.released && lease.lostReason === null && this.leases.get(lease.tokenText) !== lease) {
      this.know(lease);
    }
  }

  private untrack(lease: Lease): void {
    if (this.leases.get(lease.tokenText) !== lease) return;
    this.leases.delete(lease.tokenText);
    this.armed.delete(lease.tokenText);
    if (this.leases.size === 0) this.letGo();
    // The heap drops an entry of a forgotten lease when it reaches the top, a renewal
    // interval later: at a few thousand deliveries a second that is tens of thousands of
    // dead leases kept alive (and old by the time they go, which costs the GC). Rebuilt
    // from its live entries once most are dead: O(1) a lease, amortised.
    if (this.heap.length > 2 * this.leases.size + 64) this.compact();
  }

  /** The heap with its dead entries (forgotten or rescheduled leases) dropped. */
  private compact(): void {
    const live = this.heap.filter((entry) => this.isLive(entry));
    for (let i = (live.length >> 1) - 1; i >= 0; i -= 1) siftDown(live, i);
    this.heap.length = 0;
    for (const entry of live) this.heap.push(entry);
  }

  /** Nothing left to renew: stop keeping the process alive. */
  private letGo(): void {
    this.unhold?.();
    this.unhold = null;
    this.timer?.unref();
  }

  /** Hear about `lease`'s loss even if it is not renewed here (a received delivery). */
  know(lease: Lease): void {
    if (this.known.get(lease.tokenText)?.deref() === lease) return;
    this.known.set(lease.tokenText, new WeakRef(lease));
    this.forgetKnown.register(lease, lease.tokenText);
  }

  held(): Lease[] {
    return [...this.leases.values()];
  }

  close(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    this.timerAt = null;
    this.letGo();
  }

  /** Renew `leases` at once (optionally with a new length), outside the rounds. */
  async renewNow(leases: Lease[], leaseSeconds: number | null): Promise<void> {
    let due = leases;
    for (let redirects = 0; due.length > 0; redirects += 1) {
      const moved: Array<[Lease, Connection]> = [];
      for (const [conn, ofConn] of byConnection(due)) {
        const limit = batchLimit(conn);
        for (let start = 0; start < ofConn.length; start += limit) {
          const part = ofConn.slice(start, start + limit);
          const sentAt = now();
          const items = part.map((lease) =>
            leaseSeconds === null ? lease.handle : [lease.handle, leaseSeconds],
          );
          const reply = await call(conn, Op.LEASE_RENEW, { leases: items }); // failover.ts
          for (const lease of this.settle(part, reply, sentAt, leaseSeconds)) moved.push([lease, conn]);
        }
      }
      if (redirects >= MAX_REDIRECTS) {
        for (const [lease, conn] of moved) void this.follow(lease, conn);
        return;
      }
      const followed = await Promise.all(moved.map(([lease, conn]) => lease.follow(conn).catch(() => false)));
      due = [];
      moved.forEach(([lease], n) => {
        if (followed[n]) {
          due.push(lease); // renewed on its new shard's connection, at once
        } else {
          lease.renewAt = Math.min(now() + RENEWAL_RETRY_SECONDS, lease.lostAt);
          this.schedule(lease);
        }
      });
    }
  }

  // ---- internals -------------------------------------------------------------------

  private onLostPush(body: Reply): void {
    const handle = body['lease'] as LeaseHandle | undefined;
    if (handle === undefined || handle === null) return;
    const token = handleText(handle);
    const lease = this.leases.get(token) ?? this.settlingNow.get(token) ?? this.known.get(token)?.deref();
    if (lease !== undefined) {
      declareLost(lease, `the server ended it (${String(body['reason'] ?? 'expired')})`);
    }
  }

  private schedule(lease: Lease): void {
    const token = lease.tokenText;
    if (this.leases.get(token) !== lease) return;
    const when = this.inFlight.has(token) ? lease.lostAt : Math.min(lease.renewAt, lease.lostAt);
    this.seq += 1;
    this.armed.set(token, this.seq);
    heapPush(this.heap, [when, this.seq, lease]);
    if (this.timerAt === null || when < this.timerAt) this.arm(when);
  }

  private arm(when: number): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timerAt = when;
    this.timer = setTimeout(() => this.due(), Math.max(0, (when - now()) * 1000));
    if (this.unhold === null) this.timer.unref();
  }

  private isLive(entry: HeapEntry): boolean {
    return this.armed.get(entry[2].tokenText) === entry[1] && this.leases.get(entry[2].tokenText) === entry[2];
  }

  /** The outcome of each of `leases` renewed (one LEASE_RENEW sent at `sentAt`); the
   * leases answered `"MOVED"`, for the caller to follow. */
  private settle(leases: Lease[], reply: Reply, sentAt: number, leaseSeconds: number | null): Lease[] {
    const results = reply['results'] as unknown[];
    const moved: Lease[] = [];
    leases.forEach((lease, i) => {
      const outcome = results[i];
      if (outcome === null || outcome === undefined) {
        if (leaseSeconds !== null) lease.leaseSeconds = leaseSeconds;
        confirmRenewal(lease, sentAt);
        this.schedule(lease);
      } else if (outcome === 'STALE_CLAIM') {
        declareLost(lease, 'the server no longer knows it (STALE_CLAIM)');
      } else if (outcome === 'MOVED' && lease.conn.shards !== null) {
        moved.push(lease); // its run moved to another shard, the lease with it
      } else {
        // an outcome this client does not know: try again soon, until its deadline
        lease.renewAt = Math.min(sentAt + RENEWAL_RETRY_SECONDS, lease.lostAt);
        this.schedule(lease);
      }
    });
    return moved;
  }

  /** `from` answered `"MOVED"` for `lease`: rebound to its run's new shard and renewed
   * there at once (a map that still says `from`: tried again soon, until its deadline). */
  private async follow(lease: Lease, from: Connection): Promise<void> {
    const rebound = await lease.follow(from).catch(() => false);
    lease.renewAt = rebound ? now() : Math.min(now() + RENEWAL_RETRY_SECONDS, lease.lostAt);
    this.schedule(lease);
  }

  private due(): void {
    this.timer = null;
    this.timerAt = null;
    const t = now();
    const heap = this.heap;
    const batch: Lease[] = [];
    const watch: Lease[] = [];
    while (heap.length > 0) {
      const top = heap[0]!;
      if (!this.isLive(top)) {
        heapPop(heap);
        continue;
      }
      const lease = top[2];
      if (top[0] > t + lease.leaseSeconds / RENEWAL_BATCH_DIVISOR) break;
      heapPop(heap);
      if (lease.isLost) continue; // past its deadline: declared lost by the read
      if (this.inFlight.has(lease.tokenText)) watch.push(lease);
      else batch.push(lease);
    }
    if (batch.length > 0) {
      for (const lease of batch) this.inFlight.add(lease.tokenText);
      for (const [conn, ofConn] of byConnection(batch)) {
        const limit = batchLimit(conn);
        for (let start = 0; start < ofConn.length; start += limit) {
          void this.renewBatch(conn, ofConn.slice(start, start + limit), t);
        }
      }
    }
    for (const lease of batch) this.schedule(lease); // in flight: armed at its loss deadline
    for (const lease of watch) this.schedule(lease);
    this.rearm();
  }

  private rearm(): void {
    const heap = this.heap;
    while (heap.length > 0 && !this.isLive(heap[0]!)) heapPop(heap);
    if (heap.length === 0) return;
    const when = heap[0]![0];
    if (this.timerAt !== null && this.timerAt <= when) return;
    this.arm(when);
  }

  private async renewBatch(conn: Connection, batch: Lease[], sentAt: number): Promise<void> {
    let reply: Reply;
    try {
      reply = await conn.direct(Op.LEASE_RENEW, {
        leases: batch.map((lease) => lease.handle),
      });
    } catch (error) {
      const retryAt = now() + RENEWAL_RETRY_SECONDS;
      for (const lease of batch) this.inFlight.delete(lease.tokenText);
      const message = error instanceof RunstateError ? error.message : String(error);
      this.logger.info(`lease renewal failed, retrying: ${message}`);
      for (const lease of batch) {
        lease.renewAt = Math.min(retryAt, lease.lostAt);
        this.schedule(lease);
      }
      return;
    }
    for (const lease of batch) this.inFlight.delete(lease.tokenText);
    for (const lease of this.settle(batch, reply, sentAt, null)) void this.follow(lease, conn);
  }
}

/** The largest LEASE_RENEW `conn`'s server takes. */
function batchLimit(conn: Connection): number {
  const limits = (conn.serverInfo['limits'] ?? {}) as Record<string, unknown>;
  const value = limits['max_renew_batch'];
  return typeof value === 'number' && value > 0 ? value : Limits.MAX_RENEW_BATCH;
}

/** `leases` by the connection each was granted on, in order (one group for a client of
 * one connection). */
function byConnection(leases: Lease[]): Map<Connection, Lease[]> {
  const groups = new Map<Connection, Lease[]>();
  for (const lease of leases) {
    const group = groups.get(lease.conn);
    if (group === undefined) groups.set(lease.conn, [lease]);
    else group.push(lease);
  }
  return groups;
}

function heapPush(heap: HeapEntry[], entry: HeapEntry): void {
  heap.push(entry);
  let i = heap.length - 1;
  while (i > 0) {
    const parent = (i - 1) >> 1;
    if (!less(heap[i]!, heap[parent]!)) break;
    [heap[i], heap[parent]] = [heap[parent]!, heap[i]!];
    i = parent;
  }
}

function heapPop(heap: HeapEntry[]): HeapEntry | undefined {
  const top = heap[0];
  const last = heap.pop();
  if (heap.length > 0 && last !== undefined) {
    heap[0] = last;
    siftDown(heap, 0);
  }
  return top;
}

function siftDown(heap: HeapEntry[], from: number): void {
  let i = from;
  for (;;) {
    const l = 2 * i + 1;
    const r = l + 1;
    let m = i;
    if (l < heap.length && less(heap[l]!, heap[m]!)) m = l;
    if (r < heap.length && less(heap[r]!, heap[m]!)) m = r;
    if (m === i) break;
    [heap[i], heap[m]] = [heap[m]!, heap[i]!];
    i = m;
  }
}

function less(a: HeapEntry, b: HeapEntry): boolean {
  return a[0] < b[0] || (a[0] === b[0] && a[1] < b[1]);
}
