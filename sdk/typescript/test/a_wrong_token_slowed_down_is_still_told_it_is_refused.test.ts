/**
 * A wrong token past its address's allowance is still told as a wrong token (issue 30;
 * the Python suite's test_a_wrong_token_slowed_down_is_still_told_it_is_refused.py).
 * After 10 failed HELLOs from an address rsd slows its wrong tokens down, up to 5 s; a
 * client whose HELLO answer waited past its 2 s connect timeout saw `UNAVAILABLE ...
 * timed out`. rsd answers a slowed refusal within 0.5 s (keeping its place for the whole
 * delay), so a client with the default options throws AuthenticationError
 * (UNAUTHENTICATED). A real rsd: the answer against the SDK's own bound.
 */

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { test } from 'node:test';

import { AuthenticationError } from '../src/index.js';
import { client, startRsd } from './support.js';

const digest = (token: string): string => `sha256:${createHash('sha256').update(token).digest('hex')}`;

async function refused(address: string, connectTimeoutMs?: number): Promise<AuthenticationError> {
  const rs = client(address, 'worker', {
    token: 'rsd_not_a_token',
    ...(connectTimeoutMs === undefined ? {} : { connectTimeoutMs }),
  });
  try {
    await rs.ping();
  } catch (error) {
    assert.ok(error instanceof AuthenticationError, String(error));
    return error;
  } finally {
    await rs.close();
  }
  assert.fail('a wrong token was accepted');
}

test('a bad token after many bad attempts throws AuthenticationError with the default options', async () => {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-slowed-'));
  const tokens = path.join(dir, 'tokens');
  writeFileSync(tokens, `${digest('rsd_the-one-valid-token-here')} acme client\n`);
  const rsd = await startRsd({ extra: ['--tokens-file', tokens] });
  try {
    // 20 bad attempts at once: 10 within the allowance, 10 slowed down, the last by 5 s
    // (these clients wait as long as it takes).
    await Promise.all(Array.from({ length: 20 }, () => refused(rsd.address, 30_000)));
    const failure = await refused(rsd.address); // the defaults: a 2 s connect timeout
    assert.equal(failure.code, 'UNAUTHENTICATED');
    assert.match(failure.message, /not valid/);
  } finally {
    await rsd.stop();
    rmSync(dir, { recursive: true, force: true });
  }
});
