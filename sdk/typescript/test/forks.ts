/**
 * rsd servers forked for the tests by one process that has already imported rsd
 * (tests/support/nodeforkserver.py, under which `npm test` runs the test runner): a start
 * then costs a fork, not the 0.4 s of CPU of the console script's imports.
 *
 * `forkRsd(...)` asks the server named by `$RSD_TEST_FORK_SERVER` for a start, over one
 * connection per test process (JSON, a message a line: the server's docstring gives the
 * protocol). It resolves to why it did not fork where there is no server, or where the
 * server says the start must be a process of its own (an environment that differs from
 * the server's in what Python reads as it starts); the caller then spawns rsd as before.
 *
 * A child's pid stays its own until its exit has been seen here: the server reaps it only
 * when told, after the exit is reported, so `kill` never signals a reused pid.
 */

import net from 'node:net';

export const FORK_SERVER_VARIABLE = 'RSD_TEST_FORK_SERVER';

/** A forked rsd: its pid, its end, and signals sent to it while it runs. */
export interface ForkedRsd {
  readonly pid: number;
  /** Resolves with the exit code (`-signal` if a signal ended it). */
  readonly exit: Promise<number>;
  ended(): boolean;
  kill(signal: NodeJS.Signals): void;
}

type Message = { pid?: number; plain?: string; exit?: number; code?: number };
/** A start's answer: the child's pid and its end, or why it must be a process of its own. */
type Started = { pid: number; exit: Promise<number> } | { plain: string };

class ForkServerConnection {
  private readonly socket: net.Socket;
  private pending = '';
  private readonly starts: Array<(answer: Started) => void> = [];
  private readonly running = new Map<number, (code: number) => void>();
  private failure: Error | null = null;

  constructor(address: string) {
    this.socket = net.createConnection(address);
    this.socket.setEncoding('utf8');
    this.socket.on('data', (chunk: string) => this.read(chunk));
    this.socket.on('error', (err) => this.fail(err));
    this.socket.on('close', () => this.fail(new Error('the fork server closed its connection')));
    this.socket.unref(); // held only while a start or a child is outstanding (hold())
  }

  start(request: object): Promise<Started> {
    if (this.failure) return Promise.resolve({ plain: `the fork server failed: ${this.failure.message}` });
    return new Promise((resolve) => {
      this.starts.push(resolve);
      this.hold();
      this.socket.write(`${JSON.stringify(request)}\n`);
    });
  }

  private read(chunk: string): void {
    this.pending += chunk;
    for (let nl = this.pending.indexOf('\n'); nl >= 0; nl = this.pending.indexOf('\n')) {
      let message: Message;
      try {
        message = JSON.parse(this.pending.slice(0, nl)) as Message;
      } catch (err) {
        this.fail(err as Error); // (a server that says what it should not: no more forks)
        this.socket.destroy();
        return;
      }
      this.pending = this.pending.slice(nl + 1);
      if (message.exit !== undefined) {
        const ended = this.running.get(message.exit);
        this.running.delete(message.exit);
        this.socket.write(`${JSON.stringify({ reap: message.exit })}\n`);
        ended?.(message.code!);
      } else if (message.pid !== undefined) {
        // Its end is awaited from now: a report of it may be the next line of this chunk.
        const exit = new Promise<number>((resolve) => this.running.set(message.pid!, resolve));
        this.starts.shift()?.({ pid: message.pid, exit });
      } else {
        this.starts.shift()?.({ plain: message.plain ?? 'the fork server did not say why' });
      }
    }
    this.hold();
  }

  /** Keep the process alive while something is awaited of the server, no longer. */
  private hold(): void {
    if (this.starts.length > 0 || this.running.size > 0) this.socket.ref();
    else this.socket.unref();
  }

  private fail(err: Error): void {
    if (this.failure) return;
    this.failure = err;
    for (const answer of this.starts.splice(0)) answer({ plain: `the fork server failed: ${err.message}` });
    // A child whose server is gone is gone with it (the server kills its clients' children).
    for (const ended of this.running.values()) ended(-9);
    this.running.clear();
    this.socket.unref();
  }
}

let connection: ForkServerConnection | null = null;

/** Start `rsd ARGS` in `cwd` with environment `env`, its output written to `stdout` and
 * `stderr` (paths), forked by the tests' fork server; where it cannot be, why not. */
export async function forkRsd(
  args: string[],
  cwd: string,
  env: NodeJS.ProcessEnv,
  stdout: string,
  stderr: string,
): Promise<ForkedRsd | string> {
  const address = process.env[FORK_SERVER_VARIABLE];
  if (!address) return `no fork server (${FORK_SERVER_VARIABLE} is not set)`;
  connection ??= new ForkServerConnection(address);
  const answer = await connection.start({ args, cwd, env, stdout, stderr });
  if (!('pid' in answer)) return answer.plain;
  const pid = answer.pid;
  let code: number | null = null;
  const exit = answer.exit.then((ended) => {
    code = ended;
    return ended;
  });
  return {
    pid,
    exit,
    ended: () => code !== null,
    kill(signal: NodeJS.Signals): void {
      if (code === null) process.kill(pid, signal); // (not yet reaped: still its pid)
    },
  };
}
