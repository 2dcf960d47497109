/**
 * Small shared pieces: the monotonic clock, the one backoff with jitter, the logger
 * interface, and UTF-8 clipping.
 *
 * What always holds: `Backoff.nextPauseMs()` is the current delay times a random factor
 * in [0.5, 1] (so clients that failed together do not retry together), and the delay
 * then doubles up to its ceiling; `now()` never goes back.
 */

import { performance } from 'node:perf_hooks';

/** Seconds on a monotonic clock. */
export function now(): number {
  return performance.now() / 1000;
}

export class Backoff {
  private delay: number;

  constructor(
    private readonly firstMs: number,
    private readonly ceilingMs: number,
  ) {
    this.delay = firstMs;
  }

  nextPauseMs(): number {
    const pause = this.delay * (0.5 + Math.random() * 0.5);
    this.delay = Math.min(this.delay * 2, this.ceilingMs);
    return pause;
  }

  sleep(): Promise<void> {
    return sleep(this.nextPauseMs());
  }

  reset(): void {
    this.delay = this.firstMs;
  }
}

export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Where the SDK reports what it cannot throw (a lost lease, a failed renewal). */
export interface Logger {
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

export const consoleLogger: Logger = {
  info: () => undefined,
  warn: (message) => console.warn(`rsclient: ${message}`),
  error: (message) => console.error(`rsclient: ${message}`),
};

/** `text` cut to at most `maxBytes` of UTF-8, never inside a character. */
export function clipUtf8(text: string, maxBytes: number): string {
  const bytes = Buffer.from(text, 'utf8');
  if (bytes.length <= maxBytes) return text;
  let end = maxBytes;
  while (end > 0 && (bytes[end]! & 0xc0) === 0x80) end -= 1;
  return bytes.subarray(0, end).toString('utf8');
}

export function utf8Length(text: string): number {
  return Buffer.byteLength(text, 'utf8');
}
