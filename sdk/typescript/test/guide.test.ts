/**
 * The TypeScript snippets of the user's guide (work-once.md), as written; only the
 * import is left out. The helpers the guide leaves to the reader (researchCompany,
 * writeSection, sections, runId, taskId) are stubs here, and `console` is captured so
 * the test can check what each snippet printed.
 */

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { Runstate } from '../src/index.js';
import { type RsdServer, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

test("the guide's TypeScript snippets run as written", async () => {
  process.env['RUNSTATE_ADDRESS'] = rsd.address; // the guide's clients take the default address
  const setup = new Runstate({ holder: 'setup' });
  process.env['RUNSTATE_SCOPE_ID'] = (await setup.scopes.create()).id;
  const printed: string[] = [];
  const console = {
    log: (...parts: unknown[]) => printed.push(parts.map((p) => (typeof p === 'string' ? p : JSON.stringify(p))).join(' ')),
    error: (...parts: unknown[]) => printed.push(`error: ${parts.map(String).join(' ')}`),
  };
  const researched: string[] = [];
  async function researchCompany(company: string, _options: { signal?: AbortSignal } = {}) {
    researched.push(company);
    return { company, summary: `all about ${company}` };
  }
  const sections = ['intro', 'body'];
  const written: Array<{ section: string; fencingToken: string }> = [];
  async function writeSection(section: string, options: { fencingToken: string; signal: AbortSignal }) {
    assert.equal(options.signal.aborted, false);
    written.push({ section, fencingToken: options.fencingToken });
  }

  // ---- The examples assume a client and a run.
  const rs = new Runstate({ holder: 'researcher-1' });
  const run = rs.scope(process.env.RUNSTATE_SCOPE_ID!); // or: await rs.scopes.create()

  try {
    // ---- Own a key with a claim.
    {
      const report = await run.claim('company:acme').run(
        async (lease) => {
          console.log(`researching acme as generation ${lease.generation}`);
          return researchCompany('acme', { signal: lease.signal });
        },
        { wait: true, timeoutMs: 120_000 },
      );
      assert.deepEqual(report, { company: 'acme', summary: 'all about acme' });
      assert.match(printed.at(-1)!, /^researching acme as generation \d+$/);
    }

    // ---- tryAcquire(), busy and free.
    const other = await setup.scope(run.id).claim('company:acme').acquire();
    {
      const attempt = await run.claim('company:acme').tryAcquire();
      if (attempt.kind === 'busy') {
        console.log('another agent is already on acme');
      } else {
        try {
          await researchCompany('acme');
        } finally {
          await attempt.lease.release();
        }
      }
    }
    assert.equal(printed.at(-1), 'another agent is already on acme');
    await other.release();
    {
      const attempt = await run.claim('company:acme').tryAcquire();
      if (attempt.kind === 'busy') {
        console.log('another agent is already on acme');
      } else {
        try {
          await researchCompany('acme');
        } finally {
          await attempt.lease.release();
        }
      }
    }
    assert.equal(researched.length, 2);
    assert.equal((await run.claim('company:acme').inspect()).held, false);

    // ---- When the lease is lost: checked in long-running work.
    await run.claim('file:report.md').run(async (lease) => {
      for (const section of sections) {
        if (lease.isLost) throw new Error('lost ownership of report.md, stopping');
        await writeSection(section, { fencingToken: lease.token(), signal: lease.signal });
      }
    });
    assert.deepEqual(written.map((w) => w.section), sections);
    assert.equal(new Set(written.map((w) => w.fencingToken)).size, 1);

    // ---- Workers: consume() until SIGTERM, while a planner submits a shared task.
    await setup.mailboxes.ensure('research', { mode: 'WORK' }); // a worker needs its queue
    const worker = (async () => {
      const controller = new AbortController();
      process.on('SIGTERM', () => controller.abort());

      await run.mailbox('research').consume<{ company: string }>(
        async (data, delivery) => {
          const report = await researchCompany(data.company);
          await delivery.complete({ payload: report });
        },
        {
          concurrency: 4, // handlers running at once in this process
          leaseSeconds: 60, // renewed while each handler runs
          signal: controller.signal, // stop taking work, drain, requeue the rest
          onError: (err, delivery) => console.error(`attempt ${delivery.attempt} failed`, err),
        },
      );
    })();

    // ---- Shared tasks.
    let runId = '';
    let taskId = '';
    {
      await rs.mailboxes.ensure('research', { mode: 'WORK' });

      // Any number of planners can run this. They all get the same task.
      const ticket = await run.mailbox('research').submit(
        { company: 'acme' },
        { key: 'research:acme', subscriberId: 'planner-7' },
      );

      const outcome = await ticket.result({ timeoutMs: 300_000 });
      if (outcome.state === 'SUCCEEDED') {
        console.log('report', outcome.outcome);
      } else {
        console.log(`task ended ${outcome.state}: ${outcome.reason ?? 'no reason'}`);
      }
      runId = run.id;
      taskId = ticket.id;
    }
    assert.equal(printed.at(-1), 'report {"company":"acme","summary":"all about acme"}');
    process.kill(process.pid, 'SIGTERM'); // the worker's own handler stops it
    await worker;
    process.removeAllListeners('SIGTERM');

    // ---- Get a result back after a restart.
    {
      const ticket = rs.scope(runId).task(taskId);
      const view = await ticket.status();
      console.log(view.state, view.attempt, view.outcome);
    }
    assert.equal(printed.at(-1), 'SUCCEEDED 1 {"company":"acme","summary":"all about acme"}');

    // ---- Receiving manually.
    await setup.mailboxes.ensure('manual', { mode: 'WORK' });
    await setup.scope(run.id).mailbox('manual').submit({ company: 'globex' });
    {
      const delivery = await run.mailbox('manual').receive<{ company: string }>();
      if (delivery !== null) {
        try {
          await delivery.renew(120); // extend before long work
          const report = await researchCompany(delivery.data.company);
          await delivery.complete({ payload: report });
        } catch (err) {
          await delivery.retry();
          throw err;
        }
      }
    }
    assert.equal(researched.at(-1), 'globex');

    // ---- Plain messages.
    {
      const sent = await run.mailbox('research').send({ company: 'acme' }, { workKey: 'crawl:acme' });
      console.log(sent.id, sent.replay);
    }
    assert.match(printed.at(-1)!, /^\S+ false$/);

  } finally {
    await rs.close();
    await setup.close();
  }
});
