/**
 * A client of a cluster rides through a takeover (issue 30; the Python suite's
 * test_a_client_of_a_cluster_follows_its_primary.py and
 * test_a_call_in_flight_across_a_takeover_is_answered_with_default_options.py, the same
 * rules):
 * - a takeover takes about the cluster lease, longer than the connect timeout: a client
 *   that was connected to a cluster reconnects for two leases (told in HELLO) plus
 *   `connectTimeoutMs`, so a call made across a takeover is answered by the new primary;
 *   a first connect keeps to `connectTimeoutMs`;
 * - the node whose connection was lost is tried last; a paused primary (it accepts TCP,
 *   answers nothing) is not tried first again, even with a long connect timeout (the
 *   order of the HELLOs is checked, not how long anything took); a redirect to it from a
 *   node not yet told of the takeover is not followed at once either.
 * Fake nodes (fake_node.ts) stand in for rsd, so each answer is exactly the one under test.
 */

import assert from 'node:assert/strict';
import { test } from 'node:test';

import { type Runstate, UnavailableError } from '../src/index.js';
import { type FakeNode, fakeNodes, notPrimary } from './fake_node.js';
import { client, sleep } from './support.js';

function listed(...nodes: FakeNode[]): string {
  return nodes.map((node) => node.address).join(',');
}

function serverOf(rs: Runstate): unknown {
  return rs.serverInfo['server'];
}

function connectionOf(rs: Runstate): { clusterLeaseMs: number | null } {
  return (rs as unknown as { session: { conn: { clusterLeaseMs: number | null } } }).session.conn;
}

test('the node whose connection was lost is tried last', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  const [first, second] = nodes as [FakeNode, FakeNode];
  first.hello = notPrimary(second.address);
  const rs = client(listed(first, second), 'lost-last');
  try {
    await rs.ping();
    assert.deepEqual([first.hellos, second.hellos], [1, 1]);
    second.drop(); // the connection is lost; the primary is still the primary
    await sleep(50);
    await rs.ping();
    assert.deepEqual([first.hellos, second.hellos], [2, 2]); // n1 first, which names n2
    assert.ok(first.greetedAt[1]! < second.greetedAt[1]!);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a paused primary is tried last even with a long connect timeout', async () => {
  const { nodes, closeAll } = await fakeNodes(3);
  const [first, second, third] = nodes as [FakeNode, FakeNode, FakeNode];
  const rs = client(listed(first, second, third), 'paused', { connectTimeoutMs: 30_000 });
  try {
    await rs.ping();
    assert.deepEqual([first.hellos, second.hellos, third.hellos], [1, 0, 0]);
    first.pause();
    second.hello = notPrimary(first.address); // not yet told: it names the paused one
    assert.deepEqual(await rs.ping(), { time: 0 }); // given up for the silence, sent again
    assert.equal(serverOf(rs), 'fake/n3'); // (elected meanwhile)
    assert.equal(first.hellos, 1); // the paused node was never tried again, nor redirected to
    assert.ok(second.greetedAt[0]! < third.greetedAt[0]!);
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a reconnect of a cluster client outlasts the connect timeout by two cluster leases', async () => {
  const { nodes, closeAll } = await fakeNodes(3);
  const [first, second, third] = nodes as [FakeNode, FakeNode, FakeNode];
  for (const node of nodes) node.clusterLease = 2;
  second.hello = notPrimary(first.address);
  third.hello = notPrimary(first.address);
  const rs = client(listed(first, second, third), 'rides', { connectTimeoutMs: 500 });
  try {
    await rs.ping();
    assert.equal(connectionOf(rs).clusterLeaseMs, 2000);
    for (const node of nodes) node.hello = notPrimary(null, 2); // nobody leads yet
    first.drop();
    const election = sleep(1000).then(() => {
      second.hello = null; // elected: 1 s, twice the connect timeout
    });
    assert.deepEqual(await rs.ping(), { time: 0 });
    assert.equal(serverOf(rs), 'fake/n2');
    await election;
  } finally {
    await rs.close();
    await closeAll();
  }
});

test('a first connect keeps to the connect timeout', async () => {
  const { nodes, closeAll } = await fakeNodes(2);
  for (const node of nodes) node.hello = notPrimary(null);
  const rs = client(listed(...nodes), 'first', { connectTimeoutMs: 500 });
  try {
    await assert.rejects(rs.ping(), (error: unknown) => {
      assert.ok(error instanceof UnavailableError);
      assert.match(error.message, /within 0\.5 s/);
      return true;
    });
  } finally {
    await rs.close();
    await closeAll();
  }
});
