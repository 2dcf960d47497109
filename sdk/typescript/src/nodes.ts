/**
 * The nodes a client may reach, and the order in which one connect tries them (the
 * Python SDK's `rsclient/nodes.py`, the same rules).
 *
 * A client is given one address or a comma-separated list of them (`'h1:7420,h2:7420'`):
 * the nodes of one rsd cluster, of which one at a time is the primary (protocol.md,
 * "Clusters"). What always holds:
 * - every entry is an address `parseAddress` takes; an empty list or an empty entry is
 *   refused with InvalidArgumentError, and a node listed twice is kept once, in its
 *   first place;
 * - a `Route` is the order of one connect's attempts: the node last known as the primary
 *   first, then the listed nodes in their order, each once per round, but the node the
 *   client just gave up on (its connection lost or silent: `last`) at the end of every
 *   round, never first: a node that died, paused or was cut off is the least likely to
 *   answer, and one that accepts TCP but answers nothing would cost a whole attempt. A
 *   redirect to it is not followed at once either (the nodes that name it may not know
 *   yet that it is gone): it keeps its place at the end of the round;
 * - a node that answers NOT_PRIMARY naming the primary sends the route there next, even
 *   to a node that is not listed (the cluster's advertised address), but at most
 *   `MAX_REDIRECTS` times in a row: one more ends the round, so redirects going round
 *   between nodes never spin; any other failure resets the count;
 * - a NOT_PRIMARY without a primary (an election) or any other failure moves on to the
 *   next node of the round; when the round is over the caller pauses (backoff with
 *   jitter) and starts the next one;
 * - a node named by a redirect is reached the way its listed twin is, else the way the
 *   node that named it was (TLS or not), unless it carries `tls://` itself;
 * - nodes are the same node when host and port are (`sameNode`).
 */

import { InvalidArgumentError } from './errors.js';
import { type Address, parseAddress } from './reach.js';
import { MAX_REDIRECTS } from './sdkrules.js';

/** NOT_PRIMARY redirects followed in a row before the route pauses. */
export { MAX_REDIRECTS };

export function sameNode(a: Address, b: Address): boolean {
  return a.host === b.host && a.port === b.port;
}

/** The nodes of `'HOST:PORT'` or `'HOST:PORT,HOST:PORT,...'`, in order, each once. */
export function parseAddresses(text: string): Address[] {
  if (typeof text !== 'string' || text.trim() === '') {
    throw new InvalidArgumentError(`address must be HOST:PORT, got '${String(text)}'`);
  }
  const nodes: Address[] = [];
  for (const entry of text.split(',')) {
    if (entry.trim() === '') {
      throw new InvalidArgumentError(
        `address must be HOST:PORT or a comma-separated list of them, got '${text}' (an empty entry)`,
      );
    }
    const node = parseAddress(entry);
    if (!nodes.some((known) => sameNode(known, node))) nodes.push(node);
  }
  return nodes;
}

/** The node that `primary` is, as `by` named it in a NOT_PRIMARY answer (the listed
 * node of that host and port, else one reached as `by` is); null if it names none. */
export function resolve(nodes: readonly Address[], by: Address, primary: unknown): Address | null {
  if (typeof primary !== 'string' || primary.trim() === '') return null;
  let named: Address;
  try {
    named = parseAddress(primary);
  } catch {
    return null;
  }
  const listed = nodes.find((node) => sameNode(node, named));
  if (listed !== undefined) return listed;
  return { ...named, tls: named.tls || by.tls };
}

/** The order of one connect's attempts over `nodes` (see the module comment). */
export class Route {
  private round: Address[] = []; // what is left of this round, next one last
  private nextNode: Address | null = null; // a node to try before the rest of the round
  private redirects = 0;

  constructor(
    readonly nodes: readonly Address[],
    /** The node last known as primary (or named as it). */
    public primary: Address | null,
    /** The node just given up on: tried last in every round. */
    readonly last: Address | null = null,
  ) {
    this.newRound();
  }

  /** Start a round: the known primary first, then every listed node, the node just given
   * up on last. */
  newRound(): void {
    const last = this.last;
    const first = this.primary !== null && (last === null || !sameNode(this.primary, last)) ? this.primary : null;
    const order = first === null ? [] : [first];
    const skip = (node: Address): boolean =>
      (first !== null && sameNode(node, first)) || (last !== null && sameNode(node, last));
    for (const node of this.nodes) if (!skip(node)) order.push(node);
    if (last !== null) order.push(last);
    this.round = order.reverse();
    this.nextNode = null;
    this.redirects = 0;
  }

  /** The node to try now; null once the round is over. */
  next(): Address | null {
    const node = this.nextNode;
    this.nextNode = null;
    if (node !== null) return node;
    return this.round.pop() ?? null;
  }

  /** Try `node` once more next (it asked to be retried after a pause). */
  again(node: Address): void {
    this.nextNode = node;
  }

  /** An attempt failed some other way than by a redirect: the count starts over. */
  failed(): void {
    this.redirects = 0;
  }

  /** `by` answered NOT_PRIMARY naming `primary` (null: it knows none). True if the route
   * goes there next; false if not: none named or the node given up on named (the round
   * goes on), or one redirect too many in a row (the round is over). */
  redirect(by: Address, primary: unknown): boolean {
    const target = resolve(this.nodes, by, primary);
    this.primary = target;
    if (target === null || (this.last !== null && sameNode(target, this.last))) {
      // none named, or the node given up on: it keeps its place at the end of the round
      this.redirects = 0;
      return false;
    }
    this.redirects += 1;
    if (this.redirects > MAX_REDIRECTS) {
      this.round = [];
      return false;
    }
    this.nextNode = target;
    return true;
  }
}
