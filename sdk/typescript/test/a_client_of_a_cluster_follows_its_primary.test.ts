/**
 * A client given the nodes of a cluster connects to the primary and follows it; what it
 * sends again when its primary dies or steps down (failover.ts). Fake nodes
 * (fake_node.ts) stand in for rsd, so each answer is exactly the one under test.
 *
 * A HELLO answered NOT_PRIMARY naming the primary sends the client there; NOT_PRIMARY
 * naming none sends it on to the next address; redirects going round between nodes back
 * off and end, at the connect timeout, in an UnavailableError with code NOT_PRIMARY. A
 * request answered NOT_PRIMARY (not executed) is sent to the new primary, and the lease
 * keeper renews its leases there; a request lost with its connection is sent again only
 * if a second execution cannot differ from one, and never by a client of one lone rsd.
 */

import assert from 'node:assert/strict';
import { performance } from 'node:perf_hooks';
import { test } from 'node:test';

import { InvalidArgumentError, Runstate, UnavailableError } from '../src/index.js';
import { MAX_SENDS } from '../src/failover.js';
import { Op } from '../src/wire.js';
import { DROP, type FakeNode, HOLD, fakeNodes, notPrimary } from './fake_node.js';
import { MemoryLogger, client, sleep } from './support.js';

const HANDLE = Uint8Array.from({ length: 16 }, (_, i) => i);

function listed(...nodes: FakeNode[]): string {
  return nodes.map((node) => node.address).join(',');
}

function serverOf(rs: Runstate): unknown {
  return rs.serverInfo['server'];
}

async function until(check: () => boolean, timeoutMs = 5000): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!check()) {
    assert.ok(performance.now() < deadline, 'condition not reached in time');
    await sleep(10);
  }
}

/** `node` answers `op` NOT_PRIMARY naming `successor` (it just stepped down). */
function stepsDownOn(node: FakeNode, op: number, successor: FakeNode): void {
  node.handlers.set(op, () => {
    node.hello = notPrimary(successor.address, 2);
    return notPrimary(successor.address, 2);
  });
}

/** `node` dies with `op` unanswered and comes back as a standby naming `successor`. */
function diesOn(node: FakeNode, op: number, successor: FakeNode): void {
  node.handlers.set(op, () => {
    node.hello = notPrimary(successor.address, 2);
    return DROP;
  });
}

test('a HELLO answered NOT_PRIMARY goes straight to the primary it names', async () => {
  const { nodes, closeAll } = await fakeNodes(3);
  const [first, second, third] = nodes as [FakeNode, FakeNode, FakeNode];
  first.hello = notPrimary(third.address);
  second.hello = notPrimary(null);
  const rs = client(listed(first, second, third), 'follower');
  try {
    assert.deepEqual(await rs.ping(), { time: 0 });
    assert.equal(serverOf(rs), 'fake/n3');
    assert.deepEqual([first.hellos, second.hellos, third.hellos], [1, 0, 1]);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('NOT_PRIMARY without a primary goes on to the next address', async () => {
  const { nodes, closeAll } = await fakeNodes(3);
  const [first, second, third] = nodes as [FakeNode, FakeNode, FakeNode];
  first.hello = notPrimary(null); // an election: nobody leads right now
  const rs = client(listed(first, second, third), 'follower');
  try {
    await rs.connect();
    assert.equal(serverOf(rs), 'fake/n2');
    assert.deepEqual([first.hellos, second.hellos, third.hellos], [1, 1, 0]);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a redirect loop backs off and ends in UnavailableError NOT_PRIMARY at the connect timeout', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [first, second] = nodes as [FakeNode, FakeNode];
  first.hello = notPrimary(second.address, 7);
  second.hello = notPrimary(first.address, 7);
  const rs = client(listed(first, second), 'looping', { connectTimeoutMs: 1000 });
  try {
    const started = performance.now();
    await assert.rejects(rs.ping(), (error: unknown) => {
      assert.ok(error instanceof UnavailableError);
      assert.equal(error.code, 'NOT_PRIMARY');
      assert.equal(error.details['epoch'], 7);
      assert.ok([first.address, second.address].includes(error.details['primary'] as string));
      assert.match(error.message, /^NOT_PRIMARY: cannot reach rsd's primary at .* within 1 s: .*not the primary \(it names/);
      return true;
    });
    const elapsed = performance.now() - started;
    assert.ok(elapsed > 300 && elapsed < 1500, `gave up after ${elapsed} ms`);
    const hellos = first.hellos + second.hellos;
    assert.ok(hellos >= 8 && hellos <= 40, `${hellos} HELLOs: a few per round, rounds backed off`);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a request answered NOT_PRIMARY reconnects and the lease keeper renews its leases on the new primary', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [old, next] = nodes as [FakeNode, FakeNode];
  old.handlers.set(Op.CLAIM_ACQUIRE, () => ({ lease: HANDLE, generation: 1, lease_seconds: 3 }));
  stepsDownOn(old, Op.LEASE_RENEW, next);
  const rs = client(listed(old, next), 'holder');
  try {
    const lease = await rs.scope('run').claim('k', { leaseSeconds: 5 }).acquire(); // 3 s granted
    const firstDeadline = lease.lostAt;
    await until(() => next.count(Op.LEASE_RENEW) >= 1);
    assert.equal(old.count(Op.LEASE_RENEW), 1); // answered NOT_PRIMARY: not executed
    const renewed = next.requests.find(([op]) => op === Op.LEASE_RENEW)![1]['leases'] as Uint8Array[];
    assert.deepEqual(renewed.map((handle) => Buffer.from(handle).toString('hex')), [Buffer.from(HANDLE).toString('hex')]);
    await until(() => lease.lostAt > firstDeadline);
    assert.equal(lease.isLost, false);
    assert.equal(serverOf(rs), 'fake/n2');
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a request answered NOT_PRIMARY is sent to the primary even without a key (it was not executed)', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [old, next] = nodes as [FakeNode, FakeNode];
  stepsDownOn(old, Op.TASK_SUBMIT, next);
  next.handlers.set(Op.TASK_SUBMIT, () => ({ id: 't-1', state: 'PENDING', created: true }));
  const rs = client(listed(old, next), 'planner');
  try {
    const ticket = await rs.scope('run').mailbox('m').submit({ n: 1 });
    assert.equal(ticket.id, 't-1');
    assert.deepEqual([old.count(Op.TASK_SUBMIT), next.count(Op.TASK_SUBMIT)], [1, 1]);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('requests in flight at a step-down are unknown: a send with a workKey goes again, one without throws', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [old, next] = nodes as [FakeNode, FakeNode];
  old.handlers.set(Op.MESSAGE_SEND, () => HOLD);
  next.handlers.set(Op.MESSAGE_SEND, () => ({ id: 'm-1', replay: false }));
  const rs = client(listed(old, next), 'sender');
  try {
    const mailbox = rs.scope('run').mailbox('m');
    const keyed = mailbox.send({ n: 1 }, { workKey: 'w' });
    const unkeyed = mailbox.send({ n: 2 }).then(
      () => null,
      (error: unknown) => error,
    );
    await until(() => old.count(Op.MESSAGE_SEND) === 2);
    old.stepDown(next.address); // a connection-level NOT_PRIMARY, then close
    assert.equal((await keyed).id, 'm-1');
    const error = await unkeyed;
    assert.ok(error instanceof UnavailableError, String(error));
    assert.equal(error.code, 'UNAVAILABLE'); // unknown, not "not executed"
    assert.match(error.message, /no longer the primary/);
    assert.equal(next.count(Op.MESSAGE_SEND), 1);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a keyed submit lost with its primary is sent to the next; an unkeyed one throws', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [old, next] = nodes as [FakeNode, FakeNode];
  diesOn(old, Op.TASK_SUBMIT, next);
  next.handlers.set(Op.TASK_SUBMIT, () => ({ id: 't-1', state: 'PENDING', created: false }));
  const rs = client(listed(old, next), 'planner');
  try {
    const ticket = await rs.scope('run').mailbox('m').submit({ n: 1 }, { key: 'k' });
    assert.equal(ticket.id, 't-1');
    assert.deepEqual([old.count(Op.TASK_SUBMIT), next.count(Op.TASK_SUBMIT)], [1, 1]);
    diesOn(next, Op.TASK_SUBMIT, old);
    old.hello = null;
    await assert.rejects(rs.scope('run').mailbox('m').submit({ n: 2 }), { name: 'UnavailableError', code: 'UNAVAILABLE' });
    assert.equal(next.count(Op.TASK_SUBMIT), 2);
    assert.equal(old.count(Op.TASK_SUBMIT), 1); // not sent again
  } finally {
    await rs.close();
    await closeAll();
  }
});

test("an admin listing lost with its primary is sent to the next; a dead letter's delete throws", async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [old, next] = nodes as [FakeNode, FakeNode];
  const listings: Array<[number, string, (rs: Runstate) => AsyncGenerator<unknown>]> = [
    [Op.ADMIN_QUOTAS, 'quotas', (rs) => rs.admin.iterQuotas()],
    [Op.ADMIN_MAILBOXES, 'mailboxes', (rs) => rs.admin.iterMailboxes()],
    [Op.ADMIN_QUEUES, 'mailboxes', (rs) => rs.admin.iterQueues('run')],
    [Op.ADMIN_GROUPS, 'groups', (rs) => rs.admin.iterGroups('run')],
  ];
  const rs = client(listed(old, next), 'operator');
  try {
    let [dying, successor] = [old, next];
    for (const [op, field, listing] of listings) {
      diesOn(dying, op, successor);
      successor.handlers.set(op, () => ({ [field]: [], next: null }));
      successor.hello = null;
      for await (const _ of listing(rs)) assert.fail('the fake lists nothing');
      assert.deepEqual([dying.count(op), successor.count(op)], [1, 1], `op ${op} sent again`);
      [dying, successor] = [successor, dying];
    }
    diesOn(dying, Op.DEAD_LETTER_DELETE, successor);
    successor.hello = null;
    await assert.rejects(rs.admin.deleteDeadLetter('run', 'm', 't-1'), {
      name: 'UnavailableError',
      code: 'UNAVAILABLE',
    });
    assert.deepEqual([dying.count(Op.DEAD_LETTER_DELETE), successor.count(Op.DEAD_LETTER_DELETE)], [1, 0]);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a client of one lone rsd never sends again what its connection lost', async () => {
  const { nodes, closeAll } = await fakeNodes(1);
  const [alone] = nodes as [FakeNode];
  alone.handlers.set(Op.TASK_STATUS, () => DROP);
  const rs = client(alone.address, 'reader');
  try {
    await assert.rejects(rs.scope('run').task('t-1').status(), {
      name: 'UnavailableError',
      message: 'UNAVAILABLE: the connection to rsd was lost',
    });
    assert.equal(alone.count(Op.TASK_STATUS), 1);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a request that takes down every node it reaches is sent at most three times', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [first, second] = nodes as [FakeNode, FakeNode];
  first.handlers.set(Op.TASK_STATUS, () => DROP);
  second.handlers.set(Op.TASK_STATUS, () => DROP);
  const rs = client(listed(first, second), 'reader');
  try {
    await assert.rejects(rs.scope('run').task('t-1').status(), { name: 'UnavailableError' });
    assert.equal(first.count(Op.TASK_STATUS) + second.count(Op.TASK_STATUS), MAX_SENDS);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('$RUNSTATE_ADDRESS takes a list', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [standby, primary] = nodes as [FakeNode, FakeNode];
  standby.hello = notPrimary(null);
  const saved = process.env['RUNSTATE_ADDRESS'];
  process.env['RUNSTATE_ADDRESS'] = ` ${standby.address} , ${primary.address}`;
  const rs = new Runstate({ holder: 'env', logger: new MemoryLogger() });
  try {
    assert.deepEqual(await rs.ping(), { time: 0 });
    assert.deepEqual(primary.ops(), [Op.PING]);
  } finally {
    if (saved === undefined) delete process.env['RUNSTATE_ADDRESS'];
    else process.env['RUNSTATE_ADDRESS'] = saved;
    await rs.close();
    await closeAll();
  }
});

test('an address list with an empty or malformed entry is refused at construction', () => {
  for (const address of ['h1:7420,,h2:7420', 'h1:7420,', ',h1:7420']) {
    assert.throws(() => new Runstate({ address }), (error: unknown) => {
      assert.ok(error instanceof InvalidArgumentError);
      assert.match(error.message, /an empty entry/);
      return true;
    });
  }
  assert.throws(() => new Runstate({ address: 'h1:7420,http://h2:7420' }), /drop the 'http:\/\/'/);
});
