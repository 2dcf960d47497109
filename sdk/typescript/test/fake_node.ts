/**
 * Fake rsd nodes: real sockets speaking frames, answering exactly what a test scripts
 * (the Python suite's tests/support/fake.py, the same rules). For what rsd cannot be made
 * to show at will: a standby's NOT_PRIMARY, a primary stepping down between two requests,
 * a reply that never comes. The fake servers of the throttling and settlement tests, made
 * reusable: one `FakeNode` per node of a fake cluster.
 *
 * - `hello` decides each HELLO's answer: `null` accepts, a `Refusal` (`notPrimary(...)`)
 *   is the ERROR for the HELLO, then the connection-level error, then the close;
 * - every other request goes to `handlers[op]` (default: PING and LEASE_RENEW answered,
 *   anything else `{}`), which returns a reply map, a `Refusal`, `DROP` (the connection
 *   is cut, that request unanswered) or `HOLD` (no answer, the connection kept);
 * - what a node saw is kept: `hellos` (a count), `requests` (op and args, in order) and
 *   `greetedAt` (the place of each of its HELLOs among every fake node's HELLOs, so a test
 *   checks the order in which a client tried the nodes);
 * - `pause()`: the node reads on but answers nothing, on its connections and new ones (a
 *   paused process, SIGSTOP: its kernel still accepts connections);
 * - `clusterLease`: if set, the HELLO reply tells it (`cluster.lease_seconds`);
 * - `shard`: if set, the HELLO reply tells it (a node of a sharded cluster), and `gate`,
 *   if set, answers a request before its handler does (a MOVED for a slot not owned).
 */

import net from 'node:net';

import { FrameDecoder, Op } from '../src/wire.js';
import { frame } from './support.js';

export interface Refusal {
  code: string;
  message: string;
  details: Record<string, unknown> | null;
}

export const DROP = Symbol('drop');
export const HOLD = Symbol('hold');

export type Args = Record<string, unknown>;
export type Answer = Record<string, unknown> | Refusal | typeof DROP | typeof HOLD;

export function notPrimary(primary: string | null, epoch = 1): Refusal {
  return { code: 'NOT_PRIMARY', message: 'this node is not the primary', details: { primary, epoch } };
}

/** HELLO's `shard`: the node's shard, the cluster's slots and its map's epoch. */
export interface ShardTold {
  name: string;
  slots: number;
  map_epoch: number;
}

/** MOVED, as a shard answers a request for a slot it does not own. */
export function moved(slot: number, shard: string, primary: string | null, mapEpoch: number): Refusal {
  return {
    code: 'MOVED',
    message: `slot ${slot} is served by shard ${shard}`,
    details: { slot, shard, primary, map_epoch: mapEpoch },
  };
}

function isRefusal(answer: Answer): answer is Refusal {
  return typeof answer === 'object' && typeof (answer as Refusal).code === 'string' && 'details' in answer;
}

let helloCount = 0; // every fake node's HELLOs, in the order they came

export class FakeNode {
  hello: Refusal | null = null;
  readonly handlers = new Map<number, (args: Args) => Answer>([
    [Op.PING, () => ({ time: 0 })],
    [Op.LEASE_RENEW, (args) => ({ results: (args['leases'] as unknown[]).map(() => null) })],
  ]);
  hellos = 0;
  readonly greetedAt: number[] = [];
  paused = false;
  clusterLease: number | null = null;
  shard: ShardTold | null = null;
  gate: ((op: number, args: Args) => Answer | null) | null = null;
  readonly requests: Array<[number, Args]> = [];
  address = '';
  private readonly sockets = new Set<net.Socket>();
  private readonly server: net.Server;

  constructor(readonly name: string) {
    this.server = net.createServer((socket) => this.serve(socket));
  }

  async start(): Promise<string> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.address = `127.0.0.1:${(this.server.address() as net.AddressInfo).port}`;
    return this.address;
  }

  /** The op of every request this node got after HELLO, in order. */
  ops(): number[] {
    return this.requests.map(([op]) => op);
  }

  count(op: number): number {
    return this.ops().filter((seen) => seen === op).length;
  }

  /** Answer nothing from now on (see the module comment). */
  pause(): void {
    this.paused = true;
  }

  /** Cut every open connection (as a node that dies does). */
  drop(): void {
    for (const socket of this.sockets) socket.destroy();
  }

  /** Stop being the primary: open connections get a connection-level NOT_PRIMARY and are
   * closed; new ones get it for their HELLO. */
  stepDown(primary: string | null, epoch = 2): void {
    const refusal = notPrimary(primary, epoch);
    this.hello = refusal;
    for (const socket of this.sockets) socket.end(frame([3, 0, refusal.code, refusal.message, refusal.details]));
  }

  close(): Promise<void> {
    this.drop();
    return new Promise((resolve) => this.server.close(() => resolve()));
  }

  private serve(socket: net.Socket): void {
    this.sockets.add(socket);
    socket.on('close', () => this.sockets.delete(socket));
    socket.on('error', () => undefined);
    const decoder = new FrameDecoder();
    let greeted = false;
    socket.on('data', (chunk) => {
      for (const [, rid, op, args] of decoder.feed(chunk) as Array<[number, number, number, Args]>) {
        if (socket.destroyed) return;
        if (!greeted) {
          this.hellos += 1;
          helloCount += 1;
          this.greetedAt.push(helloCount);
        }
        if (this.paused) continue;
        if (!greeted) {
          const refusal = this.hello;
          if (refusal !== null) {
            socket.write(frame([3, rid, refusal.code, refusal.message, refusal.details]));
            socket.end(frame([3, 0, refusal.code, 'handshake failed', refusal.details]));
            return;
          }
          greeted = true;
          const info: Record<string, unknown> = {
            version: 1,
            server: `fake/${this.name}`,
            connection: this.hellos,
            time: 0,
            limits: {},
          };
          if (this.clusterLease !== null) info['cluster'] = { name: 'fake', lease_seconds: this.clusterLease };
          if (this.shard !== null) info['shard'] = this.shard;
          socket.write(frame([2, rid, info]));
          continue;
        }
        this.requests.push([op, args]);
        const handler = this.handlers.get(op);
        const answer: Answer = this.gate?.(op, args) ?? (handler === undefined ? {} : handler(args));
        if (answer === DROP) {
          socket.destroy();
          return;
        }
        if (answer === HOLD) continue;
        if (isRefusal(answer)) socket.write(frame([3, rid, answer.code, answer.message, answer.details]));
        else socket.write(frame([2, rid, answer]));
      }
    });
  }
}

/** Start `count` fake nodes named n1, n2, ...; `closeAll()` stops them. */
export async function fakeNodes(count: number): Promise<{ nodes: FakeNode[]; closeAll(): Promise<void> }> {
  const nodes: FakeNode[] = [];
  for (let n = 1; n <= count; n += 1) {
    const node = new FakeNode(`n${n}`);
    await node.start();
    nodes.push(node);
  }
  return { nodes, closeAll: () => Promise.all(nodes.map((node) => node.close())).then(() => undefined) };
}
