/**
 * The wire format of protocol.md: frame kinds, op codes, push events, the limits' default
 * values, and the codec.
 *
 * What always holds:
 * - a frame is a 4-byte big-endian body length followed by exactly one msgpack value;
 *   a body over `MAX_FRAME_BYTES` is refused in both directions (`FrameError`);
 * - integers are never rounded: a msgpack int 64 / uint 64 outside the safe range of a
 *   double (2^53 − 1) decodes as a `bigint`, and a `bigint` encodes as an integer, so
 *   values such as lease ids survive a round trip exactly; every other integer is a
 *   `number`;
 * - `bin` values decode as `Uint8Array` and encode back as `bin` (lease handles are one);
 * - a string with an unpaired surrogate (no UTF-8 form) is refused, never sent; so is
 *   any value that would not come back as it went (a Map, a Set, a Date, a class
 *   instance...: values.ts), the error naming where it is (`data.items[3]: ...`);
 * - a payload map key that is not a string or number (msgpack allows nil, booleans or
 *   binary keys) decodes as its string form rather than breaking the connection.
 */

import { Decoder, Encoder } from '@msgpack/msgpack';

import { LIMITS } from './sdkrules.js';
import { RefusedValue, findRefused, refusal } from './values.js';

export const PROTOCOL_VERSION = 1;
export const HEADER_BYTES = 4;
export const MAX_FRAME_BYTES = LIMITS.MAX_FRAME_BYTES;

export const Kind = { REQUEST: 1, REPLY: 2, ERROR: 3, PUSH: 4 } as const;

export const Op = {
  HELLO: 1,
  PING: 2,
  CANCEL: 3,
  SERVER_STATS: 4,
  SLOT_MAP: 5,
  SCOPE_CREATE: 10,
  SCOPE_CANCEL: 11,
  SCOPE_STATUS: 12,
  CLAIM_ACQUIRE: 20,
  LEASE_RENEW: 21,
  CLAIM_RELEASE: 22,
  CLAIM_INSPECT: 23,
  FENCE_CHECK: 24,
  MAILBOX_ENSURE: 30,
  TASK_SUBMIT: 31,
  MESSAGE_SEND: 32,
  RECEIVE: 33,
  DELIVERY_COMPLETE: 34,
  DELIVERY_RETRY: 35,
  DELIVERY_RELEASE: 36,
  DELIVERY_REJECT: 37,
  DEAD_LETTERS: 38,
  QUEUE_INSPECT: 39,
  TASK_STATUS: 40,
  TASK_RESULT: 41,
  TASK_JOIN: 42,
  TASK_DETACH: 43,
  TASK_CANCEL: 44,
  TASK_SUBMIT_MANY: 45,
  GROUP_WAIT: 46,
  GROUP_STATUS: 47,
  MAILBOX_PAUSE: 48,
  QUEUE_PAUSE: 49,
  POOL_ENSURE: 50,
  POOL_ACQUIRE: 51,
  POOL_RELEASE: 52,
  POOL_INSPECT: 53,
  QUOTA_ENSURE: 55,
  QUOTA_TAKE: 56,
  QUOTA_INSPECT: 57,
  SCHEDULE_ENSURE: 60,
  SCHEDULE_LIST: 61,
  SCHEDULE_GET: 62,
  SCHEDULE_PAUSE: 63,
  SCHEDULE_RESUME: 64,
  SCHEDULE_DELETE: 65,
  DELIVERY_PROGRESS: 66,
  TASK_EVENTS: 67,
  DELIVERY_SUSPEND: 68,
  TASK_SIGNAL: 69,
  TASK_CHILDREN: 70,
  ADMIN_SCOPES: 80,
  ADMIN_CLAIMS: 81,
  ADMIN_TASKS: 82,
  ADMIN_TASK: 83,
  ADMIN_POOLS: 84,
  DEAD_LETTER_REQUEUE: 85,
  SNAPSHOT_NOW: 86,
  ADMIN_DEAD_LETTERS: 87,
  DEAD_LETTER_DELETE: 88,
  ADMIN_GROUPS: 89,
  ADMIN_QUOTAS: 100,
  ADMIN_MAILBOXES: 101,
  ADMIN_QUEUES: 102,
  SLOTS_MOVE: 103,
} as const;

export const Push = { LEASE_LOST: 1, TASK_EVENTS: 4 } as const;

/** The defaults of protocol.md's "Limits" table; the HELLO reply's values take precedence
 * (generated from rsproto, sdkrules.ts). */
export const Limits = LIMITS;

/** A lease handle exactly as the server sent it: kept and sent back as-is. */
export type LeaseHandle = number | bigint | Uint8Array;

/** The handle's fencing-token text: hex for bytes, decimal for an integer. */
export function handleText(handle: LeaseHandle): string {
  if (handle instanceof Uint8Array) return Buffer.from(handle).toString('hex');
  return String(handle);
}

export class FrameError extends Error {}

const SAFE = BigInt(Number.MAX_SAFE_INTEGER);

function mapKey(key: unknown): string | number {
  if (typeof key === 'string' || typeof key === 'number') return key;
  if (key instanceof Uint8Array) return Buffer.from(key).toString('hex');
  return String(key);
}

function makeDecoder(): Decoder {
  const decoder = new Decoder({ useBigInt64: true, mapKeyConverter: mapKey });
  // int 64 / uint 64: a number when a double holds it exactly, else a bigint.
  const internals = decoder as unknown as {
    readU64AsBigInt(): bigint;
    readI64AsBigInt(): bigint;
  };
  const u64 = internals.readU64AsBigInt.bind(decoder);
  const i64 = internals.readI64AsBigInt.bind(decoder);
  const narrow = (value: bigint): number | bigint =>
    value <= SAFE && value >= -SAFE ? Number(value) : value;
  (internals as unknown as Record<string, unknown>)['readU64AsBigInt'] = () => narrow(u64());
  (internals as unknown as Record<string, unknown>)['readI64AsBigInt'] = () => narrow(i64());
  return decoder;
}

function makeEncoder(): Encoder {
  const encoder = new Encoder({ ignoreUndefined: true });
  const internals = encoder as unknown as {
    doEncode(object: unknown, depth: number): void;
    encodeObject(object: unknown, depth: number): void;
    encodeBigInt64(object: bigint): void;
    encodeString(object: string): void;
  };
  // Every string (map keys too) must be valid UTF-8 on the wire: a JavaScript string
  // with an unpaired surrogate has no UTF-8 form, and sending one would make rsd close
  // the connection (PROTOCOL_ERROR). Refuse it here, for this request alone.
  const encodeString = internals.encodeString.bind(encoder);
  (internals as unknown as Record<string, unknown>)['encodeString'] = (object: string): void => {
    if (!(object as unknown as { isWellFormed(): boolean }).isWellFormed()) {
      throw new FrameError(`string ${JSON.stringify(object.slice(0, 40))} has an unpaired surrogate`);
    }
    encodeString(object);
  };
  const doEncode = internals.doEncode.bind(encoder);
  (internals as unknown as Record<string, unknown>)['doEncode'] = (
    object: unknown,
    depth: number,
  ): void => {
    if (typeof object === 'bigint') {
      const why = refusal(object, false);
      if (why !== null) throw new RefusedValue(why);
      internals.encodeBigInt64(object);
      return;
    }
    // Map values set to undefined are skipped before this (ignoreUndefined): an
    // undefined here is an array's element, which would arrive as null.
    if (object === undefined) throw new RefusedValue(refusal(undefined, true)!);
    doEncode(object, depth);
  };
  // Objects, functions and symbols: only what round-trips (values.ts) is encoded.
  const encodeObject = internals.encodeObject.bind(encoder);
  (internals as unknown as Record<string, unknown>)['encodeObject'] = (
    object: unknown,
    depth: number,
  ): void => {
    const why = refusal(object, false);
    if (why !== null) throw new RefusedValue(why);
    encodeObject(object, depth);
  };
  return encoder;
}

const encoder = makeEncoder();
const decoder = makeDecoder();

/** One msgpack value, encoded (for tests and size checks). */
export function encode(value: unknown): Uint8Array {
  return encoder.encode(value);
}

/** One msgpack value, decoded; throws on trailing bytes. */
export function decode(bytes: Uint8Array): unknown {
  return decoder.decode(bytes);
}

/**
 * The request encoder every request goes through first: msgpack of what requests are
 * made of (nil, booleans, numbers, well-formed strings, `Uint8Array`, arrays and plain
 * objects), written straight into one reused buffer after the frame's header, byte for
 * byte what `encoder` writes for the same value (the same choice of every form; tested
 * against it in wire.test.ts). Anything else in a request (a bigint, an unpaired
 * surrogate, a refused value, a depth past the encoder's limit) gives up, and the
 * request is encoded by `encoder`, with its checks and errors: one place for those.
 */
class FastFrames {
  private buf = Buffer.allocUnsafe(4096);
  private pos = 0;

  /** The frame of [REQUEST, id, op, args], or null: `encoder`'s to make. */
  frame(requestId: number, op: number, args: Record<string, unknown>): Buffer | null {
    this.pos = HEADER_BYTES;
    this.room(3);
    this.buf[this.pos++] = 0x94; // fixarray of 4
    this.buf[this.pos++] = Kind.REQUEST;
    if (!this.value(requestId, 2) || !this.value(op, 2) || !this.value(args, 2)) return null;
    const length = this.pos - HEADER_BYTES;
    if (length > MAX_FRAME_BYTES) return null; // refused by the encoder's path, with its words
    const frame = Buffer.allocUnsafe(this.pos);
    this.buf.copy(frame, 0, 0, this.pos);
    frame.writeUInt32BE(length, 0);
    return frame;
  }

  private room(bytes: number): void {
    if (this.pos + bytes <= this.buf.length) return;
    const grown = Buffer.allocUnsafe(Math.max(2 * this.buf.length, this.pos + bytes));
    this.buf.copy(grown, 0, 0, this.pos);
    this.buf = grown;
  }

  private value(value: unknown, depth: number): boolean {
    if (depth > ENCODER_MAX_DEPTH) return false;
    switch (typeof value) {
      case 'string':
        return this.string(value);
      case 'number':
        this.number(value);
        return true;
      case 'boolean':
        this.room(1);
        this.buf[this.pos++] = value ? 0xc3 : 0xc2;
        return true;
      case 'object':
        if (value === null) {
          this.room(1);
          this.buf[this.pos++] = 0xc0;
          return true;
        }
        if (Array.isArray(value)) return this.array(value, depth);
        if (value instanceof Uint8Array) {
          this.binary(value);
          return true;
        }
        {
          const proto: unknown = Object.getPrototypeOf(value);
          if (proto !== Object.prototype && proto !== null) return false;
        }
        return this.map(value as Record<string, unknown>, depth);
      default:
        return false; // undefined in an array, bigint, function, symbol
    }
  }

  private number(value: number): void {
    this.room(9);
    const buf = this.buf;
    if (Number.isSafeInteger(value)) {
      if (value >= 0) {
        if (value < 0x80) buf[this.pos++] = value;
        else if (value < 0x100) {
          buf[this.pos++] = 0xcc;
          buf[this.pos++] = value;
        } else if (value < 0x10000) {
          buf[this.pos++] = 0xcd;
          this.pos = buf.writeUInt16BE(value, this.pos);
        } else if (value < 0x100000000) {
          buf[this.pos++] = 0xce;
          this.pos = buf.writeUInt32BE(value, this.pos);
        } else {
          buf[this.pos++] = 0xcf;
          this.pos = buf.writeBigUInt64BE(BigInt(value), this.pos);
        }
      } else if (value >= -0x20) {
        buf[this.pos++] = 0xe0 | (value + 0x20);
      } else if (value >= -0x80) {
        buf[this.pos++] = 0xd0;
        this.pos = buf.writeInt8(value, this.pos);
      } else if (value >= -0x8000) {
        buf[this.pos++] = 0xd1;
        this.pos = buf.writeInt16BE(value, this.pos);
      } else if (value >= -0x80000000) {
        buf[this.pos++] = 0xd2;
        this.pos = buf.writeInt32BE(value, this.pos);
      } else {
        buf[this.pos++] = 0xd3;
        this.pos = buf.writeBigInt64BE(BigInt(value), this.pos);
      }
    } else {
      buf[this.pos++] = 0xcb;
      this.pos = buf.writeDoubleBE(value, this.pos);
    }
  }

  private string(value: string): boolean {
    const length = value.length;
    let ascii = true;
    for (let i = 0; i < length; i += 1) {
      if (value.charCodeAt(i) >= 0x80) {
        ascii = false;
        break;
      }
    }
    if (!ascii && !(value as unknown as { isWellFormed(): boolean }).isWellFormed()) return false;
    const bytes = ascii ? length : Buffer.byteLength(value, 'utf8');
    this.room(5 + bytes);
    const buf = this.buf;
    if (bytes < 32) buf[this.pos++] = 0xa0 + bytes;
    else if (bytes < 0x100) {
      buf[this.pos++] = 0xd9;
      buf[this.pos++] = bytes;
    } else if (bytes < 0x10000) {
      buf[this.pos++] = 0xda;
      this.pos = buf.writeUInt16BE(bytes, this.pos);
    } else {
      buf[this.pos++] = 0xdb;
      this.pos = buf.writeUInt32BE(bytes, this.pos);
    }
    if (ascii && length < 64) {
      let pos = this.pos;
      for (let i = 0; i < length; i += 1) buf[pos++] = value.charCodeAt(i);
      this.pos = pos;
    } else {
      this.pos += buf.write(value, this.pos, bytes, 'utf8');
    }
    return true;
  }

  private binary(value: Uint8Array): void {
    const size = value.byteLength;
    this.room(5 + size);
    const buf = this.buf;
    if (size < 0x100) {
      buf[this.pos++] = 0xc4;
      buf[this.pos++] = size;
    } else if (size < 0x10000) {
      buf[this.pos++] = 0xc5;
      this.pos = buf.writeUInt16BE(size, this.pos);
    } else {
      buf[this.pos++] = 0xc6;
      this.pos = buf.writeUInt32BE(size, this.pos);
    }
    buf.set(value, this.pos);
    this.pos += size;
  }

  private array(value: unknown[], depth: number): boolean {
    const size = value.length;
    this.header(size, 0x90, 0xdc);
    for (let i = 0; i < size; i += 1) {
      if (!this.value(value[i], depth + 1)) return false;
    }
    return true;
  }

  private map(value: Record<string, unknown>, depth: number): boolean {
    const keys = Object.keys(value);
    let size = 0;
    for (const key of keys) if (value[key] !== undefined) size += 1;
    this.header(size, 0x80, 0xde);
    for (const key of keys) {
      const item = value[key];
      if (item === undefined) continue; // ignoreUndefined, as the encoder
      if (!this.string(key) || !this.value(item, depth + 1)) return false;
    }
    return true;
  }

  /** A fixarray/fixmap (`fix` + size) header, else its 16- or 32-bit form (`wide`, +1). */
  private header(size: number, fix: number, wide: number): void {
    this.room(5);
    const buf = this.buf;
    if (size < 16) buf[this.pos++] = fix + size;
    else if (size < 0x10000) {
      buf[this.pos++] = wide;
      this.pos = buf.writeUInt16BE(size, this.pos);
    } else {
      buf[this.pos++] = wide + 1;
      this.pos = buf.writeUInt32BE(size, this.pos);
    }
  }
}

/** @msgpack/msgpack's default `maxDepth`: deeper, its encoder throws (and says so). */
const ENCODER_MAX_DEPTH = 100;
const fastFrames = new FastFrames();

/** A REQUEST frame with its length header. */
export function requestFrame(requestId: number, op: number, args: Record<string, unknown>): Buffer {
  const fast = fastFrames.frame(requestId, op, args);
  if (fast !== null) return fast;
  return encodedFrame(requestId, op, args);
}

/** `requestFrame` by `encoder`, with its checks (exported for the test that compares). */
export function encodedFrame(requestId: number, op: number, args: Record<string, unknown>): Buffer {
  let body: Uint8Array;
  try {
    // A view of the encoder's own buffer, valid until its next encode: copied once, into
    // the frame, below (`encode` would copy it first, then the frame again).
    body = encoder.encodeSharedRef([Kind.REQUEST, requestId, op, args]);
  } catch (err) {
    if (err instanceof RefusedValue) throw new FrameError(findRefused(args) ?? err.message);
    throw new FrameError(`cannot encode the request: ${(err as Error).message}`);
  }
  if (body.length > MAX_FRAME_BYTES) {
    throw new FrameError(
      `the request is ${body.length} bytes encoded; max_frame_bytes is ${MAX_FRAME_BYTES}`,
    );
  }
  const frame = Buffer.allocUnsafe(HEADER_BYTES + body.length);
  frame.writeUInt32BE(body.length, 0);
  frame.set(body, HEADER_BYTES);
  return frame;
}

/** Thrown by FastReader at anything it leaves to `decoder`. */
const NOT_MINE = new Error('left to the library');

/**
 * The frame decoder every frame goes through first: msgpack of what rsd sends (nil,
 * booleans, integers, floats, valid UTF-8 strings, bin, arrays, maps keyed by strings
 * or integers), read straight from the frame into the values `decoder` makes of it: the
 * same numbers (an int 64 outside a double's safe range a bigint), strings, `bin` as a
 * view of the frame (as the library's), plain objects built key by key. Anything else
 * (an ext type, other map keys, `__proto__`, invalid UTF-8, a broken or short body,
 * trailing bytes) is left to `decoder`, which decodes it or says what is wrong.
 */
class FastReader {
  private data: Buffer = Buffer.alloc(0);
  private pos = 0;

  read(data: Buffer, start: number, end: number): unknown {
    this.data = data;
    this.pos = start;
    const value = this.value();
    if (this.pos !== end) throw NOT_MINE;
    return value;
  }

  private value(): unknown {
    const data = this.data;
    const head = data[this.pos++];
    if (head === undefined) throw NOT_MINE;
    if (head < 0x80) return head;
    if (head >= 0xe0) return head - 0x100;
    if (head < 0x90) return this.map(head - 0x80);
    if (head < 0xa0) return this.array(head - 0x90);
    if (head < 0xc0) return this.string(head - 0xa0);
    const pos = this.pos;
    switch (head) {
      case 0xc0:
        return null;
      case 0xc2:
        return false;
      case 0xc3:
        return true;
      case 0xc4:
        this.pos += 1;
        return this.binary(data.readUInt8(pos));
      case 0xc5:
        this.pos += 2;
        return this.binary(data.readUInt16BE(pos));
      case 0xc6:
        this.pos += 4;
        return this.binary(data.readUInt32BE(pos));
      case 0xca:
        this.pos += 4;
        return data.readFloatBE(pos);
      case 0xcb:
        this.pos += 8;
        return data.readDoubleBE(pos);
      case 0xcc:
        this.pos += 1;
        return data.readUInt8(pos);
      case 0xcd:
        this.pos += 2;
        return data.readUInt16BE(pos);
      case 0xce:
        this.pos += 4;
        return data.readUInt32BE(pos);
      case 0xcf:
        this.pos += 8;
        return narrow(data.readBigUInt64BE(pos));
      case 0xd0:
        this.pos += 1;
        return data.readInt8(pos);
      case 0xd1:
        this.pos += 2;
        return data.readInt16BE(pos);
      case 0xd2:
        this.pos += 4;
        return data.readInt32BE(pos);
      case 0xd3:
        this.pos += 8;
        return narrow(data.readBigInt64BE(pos));
      case 0xd9:
        this.pos += 1;
        return this.string(data.readUInt8(pos));
      case 0xda:
        this.pos += 2;
        return this.string(data.readUInt16BE(pos));
      case 0xdb:
        this.pos += 4;
        return this.string(data.readUInt32BE(pos));
      case 0xdc:
        this.pos += 2;
        return this.array(data.readUInt16BE(pos));
      case 0xdd:
        this.pos += 4;
        return this.array(data.readUInt32BE(pos));
      case 0xde:
        this.pos += 2;
        return this.map(data.readUInt16BE(pos));
      case 0xdf:
        this.pos += 4;
        return this.map(data.readUInt32BE(pos));
      default:
        throw NOT_MINE; // ext types, 0xc1
    }
  }

  /** A map key of 1 to 16 bytes (a fixstr): the string of the same bytes read before, if
   * any (keys repeat in every reply), without making it again. */
  private key(bytes: number): string {
    const data = this.data;
    const start = this.pos + 1;
    const end = start + bytes;
    const cached = this.keys[bytes]!;
    search: for (const [known, text] of cached) {
      for (let i = 0; i < bytes; i += 1) if (known[i] !== data[start + i]) continue search;
      this.pos = end;
      return text;
    }
    this.pos += 1;
    const text = this.string(bytes);
    if (cached.length < 32) cached.push([Uint8Array.prototype.slice.call(data, start, end), text]);
    return text;
  }

  private readonly keys: Array<Array<[Uint8Array, string]>> = Array.from({ length: 17 }, () => []);

  private string(bytes: number): string {
    const data = this.data;
    const start = this.pos;
    const end = start + bytes;
    if (end > data.length) throw NOT_MINE;
    this.pos = end;
    if (bytes <= 32) {
      let text = '';
      let i = start;
      for (; i < end; i += 1) {
        const byte = data[i]!;
        if (byte >= 0x80) break;
        text += String.fromCharCode(byte);
      }
      if (i === end) return text;
    } else if (isAscii(data, start, end)) {
      return data.toString('latin1', start, end);
    }
    // Valid UTF-8 comes back byte for byte; anything else is the library's to decode (and
    // so is a leading BOM, which the library's TextDecoder drops from a long string).
    if (data[start] === 0xef && data[start + 1] === 0xbb && data[start + 2] === 0xbf) throw NOT_MINE;
    const text = data.toString('utf8', start, end);
    if (!Buffer.from(text, 'utf8').equals(data.subarray(start, end))) throw NOT_MINE;
    return text;
  }

  private binary(bytes: number): Buffer {
    const start = this.pos;
    if (start > this.data.length || start + bytes > this.data.length) throw NOT_MINE;
    this.pos = start + bytes;
    return this.data.subarray(start, start + bytes);
  }

  private array(size: number): unknown[] {
    if (size > this.data.length - this.pos) throw NOT_MINE; // each item takes a byte at least
    const array = new Array<unknown>(size);
    for (let i = 0; i < size; i += 1) array[i] = this.value();
    return array;
  }

  private map(size: number): Record<string, unknown> {
    if (2 * size > this.data.length - this.pos) throw NOT_MINE;
    const map: Record<string, unknown> = {};
    for (let i = 0; i < size; i += 1) {
      const head = this.data[this.pos];
      const key = head !== undefined && head > 0xa0 && head <= 0xb0 ? this.key(head - 0xa0) : this.value();
      if (typeof key === 'string') {
        if (key === '__proto__') throw NOT_MINE;
      } else if (typeof key !== 'number') {
        throw NOT_MINE; // bytes, nil, booleans... as keys: mapKey's, through the library
      }
      map[key] = this.value();
    }
    return map;
  }
}

function narrow(value: bigint): number | bigint {
  return value <= SAFE && value >= -SAFE ? Number(value) : value;
}

function isAscii(data: Buffer, start: number, end: number): boolean {
  for (let i = start; i < end; i += 1) if (data[i]! >= 0x80) return false;
  return true;
}

const fastReader = new FastReader();

/** One frame's body (`data[start, end)`), as `decoder` decodes it. */
function decodeBody(data: Buffer, start: number, end: number): unknown {
  try {
    return fastReader.read(data, start, end);
  } catch {
    return decoder.decode(data.subarray(start, end));
  }
}

/** `decodeBody` by `decoder` alone (for the test that compares). */
export function decodeByLibrary(body: Uint8Array): unknown {
  return decoder.decode(body);
}

/** `decodeBody` of a whole body (for the test that compares). */
export function decodeFast(body: Buffer): unknown {
  return decodeBody(body, 0, body.length);
}

/**
 * Splits a byte stream into frames and decodes them. Accepts frames split across any
 * number of chunks and any number of frames per chunk; holds at most one unfinished
 * frame. A length over the limit or an undecodable body throws `FrameError`: the
 * stream cannot be resynchronised and the connection must be closed.
 */
export class FrameDecoder {
  private chunks: Buffer[] = [];
  private buffered = 0;
  private need = HEADER_BYTES;

  constructor(private readonly maxFrameBytes: number = MAX_FRAME_BYTES) {}

  feed(chunk: Buffer): unknown[] {
    this.chunks.push(chunk);
    this.buffered += chunk.length;
    if (this.buffered < this.need) return [];
    const data = this.chunks.length === 1 ? this.chunks[0]! : Buffer.concat(this.chunks);
    const messages: unknown[] = [];
    let pos = 0;
    while (data.length - pos >= HEADER_BYTES) {
      const length = data.readUInt32BE(pos);
      if (length > this.maxFrameBytes) {
        throw new FrameError(`frame of ${length} bytes is over the ${this.maxFrameBytes} limit`);
      }
      if (data.length - pos - HEADER_BYTES < length) break;
      const start = pos + HEADER_BYTES;
      pos = start + length;
      try {
        messages.push(decodeBody(data, start, pos));
      } catch (err) {
        throw new FrameError(`undecodable frame: ${(err as Error).message}`);
      }
    }
    const rest = data.subarray(pos);
    this.chunks = rest.length > 0 ? [rest] : [];
    this.buffered = rest.length;
    this.need = rest.length >= HEADER_BYTES ? HEADER_BYTES + rest.readUInt32BE(0) : HEADER_BYTES;
    return messages;
  }
}
