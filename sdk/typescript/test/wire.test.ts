/**
 * The codec against protocol.md: the worked example's frames encode to the document's
 * bytes and decode to its values; integers are never rounded; handles of any form
 * survive a round trip; a broken stream is refused.
 */

import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { describe, test } from 'node:test';

import { FrameDecoder, FrameError, MAX_FRAME_BYTES, decode, encode, handleText, requestFrame } from '../src/wire.js';
import { REPO } from './support.js';

function hexBlocks(): Buffer[] {
  const doc = readFileSync(path.join(REPO, 'protocol.md'), 'utf8');
  const blocks = [...doc.matchAll(/```hex\n([\s\S]*?)```/g)].map((m) => m[1]!);
  return blocks.map((block) => Buffer.from(block.replace(/\s+/g, ''), 'hex'));
}

describe('wire', () => {
  test("the worked example's requests encode to protocol.md's bytes, and its frames decode", () => {
    const blocks = hexBlocks();
    assert.ok(blocks.length >= 8, 'the worked example has its hex blocks');
    const hello = requestFrame(1, 1, { version: 1, holder: 'worker-1', client: 'example/1.0', token: null });
    assert.deepEqual(hello, blocks[0]);
    const acquire = requestFrame(2, 20, { scope: 'run-42', key: 'company:acme', lease_seconds: 30 });
    assert.deepEqual(acquire, blocks[2]);
    for (const block of blocks) {
      const frames = new FrameDecoder().feed(block);
      assert.equal(frames.length, 1, 'each block is exactly one frame');
    }
    const [reply] = new FrameDecoder().feed(blocks[1]!) as Array<[number, number, Record<string, unknown>]>;
    assert.equal(reply![2]['time'], 1767225600.5);
    assert.equal((reply![2]['limits'] as Record<string, number>)['max_frame_bytes'], MAX_FRAME_BYTES);
  });

  test('frames split across any reads and joined in one read decode the same', () => {
    const frames = Buffer.concat(hexBlocks());
    const whole = new FrameDecoder().feed(frames);
    const decoder = new FrameDecoder();
    const pieces: unknown[] = [];
    for (let i = 0; i < frames.length; i += 1) pieces.push(...decoder.feed(frames.subarray(i, i + 1)));
    assert.deepEqual(pieces, whole);
  });

  test('integers beyond 2^53 decode as exact bigints and encode back unchanged; smaller ones are numbers', () => {
    const big = (1n << 63n) + 12345n;
    assert.equal(decode(encode(big)), big);
    assert.equal(decode(encode(-(1n << 62n) - 1n)), -(1n << 62n) - 1n);
    assert.equal(decode(encode(2 ** 40)), 2 ** 40);
    assert.equal(typeof decode(encode(2 ** 40)), 'number');
    assert.equal(decode(encode(Number.MAX_SAFE_INTEGER)), Number.MAX_SAFE_INTEGER);
    assert.throws(() => encode(1n << 64n));
  });

  test('a 16-byte handle stays bytes, and its token is its hex; an integer handle is its decimal', () => {
    const handle = Uint8Array.from({ length: 16 }, (_, i) => i * 16 + 1);
    const back = decode(encode({ lease: handle })) as { lease: Uint8Array };
    assert.ok(back.lease instanceof Uint8Array);
    assert.deepEqual([...back.lease], [...handle]);
    assert.equal(handleText(back.lease), '01112131415161718191a1b1c1d1e1f1');
    assert.equal(handleText(42), '42');
    assert.equal(handleText(1n << 60n), String(1n << 60n));
  });

  test('payload maps with non-string keys decode without breaking the stream', () => {
    // {true: 1, nil: 2} as msgpack: 82 c3 01 c0 02
    assert.deepEqual(decode(Buffer.from('82c301c002', 'hex')), { true: 1, null: 2 });
  });

  test('an oversized length or undecodable body is a FrameError; requests over the limit are refused', () => {
    const header = Buffer.alloc(4);
    header.writeUInt32BE(MAX_FRAME_BYTES + 1);
    assert.throws(() => new FrameDecoder().feed(header), FrameError);
    assert.throws(() => new FrameDecoder().feed(Buffer.from('00000002c1c1', 'hex')), FrameError);
    assert.throws(() => requestFrame(1, 2, { data: 'x'.repeat(MAX_FRAME_BYTES) }), FrameError);
    // No UTF-8 form: refused here rather than sent (rsd would close the connection).
    assert.throws(() => requestFrame(1, 20, { key: 'a\ud800b' }), FrameError);
    assert.throws(() => requestFrame(1, 31, { data: { ['k\udc00']: 1 } }), FrameError);
    assert.throws(() => requestFrame(1, 31, { data: 'x'.repeat(300) + '\ud800' }), FrameError);
  });
});
