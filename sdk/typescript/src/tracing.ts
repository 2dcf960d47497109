/**
 * OpenTelemetry spans and the W3C trace context, from a task's submit to its handler (the
 * twin of rsclient/tracing.py).
 *
 * With `@opentelemetry/api` installed (an optional peer dependency) and a tracer provider
 * registered (or given as `new Runstate({ tracerProvider })`), `submit` (and
 * `submitMany`, `send`) runs in a `submit` span (client kind) and puts that span's context
 * in the request's `trace` (`traceparent`, and `tracestate` if any); rsd keeps it with the
 * task and gives it back with each delivery (protocol.md, "Trace context"); `consume()`
 * runs the handler in a `handle` span (consumer kind) whose parent is that context, the
 * span active while the handler runs (given a context manager); a delivery's `complete`
 * (`retry`, `reject`) runs in a span of that name, under the `handle` span in consume().
 *
 * What always holds: without the package, or with it and no provider, the task path makes
 * no call here: a client's `session.spans` is null (decided once, when the client is
 * made), and each path tests only that. The package is loaded then (synchronously, by
 * `createRequire`: a constructor cannot await an `import()`), never by importing rsclient,
 * and only if a provider is given or one was registered (its global state, one per
 * process whichever copy, ESM or CommonJS, registered it, says so).
 */

import { createRequire } from 'node:module';

/** What rsclient uses of `@opentelemetry/api`'s TracerProvider (a structural type, so
 * that rsclient's types need no OpenTelemetry package). */
export interface TracerProviderLike {
  getTracer(name: string, version?: string): unknown;
}

type Api = typeof import('@opentelemetry/api');
type Tracer = import('@opentelemetry/api').Tracer;
type Span = import('@opentelemetry/api').Span;
type Context = import('@opentelemetry/api').Context;
type TextMapPropagator = import('@opentelemetry/api').TextMapPropagator;
type TextMapSetter = import('@opentelemetry/api').TextMapSetter;
type TextMapGetter = import('@opentelemetry/api').TextMapGetter;
type SpanContext = import('@opentelemetry/api').SpanContext;

/** The W3C trace context of a request's `trace` and a delivery's. */
export interface TraceContext {
  traceparent: string;
  tracestate?: string;
}

/** rsclient's spans (the session's `spans`: null when tracing is off). */
export interface Spans {
  submitted<R>(scope: string, mailbox: string, args: Record<string, unknown>, send: () => Promise<R>): Promise<R>;
  handled<R>(delivery: Traceable, handle: () => Promise<R>): Promise<R>;
  settled<R>(name: string, settle: () => Promise<R>, delivery: object): Promise<R>;
}

/** What a `handle` span says of a delivery. */
interface Traceable {
  trace: TraceContext | null;
  mailbox: string;
  id: string;
  scopeId: string;
  attempt: number;
}

/** rsclient's spans, made by one OpenTelemetry tracer (not exported: its types are the
 * API package's, which rsclient's declarations must not need). */
class OtelSpans implements Spans {
  /** The context of each delivery's `handle` span, for its settlement's span. */
  private readonly handling = new WeakMap<object, Context>();

  constructor(
    private readonly tracer: Tracer,
    private readonly api: Api,
  ) {}

  /** `send()` (the request made of `args`) in a `submit` span, its context put in
   * `args.trace` (or, with `items`, in each item's); the answer's `id` set on the span. */
  async submitted<R>(
    scope: string,
    mailbox: string,
    args: Record<string, unknown>,
    send: () => Promise<R>,
  ): Promise<R> {
    const api = this.api;
    const span = this.tracer.startSpan(
      'submit',
      {
        kind: api.SpanKind.CLIENT,
        attributes: {
          'messaging.system': 'rsd',
          'messaging.destination.name': mailbox,
          'rsd.scope': scope,
        },
      },
      api.context.active(),
    );
    const carrier: Record<string, string> = {};
    W3C(api).inject(api.trace.setSpan(api.context.active(), span), carrier, api.defaultTextMapSetter);
    if (carrier['traceparent'] !== undefined) {
      const trace: TraceContext = { traceparent: carrier['traceparent'] };
      if (carrier['tracestate'] !== undefined) trace.tracestate = carrier['tracestate'];
      const items = args['items'] as Array<Record<string, unknown>> | undefined;
      if (items === undefined) args['trace'] = trace;
      else for (const item of items) item['trace'] ??= trace;
    }
    return this.ended(span, async () => {
      const reply = await send();
      const id = (reply as { id?: unknown } | null)?.id;
      if (typeof id === 'string') span.setAttribute('messaging.message.id', id);
      return reply;
    });
  }

  /** `handle()` (the handler and the settlement of a delivery) in a `handle` span, a
   * child of the submitter's span when the delivery carries its trace. */
  handled<R>(
    delivery: Traceable,
    handle: () => Promise<R>,
  ): Promise<R> {
    const api = this.api;
    let parent: Context = api.ROOT_CONTEXT;
    if (delivery.trace !== null) {
      parent = W3C(api).extract(api.ROOT_CONTEXT, delivery.trace, api.defaultTextMapGetter);
    }
    const span = this.tracer.startSpan(
      'handle',
      {
        kind: api.SpanKind.CONSUMER,
        attributes: {
          'messaging.system': 'rsd',
          'messaging.destination.name': delivery.mailbox,
          'messaging.message.id': delivery.id,
          'rsd.scope': delivery.scopeId,
          'rsd.attempt': delivery.attempt,
        },
      },
      parent,
    );
    const context = api.trace.setSpan(parent, span);
    this.handling.set(delivery, context);
    return api.context.with(context, () => this.ended(span, handle));
  }

  /** `settle()` of `delivery` in a span named `name` (`complete`, `retry`, `reject`), a
   * child of its `handle` span if consume() handles it (whether or not the process
   * registered a context manager), else of the active one. */
  settled<R>(name: string, settle: () => Promise<R>, delivery: object): Promise<R> {
    const context = this.handling.get(delivery) ?? this.api.context.active();
    const span = this.tracer.startSpan(name, {}, context);
    return this.ended(span, settle);
  }

  private async ended<R>(span: Span, work: () => Promise<R>): Promise<R> {
    try {
      return await work();
    } catch (error) {
      span.recordException(error instanceof Error ? error : String(error));
      span.setStatus({ code: this.api.SpanStatusCode.ERROR });
      throw error;
    } finally {
      span.end();
    }
  }
}

let w3c: TextMapPropagator | null = null;

/** The W3C trace-context propagator (traceparent, tracestate), whatever propagator the
 * process registered: rsd's `trace` holds exactly those two fields. */
function W3C(api: Api): TextMapPropagator {
  if (w3c === null) w3c = new TraceContextPropagator(api);
  return w3c;
}

const VERSION = '00';
const TRACEPARENT = /^([\da-f]{2})-([\da-f]{32})-([\da-f]{16})-([\da-f]{2})(-.*)?$/;

/** W3C trace context, written and read as the spec says (the API package has no
 * propagator of its own; `@opentelemetry/core`'s would be one dependency more). */
class TraceContextPropagator implements TextMapPropagator {
  constructor(private readonly api: Api) {}

  inject(context: Context, carrier: unknown, setter: TextMapSetter): void {
    const span = this.api.trace.getSpanContext(context);
    if (!span || !this.api.isSpanContextValid(span)) return;
    const flags = (span.traceFlags & 0xff).toString(16).padStart(2, '0');
    setter.set(carrier, 'traceparent', `${VERSION}-${span.traceId}-${span.spanId}-${flags}`);
    const state = span.traceState?.serialize();
    if (state) setter.set(carrier, 'tracestate', state);
  }

  extract(context: Context, carrier: unknown, getter: TextMapGetter): Context {
    const header = getter.get(carrier, 'traceparent');
    const parent = Array.isArray(header) ? header[0] : header;
    const match = parent === undefined ? null : TRACEPARENT.exec(parent.trim());
    if (match === null || match[1] === 'ff' || (match[1] === VERSION && match[5] !== undefined)) {
      return context;
    }
    const spanContext: SpanContext = {
      traceId: match[2] as string,
      spanId: match[3] as string,
      traceFlags: parseInt(match[4] as string, 16),
      isRemote: true,
    };
    if (!this.api.isSpanContextValid(spanContext)) return context;
    const state = getter.get(carrier, 'tracestate');
    const stateText = Array.isArray(state) ? state.join(',') : state;
    if (stateText) spanContext.traceState = this.api.createTraceState(stateText);
    return this.api.trace.setSpanContext(context, spanContext);
  }

  fields(): string[] {
    return ['traceparent', 'tracestate'];
  }
}

const GLOBAL = Symbol.for('opentelemetry.js.api.1');

/** The API, loaded once (null: not installed). */
let loaded: Api | null | undefined;

function api(): Api | null {
  if (loaded === undefined) {
    try {
      loaded = createRequire(import.meta.url)('@opentelemetry/api') as Api;
    } catch {
      loaded = null; // not installed: no spans
    }
  }
  return loaded;
}

/** rsclient's spans: made by `provider`'s tracer if given, else by the registered
 * global provider's if one is; null when `@opentelemetry/api` is not installed or no
 * provider is (the task path then makes no call here). */
export function spansFor(provider?: TracerProviderLike | null): Spans | null {
  if (provider == null) {
    // Where the API keeps what was registered (its version 1's key): nothing there, no
    // provider, and the package is not even loaded.
    const registered = (globalThis as Record<symbol, { trace?: unknown } | undefined>)[GLOBAL];
    if (registered?.trace === undefined) return null;
  }
  const otel = api();
  if (otel === null) return null;
  let chosen = provider ?? null;
  if (chosen === null) {
    const global = otel.trace.getTracerProvider() as TracerProviderLike & { getDelegate?: () => object };
    const delegate = global.getDelegate === undefined ? global : global.getDelegate();
    // The API's NoopTracerProvider (what the proxy stands for until one is registered) is
    // not exported: known by its name.
    if (delegate.constructor.name === 'NoopTracerProvider') return null;
    chosen = global;
  }
  return new OtelSpans(chosen.getTracer('rsclient') as Tracer, otel);
}
