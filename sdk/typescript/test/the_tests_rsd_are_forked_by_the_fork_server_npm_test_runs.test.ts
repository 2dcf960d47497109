/**
 * `npm test` runs the test runner under the tests' fork server
 * (tests/support/nodeforkserver.py), and `startRsd()` forks its rsd from it
 * (test/forks.ts): a start costs a fork, not the console script's imports. Here, as
 * `npm test` runs this file: the server's address is in the environment; a start through
 * it runs rsd (its output in the file named, its exit code reported: 0 for `--version`,
 * -9 for SIGKILL, signalled by pid); and a start whose environment differs in what Python
 * reads as it starts is left to the caller (told why), which spawns rsd as before. The
 * protocol's own rules are tests/test_the_typescript_tests_fork_server_forks_rsd_as_its_
 * script_would_start.py's.
 */

import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, test } from 'node:test';

import { FORK_SERVER_VARIABLE, forkRsd } from './forks.js';
import { PACKAGE } from './support.js';

const folder = mkdtempSync(path.join(os.tmpdir(), 'rsd-ts-forked-'));
after(() => rmSync(folder, { recursive: true, force: true }));
const env = { ...process.env, PYTHONUNBUFFERED: '1' }; // as startRsd() sets it

test('npm test runs the runner under the fork server', () => {
  const script = JSON.parse(readFileSync(path.join(PACKAGE, 'package.json'), 'utf8')).scripts.test as string;
  assert.match(script, /tests\/support\/nodeforkserver\.py node --test /);
  assert.ok(process.env[FORK_SERVER_VARIABLE], `npm test sets ${FORK_SERVER_VARIABLE}`);
});

test('a start through it runs rsd and reports how it ended', async () => {
  const out = path.join(folder, 'version.out');
  const version = await forkRsd(['--version'], folder, env, out, path.join(folder, 'version.err'));
  assert.ok(typeof version !== 'string', `forked, not: ${String(version)}`);
  assert.equal(await version.exit, 0);
  assert.ok(version.ended());
  assert.match(readFileSync(out, 'utf8'), /^rsd \d+\.\d+\.\d+\n$/);

  const args = ['--listen', '127.0.0.1:0', '--data-dir', path.join(folder, 'data')];
  const server = await forkRsd(args, folder, env, path.join(folder, 'serve.out'), path.join(folder, 'serve.err'));
  assert.ok(typeof server !== 'string', `forked, not: ${String(server)}`);
  assert.ok(!server.ended());
  server.kill('SIGKILL');
  assert.equal(await server.exit, -9);
  server.kill('SIGKILL'); // seen to have ended: not sent again (its pid may be another's)
});

test('a start with another interpreter setting is left to the caller', async () => {
  const other = { ...env, PYTHONHASHSEED: '5' };
  assert.equal(
    await forkRsd(['--version'], folder, other, path.join(folder, 'o.out'), path.join(folder, 'o.err')),
    "its environment differs from the fork server's in PYTHONHASHSEED",
  );
});
