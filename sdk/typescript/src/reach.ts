/**
 * Reaching rsd: the address a user writes, and why an attempt to reach it failed, in
 * words. The one place where the messages of a connect that failed are built (the
 * Python SDK builds the same ones in `rsclient/connection.py`).
 *
 * What always holds:
 * - an address is `HOST:PORT`, `[v6]:PORT`, or `tls://` (TLS) or `tcp://` before either;
 *   any other scheme (`http://`, `rsd://`) is refused at construction, saying to drop it;
 * - a connect that gave up says `cannot reach rsd at HOST:PORT within N s: CAUSE`, the
 *   cause naming what failed (`connection refused (is rsd running there?)`, `timed
 *   out`, `name or service not known`, ...) and, where the failure looks like one,
 *   the likely mix-up: a plain client at a TLS port (its answer looked like TLS: rsd's
 *   TLS port sends a plain client a TLS alert), a TLS client at a plain port. A node
 *   that closed or reset the connection without a word (one that died) gets no hint;
 * - a HELLO refused because rsd is slowing down this address (an ERROR `UNAVAILABLE`
 *   whose details carry `retry_after_ms`) is an attempt to try again after that long,
 *   plus jitter, never more than `MAX_THROTTLE_PAUSE_MS`.
 */

import { InvalidArgumentError, type RunstateError } from './errors.js';
import { MAX_SLOWED_PAUSE_MS } from './sdkrules.js';

export const DEFAULT_PORT = 7420;
/** The longest pause a throttled HELLO waits before it is tried again. */
export const MAX_THROTTLE_PAUSE_MS = MAX_SLOWED_PAUSE_MS;

export interface Address {
  host: string;
  port: number;
  tls: boolean;
}

/** `HOST:PORT`, `[v6]:PORT` or `tls://HOST:PORT`; InvalidArgumentError otherwise. */
export function parseAddress(address: string): Address {
  let text = address.trim();
  let useTls = false;
  const scheme = /^([a-z][a-z0-9+.-]*):\/\//i.exec(text);
  if (scheme) {
    const name = scheme[1]!.toLowerCase();
    if (name !== 'tls' && name !== 'tcp') {
      throw new InvalidArgumentError(
        `address must be HOST:PORT, got '${address}' (drop the '${scheme[0]}')`,
      );
    }
    useTls = name === 'tls';
    text = text.slice(scheme[0].length);
  }
  const match = /^(?:\[([^\]]+)\]|([^:[\]/]+)):(\d{1,5})$/.exec(text);
  const port = match ? Number(match[3]) : NaN;
  if (!match || port < 1 || port > 65535) {
    throw new InvalidArgumentError(
      `address must be HOST:PORT (port 1-65535, default ${DEFAULT_PORT}), got '${address}'`,
    );
  }
  return { host: (match[1] ?? match[2])!, port, tls: useTls };
}

/** `HOST:PORT` as messages show it (`[v6]:PORT` for an IPv6 host). */
export function hostPort(address: Address): string {
  return `${address.host.includes(':') ? `[${address.host}]` : address.host}:${address.port}`;
}

/** One attempt to reach rsd failed: `why`, in words (no code prefix); for a throttled
 * HELLO, the pause rsd asked for; for a HELLO answered NOT_PRIMARY, that answer's
 * details. Connecting catches this alone and tries again. */
export class AttemptFailed extends Error {
  constructor(
    readonly why: string,
    readonly retryAfterMs: number | null = null,
    /** Cut short by the connect's own deadline: the last attempt often has little time
     * left, so an earlier attempt's cause says more. */
    readonly timedOut = false,
    /** The node is not the primary: `{ primary, epoch }` as it answered. */
    readonly notPrimary: Record<string, unknown> | null = null,
    /** The same on every attempt (an untrusted certificate): for a lone node, the
     * message to throw at once; a node of several is passed over. */
    readonly final: string | null = null,
  ) {
    super(why);
  }
}

/** The message of a connect that gave up within `timeoutMs` (UnavailableError adds
 * the `UNAVAILABLE: ` prefix). */
export function unreachable(address: Address, timeoutMs: number, why: string): string {
  return `cannot reach rsd at ${hostPort(address)} within ${timeoutMs / 1000} s: ${why}`;
}

/** The message of a connect to several nodes that gave up: the nodes given, how long it
 * tried, and why each node tried failed (its last cause, in the order they were first
 * tried, nodes a redirect named included). */
export function unreachableNodes(
  nodes: readonly Address[],
  causes: ReadonlyMap<string, string>,
  timeoutMs: number,
): string {
  const where = nodes.map(hostPort).join(', ');
  const why = [...causes].map(([node, cause]) => `${node}: ${cause}`).join('; ');
  return `cannot reach rsd's primary at ${where} within ${timeoutMs / 1000} s: ${why}`;
}

/** What a NOT_PRIMARY answer says, in words (no code prefix). */
export function notPrimaryWords(details: Readonly<Record<string, unknown>>): string {
  const primary = details['primary'];
  if (typeof primary === 'string' && primary !== '') {
    return `not the primary (it names ${primary} as the primary)`;
  }
  return 'not the primary, and it knows of none (an election may be in progress)';
}

const PLAIN_AT_TLS_PORT = '(is this a TLS port? connect with tls: true or a tls:// address)';
const TLS_AT_PLAIN_PORT = '(the server there does not speak TLS: is it a plain rsd port?)';

const WORDS: Record<string, string> = {
  ECONNREFUSED: 'connection refused (is rsd running there?)',
  ENOTFOUND: 'name or service not known',
  EAI_AGAIN: 'temporary failure in name resolution',
  ETIMEDOUT: 'timed out',
  ECONNRESET: 'connection reset by peer',
  EHOSTUNREACH: 'no route to host',
  ENETUNREACH: 'network is unreachable',
  EADDRNOTAVAIL: 'cannot assign the requested address',
};

/** Socket errors that mean a TLS client reached something that does not speak TLS. */
const NOT_TLS = /WRONG_VERSION_NUMBER|PACKET_LENGTH_TOO_LONG|HTTP_REQUEST|UNKNOWN_PROTOCOL|RECORD_LAYER_FAILURE/;

/** Whether `error` says the server's certificate cannot be trusted (the same on every
 * attempt: not worth retrying). */
export function isCertificateError(error: Error): boolean {
  const code = (error as NodeJS.ErrnoException).code ?? '';
  return /CERT|SELF_SIGNED|UNABLE_TO_VERIFY|UNABLE_TO_GET_ISSUER|ALTNAME/.test(code);
}

/** The message of a server certificate this client does not trust. */
export function untrusted(address: Address, error: Error): string {
  return `TLS: the certificate of rsd at ${hostPort(address)} cannot be trusted: ${error.message}`;
}

/** Why a socket could not be opened, in words, with the TLS mix-up hint if it fits. */
export function socketFailure(error: Error, useTls: boolean): string {
  const code = (error as NodeJS.ErrnoException).code ?? '';
  if (useTls && NOT_TLS.test(code)) {
    return `${code.replace(/^ERR_SSL_/, '').replace(/_/g, ' ').toLowerCase()} ${TLS_AT_PLAIN_PORT}`;
  }
  if (useTls && /before secure TLS connection/.test(error.message)) {
    return `the server closed the connection during the TLS handshake ${TLS_AT_PLAIN_PORT}`;
  }
  return WORDS[code] ?? (error.message || String(error));
}

/** Why a handshake (HELLO) failed when the server closed the connection: it answered
 * with TLS (a plain client at a TLS port), it reset the connection (`error`: a node that
 * died), or it closed without a word. */
export function handshakeLost(useTls: boolean, answeredTls: boolean, error: Error | null): string {
  if (answeredTls) return `the server answered with TLS ${PLAIN_AT_TLS_PORT}`;
  if (error !== null) return socketFailure(error, useTls);
  return 'the server closed the connection before answering the handshake';
}

/** Why a handshake got no answer in time (a paused or overloaded node: rsd answers even
 * a wrong token it slows down within half a second). */
export const HANDSHAKE_TIMED_OUT = 'timed out (no answer to the handshake)';

/** Whether the first bytes a plain connection got look like a TLS record (an alert or
 * a handshake of TLS 1.0 to 1.3). */
export function looksLikeTls(chunk: Buffer): boolean {
  return chunk.length >= 2 && (chunk[0] === 0x15 || chunk[0] === 0x16) && chunk[1] === 0x03;
}

/** The pause rsd asked for in a throttled HELLO's ERROR (`retry_after_ms`, an integer
 * of at least 1), or null if the error is not one. */
export function throttledFor(error: RunstateError): number | null {
  if (error.code !== 'UNAVAILABLE') return null;
  const value = error.details['retry_after_ms'];
  const ms = typeof value === 'bigint' ? Number(value) : value;
  return typeof ms === 'number' && Number.isInteger(ms) && ms >= 1 ? ms : null;
}

/** How long to wait before a throttled HELLO is tried again: what rsd asked, plus up
 * to a fifth more (at least 50 ms) of jitter, at most MAX_THROTTLE_PAUSE_MS. */
export function throttlePauseMs(retryAfterMs: number): number {
  const jitter = Math.random() * Math.max(50, retryAfterMs / 5);
  return Math.min(retryAfterMs + jitter, MAX_THROTTLE_PAUSE_MS);
}

/** Why a throttled attempt failed, in words. */
export function throttled(retryAfterMs: number): string {
  return (
    `rsd is slowing down connections from this address after failed logins ` +
    `(it asked to retry after ${retryAfterMs} ms)`
  );
}
