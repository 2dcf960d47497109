/**
 * A settlement whose answer a disconnect lost (rsd may have recorded it) is sent again
 * after the client reconnects, with the same lease handle, and `complete()` returns what
 * the repeat is answered (contract 4; protocol.md, "Repeated settlements").
 *
 * The first test needs no server change (a fake server drops the first complete
 * unanswered). The second runs against real rsd through a proxy that cuts the
 * connection in place of the complete's reply: rsd recorded it, the client never heard;
 * it needs the server side of contract 4 (a repeat answered as the first).
 */

import assert from 'node:assert/strict';
import net from 'node:net';
import { after, before, test } from 'node:test';

import { FrameDecoder, Op } from '../src/wire.js';
import { client, frame, type RsdServer, startRsd } from './support.js';

async function listen(server: net.Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
}

/** A fake rsd that hands out one delivery under `handle` and passes each settlement of
 * `settleOp` to `settle`: its answer is sent, or null drops the connection unanswered
 * (recorded, or not: the client cannot tell). */
async function fakeServer(
  handle: Uint8Array,
  settleOp: number,
  settle: (args: Record<string, unknown>) => unknown,
): Promise<{ address: string; close(): Promise<void> }> {
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('error', () => undefined);
    const decoder = new FrameDecoder();
    socket.on('data', (chunk) => {
      for (const [, rid, op, args] of decoder.feed(chunk) as Array<[number, number, number, Record<string, unknown>]>) {
        let result: unknown;
        if (op === Op.HELLO) result = { version: 1, server: 'fake', connection: 1, time: 0, limits: {} };
        else if (op === Op.RECEIVE) {
          result = {
            delivery: { id: 't1', kind: 'task', task_id: 't1', key: null, data: 1, attempt: 1, lease: handle, lease_seconds: 30 },
          };
        } else if (op === settleOp) {
          result = settle(args);
          if (result === null) {
            socket.destroy();
            continue;
          }
        } else result = {};
        socket.write(frame([2, rid, result]));
      }
    });
  });
  const address = await listen(server);
  return {
    address,
    async close(): Promise<void> {
      for (const socket of sockets) socket.destroy();
      await new Promise((resolve) => server.close(resolve));
    },
  };
}

test('a complete left unanswered by a dropped connection is sent again with the same handle', async () => {
  const handle = new Uint8Array(16).fill(7);
  const completes: unknown[] = [];
  const fake = await fakeServer(handle, Op.DELIVERY_COMPLETE, (args) => {
    completes.push(args['lease']);
    return completes.length === 1 ? null : { id: 't1', state: 'SUCCEEDED' };
  });
  const rs = client(fake.address, 'resender');
  try {
    const delivery = await rs.scope('s').mailbox('m').receive();
    assert.ok(delivery !== null);
    await delivery.complete({ payload: { done: true } });
    assert.equal(delivery.state, 'SUCCEEDED');
    assert.equal(delivery.settled, true);
    assert.equal(completes.length, 2, 'sent twice');
    assert.deepEqual(completes.map((h) => [...(h as Uint8Array)]), [[...handle], [...handle]]);
  } finally {
    await rs.close();
    await fake.close();
  }
});

test('a requeue left unanswered by a dropped connection is not sent again', async () => {
  let releases = 0;
  const fake = await fakeServer(new Uint8Array(16).fill(9), Op.DELIVERY_RELEASE, () => {
    releases += 1;
    return null;
  });
  const rs = client(fake.address, 'requeuer');
  try {
    const delivery = await rs.scope('s').mailbox('m').receive();
    assert.ok(delivery !== null);
    await assert.rejects(delivery.requeue(), { name: 'UnavailableError' });
    await new Promise((resolve) => setTimeout(resolve, 300)); // a resend would have come by now
    assert.equal(releases, 1, 'sent once');
  } finally {
    await rs.close();
    await fake.close();
  }
});

// ---- against real rsd (needs contract 4's server side)

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

/** A TCP proxy to rsd; `cutNextReply()` makes it close the client's connection in place
 * of forwarding the next bytes rsd sends on it. */
async function proxy(upstream: string) {
  const [host, port] = [upstream.slice(0, upstream.lastIndexOf(':')), Number(upstream.slice(upstream.lastIndexOf(':') + 1))];
  let cut = false;
  const pairs = new Set<[net.Socket, net.Socket]>();
  const server = net.createServer((down) => {
    const up = net.connect({ host, port });
    const pair: [net.Socket, net.Socket] = [down, up];
    pairs.add(pair);
    const end = (): void => {
      down.destroy();
      up.destroy();
      pairs.delete(pair);
    };
    down.on('error', end).on('close', end);
    up.on('error', end).on('close', end);
    down.on('data', (chunk) => up.write(chunk));
    up.on('data', (chunk) => {
      if (cut) {
        cut = false;
        end();
        return;
      }
      down.write(chunk);
    });
  });
  const address = await listen(server);
  return {
    address,
    cutNextReply(): void {
      cut = true;
    },
    close(): Promise<void> {
      for (const [down, up] of pairs) {
        down.destroy();
        up.destroy();
      }
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

test('a complete rsd recorded but whose reply was lost returns normally, the result recorded once', async () => {
  const setup = client(rsd.address, 'setup');
  const relay = await proxy(rsd.address);
  const rs = client(relay.address, 'worker');
  try {
    await setup.mailboxes.ensure('resend');
    const run = await setup.scopes.create();
    const ticket = await run.mailbox('resend').submit({ n: 1 });
    const delivery = await rs.scope(run.id).mailbox('resend').receive();
    assert.ok(delivery !== null);
    relay.cutNextReply();
    await delivery.complete({ payload: { answer: 42 } });
    assert.equal(delivery.state, 'SUCCEEDED');
    const view = await ticket.result({ timeoutMs: 5000 });
    assert.equal(view.state, 'SUCCEEDED');
    assert.deepEqual(view.outcome, { answer: 42 });
    assert.equal(view.attempt, 1);
  } finally {
    await rs.close();
    await setup.close();
    await relay.close();
  }
});
