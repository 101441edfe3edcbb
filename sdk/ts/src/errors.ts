// Errors with the contract's codes (CONTRACT §2): one set of codes for bus
// replies, HTTP, the CLI and every SDK.

import type { View } from "./types.js";

/** The contract's error codes, by name. */
export const Codes = {
  InvalidArgument: "INVALID_ARGUMENT",
  Unauthenticated: "UNAUTHENTICATED",
  PermissionDenied: "PERMISSION_DENIED",
  NotFound: "NOT_FOUND",
  FailedPrecondition: "FAILED_PRECONDITION",
  Aborted: "ABORTED",
  ResourceExhausted: "RESOURCE_EXHAUSTED",
  AlreadyExists: "ALREADY_EXISTS",
  Unimplemented: "UNIMPLEMENTED",
  Unavailable: "UNAVAILABLE",
  DeadlineExceeded: "DEADLINE_EXCEEDED",
  Internal: "INTERNAL",
} as const;

/** A code this SDK knows. */
export type KnownCode = (typeof Codes)[keyof typeof Codes];

/**
 * A contract error code. The set is open: a server newer than this SDK may
 * answer a code not listed, which comes through as its string.
 */
export type Code = KnownCode | (string & {});

/**
 * The error of every call that the server (or the SDK on its behalf)
 * answers with a contract code: `code` is the code, `status` the HTTP
 * status of the answer (0 when there was no answer), `message` the
 * server's message.
 */
export class TorporError extends Error {
  readonly code: Code;
  readonly status: number;
  /**
   * The view the answer carried beside its error: a command sent with
   * `wait` whose outcome was not in the view by its timeout
   * (DEADLINE_EXCEEDED) says where the sandbox is; unset otherwise.
   */
  view?: View;

  constructor(code: Code, message: string, status = 0, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "TorporError";
    this.code = code;
    this.status = status;
  }
}

/** INVALID_ARGUMENT (400): the request is malformed. */
export class InvalidArgumentError extends TorporError {}
/** UNAUTHENTICATED (401): no token, or one the server does not know. */
export class UnauthenticatedError extends TorporError {}
/** PERMISSION_DENIED (403): the token lacks the scope the call wants. */
export class PermissionDeniedError extends TorporError {}
/** NOT_FOUND (404): no such sandbox (or route, forward, token). */
export class NotFoundError extends TorporError {}
/** FAILED_PRECONDITION (409): the sandbox is in the wrong phase. */
export class FailedPreconditionError extends TorporError {}
/** ABORTED (409): a concurrent change; safe to retry. */
export class AbortedError extends TorporError {}
/** RESOURCE_EXHAUSTED (429): past a rate or a limit. */
export class ResourceExhaustedError extends TorporError {}
/** ALREADY_EXISTS (409): a name in use. */
export class AlreadyExistsError extends TorporError {}
/** UNIMPLEMENTED (501): the driver lacks the capability. */
export class UnimplementedError extends TorporError {}
/** UNAVAILABLE (503, or no answer at all): retrying may succeed. */
export class UnavailableError extends TorporError {}
/** DEADLINE_EXCEEDED (504): a wait or a call ran out of time. */
export class DeadlineExceededError extends TorporError {}
/** INTERNAL (500), or an answer without a code. */
export class InternalError extends TorporError {}

const classes: Record<KnownCode, typeof TorporError> = {
  INVALID_ARGUMENT: InvalidArgumentError,
  UNAUTHENTICATED: UnauthenticatedError,
  PERMISSION_DENIED: PermissionDeniedError,
  NOT_FOUND: NotFoundError,
  FAILED_PRECONDITION: FailedPreconditionError,
  ABORTED: AbortedError,
  RESOURCE_EXHAUSTED: ResourceExhaustedError,
  ALREADY_EXISTS: AlreadyExistsError,
  UNIMPLEMENTED: UnimplementedError,
  UNAVAILABLE: UnavailableError,
  DEADLINE_EXCEEDED: DeadlineExceededError,
  INTERNAL: InternalError,
};

/**
 * torporError is the error of code: an instance of the code's class (a
 * TorporError all the same), or of TorporError for a code this SDK does
 * not know.
 */
export function torporError(code: Code, message: string, status = 0, cause?: unknown): TorporError {
  const C = Object.prototype.hasOwnProperty.call(classes, code) ? classes[code as KnownCode] : TorporError;
  const err = new C(code, message, status, cause === undefined ? undefined : { cause });
  err.name = C === TorporError ? "TorporError" : C.name;
  return err;
}

/** isCode reports whether err is a TorporError carrying code. */
export function isCode(err: unknown, code: Code): err is TorporError {
  return err instanceof TorporError && err.code === code;
}

/** codeOf is the contract code of err: INTERNAL for an error that carries none. */
export function codeOf(err: unknown): Code {
  return err instanceof TorporError ? err.code : Codes.Internal;
}

/** The HTTP status of each code (CONTRACT §2), for answers without a body. */
const byStatus: Record<number, KnownCode> = {
  400: Codes.InvalidArgument,
  401: Codes.Unauthenticated,
  403: Codes.PermissionDenied,
  404: Codes.NotFound,
  429: Codes.ResourceExhausted,
  501: Codes.Unimplemented,
  502: Codes.Unavailable,
  503: Codes.Unavailable,
  504: Codes.DeadlineExceeded,
};

/**
 * answerError is the error of an answer with a status of 300 or more: the
 * contract error of its body, or, for a body without one (a proxy's
 * page), the code of its status (409 and the rest: INTERNAL, since 409 is
 * three codes).
 */
export function answerError(what: string, status: number, statusText: string, body: string): TorporError {
  try {
    const parsed = JSON.parse(body) as { error?: { code?: unknown; message?: unknown }; view?: unknown };
    const e = parsed?.error;
    if (e && typeof e.code === "string" && e.code !== "") {
      const err = torporError(e.code, typeof e.message === "string" ? e.message : e.code, status);
      if (parsed.view && typeof parsed.view === "object") {
        err.view = parsed.view as View;
      }
      return err;
    }
  } catch {
    // Not JSON: the status decides.
  }
  const code = byStatus[status] ?? Codes.Internal;
  return torporError(code, `${what}: ${status} ${statusText}`.trim(), status);
}

/**
 * retryable reports whether a call that failed with err is worth sending
 * again (with the same idempotency key for a command): the server could
 * not be reached, or answered UNAVAILABLE or ABORTED (a concurrent change).
 */
export function retryable(err: unknown): boolean {
  const code = codeOf(err);
  return code === Codes.Unavailable || code === Codes.Aborted;
}
