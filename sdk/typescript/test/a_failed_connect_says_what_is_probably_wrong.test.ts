/**
 * A connect that fails says so in the SDKs' one message (contract 2: `cannot reach rsd at
 * HOST:PORT within 2 s: CAUSE`, 2 s by default), and names the likely mix-up (contract
 * 3): an address with a scheme is refused at construction, a plain client at a TLS port
 * and a TLS client at a plain port are told which is which. A node that closes or resets
 * the connection before answering (one that died) is not asked whether it is a TLS port:
 * only an answer that looks like TLS earns that hint (issue 30).
 */

import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { InvalidArgumentError, Runstate, UnavailableError } from '../src/index.js';
import { MemoryLogger, type RsdServer, client, python, startRsd } from './support.js';

let dir: string;
let ca: Buffer;
let plain: RsdServer;
let secure: RsdServer;

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-mixup-'));
  const made = await python('certs.py', [dir, 'worker-7']).done;
  assert.equal(made.code, 0, made.stderr);
  ca = readFileSync(path.join(dir, 'ca.pem'));
  plain = await startRsd();
  secure = await startRsd({
    extra: ['--tls-cert', path.join(dir, 'server.pem'), '--tls-key', path.join(dir, 'server.key')],
  });
});
after(async () => {
  await plain.stop();
  await secure.stop();
  rmSync(dir, { recursive: true, force: true });
});

function unavailable(message: RegExp | string) {
  return (err: unknown): boolean => {
    assert.ok(err instanceof UnavailableError, String(err));
    if (typeof message === 'string') assert.equal(err.message, message);
    else assert.match(err.message, message);
    return true;
  };
}

test('no server there: the same message as Python, within the default 2 s', async () => {
  const rs = new Runstate({ holder: 'x', address: '127.0.0.1:1', logger: new MemoryLogger() });
  const started = Date.now();
  try {
    await assert.rejects(
      rs.ping(),
      unavailable('UNAVAILABLE: cannot reach rsd at 127.0.0.1:1 within 2 s: connection refused (is rsd running there?)'),
    );
    assert.ok(Date.now() - started < 8000, 'gave up near the 2 s default, not after 10 s');
  } finally {
    await rs.close();
  }
});

test('an address with a scheme other than tls:// or tcp:// is refused at construction, saying what to drop', () => {
  assert.throws(
    () => new Runstate({ holder: 'x', address: 'http://127.0.0.1:7420' }),
    (err: unknown) => {
      assert.ok(err instanceof InvalidArgumentError);
      assert.equal(
        err.message,
        "INVALID_ARGUMENT: address must be HOST:PORT, got 'http://127.0.0.1:7420' (drop the 'http://')",
      );
      return true;
    },
  );
  assert.throws(() => new Runstate({ holder: 'x', address: 'rsd://h:1' }), /\(drop the 'rsd:\/\/'\)/);
  for (const address of ['tls://h:1', 'tcp://h:1', 'h:1', '[::1]:1']) new Runstate({ holder: 'x', address });
});

test('a plain client at a TLS port is asked whether it is one', async () => {
  const rs = client(secure.address, 'plain-at-tls', { connectTimeoutMs: 1000 });
  try {
    await assert.rejects(
      rs.ping(),
      unavailable(/^UNAVAILABLE: cannot reach rsd at 127\.0\.0\.1:\d+ within 1 s: .*\(is this a TLS port\? connect with tls: true or a tls:\/\/ address\)$/),
    );
  } finally {
    await rs.close();
  }
});

test('a TLS client at a plain port is told the server there does not speak TLS', async () => {
  const rs = client(`tls://${plain.address}`, 'tls-at-plain', { tls: { ca }, connectTimeoutMs: 1000 });
  try {
    await assert.rejects(
      rs.ping(),
      unavailable(/^UNAVAILABLE: cannot reach rsd at 127\.0\.0\.1:\d+ within 1 s: .*\(the server there does not speak TLS: is it a plain rsd port\?\)$/),
    );
  } finally {
    await rs.close();
  }
});

for (const how of ['close', 'reset'] as const) {
  test(`a node that drops the handshake (${how}) is not asked whether it is a TLS port`, async () => {
    const server = net.createServer((socket) => {
      socket.on('error', () => undefined);
      socket.once('data', () => (how === 'reset' ? socket.resetAndDestroy() : socket.end()));
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const address = `127.0.0.1:${(server.address() as net.AddressInfo).port}`;
    const rs = client(address, `dropped-${how}`, { connectTimeoutMs: 1000 });
    try {
      await assert.rejects(rs.ping(), (err: unknown) => {
        assert.ok(err instanceof UnavailableError, String(err));
        assert.doesNotMatch(err.message, /TLS/);
        const cause =
          how === 'close' ? 'the server closed the connection before answering the handshake' : 'connection reset by peer';
        assert.ok(err.message.endsWith(cause), err.message);
        return true;
      });
    } finally {
      await rs.close();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });
}
