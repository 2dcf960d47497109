/**
 * A value that would not come back as it went (a Set or a Map arriving as `{}`, a Date as
 * a msgpack timestamp, a class instance as a plain object...) is refused before it is
 * sent, with InvalidArgumentError naming where it is; nothing is sent, nothing changes,
 * and the connection carries on. What does round-trip is sent as before.
 */

import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';

import { InvalidArgumentError } from '../src/index.js';
import { FrameError, decode, requestFrame } from '../src/wire.js';
import { type RsdServer, client, startRsd } from './support.js';

let rsd: RsdServer;
before(async () => {
  rsd = await startRsd();
});
after(async () => {
  await rsd.stop();
});

class Company {
  constructor(readonly name: string) {}
}

const REFUSED: Array<[string, unknown, RegExp]> = [
  ['a Set', new Set([1]), /^data\.items\[3\]: a Set does not round-trip .*; use an array$/],
  ['a Map', new Map([['a', 1]]), /^data\.items\[3\]: a Map does not round-trip .*; use a plain object$/],
  ['a Date', new Date(0), /^data\.items\[3\]: a Date does not round-trip .*toISOString/],
  ['a Float64Array', new Float64Array(2), /^data\.items\[3\]: a Float64Array does not round-trip/],
  ['an ArrayBuffer', new ArrayBuffer(2), /^data\.items\[3\]: an ArrayBuffer does not round-trip/],
  ['a class instance', new Company('acme'), /^data\.items\[3\]: an instance of Company does not round-trip/],
  ['an Error', new Error('x'), /^data\.items\[3\]: an instance of Error does not round-trip/],
  ['a function', () => 1, /^data\.items\[3\]: a function cannot be sent$/],
  ['a symbol', Symbol('s'), /^data\.items\[3\]: a symbol cannot be sent$/],
  ['a bigint over 64 bits', 1n << 64n, /^data\.items\[3\]: the integer 18446744073709551616 does not fit in 64 bits$/],
  ['undefined in an array', [1, undefined], /^data\.items\[3\]\[1\]: undefined in an array does not round-trip .*use null$/],
  ['a hole in an array', [1, , 3], /^data\.items\[3\]\[1\]: undefined in an array/], // eslint-disable-line no-sparse-arrays
  ['a Set deep inside', { ok: { x: [1, { 'odd key': new Set() }] } }, /^data\.items\[3\]\.ok\.x\[1\]\["odd key"\]: a Set/],
];

test('each value that does not round-trip is refused, naming its path; what does is sent as it is', () => {
  for (const [what, value, message] of REFUSED) {
    assert.throws(
      () => requestFrame(1, 31, { data: { items: [0, 1, 2, value] } }),
      (err: unknown) => {
        assert.ok(err instanceof FrameError, `${what}: ${String(err)}`);
        assert.match(err.message, message, what);
        return true;
      },
      what,
    );
  }
  // and what does round-trip is still sent as it is
  const value = {
    nil: null,
    yes: true,
    n: -3,
    x: 1.5,
    nan: NaN,
    s: 'text',
    big: 1n << 62n,
    bytes: new Uint8Array([1, 2]),
    buffer: Buffer.from('ab'),
    list: [[], {}, [1, 'a']],
    bare: Object.create(null) as object,
    dropped: undefined, // left out, as JSON leaves it out
  };
  const frame = requestFrame(1, 31, { data: value });
  const [, , , args] = decode(frame.subarray(4)) as [number, number, number, { data: Record<string, unknown> }];
  const { dropped: _dropped, ...sent } = value;
  const got = args.data;
  assert.deepEqual([...(got['bytes'] as Uint8Array)], [1, 2]);
  assert.deepEqual([...(got['buffer'] as Uint8Array)], [...Buffer.from('ab')]);
  assert.deepEqual(
    { ...got, bytes: null, buffer: null },
    { ...sent, bytes: null, buffer: null, bare: {} },
  );
  assert.equal('dropped' in got, false);
});

test('a refused submit or completion sends nothing and the client carries on', async () => {
  const rs = client(rsd.address, 'refused-values');
  try {
    await rs.mailboxes.ensure('values');
    const run = await rs.scopes.create();
    const box = run.mailbox('values');
    await assert.rejects(box.submit({ items: [0, 1, 2, new Set(['a'])] }), (err: unknown) => {
      assert.ok(err instanceof InvalidArgumentError, String(err));
      assert.equal(
        err.message,
        'INVALID_ARGUMENT: data.items[3]: a Set does not round-trip (it would arrive as {}); use an array',
      );
      return true;
    });
    await assert.rejects(
      box.submitMany([{ data: 1 }, { data: { when: new Date(0) } }]),
      /items\[1\]\.data\.when: a Date does not round-trip/,
    );
    assert.equal((await box.inspect()).ready, 0, 'nothing was submitted');
    const ticket = await box.submit({ company: 'acme' });
    const delivery = await box.receive();
    assert.ok(delivery !== null);
    await assert.rejects(delivery.complete({ payload: new Map([['a', 1]]) }), /INVALID_ARGUMENT: outcome: a Map does not round-trip/);
    assert.equal(delivery.settled, false, 'the delivery is still ours to settle');
    await delivery.complete({ payload: { a: 1 } });
    assert.deepEqual((await ticket.result({ timeoutMs: 5000 })).outcome, { a: 1 });
  } finally {
    await rs.close();
  }
});
