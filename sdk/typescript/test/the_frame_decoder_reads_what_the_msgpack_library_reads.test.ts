/**
 * Rule: every frame rsd sends is read by wire.ts's own decoder first (FastReader), and
 * what it makes of a body is exactly what @msgpack/msgpack's decoder (as wire.ts sets it
 * up) makes of it: the same numbers and bigints, strings, bytes, arrays and objects, for
 * every form; a body it does not read (an ext type, a key of another type, `__proto__`,
 * invalid UTF-8, a short body, trailing bytes) is the library's, which decodes it or
 * throws as before.
 */

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { Encoder } from '@msgpack/msgpack';

import { FrameDecoder, decodeByLibrary, decodeFast } from '../src/wire.js';

const encoder = new Encoder({ useBigInt64: true });

function outcome(read: () => unknown): unknown {
  try {
    return { value: read() };
  } catch (error) {
    return { error: `${(error as Error).name}: ${(error as Error).message}` };
  }
}

function same(body: Uint8Array, what: string): void {
  const bytes = Buffer.from(body);
  const fast = outcome(() => decodeFast(bytes));
  const library = outcome(() => decodeByLibrary(bytes));
  assert.deepStrictEqual(fast, library, what);
  const value = (fast as { value?: unknown }).value;
  if (value instanceof Uint8Array) {
    assert.equal(value.constructor, (library as { value: Uint8Array }).value.constructor, `${what}: bytes' type`);
  }
}

function sameValue(value: unknown, what: string): void {
  same(encoder.encode(value), what);
}

function text(length: number, unit: string): string {
  return unit.repeat(Math.ceil(length / unit.length)).slice(0, length);
}

describe('the frame decoder reads what the msgpack library reads', () => {
  test('numbers of every form, 64-bit ones as numbers when safe and bigints when not', () => {
    const numbers: unknown[] = [
      0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff, 0x100000000, 2 ** 53 - 1,
      -1, -0x20, -0x21, -0x80, -0x81, -0x8000, -0x8001, -0x80000000, -0x80000001, -(2 ** 53 - 1),
      0.5, -1.25, 1e300, Number.NaN, Number.POSITIVE_INFINITY, 2n ** 53n, 2n ** 64n - 1n, -(2n ** 63n), -(2n ** 53n),
    ];
    for (const n of numbers) sameValue({ n, list: [n] }, `number ${String(n)}`);
    same(Buffer.from([0xca, 0x3f, 0xc0, 0x00, 0x00]), 'a float 32');
  });

  test('strings of every length form, ASCII, UTF-8 and not UTF-8, and keys', () => {
    for (const length of [0, 1, 23, 24, 31, 32, 199, 200, 201, 255, 256, 65_535, 65_536]) {
      for (const unit of ['a', 'é', '€', '😀', 'ab€', '\ufeffx']) {
        const s = text(length, unit);
        sameValue({ s, [s.slice(0, 30)]: [s] }, `string of ${length} (${JSON.stringify(unit)})`);
      }
    }
    for (const raw of [[0xff], [0xc0, 0x80], [0xed, 0xa0, 0x80], [0xf0, 0x90, 0x80, 0x41], [0x61, 0xe2, 0x82]]) {
      same(Buffer.from([0xa0 + raw.length, ...raw]), `invalid UTF-8 ${JSON.stringify(raw)}`);
      same(Buffer.from([0x81, 0xa0 + raw.length, ...raw, 0x01]), `invalid UTF-8 key ${JSON.stringify(raw)}`);
    }
  });

  test('bytes, arrays and maps of every size form, nested', () => {
    for (const size of [0, 1, 255, 256, 65_535, 65_536]) sameValue({ b: new Uint8Array(size).fill(9) }, `bytes of ${size}`);
    for (const size of [0, 15, 16, 65_535, 65_536]) {
      sameValue({ a: Array.from({ length: size }, (_, i) => i) }, `array of ${size}`);
      sameValue(Object.fromEntries(Array.from({ length: size }, (_, i) => [`k${i}`, i])), `map of ${size}`);
    }
    sameValue([2, 7, { id: 'tsk-1', state: 'SUCCEEDED', outcome: { n: 5, list: [true, false, null] }, lease: new Uint8Array(16) }], 'a reply');
    same(Buffer.from([0x82, 0x01, 0xa1, 0x61, 0xff, 0x02]), 'integer keys');
  });

  test('what it leaves to the library is read, or refused, as the library does', () => {
    same(Buffer.from([0x81, 0xc4, 0x02, 0x01, 0x02, 0x01]), 'a bytes key');
    same(Buffer.from([0x82, 0xc0, 0x01, 0xc3, 0x02]), 'nil and boolean keys');
    same(Buffer.from([0x81, 0xa9, ...Buffer.from('__proto__'), 0x01]), 'a __proto__ key');
    same(Buffer.from([0x81, 0x91, 0x01, 0x02]), 'an array key');
    same(encoder.encode({ d: new Date(1_700_000_000_000) }), 'a timestamp ext');
    same(Buffer.from([0xd4, 0x05, 0x01]), 'another ext');
    same(Buffer.from([0xc1]), 'the unused byte');
    same(Buffer.from([0x92, 0x01]), 'a short array');
    same(Buffer.from([0xa5, 0x61]), 'a short string');
    same(Buffer.from([0xdd, 0xff, 0xff, 0xff, 0xff]), 'a huge array header');
    same(Buffer.from([0x01, 0x02]), 'trailing bytes');
    same(Buffer.from([]), 'nothing');
  });

  test('frames read back to back from one chunk each decode as alone', () => {
    const bodies = [encoder.encode([2, 1, { a: 'x' }]), encoder.encode([4, 3, { lease: new Uint8Array([1, 2]) }]), encoder.encode([2, 2, 'é'])];
    const chunk = Buffer.concat(bodies.flatMap((body) => {
      const header = Buffer.alloc(4);
      header.writeUInt32BE(body.length);
      return [header, Buffer.from(body)];
    }));
    assert.deepStrictEqual(new FrameDecoder().feed(chunk), bodies.map((body) => decodeByLibrary(Buffer.from(body))));
  });
});
