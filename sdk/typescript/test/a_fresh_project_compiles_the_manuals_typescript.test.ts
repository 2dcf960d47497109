/**
 * A newcomer's project, made as the manual's TypeScript page (docs/typescript.md) says,
 * with the current `typescript` and `@types/node` from the npm registry (not this
 * package's pinned compiler): the tarball `npm pack` makes is installed by the page's own
 * commands, its tsconfig.json is written as it stands, and every TypeScript block of the
 * README and the manual compiles there (the names a block leaves to the reader are
 * declared before it). The pools block then runs as a program against a real rsd and
 * must exit by itself.
 *
 * And the package's declarations stand alone: a project that lists no `types` (what
 * TypeScript 6 and later load by default) and checks library files compiles an import of
 * the package (they name Buffer and node:tls; the package brings Node's types).
 *
 * Skipped, saying why, where the npm registry cannot be reached.
 */

import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import { promisify } from 'node:util';

import { type RsdServer, PACKAGE, REPO, startRsd } from './support.js';

const exec = promisify(execFile);
const DOCS = path.join(REPO, 'docs');
/** The README and every page of the manual (docs/protocol.md, the protocol, holds no TypeScript). */
const MANUAL = [
  readFileSync(path.join(REPO, 'README.md'), 'utf8'),
  ...readdirSync(DOCS)
    .filter((name) => name.endsWith('.md') && name !== 'protocol.md')
    .sort()
    .map((name) => readFileSync(path.join(DOCS, name), 'utf8')),
];
const INSTALL_TIMEOUT_MS = 240_000; // npm fetches typescript (about 10 MB) and @types/node
const EXIT_BOUND_MS = 60_000; // as the manual's Python blocks: generous, the machine is shared

/** The manual's TypeScript page. */
function typescriptSection(): string {
  return readFileSync(path.join(DOCS, 'typescript.md'), 'utf8');
}

/** The fenced blocks of `text` in one of `languages`. */
function blocks(text: string, languages: string[]): string[] {
  const fence = /^```(\w+)\n([\s\S]*?)^```$/gm;
  return [...text.matchAll(fence)].filter((m) => languages.includes(m[1]!)).map((m) => m[2]!);
}

/** What a block leaves to the reader, declared (or made) before it, as a module. */
const PRELUDES: Array<{ marks: string; prelude: string; runs: boolean }> = [
  {
    marks: "const rs = new Runstate({ holder: 'researcher-1' })", // the guide's snippets
    prelude: [
      'declare function researchCompany(company: string, options?: { signal?: AbortSignal }): Promise<unknown>;',
      'declare function writeSection(section: string, options: { fencingToken: string; signal: AbortSignal }): Promise<void>;',
      'declare const sections: string[];',
      'declare const runId: string;',
      'declare const taskId: string;',
    ].join('\n'),
    runs: false, // its worker consumes until SIGTERM
  },
  {
    marks: "await rs.pools.ensure('gpu', { size: 2 });", // pools and quotas
    prelude: [
      "import { Runstate } from 'rsclient';",
      "const rs = new Runstate({ holder: 'readme-pools' });",
      'const run = await rs.scopes.create();',
      'async function trainOnGpu(token: string): Promise<string> {',
      '  return `trained with ${token}`;',
      '}',
    ].join('\n'),
    runs: true,
  },
  {
    marks: "await rs.mailboxes.ensure('search');", // groups, cancellation, needs
    prelude: ["import { Runstate } from 'rsclient';", "const rs = new Runstate({ holder: 'readme' });"].join('\n'),
    runs: false, // test/runs.test.ts runs it
  },
  {
    marks: "const box = run.mailbox('research');", // delays, priorities, fair shares
    prelude: [
      "import { Runstate } from 'rsclient';",
      "const rs = new Runstate({ holder: 'readme' });",
      'const run = await rs.scopes.create();',
    ].join('\n'),
    runs: false, // test/delayed_items_priorities_and_fair_shares.test.ts runs it
  },
];

async function npm(args: string[], cwd: string): Promise<string> {
  try {
    const { stdout, stderr } = await exec('npm', args, { cwd, timeout: INSTALL_TIMEOUT_MS, maxBuffer: 1 << 24 });
    return stdout + stderr;
  } catch (err) {
    const failed = err as { stdout?: string; stderr?: string; message: string };
    throw new Error(`npm ${args.join(' ')} failed: ${failed.message}\n${failed.stdout ?? ''}${failed.stderr ?? ''}`);
  }
}

async function tsc(project: string): Promise<void> {
  try {
    await exec(path.join(project, 'node_modules', '.bin', 'tsc'), ['-p', '.'], { cwd: project, timeout: INSTALL_TIMEOUT_MS });
  } catch (err) {
    const failed = err as { stdout?: string; stderr?: string; message: string };
    assert.fail(`tsc in ${project} failed:\n${failed.stdout ?? ''}${failed.stderr ?? ''}`);
  }
}

/** The newest typescript on the registry, or why it cannot be had. */
async function registry(): Promise<{ version: string } | { skip: string }> {
  try {
    const { stdout } = await exec('npm', ['view', 'typescript', 'version'], { timeout: 60_000 });
    return { version: stdout.trim() };
  } catch (err) {
    return { skip: `the npm registry cannot be reached (npm view typescript: ${(err as Error).message.split('\n')[0]})` };
  }
}

let rsd: RsdServer | undefined;
let tarball: string;
const folders: string[] = [];
let reach: { version: string } | { skip: string };

function folder(name: string): string {
  const made = mkdtempSync(path.join(os.tmpdir(), `rsclient-${name}-`));
  folders.push(made);
  return made;
}

// The registry's answer, the rsd and the tarball are made at once, and the two projects
// below are made side by side: each mostly waits on npm's registry, and in line they were
// the longest of the TypeScript tests (35 s) by twice over.
before(async () => {
  const packed = folder('tarball');
  const [reached, , out] = await Promise.all([
    registry(),
    startRsd().then((started) => {
      rsd = started; // stopped after, whatever else failed
    }),
    npm(['pack', '--pack-destination', packed, '--loglevel=error'], PACKAGE),
  ]);
  reach = reached;
  tarball = path.join(packed, out.trim().split('\n').at(-1)!);
});
after(async () => {
  await rsd?.stop();
  for (const made of folders) rmSync(made, { recursive: true, force: true });
});

describe('a fresh project made as the manual says', { concurrency: true }, () => {
  test('compiles every TypeScript block of the manual with the current typescript, and the pools block exits', async (t) => {
    if ('skip' in reach) return t.skip(reach.skip);
    const section = typescriptSection();
    const project = folder('project');
    writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'readme-project', private: true, type: 'module' }));
    // The page's commands from its `npm pack` on, in the new project's place.
    const [install] = blocks(section, ['sh']);
    const commands = install!.split('\n').filter((line) => line.trim() !== '');
    const from = commands.findIndex((line) => line.startsWith('npm pack'));
    assert.ok(from >= 0, "the page's install block packs the package");
    for (const line of commands.slice(from + 1)) {
      const command = line.replace(/#.*$/, '').trim();
      if (command.startsWith('cd ')) continue; // into the project: the commands run there
      assert.ok(command.startsWith('npm install '), `a command the test knows how to run: ${command}`);
      const args = command.split(/\s+/).slice(1).map((arg) => (arg === './rsclient-0.1.0.tgz' ? tarball : arg));
      await npm([...args, '--no-audit', '--no-fund', '--loglevel=error'], project);
    }
    const installed = JSON.parse(readFileSync(path.join(project, 'node_modules', 'typescript', 'package.json'), 'utf8'));
    assert.equal(installed.version, reach.version, 'the current typescript, as a newcomer gets it');
    const [tsconfig] = blocks(section, ['json']);
    assert.ok(tsconfig, 'the page gives a tsconfig.json');
    writeFileSync(path.join(project, 'tsconfig.json'), tsconfig);

    const snippets = MANUAL.flatMap((text) => blocks(text, ['ts', 'typescript']));
    const runnable: string[] = [];
    snippets.forEach((snippet, n) => {
      const known = PRELUDES.find((p) => snippet.includes(p.marks));
      assert.ok(known, `TypeScript block ${n} of the manual is known to this test:\n${snippet}`);
      writeFileSync(path.join(project, `block${n}.ts`), `${known.prelude}\n${snippet}`);
      if (known.runs) runnable.push(`block${n}.js`);
    });
    assert.equal(snippets.length, PRELUDES.length, 'each prelude has its block in the manual');
    await tsc(project);

    for (const program of runnable) {
      const child = spawn(process.execPath, [program], {
        cwd: project,
        env: { ...process.env, RUNSTATE_ADDRESS: rsd!.address },
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let output = '';
      child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
      child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
      const code = await new Promise<number | null>((resolve) => {
        const timer = setTimeout(() => {
          child.kill('SIGKILL');
          resolve(null);
        }, EXIT_BOUND_MS);
        child.once('exit', (exitCode) => {
          clearTimeout(timer);
          resolve(exitCode);
        });
      });
      assert.equal(code, 0, `${program} exits by itself with 0 (null: still running after ${EXIT_BOUND_MS} ms); output:\n${output}`);
    }
  });

  test("the package's declarations compile in a project that lists no types", async (t) => {
    if ('skip' in reach) return t.skip(reach.skip);
    const project = folder('bare');
    writeFileSync(path.join(project, 'package.json'), JSON.stringify({ name: 'bare-project', private: true, type: 'module' }));
    await npm(['install', tarball, 'typescript', '--no-audit', '--no-fund', '--loglevel=error'], project);
    writeFileSync(
      path.join(project, 'tsconfig.json'),
      JSON.stringify({ compilerOptions: { module: 'nodenext', target: 'es2022', types: [], strict: true, skipLibCheck: false } }),
    );
    writeFileSync(
      path.join(project, 'main.ts'),
      [
        "import { Runstate } from 'rsclient';",
        "const rs = new Runstate({ holder: 'bare', address: '127.0.0.1:7420' });",
        "const attempt = await rs.scope('run').claim('k').tryAcquire();",
        "if (attempt.kind === 'acquired') await attempt.lease.release();",
        'await rs.close();',
      ].join('\n'),
    );
    await tsc(project);
  });
});
