/**
 * Rule: every request goes through wire.ts's own encoder first (FastFrames), and its frame
 * is byte for byte the frame @msgpack/msgpack's encoder makes of the same request, for
 * every form of every kind of value a request is made of; what it does not encode (a
 * bigint, an unpaired surrogate, a value that does not round-trip, a depth past the
 * library's limit) is encoded, or refused with the same error, by the library's path.
 */

import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { encodedFrame, requestFrame } from '../src/wire.js';

function outcome(make: () => Buffer): string {
  try {
    return make().toString('hex');
  } catch (error) {
    return `${(error as Error).name}: ${(error as Error).message}`;
  }
}

// A request id of every form the header writes it in.
const IDS = [0, 1, 127, 128, 65_535, 65_536, 2 ** 32, 2 ** 53 - 1];

function same(args: Record<string, unknown>, what: string, ids: number[] = IDS): void {
  for (const id of ids) {
    assert.equal(outcome(() => requestFrame(id, 40, args)), outcome(() => encodedFrame(id, 40, args)), `${what} (id ${id})`);
  }
}

const EDGES = [0, 1, 2, 3, 4, 5, 8, 9, 16, 17];
const numbers: number[] = [
  0, -0, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000, 0xffffffff, 0x100000000, 2 ** 53 - 1, 2 ** 53, 2 ** 64,
  -1, -0x20, -0x21, -0x80, -0x81, -0x8000, -0x8001, -0x80000000, -0x80000001, -(2 ** 53 - 1), -(2 ** 53),
  0.5, -1.25, 1e300, Number.MIN_VALUE, Number.NaN, Number.POSITIVE_INFINITY, Number.NEGATIVE_INFINITY,
];

function text(length: number, unit: string): string {
  return unit.repeat(Math.ceil(length / unit.length)).slice(0, length);
}

describe('the request encoder writes what the msgpack library writes', () => {
  test('numbers of every form', () => {
    for (const n of numbers) same({ n, list: [n, -n] }, `number ${n}`);
  });

  test('strings of every length form, ASCII or not, and keys', () => {
    for (const length of [0, 1, 31, 32, 63, 64, 255, 256, 65_535, 65_536]) {
      for (const unit of ['a', 'é', '€', '😀', 'ab€']) {
        const s = text(length, unit);
        same({ s, [s.slice(0, 40) || 'k']: s }, `string of ${length} (${unit})`);
      }
    }
  });

  test('bytes, arrays and maps of every size form, nested, with undefined map values left out', () => {
    for (const size of [0, 1, 15, 16, 255, 256, 65_535, 65_536]) {
      same({ b: new Uint8Array(size).fill(7), buf: Buffer.alloc(size % 300, 1) }, `bytes of ${size}`);
    }
    for (const size of [0, 15, 16, 17, 65_535, 65_536]) {
      same({ a: Array.from({ length: size }, (_, i) => i) }, `array of ${size}`);
      same({ m: Object.fromEntries(Array.from({ length: size }, (_, i) => [`k${i}`, i])) }, `map of ${size}`);
    }
    const bare = Object.create(null) as Record<string, unknown>;
    bare['x'] = 1;
    for (const e of EDGES) {
      same(
        { scope: 'run-1', data: { n: e, deep: { list: [true, false, null, 'x', { y: [e] }] }, bare }, gone: undefined, t: true },
        `nested ${e}`,
      );
    }
    let deep: unknown = 1;
    for (let depth = 0; depth < 120; depth += 1) {
      deep = [deep];
      if (depth > 90) same({ deep }, `depth ${depth}`);
    }
  });

  test('what it leaves to the library is encoded or refused as the library does', () => {
    same({ big: 2n ** 63n - 1n, small: -(2n ** 63n) }, 'bigints');
    same({ big: 2n ** 64n }, 'a bigint too big');
    same({ s: 'a\ud800b' }, 'an unpaired surrogate');
    same({ ['k\udc00']: 1 }, 'an unpaired surrogate in a key');
    same({ m: new Map([[1, 2]]) }, 'a Map');
    same({ d: new Date(0) }, 'a Date');
    same({ a: [1, undefined] }, 'undefined in an array');
    same({ f: () => 1 }, 'a function');
    same({ u: new Uint16Array(2) }, 'a Uint16Array');
    // Refused for its size, whatever the id's form: the id's smallest and largest forms
    // (each of the two encoders writes the 17 MiB before it refuses them: 0.45 s a time).
    same({ big: 'x'.repeat(17 * 1024 * 1024) }, 'over the frame limit', [0, 2 ** 53 - 1]);
  });
});
