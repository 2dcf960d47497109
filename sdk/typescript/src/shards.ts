/**
 * The shards of a sharded cluster: where each request goes, one connection per shard
 * primary (protocol.md, "Slots and shards"; the Python SDK routes by the same table).
 *
 * A client starts with one connection, to the nodes it was given (the *seed*). When a
 * HELLO names a shard (a node of a cluster), that connection is the connection of its
 * shard, and every request is routed here by its route (`ROUTE`, sdkrules.ts):
 * - 'run' and 'name': to the connection of the shard that owns the slot of the request's
 *   key (a run id, a placement, a pool's or a quota's name), by the slot map;
 * - 'connection' (renewals, settlements, releases, a wait's CANCEL): on the connection
 *   the call was made on, the one holding the lease or the wait (leases, waits,
 *   consumers and pushes stay per connection); a lease whose run moved to another shard
 *   is answered MOVED there (a renewal item `"MOVED"`, a handle op the error) and follows
 *   its run: rebound to the connection of the run's new shard (`follow`, leases.ts);
 * - 'every' (MAILBOX_ENSURE): to every shard that owns slots, at once;
 * - 'any': to the seed (another ready connection while the seed is down).
 *
 * What always holds:
 * - the map is asked (SLOT_MAP) only when needed: when a HELLO tells a map epoch above
 *   the one known (a cluster whose map never changed, epoch 1, has one shard holding
 *   every slot: nothing is asked and every request goes to the seed, as to a lone rsd),
 *   when a request is answered MOVED, and when a shard's connection is lost (where its
 *   primary is now). One ask at a time, shared by whoever needs it;
 * - a request answered MOVED was not executed: it is sent to the owner, at most
 *   MAX_REDIRECTS times in a row (one more MOVED is an UnavailableError with code MOVED
 *   and that answer's details), after what `movedPause` says by the answer's `map_epoch`
 *   (the rule both SDKs follow, rsproto/sdkrules.py): newer than the map known, the map
 *   is asked again (of the node that answered); the same, it goes at once; older, the
 *   node that answered lags behind the map (a slot move's target adopts it when its etcd
 *   watch says so, while the source already lets its held requests go there) and the
 *   request waits LAGGING_NODE_PAUSE_MS, doubled with each MOVED in a row, for it to
 *   catch up, then goes to the owner by the map known again (not back where the older
 *   map sends it);
 * - a shard's connection is made when a request first needs it, with the seed's options
 *   (token, TLS, holder, timeouts), to the shard's primary first and then the nodes
 *   given; it follows its shard's primary as the seed follows its own (a takeover), a
 *   node of another shard passed over, and learns where the primary went from a fresh
 *   map asked through another connection (or, none ready, a connection of its own to the
 *   nodes given);
 * - a lone rsd (no `shard` in HELLO) never meets any of this: its connection has no
 *   `shards` and sends every request itself.
 */

import type { Address } from './reach.js';
import { type Args, Connection, type Reply, type ShardTold, type Via, type WaitOptions } from './connection.js';
import { UnavailableError } from './errors.js';
import { resolve, sameNode } from './nodes.js';
import { LAGGING_NODE_PAUSE_MS, MAX_REDIRECTS, ROUTE } from './sdkrules.js';
import { SlotMap, routeKey } from './slots.js';
import { now, sleep } from './util.js';
import { Op } from './wire.js';

/** What comes before a request answered MOVED goes again (`moved`: the MOVED answers in
 * a row, this one included), by the epoch of the map known (`knownEpoch`; null: none)
 * and the answer's `map_epoch` (`toldEpoch`): null, the map is asked again first (the
 * answer's is newer, or not told); else the milliseconds it waits first: 0 when the map
 * known is the answer's, LAGGING_NODE_PAUSE_MS doubled with each MOVED in a row when it
 * is newer (the node that answered lags behind it). rsproto/sdkrules.py's `moved_pause`. */
export function movedPause(knownEpoch: number | null, toldEpoch: unknown, moved: number): number | null {
  if (knownEpoch === null || typeof toldEpoch !== 'number' || !Number.isInteger(toldEpoch) || toldEpoch > knownEpoch) {
    return null;
  }
  return toldEpoch === knownEpoch ? 0 : LAGGING_NODE_PAUSE_MS * 2 ** (moved - 1);
}

export class Shards {
  /** The map known; null: none asked yet (one shard: every request to the seed). */
  map: SlotMap | null = null;
  /** Called with each connection made for a shard (the lease keeper watches it). */
  onConnection: ((conn: Connection) => void) | null = null;
  /** @internal: how a request answered MOVED by a node behind the map waits, in
   * milliseconds (`movedPause`; a test stands in for it). */
  pause: (ms: number) => Promise<void> = sleep;
  private stale = false; // a HELLO told a newer map epoch than the map known
  private refreshing: Promise<void> | null = null;
  private readonly links = new Map<string, Connection>(); // shard → its connection
  private closed = false;

  constructor(readonly seed: Connection) {
    seed.options.onShard = (conn, told) => this.heard(conn, told);
    seed.options.locate = (conn) => this.locate(conn);
  }

  /** Every connection made so far, the seed first. */
  connections(): Connection[] {
    const all = [this.seed];
    for (const conn of this.links.values()) if (conn !== this.seed) all.push(conn);
    return all;
  }

  /** `op` from a call made on `from`, sent where its route says; `via` is told the
   * connection that answered. */
  request<T = Reply>(from: Connection, op: number, args: Args, via?: Via): Promise<T> {
    if (this.map !== null || this.stale) return this.routed<T>(from, op, args, via);
    // No map (one shard): where a lone rsd's request goes, and no more per request; a
    // MOVED (slots given to a shard since) asks for the map and routes from then on.
    const route = ROUTE[op]?.[0];
    const target = route === 'connection' ? from : this.anyConnection();
    return target.direct<T>(op, args, via).catch(async (error: unknown) => {
      if (route === 'connection' || route === 'every') throw error;
      const next = await this.redirected(error, target, routeKey(op, args)[1], 0);
      return this.routed<T>(from, op, args, via, next, 1);
    });
  }

  /** `request` by the map: `target` (by default the owner of the key's slot) after
   * `redirects` MOVED answers in a row. */
  private async routed<T>(
    from: Connection,
    op: number,
    args: Args,
    via: Via | undefined,
    target: Connection | null = null,
    redirects = 0,
  ): Promise<T> {
    const [route, key] = routeKey(op, args);
    if (route === 'connection') return from.direct<T>(op, args, via);
    if (this.stale) await this.refresh(from).catch(() => undefined);
    if (route === 'every') return this.toEvery<T>(op, args);
    target ??= this.pick(key);
    for (; ; redirects += 1) {
      try {
        return await target.direct<T>(op, args, via);
      } catch (error) {
        target = await this.redirected(error, target, key, redirects);
      }
    }
  }

  /** A wait (`Connection.requestWait`), sent where its route says; a MOVED answer is
   * followed with the time left. */
  requestWait(from: Connection, op: number, args: Args, options: WaitOptions): Promise<Reply> {
    const started = now();
    if (this.map !== null || this.stale) return this.routedWait(from, op, args, options, started);
    // No map (one shard): as `request`.
    const route = ROUTE[op]?.[0];
    const target = route === 'connection' || route === 'every' ? from : this.anyConnection();
    return target.directWait(op, args, options).catch(async (error: unknown) => {
      if (route === 'connection' || route === 'every') throw error;
      const next = await this.redirected(error, target, routeKey(op, args)[1], 0);
      return this.routedWait(from, op, args, options, started, next, 1);
    });
  }

  /** `requestWait` by the map, as `routed`; a MOVED answer is followed with the time
   * left since `started`. */
  private async routedWait(
    from: Connection,
    op: number,
    args: Args,
    options: WaitOptions,
    started: number,
    target: Connection | null = null,
    redirects = 0,
  ): Promise<Reply> {
    const [route, key] = routeKey(op, args);
    if (route === 'connection' || route === 'every') return from.directWait(op, args, options);
    if (this.stale) await this.refresh(from).catch(() => undefined);
    target ??= this.pick(key);
    for (; ; redirects += 1) {
      const leftMs = Math.max(0, Math.floor(options.timeoutMs - (now() - started) * 1000));
      if (leftMs < options.timeoutMs) {
        args = { ...args, timeout_ms: leftMs };
        options = { ...options, timeoutMs: leftMs };
        started = now();
      }
      try {
        return await target.directWait(op, args, options);
      } catch (error) {
        target = await this.redirected(error, target, key, redirects);
      }
    }
  }

  /** Where a lease lives now that `from` answered MOVED for it (its run, and the lease
   * with it, moved to another shard: follow.md's renewal item outcome, or a handle op's
   * answer with its `details`): the map asked again of `from` (unless `details` tell an
   * epoch the map known has already), then the connection of the shard owning `key`'s
   * slot (`key`: the lease's run, or a pool slot's pool), or the shard `details` name
   * if the map still gives the slot to `from`'s. */
  async follow(from: Connection, key: string, details: Reply | null = null): Promise<Connection> {
    const told = details?.['map_epoch'];
    const known = this.map !== null && typeof told === 'number' && this.map.epoch >= told;
    if (!known) await this.refresh(from).catch(() => undefined);
    const next = this.map === null ? from : this.pick(key);
    const named = details?.['shard'];
    if (next === from && typeof named === 'string' && named !== from.shardName) {
      const primary = details?.['primary'];
      return this.link(named, typeof primary === 'string' ? primary : null);
    }
    return next;
  }

  /** Whether a view of the whole cluster asks several shards: the map gives slots to a
   * shard other than the seed's (false for a cluster of one shard, as for a lone rsd). */
  get sharded(): boolean {
    const owners = this.map?.owners() ?? [];
    return owners.length > 1 || (owners.length === 1 && owners[0] !== this.seed.shardName);
  }

  /** The shards that own slots, in the map's order, each with its connection (made if
   * need be): the shards a view of the whole cluster asks (admin.ts, fanout.ts); null
   * when the seed's connection sees it all (`sharded` false). A map a HELLO told newer
   * than the one known is asked for first. */
  async owning(): Promise<Array<[string, Connection]> | null> {
    if (this.stale) await this.refresh(this.seed).catch(() => undefined);
    if (!this.sharded) return null;
    return this.map!.owners().map((shard) => [shard, this.link(shard)]);
  }

  /** Close every shard's connection but the seed's (the client closes that one). */
  async close(): Promise<void> {
    this.closed = true;
    await Promise.all(this.connections().slice(1).map((conn) => conn.close()));
  }

  // ---- internals -------------------------------------------------------------------

  /** `error` ended a send to `target` after `redirects` MOVED answers in a row: rethrown
   * unless MOVED within MAX_REDIRECTS, else the connection to send to next, after what
   * `movedPause` says: the owner by a fresh map (or the one MOVED named, if the map
   * still says `target`), by the map known, or, after a pause, by the map known too
   * (`target` lags behind it: what its older map names is not followed). */
  private async redirected(error: unknown, target: Connection, key: string | null, redirects: number): Promise<Connection> {
    if (!(error instanceof UnavailableError) || error.code !== 'MOVED') throw error;
    const details = error.details;
    if (redirects >= MAX_REDIRECTS) {
      const said = error.message.replace(/^MOVED: /, '');
      throw new UnavailableError(
        `${said} (answered MOVED ${redirects + 1} times in a row: the slot map is changing; try again)`,
        'MOVED',
        details,
      );
    }
    const pauseMs = movedPause(this.map?.epoch ?? null, details['map_epoch'], redirects + 1);
    if (pauseMs === null) await this.refresh(target).catch(() => undefined);
    else if (pauseMs > 0) {
      await this.pause(pauseMs);
      return this.pick(key);
    }
    const next = this.pick(key);
    const named = details['shard'];
    if (next === target && typeof named === 'string' && named !== target.shardName) {
      const primary = details['primary'];
      return this.link(named, typeof primary === 'string' ? primary : null); // the map lags
    }
    return next;
  }

  /** The connection of the shard owning `key`'s slot; with no key (or no map), any. */
  private pick(key: string | null): Connection {
    const map = this.map;
    if (key === null || map === null) return this.anyConnection();
    return this.link(map.ownerOf(key));
  }

  /** The seed, or while it is down another ready connection. */
  private anyConnection(): Connection {
    const seed = this.seed;
    if (seed.connected) return seed;
    for (const conn of this.links.values()) if (conn.connected) return conn;
    return seed;
  }

  /** `op` to every shard owning slots (a declaration each must know): the first's
   * reply, `created` if any shard made it. */
  private async toEvery<T>(op: number, args: Args): Promise<T> {
    const map = this.map;
    const targets = map === null ? [this.seed] : map.owners().map((shard) => this.link(shard));
    const replies = await Promise.all(targets.map((conn) => conn.direct<Reply>(op, args)));
    const first = replies[0]!;
    if (!('created' in first)) return first as T;
    return { ...first, created: replies.some((reply) => reply['created'] === true) } as T;
  }

  /** The connection of `shard`, made now if none is (`primary`: where it is, if the
   * map does not say). */
  private link(shard: string, primary: string | null = null): Connection {
    const known = this.links.get(shard);
    if (known !== undefined) return known;
    if (this.closed || this.seed.closed) return this.seed; // it says the client is closed
    const seeds = this.seed.options.nodes;
    const first = resolve(seeds, seeds[0]!, this.map?.primaries.get(shard) ?? primary);
    const nodes = first === null ? [...seeds] : [first, ...seeds.filter((node) => !sameNode(node, first))];
    const conn = new Connection({
      ...this.seed.options,
      nodes,
      shard,
      locate: (lost) => this.locate(lost),
      onShard: (c, told) => this.heard(c, told),
    });
    conn.cluster = true; // a shard is an HA group: its takeover is ridden through
    conn.shards = this;
    this.links.set(shard, conn);
    this.onConnection?.(conn);
    return conn;
  }

  /** A HELLO named `told`: the seed's first makes this client one of a cluster; a map
   * epoch above the known one makes the map stale. */
  private heard(conn: Connection, told: ShardTold): void {
    if (conn === this.seed && !this.links.has(told.name)) {
      this.links.set(told.name, conn);
      conn.shards = this;
    }
    if (told.mapEpoch > (this.map?.epoch ?? 1)) this.stale = true;
  }

  /** Where `conn`'s shard's primary is now, by a fresh map asked through another
   * connection; null without a map (one shard: the seed follows its nodes as ever). */
  private async locate(conn: Connection): Promise<Address | null> {
    const shard = conn.shardName;
    if (this.map === null || shard === null || this.closed) return null;
    await this.refresh(null, conn);
    const seeds = this.seed.options.nodes;
    return resolve(seeds, seeds[0]!, this.map.primaries.get(shard) ?? null);
  }

  /** Ask the map again (one ask at a time, shared): of `first` if given, else of a
   * ready connection other than `besides`, else of the nodes given. */
  private refresh(first: Connection | null, besides: Connection | null = null): Promise<void> {
    if (this.refreshing === null) {
      this.stale = false;
      this.refreshing = this.askMap(first, besides).finally(() => {
        this.refreshing = null;
      });
    }
    return this.refreshing;
  }

  private async askMap(first: Connection | null, besides: Connection | null): Promise<void> {
    const candidates = this.connections().filter((conn) => conn !== besides && conn !== first && conn.connected);
    if (first !== null) candidates.unshift(first);
    let failure: unknown = new UnavailableError('no connection could tell the slot map');
    for (const conn of candidates) {
      try {
        this.adopt(await this.askOf(conn));
        return;
      } catch (error) {
        failure = error;
      }
    }
    if (this.closed) throw failure;
    // None ready: a connection of its own to the nodes given, for this one question.
    const probe = new Connection({ ...this.seed.options, shard: null, locate: undefined, onShard: undefined });
    try {
      this.adopt(await this.askOf(probe));
    } finally {
      void probe.close();
    }
  }

  private async askOf(conn: Connection): Promise<SlotMap> {
    return SlotMap.fromWire(await conn.direct<Reply>(Op.SLOT_MAP, {}));
  }

  /** Take `map` unless an older one than the map known. */
  private adopt(map: SlotMap): void {
    if (this.map !== null && map.epoch < this.map.epoch) return;
    this.map = map;
    // Its shards are HA groups: the seed rides a takeover too (failover.ts).
    if (map.owners().length > 1) this.seed.cluster = true;
  }
}
