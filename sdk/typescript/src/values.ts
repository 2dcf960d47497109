/**
 * What a value sent to rsd may hold: only what comes back as it went (from this SDK and
 * from Python), as the Python SDK's msgpack refuses what it cannot encode faithfully.
 *
 * What always holds:
 * - sent as themselves: null, booleans, numbers, strings, bigints within 64 bits,
 *   `Uint8Array` (a `Buffer` too; as bytes), arrays, and plain objects (made by `{}` or
 *   `Object.create(null)`), whose properties set to `undefined` are left out as JSON
 *   leaves them out;
 * - refused, naming where (`data.items[3]: a Set does not round-trip; use an array`):
 *   a Map, a Set, a Date, any other typed array or ArrayBuffer, an instance of a class
 *   (an Error, a RegExp, a boxed primitive...), a function, a symbol, a bigint outside
 *   64 bits, `undefined` or a hole inside an array;
 * - the check costs nothing more on success: the encoder asks `refusal` about each
 *   object and each odd scalar it meets in its own walk; only a refused request is
 *   walked again, to name the path (at most `MAX_WALK_DEPTH` levels, the server's
 *   payload nesting limit).
 */

import { LIMITS } from './sdkrules.js';

const U64_MAX = (1n << 64n) - 1n;
const I64_MIN = -(1n << 63n);
const MAX_WALK_DEPTH = LIMITS.MAX_PAYLOAD_DEPTH;

/** Thrown by the encoder for a value that would not round-trip; `requestFrame` turns it
 * into a FrameError naming the path. */
export class RefusedValue extends Error {}

function article(name: string): string {
  return /^[AEIOU]/.test(name) ? `an ${name}` : `a ${name}`;
}

/** Why `value` (an array element if `inArray`) cannot be sent, or null if it can. Only
 * objects, functions, symbols, bigints and undefined need asking: every other scalar
 * is sent as itself. */
export function refusal(value: unknown, inArray: boolean): string | null {
  switch (typeof value) {
    case 'object': {
      if (value === null || Array.isArray(value) || value instanceof Uint8Array) return null;
      const proto: unknown = Object.getPrototypeOf(value);
      if (proto === Object.prototype || proto === null) return null;
      return refusedObject(value);
    }
    case 'undefined':
      return inArray ? 'undefined in an array does not round-trip (it arrives as null); use null' : null;
    case 'bigint':
      return value > U64_MAX || value < I64_MIN ? `the integer ${value} does not fit in 64 bits` : null;
    case 'function':
      return 'a function cannot be sent';
    case 'symbol':
      return 'a symbol cannot be sent';
    default:
      return null;
  }
}

function refusedObject(value: object): string {
  if (value instanceof Map) return 'a Map does not round-trip (it would arrive as {}); use a plain object';
  if (value instanceof Set) return 'a Set does not round-trip (it would arrive as {}); use an array';
  if (value instanceof Date) {
    return 'a Date does not round-trip (it would arrive as a msgpack timestamp); send date.toISOString() or date.getTime()';
  }
  if (ArrayBuffer.isView(value) || value instanceof ArrayBuffer) {
    const name = value.constructor.name;
    return `${article(name)} does not round-trip (it would arrive as a Uint8Array of its bytes); use a Uint8Array or an array`;
  }
  const name = (value.constructor as { name?: unknown } | undefined)?.name;
  const what = typeof name === 'string' && name !== '' ? `an instance of ${name}` : 'an object with a prototype';
  return `${what} does not round-trip (it would arrive as a plain object of its own fields); use a plain object`;
}

/** `path` extended by a property name: `.name`, or `["odd key"]`. */
function keyPath(path: string, key: string): string {
  if (/^[A-Za-z_$][\w$]*$/.test(key)) return path === '' ? key : `${path}.${key}`;
  return `${path}[${JSON.stringify(key)}]`;
}

/** The path and reason of the first value in `args` that `refusal` refuses, in the
 * encoder's order, or null (a refusal deeper than MAX_WALK_DEPTH is not located). */
export function findRefused(args: Record<string, unknown>): string | null {
  const walk = (value: unknown, path: string, inArray: boolean, depth: number): string | null => {
    const why = refusal(value, inArray);
    if (why !== null) return `${path}: ${why}`;
    if (typeof value !== 'object' || value === null || value instanceof Uint8Array) return null;
    if (depth >= MAX_WALK_DEPTH) return null;
    if (Array.isArray(value)) {
      for (let i = 0; i < value.length; i += 1) {
        const found = walk(value[i], `${path}[${i}]`, true, depth + 1);
        if (found !== null) return found;
      }
      return null;
    }
    const record = value as Record<string, unknown>;
    for (const key of Object.keys(record)) {
      const found = walk(record[key], keyPath(path, key), false, depth + 1);
      if (found !== null) return found;
    }
    return null;
  };
  return walk(args, '', false, 0);
}
