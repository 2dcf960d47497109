/**
 * A lease taken with `releaseOnDisconnect` ends the moment its holder's connection closes:
 * a holder process killed with SIGKILL hands its claim to its waiter at once (its lease
 * is 600 s, so nothing else can explain it), and the SDK marks such a lease lost the
 * moment its own connection drops, while a lease taken without it is not. No timing is
 * asserted here: `python -m bench --only takeover` measures it.
 */

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { test } from 'node:test';

import { InvalidArgumentError } from '../src/index.js';
import { PACKAGE, client, lineFrom, sleep, startRsd } from './support.js';

const HOLDER = path.join(PACKAGE, 'dist', 'test', 'fixtures', 'holder.js');

test("a killed holder's claim taken with releaseOnDisconnect goes to its waiter at once", async () => {
  const rsd = await startRsd();
  const rs = client(rsd.address, 'heir');
  try {
    const run = await rs.scopes.create();
    const holder = spawn(process.execPath, [HOLDER, rsd.address, run.id, 'k', '--release-on-disconnect'], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    try {
      await lineFrom(holder, 'HELD ');
      const claim = run.claim('k', { leaseSeconds: 600 });
      const waiting = claim.acquire({ wait: true, timeoutMs: 60_000 });
      while ((await claim.inspect()).waiters === 0) await sleep(5);
      holder.kill('SIGKILL');
      const lease = await waiting; // well within the holder's 600 s lease
      assert.equal(lease.isLost, false);
      await lease.release();
    } finally {
      holder.kill('SIGKILL');
    }
  } finally {
    await rs.close();
    await rsd.stop();
  }
});

test('the SDK marks a lease taken with releaseOnDisconnect lost when its connection drops', async () => {
  const rsd = await startRsd();
  const rs = client(rsd.address, 'h');
  try {
    await rs.mailboxes.ensure('jobs');
    await rs.pools.ensure('gpu', { size: 1 });
    const run = await rs.scopes.create();
    await run.mailbox('jobs').submit({ n: 1 }, { key: 't' });
    const bound = await run.claim('bound', { leaseSeconds: 600, releaseOnDisconnect: true }).acquire();
    const slot = await run.pool('gpu', { leaseSeconds: 600, releaseOnDisconnect: true }).acquire();
    const plain = await run.claim('plain', { leaseSeconds: 600 }).acquire();
    const delivery = await run.mailbox('jobs').receive({ releaseOnDisconnect: true });
    assert.ok(delivery !== null);
    assert.equal(bound.releaseOnDisconnect, true);
    assert.equal(plain.releaseOnDisconnect, false);
    await rsd.kill();
    for (let i = 0; i < 500 && !(bound.isLost && slot.isLost && delivery.lease.isLost); i++) await sleep(10);
    assert.equal(bound.isLost, true);
    assert.equal(bound.signal.aborted, true);
    assert.match(bound.lostReason ?? '', /releaseOnDisconnect/);
    assert.equal(slot.isLost, true);
    assert.equal(delivery.lease.isLost, true);
    assert.equal(plain.isLost, false); // re-attached once the client reconnects
  } finally {
    await rs.close();
  }
});

test('releaseOnDisconnect must be a boolean', async () => {
  const rs = client('127.0.0.1:1', 'h');
  try {
    const run = rs.scope('any');
    const bad = 'yes' as unknown as boolean;
    assert.throws(() => run.claim('k', { releaseOnDisconnect: bad }), InvalidArgumentError);
    assert.throws(() => run.pool('p', { releaseOnDisconnect: bad }), InvalidArgumentError);
    await assert.rejects(async () => run.mailbox('jobs').receive({ releaseOnDisconnect: bad }), InvalidArgumentError);
    await assert.rejects(
      async () => run.mailbox('jobs').consume(() => undefined, { releaseOnDisconnect: bad }),
      InvalidArgumentError,
    );
  } finally {
    await rs.close();
  }
});
