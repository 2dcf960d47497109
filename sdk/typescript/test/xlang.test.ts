/**
 * The TypeScript SDK against the Python SDK, on one rsd: both are implementations of
 * protocol.md and must interoperate on tasks, claims, leases and idempotency.
 */

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { ConflictError, LeaseLostError } from '../src/index.js';
import { PACKAGE, type RsdServer, client, lineFrom, python, sleep, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

function lastJson(stdout: string): unknown {
  const lines = stdout.trim().split('\n');
  return JSON.parse(lines[lines.length - 1]!);
}

describe('cross-language', () => {
  test('Python planners and TypeScript workers share one task and its one result', async () => {
    const workers = [client(rsd.address, 'ts-worker-1'), client(rsd.address, 'ts-worker-2')];
    const ctl = new AbortController();
    try {
      await workers[0]!.mailboxes.ensure('research', { mode: 'WORK' });
      const run = await workers[0]!.scopes.create();
      let calls = 0;
      const consuming = workers.map((rs) =>
        rs.scope(run.id).mailbox('research').consume<{ company: string }>(
          async (data, delivery) => {
            calls += 1;
            await sleep(200);
            await delivery.complete({ payload: { report: `report on ${data.company}`, by: 'ts' } });
          },
          { concurrency: 2, leaseSeconds: 10, signal: ctl.signal },
        ),
      );
      const planners = python('xlang.py', ['planners', rsd.address, run.id, 'research', 'research:acme', '3']);
      const result = await planners.done;
      assert.equal(result.code, 0, result.stderr);
      const views = lastJson(result.stdout) as Array<Record<string, unknown>>;
      assert.equal(views.length, 3);
      assert.equal(new Set(views.map((v) => v['id'])).size, 1, 'one task');
      for (const view of views) {
        assert.equal(view['state'], 'SUCCEEDED');
        assert.deepEqual(view['outcome'], { report: 'report on acme', by: 'ts' });
        assert.equal(view['attempt'], 1);
      }
      assert.deepEqual(views[0]!['subscribers'], ['py-planner-0', 'py-planner-1', 'py-planner-2']);
      assert.equal(calls, 1, 'the work ran once');
      ctl.abort();
      await Promise.all(consuming);
    } finally {
      ctl.abort();
      await Promise.all(workers.map((rs) => rs.close()));
    }
  });

  test('a TypeScript holder killed with SIGKILL loses its claim to a Python waiter after one lease', async () => {
    const rs = client(rsd.address, 'observer');
    try {
      const run = await rs.scopes.create();
      const holder = spawn(process.execPath, [path.join(PACKAGE, 'dist', 'test', 'fixtures', 'holder.js'), rsd.address, run.id, 'company:acme'], {
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      const held = Number((await lineFrom(holder, 'HELD ')).split(' ')[1]);
      const waiter = python('xlang.py', ['waiter', rsd.address, run.id, 'company:acme']);
      await lineFrom(waiter.proc, 'WAITING');
      while ((await run.claim('company:acme').inspect()).waiters === 0) await sleep(10);
      await sleep(2000); // the holder keeps renewing: the waiter stays in line
      assert.equal((await run.claim('company:acme').inspect()).holder, 'ts-holder');
      const killedAt = Date.now() / 1000;
      holder.kill('SIGKILL');
      const result = await waiter.done;
      assert.equal(result.code, 0, result.stderr);
      const grant = lastJson(result.stdout) as { generation: number; granted_at: number };
      const after = grant.granted_at - killedAt;
      assert.ok(grant.generation > held, 'the new owner has a larger generation');
      // Renewed every 5/3 s until the kill, so the lease ended 3.3 to 5 s after it.
      assert.ok(after >= 3.0 && after <= 6.5, `granted ${after.toFixed(2)} s after the kill`);
    } finally {
      await rs.close();
    }
  });

  test('a late TypeScript completion is refused with STALE_CLAIM; the Python result stands', async () => {
    const rs = client(rsd.address, 'ts-slow-worker');
    try {
      await rs.mailboxes.ensure('late');
      const run = await rs.scopes.create();
      const ticket = await run.mailbox('late').submit({ company: 'acme' }, { key: 'late:acme' });
      const delivery = await run.mailbox('late').receive({ leaseSeconds: 5 }); // not renewed
      assert.ok(delivery !== null);
      const worker = python('xlang.py', ['worker', rsd.address, run.id, 'late']);
      const result = await worker.done; // receives it once the TypeScript lease expired
      assert.equal(result.code, 0, result.stderr);
      assert.deepEqual(lastJson(result.stdout), { attempt: 2, id: ticket.id });
      await assert.rejects(delivery.complete({ payload: { by: 'typescript' } }), (err: unknown) => {
        return err instanceof LeaseLostError && err.code === 'STALE_CLAIM';
      });
      const view = await ticket.status();
      assert.equal(view.state, 'SUCCEEDED');
      assert.deepEqual(view.outcome, { by: 'python' });
    } finally {
      await rs.close();
    }
  });

  test('the same key with other input from the other language gets IDEMPOTENCY_CONFLICT', async () => {
    const rs = client(rsd.address, 'ts-planner');
    try {
      await rs.mailboxes.ensure('idem');
      const run = await rs.scopes.create();
      const box = run.mailbox('idem');
      // Python first, TypeScript second: same input joins, other input conflicts.
      const py = await python('xlang.py', ['submit', rsd.address, run.id, 'idem', 'k1', '{"company": "acme", "n": 1, "tags": ["a"]}']).done;
      const made = lastJson(py.stdout) as { id: string; created: boolean };
      assert.equal(made.created, true, py.stderr);
      const joined = await box.submit({ tags: ['a'], n: 1, company: 'acme' }, { key: 'k1' });
      assert.equal(joined.id, made.id);
      assert.equal(joined.created, false, 'key order does not matter, values do');
      await assert.rejects(box.submit({ company: 'acme', n: 2, tags: ['a'] }, { key: 'k1' }), (err: unknown) => {
        assert.ok(err instanceof ConflictError);
        assert.equal(err.code, 'IDEMPOTENCY_CONFLICT');
        assert.equal(err.details['task'], made.id);
        return true;
      });
      // TypeScript first, Python second.
      const mine = await box.submit({ company: 'globex' }, { key: 'k2' });
      const same = lastJson((await python('xlang.py', ['submit', rsd.address, run.id, 'idem', 'k2', '{"company": "globex"}']).done).stdout);
      assert.deepEqual(same, { id: mine.id, created: false });
      const other = lastJson((await python('xlang.py', ['submit', rsd.address, run.id, 'idem', 'k2', '{"company": "initech"}']).done).stdout);
      assert.deepEqual(other, { error: 'IDEMPOTENCY_CONFLICT', details: { task: mine.id } });
      // Work keys of plain messages, likewise.
      const sent = await box.send({ url: 'https://acme.example' }, { workKey: 'crawl:acme' });
      const replay = lastJson((await python('xlang.py', ['send', rsd.address, run.id, 'idem', 'crawl:acme', '{"url": "https://acme.example"}']).done).stdout);
      assert.deepEqual(replay, { id: sent.id, replay: true });
      const clash = lastJson((await python('xlang.py', ['send', rsd.address, run.id, 'idem', 'crawl:acme', '{"url": "x"}']).done).stdout);
      assert.deepEqual(clash, { error: 'IDEMPOTENCY_CONFLICT', details: { id: sent.id } });
    } finally {
      await rs.close();
    }
  });

  test("a Python planner's group wait is satisfied by TypeScript workers", async () => {
    const rs = client(rsd.address, 'ts-group-worker');
    const ctl = new AbortController();
    try {
      await rs.mailboxes.ensure('parts');
      const run = await rs.scopes.create();
      const planner = python('xlang.py', ['group', rsd.address, run.id, 'parts', 'chapters', '6', '4']);
      await lineFrom(planner.proc, 'SUBMITTED');
      let handled = 0;
      const consuming = rs.scope(run.id).mailbox('parts').consume<{ i: number }>(
        async (data, delivery) => {
          handled += 1;
          if (handled <= 4) await delivery.complete({ payload: { chapter: data.i, by: 'ts' } });
          else await new Promise((resolve) => delivery.signal.addEventListener('abort', resolve));
        },
        { concurrency: 1, signal: ctl.signal, shutdownTimeoutMs: 200 },
      );
      const result = await planner.done;
      assert.equal(result.code, 0, result.stderr);
      const wait = lastJson(result.stdout) as {
        reached: boolean;
        need: number;
        done: Array<{ id: string; key: string; outcome: { chapter: number; by: string } }>;
        cancelled: number;
        succeeded: number;
      };
      assert.equal(wait.reached, true);
      assert.equal(wait.need, 4);
      assert.deepEqual(
        wait.done.map((d) => [d.key, d.outcome]),
        [0, 1, 2, 3].map((i) => [`part-${i}`, { chapter: i, by: 'ts' }]),
      );
      assert.equal(wait.cancelled, 2, 'the rest was cancelled');
      const group = await rs.scope(run.id).group('chapters').status();
      assert.deepEqual(group.counts, { SUCCEEDED: 4, CANCELLED: 2 });
      ctl.abort();
      await consuming;
    } finally {
      ctl.abort();
      await rs.close();
    }
  });

  test('a TypeScript cancel of the run stops a Python consumer quietly', async () => {
    const rs = client(rsd.address, 'ts-canceller');
    try {
      await rs.mailboxes.ensure('stoppable');
      const run = await rs.scopes.create();
      await run.mailbox('stoppable').submit({ n: 1 });
      await run.mailbox('stoppable').submit({ n: 2 });
      const consumer = python('xlang.py', ['consumer', rsd.address, run.id, 'stoppable']);
      await lineFrom(consumer.proc, 'HANDLING');
      const cancelled = await rs.scopes.cancel(run.id, 'the job was called off');
      assert.equal(cancelled.tasks, 2);
      const result = await consumer.done;
      assert.equal(result.code, 0, result.stderr);
      assert.deepEqual(lastJson(result.stdout), { handled: [{ n: 1 }] });
      assert.doesNotMatch(result.stderr, /ERROR|Traceback/);
      const status = await run.status();
      assert.equal(status.state, 'cancelled');
      assert.equal(status.reason, 'the job was called off');
    } finally {
      await rs.close();
    }
  });
});
