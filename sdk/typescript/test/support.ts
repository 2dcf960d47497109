/**
 * Real rsd processes and Python helpers for the tests.
 *
 * `startRsd()` runs the repository's `.venv/bin/rsd` on port 0 with a fresh temporary
 * data directory and resolves once it prints `rsd listening on HOST:PORT` (the same line
 * tests/support/process.py waits for); `stop()` sends SIGTERM (SIGKILL after 5 s) and
 * removes the directory. `python(...)` runs a script of test/py with the venv's Python.
 */

import { type ChildProcess, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { type Logger, Runstate, type RunstateOptions } from '../src/index.js';
import { encode } from '../src/wire.js';

const HERE = path.dirname(fileURLToPath(import.meta.url)); // sdk/typescript/dist/test
export const PACKAGE = path.resolve(HERE, '..', '..');
export const REPO = path.resolve(PACKAGE, '..', '..');
const VENV_BIN = path.join(REPO, '.venv', 'bin');
const READY_TIMEOUT_MS = 15_000;

export interface RsdServer {
  address: string;
  port: number;
  dataDir: string;
  proc: ChildProcess;
  stop(): Promise<void>;
  kill(): Promise<void>;
  log(): string;
}

function waitExit(proc: ChildProcess, ms: number): Promise<boolean> {
  if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    proc.once('exit', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

/** Start rsd on a free port (or `port`), on `dataDir` (a new temp dir by default). */
export async function startRsd(
  options: { port?: number; dataDir?: string; extra?: string[] } = {},
): Promise<RsdServer> {
  const dataDir = options.dataDir ?? mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-'));
  const proc = spawn(
    path.join(VENV_BIN, 'rsd'),
    [
      '--listen',
      `127.0.0.1:${options.port ?? 0}`,
      '--data-dir',
      path.join(dataDir, 'data'),
      '--log-level',
      'WARNING',
      ...(options.extra ?? []),
    ],
    { stdio: ['ignore', 'pipe', 'pipe'], env: { ...process.env, PYTHONUNBUFFERED: '1' } },
  );
  let stderr = '';
  proc.stderr!.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const line = await new Promise<string>((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`rsd not ready; log:\n${stderr}`)), READY_TIMEOUT_MS);
    proc.stdout!.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      const nl = out.indexOf('\n');
      if (nl >= 0) {
        clearTimeout(timer);
        resolve(out.slice(0, nl).trim());
      }
    });
    proc.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`rsd exited (${String(code)}) before listening; log:\n${stderr}`));
    });
  });
  const match = /^rsd listening on (\S+):(\d+)$/.exec(line);
  if (!match) throw new Error(`rsd said ${JSON.stringify(line)}; log:\n${stderr}`);
  const port = Number(match[2]);
  const owned = options.dataDir === undefined;
  return {
    address: `${match[1]}:${port}`,
    port,
    dataDir,
    proc,
    log: () => stderr,
    async kill() {
      proc.kill('SIGKILL');
      await waitExit(proc, 5000);
    },
    async stop() {
      if (proc.exitCode === null && proc.signalCode === null) {
        proc.kill('SIGTERM');
        if (!(await waitExit(proc, 5000))) {
          proc.kill('SIGKILL');
          await waitExit(proc, 5000);
        }
      }
      if (owned) rmSync(dataDir, { recursive: true, force: true });
    },
  };
}

/** Collects what the SDK logs, so tests can assert on it and keep their output clean. */
export class MemoryLogger implements Logger {
  readonly lines: string[] = [];
  info(message: string): void {
    this.lines.push(`INFO ${message}`);
  }
  warn(message: string): void {
    this.lines.push(`WARN ${message}`);
  }
  error(message: string): void {
    this.lines.push(`ERROR ${message}`);
  }
}

export function client(address: string, holder: string, extra: RunstateOptions = {}): Runstate {
  return new Runstate({ holder, address, logger: new MemoryLogger(), ...extra });
}

/** The op codes a client sends, counted (for tests about batching). */
export function countOps(rs: Runstate): Map<number, number> {
  const counts = new Map<number, number>();
  const conn = (rs as unknown as { session: { conn: Record<string, unknown> } }).session.conn;
  const send = (conn['send'] as (...a: unknown[]) => number).bind(conn);
  conn['send'] = (op: number, ...rest: unknown[]) => {
    counts.set(op, (counts.get(op) ?? 0) + 1);
    return send(op, ...rest);
  };
  return counts;
}

export interface PyResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Start `test/py/<script>` with the venv's Python; `done` resolves when it exits. */
export function python(script: string, args: string[]): { proc: ChildProcess; done: Promise<PyResult> } {
  const proc = spawn(path.join(VENV_BIN, 'python'), [path.join(PACKAGE, 'test', 'py', script), ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, PYTHONUNBUFFERED: '1', PYTHONPATH: REPO },
  });
  let stdout = '';
  let stderr = '';
  proc.stdout!.on('data', (chunk: Buffer) => {
    stdout += chunk.toString();
  });
  proc.stderr!.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const done = new Promise<PyResult>((resolve) => {
    proc.once('exit', (code) => resolve({ code, stdout, stderr }));
  });
  return { proc, done };
}

/** Resolves with the first stdout line of `proc` that starts with `prefix`. */
export function lineFrom(proc: ChildProcess, prefix: string, timeoutMs = 15_000): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = '';
    const timer = setTimeout(() => reject(new Error(`no "${prefix}" line; got ${out}`)), timeoutMs);
    const onData = (chunk: Buffer): void => {
      out += chunk.toString();
      for (const line of out.split('\n')) {
        if (line.startsWith(prefix)) {
          clearTimeout(timer);
          proc.stdout!.off('data', onData);
          resolve(line.trim());
          return;
        }
      }
    };
    proc.stdout!.on('data', onData);
  });
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** One frame as rsd sends it (a 4-byte big-endian length, then the msgpack body): what the
 * tests' fake servers answer with. */
export function frame(value: unknown): Buffer {
  const body = encode(value);
  const out = Buffer.alloc(4 + body.length);
  out.writeUInt32BE(body.length);
  out.set(body, 4);
  return out;
}
