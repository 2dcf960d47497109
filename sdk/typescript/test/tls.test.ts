/**
 * TLS against rsd's own TLS (`--tls-cert/--tls-key`, and `--tls-client-ca` with a tokens
 * file mapping a client certificate's CN to a tenant): `tls://` addresses, a CA passed in
 * the `tls` options, a client certificate as the credential, and the failures a user meets
 * (an untrusted server, a plain client at a TLS port) as UnavailableError.
 */

import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { AuthenticationError, UnavailableError } from '../src/index.js';
import { type RsdServer, client, python, startRsd } from './support.js';

let dir: string;
let ca: Buffer;

before(async () => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-tls-'));
  const made = await python('certs.py', [dir, 'worker-7', 'stranger']).done;
  assert.equal(made.code, 0, made.stderr);
  ca = readFileSync(path.join(dir, 'ca.pem'));
});
after(() => {
  rmSync(dir, { recursive: true, force: true });
});

const serverFlags = (): string[] => [
  '--tls-cert',
  path.join(dir, 'server.pem'),
  '--tls-key',
  path.join(dir, 'server.key'),
];

describe('TLS', () => {
  let rsd: RsdServer;
  before(async () => {
    rsd = await startRsd({ extra: serverFlags() });
  });
  after(async () => {
    await rsd.stop();
  });

  test('a tls:// address with the CA in the options holds a claim over TLS', async () => {
    const rs = client(`tls://${rsd.address}`, 'tls-a', { tls: { ca } });
    try {
      const run = await rs.scopes.create();
      const lease = await run.claim('k').acquire();
      assert.ok(lease.generation >= 1);
      assert.equal(lease.token().length, 32);
      await lease.release();
    } finally {
      await rs.close();
    }
  });

  test('tls: { ca } with a plain address turns TLS on too', async () => {
    const rs = client(rsd.address, 'tls-b', { tls: { ca } });
    try {
      assert.ok(typeof (await rs.ping()).time === 'number');
    } finally {
      await rs.close();
    }
  });

  test('a server the client does not trust is UnavailableError naming the address', async () => {
    const rs = client(`tls://${rsd.address}`, 'tls-c', { connectTimeoutMs: 1500 });
    try {
      await assert.rejects(rs.ping(), (err: unknown) => {
        assert.ok(err instanceof UnavailableError, String(err));
        assert.match(err.message, new RegExp(rsd.address.replace(/\./g, '\\.')));
        return true;
      });
    } finally {
      await rs.close();
    }
  });

  test('a plain client at the TLS port is UnavailableError within its connect timeout', async () => {
    const rs = client(rsd.address, 'plain', { connectTimeoutMs: 1500 });
    const started = Date.now();
    try {
      await assert.rejects(rs.ping(), (err: unknown) => err instanceof UnavailableError);
      assert.ok(Date.now() - started < 5000, 'gave up within a few seconds');
    } finally {
      await rs.close();
    }
  });
});

describe('mutual TLS', () => {
  let rsd: RsdServer;
  before(async () => {
    const tokens = path.join(dir, 'tokens');
    writeFileSync(tokens, 'cert:worker-7 team-a client\n');
    rsd = await startRsd({
      extra: [...serverFlags(), '--tls-client-ca', path.join(dir, 'ca.pem'), '--tokens-file', tokens],
    });
  });
  after(async () => {
    await rsd.stop();
  });

  test('a certificate of the right CA that the tokens file does not list is AuthenticationError', async () => {
    const rs = client(`tls://${rsd.address}`, 'stranger', {
      tls: { ca, cert: readFileSync(path.join(dir, 'stranger.pem')), key: readFileSync(path.join(dir, 'stranger.key')) },
    });
    try {
      await assert.rejects(rs.ping(), (err: unknown) => {
        assert.ok(err instanceof AuthenticationError, String(err));
        assert.equal(err.code, 'UNAUTHENTICATED');
        return true;
      });
    } finally {
      await rs.close();
    }
  });

  test('a client certificate listed in the tokens file is its credential', async () => {
    const rs = client(`tls://${rsd.address}`, 'cert-holder', {
      tls: {
        ca,
        cert: readFileSync(path.join(dir, 'worker-7.pem')),
        key: readFileSync(path.join(dir, 'worker-7.key')),
      },
    });
    try {
      const run = await rs.scopes.create();
      await run.claim('k').run(async (lease) => assert.ok(lease.generation >= 1));
    } finally {
      await rs.close();
    }
  });

  test('without a client certificate the TLS handshake is refused: UnavailableError', async () => {
    const rs = client(`tls://${rsd.address}`, 'no-cert', { tls: { ca }, connectTimeoutMs: 2000 });
    try {
      await assert.rejects(rs.ping(), (err: unknown) => {
        assert.ok(err instanceof UnavailableError, String(err));
        return true;
      });
    } finally {
      await rs.close();
    }
  });
});
