/**
 * The SDK's typed errors: one class per kind of failure, each carrying `.code` (the wire
 * error code) and `.details` (the ERROR frame's details map, or `{}`).
 *
 * `errorFor(code, message, details)` is the single place where a wire error code becomes
 * an error object, so every call site throws the same class for the same code. A code
 * this SDK does not know becomes a plain `RunstateError` carrying that code. Which class
 * a code becomes is `ERROR_CLASSES` (sdkrules.ts, generated from rsproto/sdkrules.py),
 * the table the Python SDK follows too.
 */

import { ERROR_CLASSES } from './sdkrules.js';

export type Details = Record<string, unknown>;

export class RunstateError extends Error {
  static readonly defaultCode: string = 'INTERNAL';
  readonly code: string;
  readonly details: Details;

  constructor(message: string, code?: string, details?: Details | null) {
    const ctor = new.target as unknown as { defaultCode: string };
    const resolved = code ?? ctor.defaultCode;
    super(`${resolved}: ${message}`);
    this.name = new.target.name;
    this.code = resolved;
    this.details = details ?? {};
  }
}

/** CLAIM_HELD (someone else owns the key), IDEMPOTENCY_CONFLICT, POOL_FULL (no free slot,
 * not waiting) or QUOTA_EXHAUSTED (not enough budget, not waiting). */
export class ConflictError extends RunstateError {
  static override readonly defaultCode: string = 'CLAIM_HELD';
}

/** STALE_CLAIM: the lease ended (expired, released, taken over) before this call. */
export class LeaseLostError extends RunstateError {
  static override readonly defaultCode: string = 'STALE_CLAIM';
}

/** A wait ran out of time (WAIT_TIMEOUT), on the server or by the SDK's own timer. */
export class WaitTimeoutError extends RunstateError {
  static override readonly defaultCode: string = 'WAIT_TIMEOUT';
}

export class ScopeCancelledError extends RunstateError {
  static override readonly defaultCode: string = 'SCOPE_CANCELLED';
}

export class NotFoundError extends RunstateError {
  static override readonly defaultCode: string = 'NOT_FOUND';
}

export class InvalidArgumentError extends RunstateError {
  static override readonly defaultCode: string = 'INVALID_ARGUMENT';
}

/** UNAUTHENTICATED: the HELLO token is missing or wrong. Final: not retried. */
export class AuthenticationError extends RunstateError {
  static override readonly defaultCode: string = 'UNAUTHENTICATED';
}

/** PERMISSION_DENIED: an admin-only op sent with a client token. */
export class PermissionDeniedError extends RunstateError {
  static override readonly defaultCode: string = 'PERMISSION_DENIED';
}

/** The server could not be reached, or the connection dropped before the answer; or
 * (code NOT_PRIMARY) a cluster node that is not the primary answered and the client
 * could not follow it: `details` `{ primary: 'HOST:PORT' | null, epoch: N }`. */
export class UnavailableError extends RunstateError {
  static override readonly defaultCode: string = 'UNAVAILABLE';
}

/** An UnavailableError for a request whose connection was lost before its answer: it
 * may or may not have been executed (failover.ts decides what is sent again). Its name
 * is UnavailableError's. */
export class LostConnection extends UnavailableError {
  constructor(message: string) {
    super(message, 'UNAVAILABLE');
    this.name = 'UnavailableError';
  }
}

/** An UnavailableError for a request answered NOT_PRIMARY: its node is not the primary
 * and did not execute it (code NOT_PRIMARY, the answer's details); sent again to the
 * primary (failover.ts). A connect that gives up is never this, whatever its code. */
export class NotExecuted extends UnavailableError {
  constructor(message: string, details: Details | null) {
    super(message, 'NOT_PRIMARY', details);
    this.name = 'UnavailableError';
  }
}

/** A wait the caller abandoned through its `signal`; the wait was withdrawn. */
export class CancelledError extends RunstateError {
  static override readonly defaultCode: string = 'CANCELLED';
}

type ErrorClass = new (message: string, code?: string, details?: Details | null) => RunstateError;

/** The classes by name, for the table of sdkrules.ts. */
const CLASSES: Record<string, ErrorClass> = {
  RunstateError,
  ConflictError,
  LeaseLostError,
  WaitTimeoutError,
  ScopeCancelledError,
  NotFoundError,
  InvalidArgumentError,
  AuthenticationError,
  PermissionDeniedError,
  UnavailableError,
  CancelledError,
};

const BY_CODE: Record<string, ErrorClass> = Object.fromEntries(
  Object.entries(ERROR_CLASSES).map(([code, name]) => [code, CLASSES[name] ?? RunstateError]),
);

export function errorFor(code: string, message: string, details?: Details | null): RunstateError {
  const cls = BY_CODE[code] ?? RunstateError;
  return new cls(message, code, details);
}
