/**
 * A HELLO that rsd refuses because it is slowing down the source address (ERROR
 * UNAVAILABLE with `retry_after_ms`, then the connection closed) is tried again after
 * that pause: within the connect timeout on a first connect (then an UnavailableError
 * saying it was slowed down), for as long as it takes on a reconnect. UNAUTHENTICATED
 * is final: never tried again. A fake server in the test answers the HELLOs, so this
 * holds whatever rsd's throttle does.
 */

import assert from 'node:assert/strict';
import net from 'node:net';
import { performance } from 'node:perf_hooks';
import { test } from 'node:test';

import { AuthenticationError, UnavailableError } from '../src/index.js';
import { FrameDecoder, Op } from '../src/wire.js';
import { client, frame } from './support.js';

type HelloAnswer = 'accept' | 'mute' | { code: string; details: Record<string, unknown> | null };

/** A fake rsd: each HELLO gets `hello(n)` (n counts HELLOs from 1; 'mute': no answer);
 * other requests are answered `{ time: 0 }`. `drop()` closes every open connection. */
async function fakeServer(hello: (n: number) => HelloAnswer) {
  let hellos = 0;
  let refusedAt: number | null = null;
  const gaps: number[] = []; // ms from each refusal to the next HELLO
  const sockets = new Set<net.Socket>();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => undefined);
    const decoder = new FrameDecoder();
    socket.on('data', (chunk) => {
      for (const msg of decoder.feed(chunk) as Array<[number, number, number, unknown]>) {
        const [, rid, op] = msg;
        if (op !== Op.HELLO) {
          socket.write(frame([2, rid, { time: 0 }]));
          continue;
        }
        hellos += 1;
        if (refusedAt !== null) gaps.push(performance.now() - refusedAt);
        const answer = hello(hellos);
        if (answer === 'mute') continue;
        refusedAt = answer === 'accept' ? null : performance.now();
        if (answer === 'accept') {
          socket.write(frame([2, rid, { version: 1, server: 'fake', connection: hellos, time: 0, limits: {} }]));
        } else {
          socket.end(frame([3, rid, answer.code, 'refused by the fake server', answer.details]));
        }
      }
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as net.AddressInfo;
  return {
    address: `127.0.0.1:${port}`,
    hellos: () => hellos,
    gaps: () => gaps,
    drop(): void {
      for (const socket of sockets) socket.destroy();
    },
    close(): Promise<void> {
      for (const socket of sockets) socket.destroy();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

const slowed = (ms: number): HelloAnswer => ({ code: 'UNAVAILABLE', details: { retry_after_ms: ms } });

test('a slowed-down HELLO is tried again after its retry_after_ms, no sooner; a wrong token never', async () => {
  const server = await fakeServer((n) => (n <= 2 ? slowed(400) : 'accept'));
  const rs = client(server.address, 'slowed', { connectTimeoutMs: 10_000 });
  try {
    assert.equal((await rs.ping()).time, 0);
    assert.equal(server.hellos(), 3);
    const gaps = server.gaps();
    assert.ok(gaps.every((ms) => ms >= 400), `came back after ${gaps.join(', ')} ms`);
  } finally {
    await rs.close();
    await server.close();
  }
  const refusing = await fakeServer(() => ({ code: 'UNAUTHENTICATED', details: null }));
  const wrong = client(refusing.address, 'wrong-token', { token: 'wrong', connectTimeoutMs: 10_000 });
  try {
    await assert.rejects(wrong.ping(), AuthenticationError);
    await assert.rejects(wrong.ping(), AuthenticationError); // and again, without a HELLO
    assert.equal(refusing.hellos(), 1);
  } finally {
    await wrong.close();
    await refusing.close();
  }
});

test('a first connect slowed down past its connect timeout fails at once, saying it was slowed down', async () => {
  const server = await fakeServer(() => slowed(60_000));
  const rs = client(server.address, 'slowed', { connectTimeoutMs: 1000 });
  try {
    await assert.rejects(rs.ping(), (err: unknown) => {
      assert.ok(err instanceof UnavailableError, String(err));
      assert.equal(
        err.message,
        `UNAVAILABLE: cannot reach rsd at ${server.address} within 1 s: rsd is slowing down ` +
          'connections from this address after failed logins (it asked to retry after 60000 ms)',
      );
      return true;
    });
    assert.equal(server.hellos(), 1, 'a pause longer than the time left is not waited for');
  } finally {
    await rs.close();
    await server.close();
  }
});

test('a first connect whose attempt after a slow-down is cut short by the timeout says it was slowed down', async () => {
  // The second HELLO is never answered (on a loaded machine an answer can simply come
  // too late): the error names the slow-down, the cause, not the timeout.
  const server = await fakeServer((n) => (n === 1 ? slowed(100) : 'mute'));
  const rs = client(server.address, 'slowed', { connectTimeoutMs: 1000 });
  try {
    await assert.rejects(rs.ping(), (err: unknown) => {
      assert.ok(err instanceof UnavailableError, String(err));
      assert.match(err.message, /within 1 s: rsd is slowing down connections from this address/);
      return true;
    });
    assert.equal(server.hellos(), 2);
  } finally {
    await rs.close();
    await server.close();
  }
});

test('a client that was connected is slowed down past its connect timeout and still reconnects', async () => {
  // After the drop, HELLOs 2 to 7 are slowed down 300 ms each: about 2 s in all, twice
  // the connect timeout. A reconnect waits that out rather than give up.
  const server = await fakeServer((n) => (n >= 2 && n <= 7 ? slowed(300) : 'accept'));
  const rs = client(server.address, 'reconnecting', { connectTimeoutMs: 1000 });
  try {
    await rs.ping();
    server.drop();
    await assert.rejects(rs.ping(), UnavailableError).catch(() => undefined); // may race the drop
    assert.equal((await rs.ping()).time, 0);
    assert.equal(server.hellos(), 8);
  } finally {
    await rs.close();
    await server.close();
  }
});
