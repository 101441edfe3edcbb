// @torpor/sdk: the TypeScript client of torpor's HTTP API.

export { Client } from "./client.js";
export type {
  CallOptions,
  ClientOptions,
  CommandOptions,
  FetchLike,
  ForwardRequest,
  GetOptions,
  HistoryOptions,
  ListQuery,
  LogsOptions,
  ReplayRequest,
  ResumeOptions,
  WaitOptions,
  WatchOptions,
} from "./client.js";
export {
  AbortedError,
  AlreadyExistsError,
  Codes,
  DeadlineExceededError,
  FailedPreconditionError,
  InternalError,
  InvalidArgumentError,
  NotFoundError,
  PermissionDeniedError,
  ResourceExhaustedError,
  TorporError,
  UnauthenticatedError,
  UnavailableError,
  UnimplementedError,
  codeOf,
  isCode,
  retryable,
  torporError,
} from "./errors.js";
export type { Code, KnownCode } from "./errors.js";
export { Phases, TransientPhases, isKnownPhase, isTerminal, isTransient } from "./phase.js";
export type { KnownPhase, Phase } from "./phase.js";
export type {
  CreateRequest,
  Driver,
  DriverCapabilities,
  Forward,
  HistoryEvent,
  IdlePolicy,
  NewToken,
  Outcome,
  Page,
  Reason,
  ReplayProgress,
  Restore,
  Scope,
  ServerInfo,
  TokenInfo,
  TokenRequest,
  View,
  WhoAmI,
} from "./types.js";
export { uuidv7 } from "./uuid.js";
