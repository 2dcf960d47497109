/**
 * The TypeScript SDK's side of bench/typescript.py, in the shape of bench/claims.py and
 * bench/tasks.py, against a running rsd:
 *
 *     node dist/bench/bench.js claims ADDRESS CONCURRENCY SECONDS
 *         C loops on one client (one connection, pipelined), each acquire + release on
 *         its own key for SECONDS; prints {"pairs_per_s": ...}
 *     node dist/bench/bench.js tasks ADDRESS SECONDS INFLIGHT CONCURRENCY
 *         a worker process consuming with CONCURRENCY handlers, and this process keeping
 *         INFLIGHT tasks submitted and awaiting each result; prints {"tasks_per_s": ...,
 *         "planner_cpu_s": ..., "worker_cpu_s": ...}: each process's CPU seconds over the
 *         window (the worker's from READY to its stop), as bench/tasks.py measures them
 */

import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { Runstate } from '../src/index.js';

const MAILBOX = 'bench-tasks';
const [mode, address, ...rest] = process.argv.slice(2) as [string, string, ...string[]];

async function claims(concurrency: number, seconds: number): Promise<void> {
  const rs = new Runstate({ holder: 'bench-ts-throughput', address });
  const run = await rs.scopes.create();
  const stopAt = performance.now() + seconds * 1000;
  let pairs = 0;
  const started = performance.now();
  await Promise.all(
    Array.from({ length: concurrency }, async (_, i) => {
      const claim = run.claim(`key-${i}`);
      while (performance.now() < stopAt) {
        const lease = await claim.acquire();
        await lease.release();
        pairs += 1;
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  console.log(JSON.stringify({ pairs_per_s: pairs / elapsed, pairs }));
  await rs.close();
}

async function worker(scope: string, concurrency: number): Promise<void> {
  const rs = new Runstate({ holder: 'bench-ts-worker', address });
  const ctl = new AbortController();
  process.on('SIGTERM', () => ctl.abort());
  await rs.connect();
  console.log('READY');
  const cpuBefore = process.cpuUsage();
  await rs.scope(scope).mailbox(MAILBOX).consume<{ n: number }>(
    async (data, delivery) => {
      await delivery.complete({ payload: { n: data.n } });
    },
    { concurrency, leaseSeconds: 30, signal: ctl.signal },
  );
  const cpu = process.cpuUsage(cpuBefore);
  console.log(`CPU ${(cpu.user + cpu.system) / 1e6}`);
  await rs.close();
}

async function tasks(seconds: number, inflight: number, concurrency: number): Promise<void> {
  const rs = new Runstate({ holder: 'bench-ts-planner', address });
  await rs.mailboxes.ensure(MAILBOX, { mode: 'WORK' });
  const run = await rs.scopes.create();
  const child = spawn(process.execPath, [...process.execArgv, fileURLToPath(import.meta.url), 'worker', address, run.id, String(concurrency)], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  let workerSaid = '';
  await new Promise<void>((resolve) => child.stdout!.once('data', () => resolve()));
  child.stdout!.on('data', (chunk: Buffer) => (workerSaid += chunk.toString()));
  const box = run.mailbox(MAILBOX);
  const stopAt = performance.now() + seconds * 1000;
  let counter = 0;
  let done = 0;
  const started = performance.now();
  const cpuBefore = process.cpuUsage();
  await Promise.all(
    Array.from({ length: inflight }, async () => {
      while (performance.now() < stopAt) {
        counter += 1;
        const ticket = await box.submit({ n: counter }, { key: `task-${counter}`, slim: true });
        await ticket.result({ timeoutMs: 30_000, outcomeOnly: true });
        done += 1;
      }
    }),
  );
  const elapsed = (performance.now() - started) / 1000;
  const plannerCpu = process.cpuUsage(cpuBefore);
  const exited = new Promise((resolve) => child.once('close', resolve));
  child.kill('SIGTERM');
  await exited;
  const workerCpu = Number(/^CPU (\S+)$/m.exec(workerSaid)?.[1] ?? NaN);
  console.log(JSON.stringify({
    tasks_per_s: done / elapsed, tasks: done,
    planner_cpu_s: (plannerCpu.user + plannerCpu.system) / 1e6, worker_cpu_s: workerCpu,
  }));
  await rs.close();
}

if (mode === 'claims') await claims(Number(rest[0]), Number(rest[1]));
else if (mode === 'tasks') await tasks(Number(rest[0]), Number(rest[1]), Number(rest[2]));
else if (mode === 'worker') await worker(rest[0]!, Number(rest[1]));
else throw new Error(`unknown mode ${mode}`);
