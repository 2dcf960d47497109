/**
 * The SERVER_STATS result, typed after protocol.md ("SERVER_STATS (4)"). Informational:
 * the server may add, drop or redefine counters in any release, so every field here may
 * be absent from a given server's answer and code must not depend on them for
 * correctness. Field names are as on the wire.
 */

import type { TaskState } from './tasks.js';

/** Sizes of the server's tables, each a counter. */
export interface CoreCounts {
  scopes: number;
  claims: number;
  leases: number;
  items: number;
  mailboxes: number;
  queues: number;
  waits: number;
  timers: number;
  pools: number;
  quotas: number;
  tenants: number;
}

export interface JournalStats {
  fsync: 'always' | 'everysec' | 'no';
  segment: number;
  bytes_since_snapshot: number;
  snapshot_running: boolean;
  writes: number;
  fsyncs: number;
  records: number;
  snapshots: number;
  last_fork_ms: number;
}

export interface AuthStats {
  required: boolean;
  entries: number;
  failures: number;
  rate_limited: number;
  limited_peers: number;
  reloads: number;
  reload_failures: number;
}

export interface LoopStats {
  stalls: number;
  longest_stall_ms: number;
  unfinished_frames: number;
}

export interface OpCounts {
  ok: number;
  deferred: number;
  errors: number;
}

export interface QueueDepth {
  tenant: string;
  mailbox: string;
  ready: number;
  running: number;
}

export interface FsyncTimes {
  count: number;
  last: number | null;
  p50: number | null;
  p99: number | null;
}

export interface ServerStats {
  server?: string;
  time?: number;
  connections?: number;
  core?: Partial<CoreCounts>;
  /** Null when the server keeps no journal. */
  journal?: Partial<JournalStats> | null;
  held_batches?: number;
  connections_refused?: number;
  max_connections?: number;
  max_connections_per_peer?: number;
  output_pauses?: number;
  client_buffer_bytes?: number;
  max_client_buffer_bytes?: number;
  client_buffer_evictions?: number;
  auth?: Partial<AuthStats>;
  tls?: boolean;
  loop?: Partial<LoopStats>;
  uptime_seconds?: number;
  ops_total?: number;
  /** By op name (`'CLAIM_ACQUIRE'`, ...; `'UNKNOWN'` for unknown op codes). */
  ops?: Record<string, OpCounts>;
  /** Error answers by error code. */
  errors?: Record<string, number>;
  leases_held?: number;
  tasks?: Partial<Record<TaskState, number>>;
  messages?: Partial<Record<TaskState, number>>;
  queue_depths?: { mailboxes: QueueDepth[]; omitted: number };
  journal_bytes?: number | null;
  last_snapshot_at?: number | null;
  last_snapshot_seconds?: number | null;
  fsync_ms?: FsyncTimes;
  /** Of a sharded cluster (`rs.admin.stats()`): each shard's primary's own counters, by
   * shard; the counters above are then their sum (`STATS_SUMMED`) or the first shard's. */
  shards?: Record<string, ServerStats>;
  /** Counters a newer server adds. */
  [extra: string]: unknown;
}
