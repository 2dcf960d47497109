/**
 * Real rsd processes and Python helpers for the tests.
 *
 * `startRsd()` runs the repository's `.venv/bin/rsd` on port 0 with a fresh temporary
 * data directory (forked by the tests' fork server where `npm test` runs one:
 * test/forks.ts) and resolves once it prints `rsd listening on HOST:PORT` (the same line
 * tests/support/process.py waits for); `stop()` sends SIGTERM (SIGKILL after 5 s) and
 * removes the directory. `python(...)` runs a script of test/py with the venv's Python.
 * `startEtcd()` starts one etcd member for the tests of real clusters, as
 * tests/support/etcd.py does; `ask(...)` sends one request on a bare connection, to see
 * what a given node answers (no client routing in the way). `mailboxOfAFreshRun()`: one
 * rsd for the file, and a mailbox of a new run for each test.
 */

import { type ChildProcess, spawn } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { after, before } from 'node:test';
import { fileURLToPath } from 'node:url';

import { type Logger, type Mailbox, Runstate, type RunstateOptions } from '../src/index.js';
import { FrameDecoder, Kind, Op, PROTOCOL_VERSION, encode, requestFrame } from '../src/wire.js';
import { forkRsd } from './forks.js';

const HERE = path.dirname(fileURLToPath(import.meta.url)); // sdk/typescript/dist/test
export const PACKAGE = path.resolve(HERE, '..', '..');
export const REPO = path.resolve(PACKAGE, '..', '..');
const VENV_BIN = path.join(REPO, '.venv', 'bin');
const READY_TIMEOUT_MS = 15_000;

export interface RsdServer {
  address: string;
  port: number;
  dataDir: string;
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

/** A running rsd, however it was started: spawned, or forked (test/forks.ts). */
interface RsdProcess {
  /** The first line of its standard output; rejects if it exits before writing one. */
  firstLine: Promise<string>;
  exit: Promise<unknown>;
  ended(): boolean;
  kill(signal: NodeJS.Signals): void;
  log(): string;
}

function spawned(args: string[], env: NodeJS.ProcessEnv): RsdProcess {
  const proc = spawn(path.join(VENV_BIN, 'rsd'), args, { stdio: ['ignore', 'pipe', 'pipe'], env });
  let stderr = '';
  proc.stderr!.on('data', (chunk: Buffer) => {
    stderr += chunk.toString();
  });
  const exit = new Promise<void>((resolve) => proc.once('exit', () => resolve()));
  const firstLine = new Promise<string>((resolve, reject) => {
    let out = '';
    proc.stdout!.on('data', (chunk: Buffer) => {
      out += chunk.toString();
      const nl = out.indexOf('\n');
      if (nl >= 0) resolve(out.slice(0, nl).trim());
    });
    proc.once('exit', (code) => reject(new Error(`rsd exited (${String(code)}) before listening`)));
  });
  return {
    firstLine,
    exit,
    ended: () => proc.exitCode !== null || proc.signalCode !== null,
    kill: (signal) => proc.kill(signal),
    log: () => stderr,
  };
}

let starts = 0; // (each start's output files its own: a restart on the same folder keeps the last's)

async function forked(args: string[], env: NodeJS.ProcessEnv, dataDir: string): Promise<RsdProcess | null> {
  starts += 1;
  const stdout = path.join(dataDir, `rsd-${process.pid}-${starts}.stdout`);
  const stderr = path.join(dataDir, `rsd-${process.pid}-${starts}.stderr`);
  const child = await forkRsd(args, process.cwd(), env, stdout, stderr);
  if (typeof child === 'string') return null; // (spawned instead)
  const read = (file: string): string => {
    try {
      return readFileSync(file, 'utf8');
    } catch {
      return '';
    }
  };
  // Its output is a file: read until the line is there, or the child has ended.
  const firstLine = new Promise<string>((resolve, reject) => {
    const poll = setInterval(() => {
      const out = read(stdout);
      const nl = out.indexOf('\n');
      if (nl >= 0) {
        clearInterval(poll);
        resolve(out.slice(0, nl).trim());
      } else if (child.ended()) {
        clearInterval(poll);
        void child.exit.then((code) => reject(new Error(`rsd exited (${code}) before listening`)));
      }
    }, 10);
  });
  return { firstLine, exit: child.exit, ended: child.ended, kill: child.kill, log: () => read(stderr) };
}

function waitEnd(rsd: RsdProcess, ms: number): Promise<boolean> {
  if (rsd.ended()) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), ms);
    void rsd.exit.then(() => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}

/** Start rsd on a free port (or `port`), on `dataDir` (a new temp dir by default), with
 * `env` added to the environment: forked by the tests' fork server where there is one
 * (test/forks.ts), spawned otherwise. */
export async function startRsd(
  options: { port?: number; dataDir?: string; extra?: string[]; env?: Record<string, string> } = {},
): Promise<RsdServer> {
  const dataDir = options.dataDir ?? mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-'));
  const args = [
    '--listen',
    `127.0.0.1:${options.port ?? 0}`,
    '--data-dir',
    path.join(dataDir, 'data'),
    '--log-level',
    'WARNING',
    ...(options.extra ?? []),
  ];
  const env = { ...process.env, PYTHONUNBUFFERED: '1', ...options.env };
  const rsd = (await forked(args, env, dataDir)) ?? spawned(args, env);
  const line = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => {
      rsd.kill('SIGKILL'); // (not left running, nor its output watched)
      reject(new Error(`rsd not ready; log:\n${rsd.log()}`));
    }, READY_TIMEOUT_MS);
    rsd.firstLine.then(
      (first) => {
        clearTimeout(timer);
        resolve(first);
      },
      (err: Error) => {
        clearTimeout(timer);
        reject(new Error(`${err.message}; log:\n${rsd.log()}`));
      },
    );
  });
  const match = /^rsd listening on (\S+):(\d+)$/.exec(line);
  if (!match) throw new Error(`rsd said ${JSON.stringify(line)}; log:\n${rsd.log()}`);
  const port = Number(match[2]);
  const owned = options.dataDir === undefined;
  return {
    address: `${match[1]}:${port}`,
    port,
    dataDir,
    log: rsd.log,
    async kill() {
      rsd.kill('SIGKILL');
      await waitEnd(rsd, 5000);
    },
    async stop() {
      if (!rsd.ended()) {
        rsd.kill('SIGTERM');
        if (!(await waitEnd(rsd, 5000))) {
          rsd.kill('SIGKILL');
          await waitEnd(rsd, 5000);
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

/** One rsd for the test file (started before its tests, stopped after them), and
 * `withBox(body)`: `body` given the mailbox `jobs` of a new run, through a client of its
 * own that is closed after it. */
export function mailboxOfAFreshRun(): (body: (box: Mailbox) => Promise<void>) => Promise<void> {
  let rsd: RsdServer | null = null;
  before(async () => {
    rsd = await startRsd();
  });
  after(async () => {
    await rsd?.stop();
  });
  return async (body) => {
    const rs = client(rsd!.address, 'planner');
    try {
      await rs.mailboxes.ensure('jobs');
      const run = await rs.scopes.create();
      await body(run.mailbox('jobs'));
    } finally {
      await rs.close();
    }
  };
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

// ---- etcd ----------------------------------------------------------------------------

const ETCD_START_TIMEOUT_MS = 20_000; // for the member to be healthy (a loaded machine)
const ETCD_ATTEMPTS = 4; // starts on fresh ports before giving up
const HOW_TO_INSTALL_ETCD =
  'etcd is not installed: `make test` installs Debian\'s etcd-server, or run `apt-get install etcd-server` as root';

export interface EtcdServer {
  /** `HOST:PORT` of its client port, what rsd's `--etcd` takes. */
  endpoint: string;
  proc: ChildProcess;
  log(): string;
  /** SIGKILL (its data is thrown away) and remove its directory. */
  stop(): Promise<void>;
}

/** `count` distinct loopback ports that were free a moment ago (bound at once, so they
 * differ, then closed: etcd must be told its ports before it binds them). */
async function freePorts(count: number): Promise<number[]> {
  const probes = await Promise.all(
    Array.from(
      { length: count },
      () =>
        new Promise<net.Server>((resolve, reject) => {
          const probe = net.createServer();
          probe.once('error', reject);
          probe.listen(0, '127.0.0.1', () => resolve(probe));
        }),
    ),
  );
  const ports = probes.map((probe) => (probe.address() as net.AddressInfo).port);
  await Promise.all(probes.map((probe) => new Promise((resolve) => probe.close(resolve))));
  return ports;
}

async function etcdHealthy(endpoint: string): Promise<boolean> {
  try {
    const reply = await fetch(`http://${endpoint}/health`, { signal: AbortSignal.timeout(1000) });
    return ((await reply.json()) as { health?: string }).health === 'true';
  } catch {
    return false;
  }
}

/**
 * One etcd member on loopback ports of its own, as tests/support/etcd.py starts one
 * (the same flags: `--grpc-keepalive-min-time 1s`, which rsd's etcd client needs, its
 * quick raft clock, and a cluster token of its own), in a fresh temporary directory with
 * its log beside its data; resolves once it says it is healthy. A member that finds its port taken (another
 * process got it between the probe and the start) exits, and is started again on new
 * ports.
 */
export async function startEtcd(): Promise<EtcdServer> {
  const binary = ['/usr/bin/etcd', ...(process.env['PATH'] ?? '').split(':').map((dir) => path.join(dir, 'etcd'))]
    .find((candidate) => existsSync(candidate));
  if (binary === undefined) throw new Error(HOW_TO_INSTALL_ETCD);
  const root = mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-etcd-'));
  let failure = '';
  for (let attempt = 0; attempt < ETCD_ATTEMPTS; attempt += 1) {
    const [clientPort, peerPort] = await freePorts(2);
    const endpoint = `127.0.0.1:${clientPort!}`;
    const peerUrl = `http://127.0.0.1:${peerPort!}`;
    const logPath = path.join(root, `try${attempt}.log`);
    const logFd = openSync(logPath, 'a'); // the child holds its own copy
    const proc = spawn(
      binary,
      [
        '--name', 'e0',
        '--data-dir', path.join(root, `try${attempt}.data`),
        '--listen-client-urls', `http://${endpoint}`,
        '--advertise-client-urls', `http://${endpoint}`,
        '--listen-peer-urls', peerUrl,
        '--initial-advertise-peer-urls', peerUrl,
        '--initial-cluster', `e0=${peerUrl}`,
        '--initial-cluster-state', 'new',
        '--initial-cluster-token', `rsd-ts-test-${process.pid}-${Date.now()}-${attempt}`,
        '--grpc-keepalive-min-time', '1s',
        // tests/support/etcd.py's QUICK clock (its reasons there): elected in 0.15 s, not 0.5
        '--heartbeat-interval', '20', '--election-timeout', '200', '--pre-vote=true',
        '--logger', 'zap', '--log-outputs', 'stderr', '--log-level', 'warn',
      ],
      { stdio: ['ignore', logFd, logFd] },
    );
    closeSync(logFd);
    const log = (): string => {
      try {
        return readFileSync(logPath, 'utf8');
      } catch {
        return '';
      }
    };
    const kill = async (): Promise<void> => {
      if (proc.exitCode === null && proc.signalCode === null) proc.kill('SIGKILL');
      await waitExit(proc, 5000);
    };
    const deadline = Date.now() + ETCD_START_TIMEOUT_MS;
    let healthy = false;
    while (Date.now() < deadline && proc.exitCode === null && proc.signalCode === null) {
      if (await etcdHealthy(endpoint)) {
        healthy = true;
        break;
      }
      await sleep(50);
    }
    if (healthy) {
      return {
        endpoint,
        proc,
        log,
        async stop() {
          await kill();
          rmSync(root, { recursive: true, force: true });
        },
      };
    }
    failure = log();
    await kill();
    if (!failure.includes('address already in use')) break;
  }
  rmSync(root, { recursive: true, force: true });
  throw new Error(`etcd did not start; log:\n${failure.slice(-3000)}`);
}

// ---- a bare connection ---------------------------------------------------------------

/** What a node answered one request: its reply, or its error. */
export type Answer =
  | { kind: 'reply'; reply: Record<string, unknown> }
  | { kind: 'error'; code: string; message: string; details: Record<string, unknown> | null };

/**
 * `op` with `args` sent to the node at `address` on a connection of its own (after a
 * HELLO), and its answer: what that very node says, with no client routing or
 * redirection between (tests/support/raw.py's `RawConn`, in short). A refused HELLO is
 * that answer.
 */
export function ask(address: string, op: number, args: Record<string, unknown>, timeoutMs = 10_000): Promise<Answer> {
  const colon = address.lastIndexOf(':');
  const socket = net.connect({ host: address.slice(0, colon), port: Number(address.slice(colon + 1)) });
  const decoder = new FrameDecoder();
  return new Promise<Answer>((resolve, reject) => {
    const timer = setTimeout(() => finish(new Error(`${address} did not answer op ${op} within ${timeoutMs} ms`)), timeoutMs);
    const finish = (outcome: Answer | Error): void => {
      clearTimeout(timer);
      socket.destroy();
      if (outcome instanceof Error) reject(outcome);
      else resolve(outcome);
    };
    socket.on('connect', () => {
      socket.write(requestFrame(1, Op.HELLO, { version: PROTOCOL_VERSION, holder: 'ts-ask' }));
      socket.write(requestFrame(2, op, args));
    });
    socket.on('data', (chunk: Buffer) => {
      for (const message of decoder.feed(chunk) as unknown[][]) {
        const [kind, id] = message;
        if (kind === Kind.ERROR && (id === 1 || id === 0 || id === 2)) {
          finish({
            kind: 'error',
            code: String(message[2]),
            message: String(message[3]),
            details: (message[4] ?? null) as Record<string, unknown> | null,
          });
          return;
        }
        if (kind === Kind.REPLY && id === 2) {
          finish({ kind: 'reply', reply: message[2] as Record<string, unknown> });
          return;
        }
      }
    });
    socket.on('error', (error) => finish(error));
    socket.on('close', () => finish(new Error(`${address} closed the connection before answering op ${op}`)));
  });
}
