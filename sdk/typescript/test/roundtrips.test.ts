import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { ConflictError, type Delivery, InvalidArgumentError, Ticket } from '../src/index.js';
import { WRITE_AT_FRAMES } from '../src/connection.js';
import { Op } from '../src/wire.js';
import { type RsdServer, client, countOps, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

describe('fewer round trips', () => {
  test('submitMany answers a ticket or an error per item, split at the batch limit', async () => {
    const rs = client(rsd.address, 'planner');
    try {
      await rs.mailboxes.ensure('r1');
      const run = await rs.scopes.create();
      const box = run.mailbox('r1');
      await box.submit({ n: 0 }, { key: 'taken' });
      const [first, conflict, joined] = await box.submitMany([
        { data: { n: 1 }, key: 'a' },
        { data: { n: 2 }, key: 'taken' },
        { data: { n: 1 }, key: 'a' },
      ]);
      assert.ok(first instanceof Ticket && first.created);
      assert.ok(conflict instanceof ConflictError);
      assert.equal(conflict.code, 'IDEMPOTENCY_CONFLICT');
      assert.ok(joined instanceof Ticket && joined.id === first.id && !joined.created);
      const ops = countOps(rs);
      const many = await box.submitMany(Array.from({ length: 300 }, (_, n) => ({ data: n })));
      assert.equal(many.filter((t) => t instanceof Ticket).length, 300);
      assert.equal(ops.get(Op.TASK_SUBMIT_MANY), 2, '256 + 44');
      assert.equal((await box.inspect()).ready, 302); // 'taken', 'a' and the 300
      const slim = await box.submit({ n: 9 }, { key: 'slim', slim: true });
      assert.deepEqual(slim.view, { id: slim.id, state: 'PENDING', created: true });
    } finally {
      await rs.close();
    }
  });

  test('submitMany cuts large items into requests that fit a frame', async () => {
    const rs = client(rsd.address, 'planner');
    try {
      await rs.mailboxes.ensure('r4');
      const box = (await rs.scopes.create()).mailbox('r4');
      const big = 'x'.repeat(200 * 1024); // five of these pass the frame limit together
      const huge = 'y'.repeat(1_048_577); // alone over it: refused, never sent
      const answers = await box.submitMany([
        ...Array.from({ length: 5 }, () => ({ data: big })),
        { data: huge },
        { data: 1 },
      ]);
      assert.ok(answers[5] instanceof InvalidArgumentError);
      assert.equal(answers.filter((t) => t instanceof Ticket).length, 6);
      assert.equal((await box.inspect()).ready, 6);
    } finally {
      await rs.close();
    }
  });

  test('queued frames leave early once WRITE_AT_FRAMES are queued', async () => {
    const rs = client(rsd.address, 'pinger');
    try {
      await rs.ping(); // connected
      const conn = (rs as unknown as { session: { conn: { socket: { write: (b: Buffer) => boolean } } } })
        .session.conn;
      const socket = conn.socket;
      const write = socket.write.bind(socket);
      let writes = 0;
      socket.write = (b: Buffer) => {
        writes += 1;
        return write(b);
      };
      await Promise.all(Array.from({ length: WRITE_AT_FRAMES * 3 + 1 }, () => rs.ping()));
      assert.equal(writes, 4, 'three early writes, then the rest at the end of the turn');
    } finally {
      await rs.close();
    }
  });

  test('receiveMany and settling with takeNext', async () => {
    const rs = client(rsd.address, 'worker');
    try {
      await rs.mailboxes.ensure('r2');
      const run = await rs.scopes.create();
      const box = run.mailbox('r2');
      await box.submitMany(Array.from({ length: 5 }, (_, n) => ({ data: n })));
      const got = await box.receiveMany<number>({ max: 3 });
      assert.deepEqual(got.map((d) => d.data), [0, 1, 2]);
      const next = await got[0]!.complete({ payload: 'ok', takeNext: 2 });
      assert.deepEqual(next.map((d) => d.data), [3, 4]);
      const again = await got[1]!.retry({ delayMs: 0, takeNext: 1 });
      assert.deepEqual(again.map((d) => [d.data, d.attempt]), [[1, 2]]);
      for (const d of [got[2]!, ...next, ...again]) await d.complete();
      assert.deepEqual(await box.receiveMany({ max: 5 }), []);
      assert.throws(() => box.receiveMany({ max: 257 }), InvalidArgumentError);
    } finally {
      await rs.close();
    }
  });

  test('consume holds at most concurrency deliveries and settles with next', async () => {
    const rs = client(rsd.address, 'worker');
    try {
      await rs.mailboxes.ensure('r3');
      const run = await rs.scopes.create();
      const box = run.mailbox('r3');
      const total = 40;
      await box.submitMany(Array.from({ length: total }, (_, n) => ({ data: n })));
      const ops = countOps(rs);
      const seen: number[] = [];
      let running = 0;
      let most = 0;
      const stop = new AbortController();
      await box.consume<number>(
        async (n: number, _delivery: Delivery<number>) => {
          running += 1;
          most = Math.max(most, running);
          await new Promise((resolve) => setTimeout(resolve, 1));
          running -= 1;
          seen.push(n);
          if (seen.length === total) stop.abort();
        },
        { concurrency: 4, signal: stop.signal },
      );
      assert.deepEqual([...seen].sort((a, b) => a - b), Array.from({ length: total }, (_, n) => n));
      assert.equal(most, 4);
      assert.ok((ops.get(Op.RECEIVE) ?? 0) < total / 2, `few receives: ${ops.get(Op.RECEIVE)}`);
      const info = await box.inspect();
      assert.deepEqual([info.ready, info.running, info.consumers], [0, 0, 0]);
    } finally {
      await rs.close();
    }
  });
});
