/**
 * An idle client does not keep Node running: a process that follows the guide and never
 * calls `rs.close()` exits by itself once nothing is pending (no request in flight, no
 * lease held, no consumer running, no wait parked), and stays alive while something is.
 * Each child is a real Node process (test/fixtures/guide_process.ts) against a real rsd.
 */

import assert from 'node:assert/strict';
import { type ChildProcess, spawn } from 'node:child_process';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { type RsdServer, PACKAGE, client, lineFrom, sleep, startRsd } from './support.js';

const FIXTURE = path.join(PACKAGE, 'dist', 'test', 'fixtures', 'guide_process.js');
const EXIT_BOUND_MS = 15_000; // generous: "promptly" is well under a second when not loaded

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

function start(mode: string, scope: string): ChildProcess {
  return spawn(process.execPath, [FIXTURE, mode, rsd.address, scope], { stdio: ['ignore', 'pipe', 'inherit'] });
}

/** The exit code, or null if the process was still running after `ms` (then killed). */
function exitWithin(proc: ChildProcess, ms: number): Promise<number | null> {
  if (proc.exitCode !== null) return Promise.resolve(proc.exitCode);
  return new Promise((resolve) => {
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      resolve(null);
    }, ms);
    proc.once('exit', (code) => {
      clearTimeout(timer);
      resolve(code);
    });
  });
}

function running(proc: ChildProcess): boolean {
  return proc.exitCode === null && proc.signalCode === null;
}

test('a planner that awaits its result and never closes exits by itself', async () => {
  const rs = client(rsd.address, 'test-worker');
  try {
    await rs.mailboxes.ensure('research');
    const run = await rs.scopes.create();
    const planner = start('planner', run.id);
    const done = new AbortController();
    const consumed = run.mailbox('research').consume<{ company: string }>(
      async (data, delivery) => {
        await delivery.complete({ payload: { summary: `all about ${data.company}` } });
        done.abort();
      },
      { signal: done.signal },
    );
    const result = lineFrom(planner, 'RESULT ', EXIT_BOUND_MS);
    assert.equal(await result, 'RESULT {"summary":"all about acme"}');
    assert.equal(await exitWithin(planner, EXIT_BOUND_MS), 0, 'the planner exited by itself');
    await consumed;
  } finally {
    await rs.close();
  }
});

test('a consumer keeps its process alive until SIGTERM stops it, then the process exits', async () => {
  const rs = client(rsd.address, 'test-planner');
  try {
    await rs.mailboxes.ensure('research');
    const run = await rs.scopes.create();
    const worker = start('worker', run.id);
    await lineFrom(worker, 'CONSUMING', EXIT_BOUND_MS);
    await sleep(1000); // idle on the queue: a parked receive, and alive
    assert.ok(running(worker), 'an idle consumer keeps its process alive');
    const ticket = await run.mailbox('research').submit({ company: 'initech' });
    assert.deepEqual((await ticket.result({ timeoutMs: EXIT_BOUND_MS })).outcome, { summary: 'all about initech' });
    assert.ok(running(worker));
    worker.kill('SIGTERM');
    assert.equal(await exitWithin(worker, EXIT_BOUND_MS), 0, 'the worker exited after SIGTERM');
  } finally {
    await rs.close();
  }
});

test('a process holding a lease stays alive while it holds it and exits once it is released', async () => {
  const rs = client(rsd.address, 'test-observer');
  try {
    const run = await rs.scopes.create();
    const holder = start('holder', run.id);
    await lineFrom(holder, 'HELD', EXIT_BOUND_MS);
    await sleep(2500); // past the first renewal (at a third of the 5 s lease)
    assert.ok(running(holder), 'a process holding a lease stays alive');
    assert.equal((await run.claim('company:acme').inspect()).held, true);
    const released = lineFrom(holder, 'RELEASED', EXIT_BOUND_MS);
    holder.kill('SIGUSR2');
    await released;
    assert.equal(await exitWithin(holder, EXIT_BOUND_MS), 0, 'the holder exited once it released');
    assert.equal((await run.claim('company:acme').inspect()).held, false);
  } finally {
    await rs.close();
  }
});
