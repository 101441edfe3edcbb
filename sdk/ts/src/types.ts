// The wire types of the HTTP API (CONTRACT §3, §5, §6). Every field the
// contract adds later comes through as it is; fields marked optional are
// those the server omits when empty.

import type { Phase } from "./phase.js";

/** Whether a sandbox holds a retained state, and whether it was consumed. */
export interface Restore {
  held: boolean;
  consumed: boolean;
  /** What a held state keeps, in bytes, where the driver says. */
  bytes?: number;
  /** RFC 3339: when the held state's retention ends; omitted when kept for ever. */
  expires_at?: string;
  /** The reference of the state held (the suspension's restore_ref); omitted when none. */
  restore_ref?: string;
  /** The held state was exported ahead: a resume on another node only fetches it (issue 29). */
  movable?: boolean;
  /** The size of the exported state, in bytes, once movable. */
  movable_bytes?: number;
}

/** One open TCP forward: from `address` on torpor's host to `port` of the sandbox. */
export interface Forward {
  id: string;
  listen: string;
  address: string;
  port: number;
}

/**
 * The outcome of the last suspend or resume (CONTRACT §6): "" when none.
 * Open, as phases are.
 */
export type Outcome =
  | ""
  | "restored"
  | "cold_start_fallback"
  | "restore_failed"
  | "suspend_rejected"
  | "suspend_timed_out"
  | (string & {});

/** Why the phase is what it is (CONTRACT §6): "" when nothing to say. Open. */
export type Reason =
  | ""
  | "MainProcessExited"
  | "RetainedStateLost"
  | "SuspendRejected"
  | "DeadlineExceeded"
  | "ComputeResourceMissing"
  | "StartFailed"
  | "Expired"
  | "CannotRestore"
  | (string & {});

/** The phase view of one sandbox (CONTRACT §6). */
export interface View {
  id: string;
  name: string;
  phase: Phase;
  generation: number;
  driver: string;
  node: string;
  /** null when the sandbox has none. */
  labels: Record<string, string> | null;
  restore: Restore;
  last_outcome: Outcome;
  /** The exit code of the workload's main process, once it exited; else null. */
  exit_code: number | null;
  reason: Reason;
  /** RFC 3339. */
  updated_at: string;
  /** The stream sequence of the last event folded in: a view never goes back in seq. */
  seq: number;
  /** The forwards open to the sandbox, in the order opened; omitted when none. */
  forwards?: Forward[];
  /**
   * RFC 3339: the time of the sandbox's latest activity (a command's event,
   * a touch, bytes through a forward); omitted when there was none.
   */
  last_active_at?: string;
  /**
   * In a command's answer only: the command met a twin already in flight,
   * appended nothing, and the command with this id decides the outcome.
   */
  joined?: string;
  /**
   * RFC 3339: the sandbox's time to live; omitted when none. With
   * ttl_pauses_while_suspended it is the effective expiry, moved later by
   * each stay in suspended; while expiry_paused it is the value it had on
   * entering suspended (the stay is added when it ends).
   */
  expires_at?: string;
  /** What its expiry does: "delete" or "stop"; omitted when no ttl. */
  on_expiry?: string;
  /** Time spent suspended is not counted against its ttl (create's); omitted when false. */
  ttl_pauses_while_suspended?: boolean;
  /** Set while suspended with ttl_pauses_while_suspended: the ttl is paused. */
  expiry_paused?: boolean;
  /** How long a retained state is held from its suspension (a Go duration); omitted when for ever. */
  retain_for?: string;
  /** A connection to one of its forwards while suspended resumes it (create's wake_on_traffic); omitted when false. */
  wake_on_traffic?: boolean;
  /** Its idle policy (create's idle, or the server's --idle-after); omitted when none. */
  idle?: IdlePolicy;
}

/** The body of create (CONTRACT §5). */
export interface CreateRequest {
  /** 1–63 of a-z 0-9 . _ -, alphanumeric at both ends; default sbx-<last 12 hex of the id>. */
  name?: string;
  /** sim, process, vm; the server's default when omitted. */
  driver?: string;
  driver_options?: Record<string, string>;
  command?: string[];
  env?: Record<string, string>;
  labels?: Record<string, string>;
  /** The service's own node (the default) or one of serve --remote-nodes. */
  node?: string;
  /** A time to live (a Go duration, "2h"), or expires_at (RFC 3339): not both. */
  ttl?: string;
  expires_at?: string;
  /** "delete" (the default) or "stop", at the expiry. */
  on_expiry?: string;
  /** Time spent suspended moves the expiry later (needs ttl or expires_at). */
  ttl_pauses_while_suspended?: boolean;
  /** How long a retained state is held from its suspension; the server's --retain-for when omitted. */
  retain_for?: string;
  /** A connection to one of its forwards while it is suspended resumes it (README "Wake on traffic"). */
  wake_on_traffic?: boolean;
  /** Its idle policy (README "Idle and wake"); the server's default when omitted. */
  idle?: IdlePolicy;
}

/**
 * An idle policy (README "Idle and wake"): once ready with no activity for
 * `after`, the sandbox is suspended (or stopped) through a
 * sandbox.idle_timeout event.
 */
export interface IdlePolicy {
  /** A Go duration ("15m"), longer than the server's activity window: required. */
  after: string;
  /** "suspend" (the default) or "stop". */
  action?: string;
  /** For a driver that cannot suspend: "none" (the default: left running) or "stop". */
  fallback?: string;
}

/** One page of a list, in creation order (or the order `sort` asked). */
export interface Page {
  items: View[];
  /** The opaque cursor of the next page; "" (or absent) at the end. */
  next?: string;
  /** How many sandboxes match the filters, where the server says. */
  total?: number;
}

/** One event of a sandbox's audit history (CONTRACT §3). */
export interface HistoryEvent {
  seq: number;
  /** A stable event type name: sandbox.created, sandbox.suspended, … */
  type: string;
  /** RFC 3339. */
  time: string;
  /** token:<name>, http:<addr>, bus, sagas, supervisor:<gen>, gateway:heartbeats. */
  actor: string;
  command_id: string;
  /** The phase after the event. */
  phase?: Phase;
  data: unknown;
  id?: string;
  correlation_id?: string;
  causation_id?: string;
}

/** What a driver can do. */
export interface DriverCapabilities {
  suspend: boolean;
  resume_on_another_node: boolean;
  /** What a suspension keeps ("the process group, frozen"). */
  retains?: string;
  /** Whether the view shows what a held state keeps (restore.bytes). */
  retained_size?: boolean;
}

/** One driver the server runs. */
export interface Driver {
  name: string;
  capabilities: DriverCapabilities;
}

/** What a server says of itself (GET /v1/server). */
export interface ServerInfo {
  /** serve --node. */
  node: string;
  /** serve --deadline: how long a transient phase may last. */
  deadline_seconds: number;
  /** The view reads come from: "kv" or "sql". */
  read_from: string;
}

/** A token's scope: admin holds every scope. Open. */
export type Scope = "read" | "write" | "admin" | (string & {});

/**
 * Whose token a request came with, and what it may do (GET /v1/whoami). A
 * server without authentication (serve --no-auth) answers every scope and
 * no name.
 */
export interface WhoAmI {
  name: string;
  scopes: Scope[];
}

/** The body of a token's creation. */
export interface TokenRequest {
  name: string;
  scopes: Scope[];
  /** How long it lasts ("720h", "30d"); none: it does not expire. */
  expires?: string;
}

/** A token as the server tells of it: never its secret. */
export interface TokenInfo {
  name: string;
  scopes: Scope[];
  created_at: string;
  expires_at?: string;
  created_by?: string;
}

/** A new token: its secret is in `token`, shown this once. */
export interface NewToken extends TokenInfo {
  token: string;
}

/** One line of a replay's progress (POST /v1/replay). */
export interface ReplayProgress {
  view: string;
  /** fold, write, catchup, swap; last done or failed. */
  phase: string;
  done?: number;
  total?: number;
  /** done: the log's seq the view was rebuilt to, and where it is. */
  seq?: number;
  target?: string;
  events?: number;
  elapsed_ms?: number;
  /** failed: why. */
  error?: { code: string; message: string };
}
