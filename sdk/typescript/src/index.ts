/// <reference types="node" preserve="true" />
/**
 * rsclient: the TypeScript SDK for rsd.
 *
 *     import { Runstate } from 'rsclient';
 *
 *     const rs = new Runstate({ holder: 'researcher-1' });
 *     const run = await rs.scopes.create();
 *     const report = await run.claim('company:acme').run(research, { wait: true });
 *     await rs.close();
 *
 * The reference to Node's types (first line) is kept in the emitted index.d.ts: the declarations
 * name Node's types (`Buffer`, `node:tls`'s options), and a project whose tsconfig lists
 * no `types` (TypeScript 6 and later: `"types": []` by default) would otherwise not load
 * them and fail on the package's own files. @types/node is a peer dependency for that.
 */

export { Runstate, Scope, Scopes, Fence, DEFAULT_ADDRESS } from './client.js';
export type {
  RunstateOptions,
  ClaimOptions,
  ScopeCancelResult,
  ScopeStatus,
  CreateScopeOptions,
  FenceStatus,
} from './client.js';
export { Admin } from './admin.js';
export type {
  AdminClaim,
  AdminMailbox,
  AdminPool,
  AdminQueue,
  AdminScope,
  AdminTask,
  AdminTaskEntry,
  Cursor,
  Page,
  PageOptions,
  RequeueOptions,
  RequeueResult,
  ShardNamed,
  TaskFilter,
} from './admin.js';
export { TaskGroup } from './groups.js';
export type { GroupDone, GroupStatus, GroupWaitOptions, GroupWaitResult } from './groups.js';
export type {
  AuthStats,
  CoreCounts,
  FsyncTimes,
  JournalStats,
  LoopStats,
  OpCounts,
  QueueDepth,
  ServerStats,
} from './stats.js';
export { Claim } from './claims.js';
export type { AcquireOptions, TryAcquireResult, ClaimInfo } from './claims.js';
export { Lease, lossMargin } from './leases.js';
export { Delivery } from './deliveries.js';
export type { CompleteOptions, NextOptions, RetryOptions, SuspendOptions, TaskSignal } from './deliveries.js';
export { Mailbox, Mailboxes } from './mailboxes.js';
export type {
  DeadLetter,
  EnsureOptions,
  Instant,
  LinkOptions,
  KeyLimitOptions,
  MailboxInfo,
  OrderOptions,
  QueueInfo,
  ReceiveManyOptions,
  ReceiveOptions,
  SendOptions,
  SendResult,
  SubmitAndWaitOptions,
  SubmitItem,
  SubmitOptions,
} from './mailboxes.js';
export { Pool, Pools } from './pools.js';
export type { PoolEnsureOptions, PoolHolder, PoolInfo } from './pools.js';
export { Quota, Quotas } from './quotas.js';
export { Schedules } from './schedules.js';
export type { ScheduleEnsureOptions, ScheduleInfo, ScheduleListOptions } from './schedules.js';
export type { QuotaEnsureOptions, QuotaInfo, QuotaTaken, TakeOptions } from './quotas.js';
export { Ticket } from './tasks.js';
export type { TaskEvent } from './progress.js';
export type {
  ChildView, Needs, ResultOptions, SignalReply, TaskOutcome, TaskState, TaskView,
} from './tasks.js';
export type { ConsumeOptions, Handler } from './worker.js';
export type { TraceContext, TracerProviderLike } from './tracing.js';
export type { Logger } from './util.js';
export { SlotMap, hashTag, slotOf } from './slots.js';
export type { LeaseHandle } from './wire.js';
export {
  AuthenticationError,
  CancelledError,
  ConflictError,
  InvalidArgumentError,
  LeaseLostError,
  NotFoundError,
  PermissionDeniedError,
  RunstateError,
  ScopeCancelledError,
  UnavailableError,
  WaitTimeoutError,
  errorFor,
} from './errors.js';
