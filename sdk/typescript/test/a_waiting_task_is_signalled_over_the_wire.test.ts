/**
 * Waiting for a signal from TypeScript, the twin of
 * tests/test_a_waiting_task_is_signalled_over_the_wire_and_survives_a_kill_9.py:
 * `delivery.suspend(name, { timeoutSeconds })` frees the worker (WAITING),
 * `ticket.signal(name, data)` (also from a ticket rebuilt by id) makes the task ready
 * again with `delivery.signalled` set; a signal sent before the suspend wakes it at once;
 * a timeout brings it back with `signalled` null; refusals are typed errors. (`signalled`,
 * not `signal`: a TypeScript delivery's `signal` is its lease's AbortSignal.)
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { InvalidArgumentError } from '../src/index.js';
import { client, startRsd } from './support.js';

test('suspend, signal and timeout over the wire', async () => {
  const rsd = await startRsd();
  const rs = client(rsd.address, 'waiting-ts');
  try {
    await rs.mailboxes.ensure('approvals');
    const run = await rs.scopes.create({ id: 'r' });
    const box = run.mailbox('approvals');
    const ticket = await box.submit({ draft: 1 });
    const first = await box.receive();
    assert.ok(first);
    assert.equal(first.signalled, null);
    await first.suspend('approval', { timeoutSeconds: 86_400 });
    assert.equal(first.state, 'WAITING');
    assert.equal((await box.inspect()).waiting, 1);
    assert.equal((await ticket.status()).state, 'WAITING');
    assert.equal(await box.receive(), null);
    const reply = await rs.scope('r').task(ticket.id).signal('approval', { ok: true });
    assert.deepEqual(reply, { id: ticket.id, state: 'PENDING', woken: true });
    const again = await box.receive();
    assert.ok(again);
    assert.deepEqual(again.signalled, { name: 'approval', data: { ok: true } });
    assert.equal(again.attempt, first.attempt);
    await again.complete({ payload: 'sent' });
    await assert.rejects(ticket.signal('approval'), InvalidArgumentError);

    // Sent before the suspend: kept, and the suspend is woken at once.
    const early = await box.submit({ draft: 2 });
    assert.equal((await early.signal('approval', 'yes')).woken, false);
    let got = await box.receive();
    assert.ok(got);
    await got.suspend('approval');
    assert.equal(got.state, 'PENDING');
    got = await box.receive();
    assert.ok(got);
    assert.deepEqual(got.signalled, { name: 'approval', data: 'yes' });
    await got.suspend('approval', { timeoutSeconds: 0.2 });
    await assert.rejects(early.signal('payment'), InvalidArgumentError);
    // The timeout passes first: delivered again with no signal.
    const timedOut = await box.receive({ wait: true, timeoutMs: 30_000 });
    assert.ok(timedOut);
    assert.equal(timedOut.id, early.id);
    assert.equal(timedOut.signalled, null);
    await timedOut.complete();
  } finally {
    await rs.close();
    await rsd.stop();
  }
});
