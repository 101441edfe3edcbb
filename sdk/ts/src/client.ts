// The client of one torpor server's HTTP API (CONTRACT §5), after the Go
// SDK (sdk/go): every verb, idempotency keys on commands, retries under the
// same key, wait as a long-poll loop, watch as server-sent events resumed
// with Last-Event-ID.

import { Codes, TorporError, answerError, isCode, retryable, torporError } from "./errors.js";
import type { Phase } from "./phase.js";
import { readEvents } from "./sse.js";
import type {
  CreateRequest,
  Driver,
  Forward,
  HistoryEvent,
  NewToken,
  Page,
  ReplayProgress,
  ServerInfo,
  TokenInfo,
  TokenRequest,
  View,
  WhoAmI,
} from "./types.js";
import { uuidv7 } from "./uuid.js";

/** What the client sends its requests through: the platform's fetch, or one like it. */
export type FetchLike = (input: string, init: RequestInit) => Promise<Response>;

/** Options of a Client. */
export interface ClientOptions {
  /** The bearer token every request carries (Authorization: Bearer …). */
  token?: string;
  /** The fetch to send requests through; the platform's global fetch by default. */
  fetch?: FetchLike;
  /** How many times a call is sent at most before its error is thrown (default 5). */
  attempts?: number;
}

/** Options of every call: a signal that abandons it (the call then rejects with the signal's reason). */
export interface CallOptions {
  signal?: AbortSignal;
}

/** Options of a command (create, start, stop, suspend, resume, delete, forwards). */
export interface CommandOptions extends CallOptions {
  /**
   * The command's idempotency key: the same key sent again does nothing
   * more and answers the same. By default the client makes a fresh one
   * (a uuid v7), which its own retries reuse.
   */
  idempotencyKey?: string;
  /**
   * Wait for the command's outcome in the same request (`?wait=true`, one
   * round trip): the call answers the view once the sandbox has settled
   * after the command (its target, or where it settled instead: ready
   * after a rejected suspend, error), not the view as accepted. A refused
   * command rejects at once; past `waitTimeout` it rejects with
   * DEADLINE_EXCEEDED whose `view` is the sandbox as it is (the command
   * goes on). Unset: the view as accepted, then `wait` if you like.
   */
  wait?: boolean;
  /** With `wait`: how long, in milliseconds, at most 10 minutes (default the server's, 30 s). */
  waitTimeout?: number;
}

/** Options of resume. */
export interface ResumeOptions extends CommandOptions {
  /** A cold start if the retained state is lost after it was consumed. */
  restartIfRestoreFails?: boolean;
  /** Resume on another node, where the driver can move the retained state. */
  node?: string;
}

/** Options of get. */
export interface GetOptions extends CallOptions {
  /** What the sandbox was at: a sequence number, an RFC 3339 time, or a Date. */
  at?: number | string | Date;
}

/** The filters, order and page of a list; each is left out of the query when unset. */
export interface ListQuery extends CallOptions {
  phase?: Phase;
  /** k=v: sandboxes with this label. */
  label?: string;
  /** 1–1000. */
  limit?: number;
  /** The `next` of the page before. */
  cursor?: string;
  name?: string;
  driver?: string;
  node?: string;
  /** The order of the list, where the server offers one. */
  sort?: string;
}

/** Options of history. */
export interface HistoryOptions extends CallOptions {
  /** Only the events after this seq. */
  after?: number;
}

/** Options of wait. */
export interface WaitOptions extends CallOptions {
  /**
   * How long to wait in all, in milliseconds: DEADLINE_EXCEEDED once it
   * passes (the sandbox goes on). Unset or 0: as long as the signal lets.
   */
  timeout?: number;
  /**
   * Only a view at a seq above this one counts: pass the seq of the view a
   * command answered, so that the view from before it does not.
   */
  after?: number;
}

/** Options of watch. */
export interface WatchOptions {
  /** Only views with a seq above this one (0: from every sandbox's current view on). */
  after?: number;
  /** Ends the watch: the iteration then rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Options of logs. */
export interface LogsOptions extends CallOptions {
  /** How many lines from the end, 1–10000 (the server's default: 100). */
  tail?: number;
}

/** The body of a forward's opening. */
export interface ForwardRequest {
  /** Where to listen, host:port (default 127.0.0.1:0, a free port on loopback). */
  listen?: string;
  /** The sandbox's port. */
  port: number;
}

/** The body of a replay: the view to rebuild, and up to where. */
export interface ReplayRequest {
  view: "kv" | "sql" | (string & {});
  /** A sequence number or an RFC 3339 time: build a copy as of then, never swapped in. */
  until?: number | string;
}

/** Backoff bounds of the retries and reconnects, in milliseconds. */
const minBackoff = 50;
const maxBackoff = 2000;
/** The longest long poll the server takes (wait's timeout cap), in milliseconds. */
const maxPoll = 10 * 60 * 1000;
/** How long past its own timeout a long poll's answer is waited for. */
const pollGrace = 5000;

/** Client is the client of one torpor server's HTTP API. */
export class Client {
  readonly baseUrl: string;
  readonly #token: string | undefined;
  readonly #fetch: FetchLike;
  readonly #attempts: number;
  readonly #options: ClientOptions;

  /**
   * A client of the server at baseUrl (e.g. "http://127.0.0.1:8080"; a URL
   * without a scheme is http).
   */
  constructor(baseUrl: string, options: ClientOptions = {}) {
    let base = baseUrl.includes("://") ? baseUrl : `http://${baseUrl}`;
    while (base.endsWith("/")) {
      base = base.slice(0, -1);
    }
    this.baseUrl = base;
    this.#options = { ...options };
    this.#token = options.token;
    const f = options.fetch;
    // Called as a plain function: a browser's fetch refuses another `this`.
    this.#fetch = f ? (input, init) => f(input, init) : (input, init) => globalThis.fetch(input, init);
    this.#attempts = Math.max(1, options.attempts ?? 5);
  }

  /** withToken is a client like this one that sends token as its bearer token. */
  withToken(token: string): Client {
    return new Client(this.baseUrl, { ...this.#options, token });
  }

  // ---- sandboxes ------------------------------------------------------

  /** create creates a sandbox: 201 and its view (phase provisioning). */
  create(req: CreateRequest = {}, opts: CommandOptions = {}): Promise<View> {
    return this.#json("POST", `/v1/sandboxes${waitQuery(opts)}`, { body: req, key: commandKey(opts), signal: opts.signal });
  }

  /** get is the view of a sandbox by id or name; with `at`, what it was then. */
  get(ref: string, opts: GetOptions = {}): Promise<View> {
    let path = `/v1/sandboxes/${enc(ref)}`;
    if (opts.at !== undefined) {
      const at = opts.at instanceof Date ? opts.at.toISOString() : String(opts.at);
      path += `?at=${encodeURIComponent(at)}`;
    }
    return this.#json("GET", path, { signal: opts.signal });
  }

  /** list is one page of sandboxes, filtered by the query's fields that are set. */
  list(query: ListQuery = {}): Promise<Page> {
    const q = new URLSearchParams();
    for (const k of ["phase", "label", "limit", "cursor", "name", "driver", "node", "sort"] as const) {
      const v = query[k];
      if (v !== undefined && v !== "" && v !== 0) {
        q.set(k, String(v));
      }
    }
    const qs = q.toString();
    return this.#json("GET", `/v1/sandboxes${qs ? `?${qs}` : ""}`, { signal: query.signal });
  }

  /**
   * listAll yields every sandbox the query matches, page after page (the
   * query's limit is the size of a page), without holding them all.
   */
  async *listAll(query: ListQuery = {}): AsyncGenerator<View, void, undefined> {
    let cursor = query.cursor;
    for (;;) {
      const page = await this.list({ ...query, cursor });
      yield* page.items;
      if (!page.next) {
        return;
      }
      cursor = page.next;
    }
  }

  /** start starts a stopped sandbox (cold), or a suspended one, discarding its retained state. */
  start(id: string, opts: CommandOptions = {}): Promise<View> {
    return this.#lifecycle("start", id, undefined, opts);
  }

  /** stop stops a ready sandbox; on a stopped one it does nothing more. */
  stop(id: string, opts: CommandOptions = {}): Promise<View> {
    return this.#lifecycle("stop", id, undefined, opts);
  }

  /** suspend suspends a ready sandbox; a driver that cannot is UNIMPLEMENTED. */
  suspend(id: string, opts: CommandOptions = {}): Promise<View> {
    return this.#lifecycle("suspend", id, undefined, opts);
  }

  /** resume resumes a suspended sandbox from its retained state. */
  resume(id: string, opts: ResumeOptions = {}): Promise<View> {
    const body: { restart_if_restore_fails?: boolean; node?: string } = {};
    if (opts.restartIfRestoreFails) {
      body.restart_if_restore_fails = true;
    }
    if (opts.node) {
      body.node = opts.node;
    }
    return this.#lifecycle("resume", id, body, opts);
  }

  /** delete deletes a sandbox (deleting, then deleted). */
  delete(id: string, opts: CommandOptions = {}): Promise<View> {
    return this.#json("DELETE", `/v1/sandboxes/${enc(id)}${waitQuery(opts)}`, { key: commandKey(opts), signal: opts.signal });
  }

  /**
   * touch records activity of a sandbox (a sandbox.active, at most one per
   * the server's activity window; a touch within it records nothing more)
   * and answers its view, with last_active_at. A sandbox deleting, deleted
   * or in error is FAILED_PRECONDITION.
   */
  touch(id: string, opts: CommandOptions = {}): Promise<View> {
    return this.#lifecycle("touch", id, undefined, opts);
  }

  #lifecycle(verb: string, id: string, body: object | undefined, opts: CommandOptions): Promise<View> {
    return this.#json("POST", `/v1/sandboxes/${enc(id)}/${verb}${waitQuery(opts)}`, { body, key: commandKey(opts), signal: opts.signal });
  }

  /** history is the audit history of a sandbox, after a seq. */
  async history(id: string, opts: HistoryOptions = {}): Promise<HistoryEvent[]> {
    const out = await this.#json<{ items: HistoryEvent[] | null }>("GET", `/v1/sandboxes/${enc(id)}/events?after=${opts.after ?? 0}`, {
      signal: opts.signal,
    });
    return out.items ?? [];
  }

  /**
   * wait is the view of a sandbox once it is in phase (at a seq above
   * `after`). It loops over the server's long poll, asking again when one
   * poll ends (504) before the wait's own timeout, and after a dropped
   * connection. A sandbox that ends in another terminal phase is
   * FAILED_PRECONDITION: it will never get there; past `timeout`,
   * DEADLINE_EXCEEDED.
   */
  async wait(id: string, phase: Phase, opts: WaitOptions = {}): Promise<View> {
    const what = `wait for ${id} to be ${phase}`;
    const deadline = opts.timeout !== undefined && opts.timeout > 0 ? Date.now() + opts.timeout : undefined;
    let backoff = minBackoff;
    for (;;) {
      let poll = maxPoll;
      if (deadline !== undefined) {
        const left = deadline - Date.now();
        if (left <= 0) {
          throw torporError(Codes.DeadlineExceeded, `${what}: not within ${opts.timeout}ms`);
        }
        poll = Math.min(poll, Math.max(1, Math.floor(left)));
      }
      const path = `/v1/sandboxes/${enc(id)}/wait?phase=${encodeURIComponent(phase)}&after=${opts.after ?? 0}&timeout=${poll}ms`;
      // The server answers within poll; one that does not within a grace
      // after it is given up on, and asked again.
      const guard = linked(opts.signal, poll + pollGrace);
      try {
        return parseJSON<View>(await this.#once("GET", path, undefined, undefined, guard.signal), "GET " + path);
      } catch (err) {
        if (opts.signal?.aborted) {
          throw opts.signal.reason;
        }
        if (isCode(err, Codes.DeadlineExceeded) && poll < maxPoll) {
          throw err; // the wait's own deadline: the server says where the sandbox is
        }
        if (isCode(err, Codes.DeadlineExceeded)) {
          backoff = minBackoff;
          continue; // one poll is over, not the wait
        }
        if (!retryable(err)) {
          throw err;
        }
      } finally {
        guard.dispose();
      }
      let pause = backoff;
      if (deadline !== undefined) {
        pause = Math.min(pause, Math.max(0, deadline - Date.now()));
      }
      await sleep(pause, opts.signal);
      backoff = Math.min(2 * backoff, maxBackoff);
    }
  }

  /**
   * watch streams view changes (GET /v1/watch, server-sent events: id the
   * view's seq, data the view), those with a seq above `after`, in the
   * order they arrive, as an async iterator:
   *
   *     for await (const v of client.watch({ signal })) { … }
   *
   * When the stream breaks it reconnects after a short backoff with
   * Last-Event-ID set to the seq of the last event received, so nothing is
   * skipped; a view at or below one already given of the same sandbox is
   * dropped, so nothing comes twice. The token travels in the
   * Authorization header, never in the URL. It ends when the signal aborts
   * (rejecting with its reason) or when the loop leaves it; an answer no
   * retry can change (PERMISSION_DENIED, say) is thrown.
   */
  async *watch(opts: WatchOptions = {}): AsyncGenerator<View, void, undefined> {
    const after = opts.after ?? 0;
    let last = after;
    const seen = new Map<string, number>();
    const signal = opts.signal;
    signal?.throwIfAborted();
    const ctl = new AbortController();
    const onAbort = () => ctl.abort(signal?.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    let backoff = minBackoff;
    try {
      for (;;) {
        let delivered = false;
        try {
          const headers = this.#headers();
          headers["Accept"] = "text/event-stream";
          if (last > 0) {
            headers["Last-Event-ID"] = String(last);
          }
          let resp: Response;
          try {
            resp = await this.#fetch(this.baseUrl + "/v1/watch", { method: "GET", headers, signal: ctl.signal });
          } catch (err) {
            throw transportError("GET /v1/watch", err);
          }
          if (resp.status >= 300) {
            const text = await resp.text().catch(() => "");
            throw answerError("GET /v1/watch", resp.status, resp.statusText, text);
          }
          if (resp.body === null) {
            throw torporError(Codes.Unavailable, "GET /v1/watch: an answer without a stream");
          }
          try {
            for await (const ev of readEvents(resp.body)) {
              const v = parseJSON<View>(ev.data, "GET /v1/watch");
              const n = Number(ev.id);
              if (ev.id !== "" && Number.isSafeInteger(n) && n >= 0) {
                last = n;
              } else if (v.seq > 0) {
                last = v.seq;
              }
              if (v.seq > after && v.seq > (seen.get(v.id) ?? 0)) {
                seen.set(v.id, v.seq);
                delivered = true;
                yield v;
              }
            }
          } catch (err) {
            throw err instanceof TorporError ? err : transportError("GET /v1/watch", err);
          }
          throw torporError(Codes.Unavailable, "GET /v1/watch: the stream ended");
        } catch (err) {
          if (signal?.aborted) {
            throw signal.reason;
          }
          if (!retryable(err)) {
            throw err;
          }
        }
        if (delivered) {
          backoff = minBackoff; // it was up: reconnect soon
        }
        await sleep(backoff, signal);
        backoff = Math.min(2 * backoff, maxBackoff);
      }
    } finally {
      signal?.removeEventListener("abort", onAbort);
      ctl.abort();
    }
  }

  /** logs is the last lines of a sandbox's workload output, as text. */
  logs(id: string, opts: LogsOptions = {}): Promise<string> {
    const q = opts.tail !== undefined ? `?tail=${opts.tail}` : "";
    return this.#do("GET", `/v1/sandboxes/${enc(id)}/logs${q}`, { signal: opts.signal });
  }

  /** openForward opens a TCP forward from a local address to a port of the sandbox. */
  openForward(id: string, req: ForwardRequest, opts: CommandOptions = {}): Promise<Forward> {
    return this.#json("POST", `/v1/sandboxes/${enc(id)}/forwards`, { body: req, key: commandKey(opts), signal: opts.signal });
  }

  /** closeForward closes a forward of a sandbox and answers its view. */
  closeForward(id: string, forwardId: string, opts: CommandOptions = {}): Promise<View> {
    return this.#json("DELETE", `/v1/sandboxes/${enc(id)}/forwards/${enc(forwardId)}`, {
      key: commandKey(opts),
      signal: opts.signal,
    });
  }

  // ---- the server -----------------------------------------------------

  /** phases is the count of sandboxes per phase (every phase the server knows). */
  phases(opts: CallOptions = {}): Promise<Record<Phase, number>> {
    return this.#json("GET", "/v1/phases", { signal: opts.signal });
  }

  /** drivers lists the server's drivers with their capabilities. */
  async drivers(opts: CallOptions = {}): Promise<Driver[]> {
    const out = await this.#json<{ items: Driver[] | null }>("GET", "/v1/drivers", { signal: opts.signal });
    return out.items ?? [];
  }

  /** server is what the server says of itself: its node, its deadline, its view. */
  server(opts: CallOptions = {}): Promise<ServerInfo> {
    return this.#json("GET", "/v1/server", { signal: opts.signal });
  }

  /** whoami is the name and scopes of the token this client sends (read). */
  whoami(opts: CallOptions = {}): Promise<WhoAmI> {
    return this.#json("GET", "/v1/whoami", { signal: opts.signal });
  }

  /** logSandboxes lists the id of every sandbox the log holds, deleted ones too. */
  async logSandboxes(opts: CallOptions = {}): Promise<string[]> {
    const out = await this.#json<{ items: string[] | null }>("GET", "/v1/log/sandboxes", { signal: opts.signal });
    return out.items ?? [];
  }

  /**
   * replay asks the server to rebuild a view from the log (admin) and
   * yields its progress, the last line `done`; a `failed` line is thrown
   * as its error. Leaving the loop cancels the rebuild.
   */
  async *replay(req: ReplayRequest, opts: CallOptions = {}): AsyncGenerator<ReplayProgress, void, undefined> {
    const ctl = linked(opts.signal, 0);
    try {
      const headers = this.#headers();
      headers["Content-Type"] = "application/json";
      let resp: Response;
      try {
        resp = await this.#fetch(this.baseUrl + "/v1/replay", {
          method: "POST",
          headers,
          body: JSON.stringify(req),
          signal: ctl.signal,
        });
      } catch (err) {
        throw opts.signal?.aborted ? opts.signal.reason : transportError("POST /v1/replay", err);
      }
      if (resp.status >= 300) {
        throw answerError("POST /v1/replay", resp.status, resp.statusText, await resp.text().catch(() => ""));
      }
      if (resp.body === null) {
        throw torporError(Codes.Unavailable, "POST /v1/replay: an answer without a body");
      }
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      try {
        for (;;) {
          let chunk: ReadableStreamReadResult<Uint8Array>;
          try {
            chunk = await reader.read();
          } catch (err) {
            throw opts.signal?.aborted ? opts.signal.reason : transportError("POST /v1/replay", err);
          }
          buf += chunk.done ? decoder.decode() : decoder.decode(chunk.value, { stream: true });
          let nl: number;
          while ((nl = buf.indexOf("\n")) >= 0) {
            const line = buf.slice(0, nl).trim();
            buf = buf.slice(nl + 1);
            if (line === "") {
              continue;
            }
            const p = parseJSON<ReplayProgress>(line, "POST /v1/replay");
            if (p.phase === "failed") {
              throw torporError(p.error?.code ?? Codes.Internal, p.error?.message ?? "replay failed", resp.status);
            }
            yield p;
            if (p.phase === "done") {
              return;
            }
          }
          if (chunk.done) {
            throw torporError(Codes.Unavailable, "POST /v1/replay: the answer ended before the replay was done");
          }
        }
      } finally {
        reader.cancel().catch(() => undefined);
      }
    } finally {
      ctl.dispose();
    }
  }

  // ---- tokens (admin) -------------------------------------------------

  /** createToken makes a bearer token; its secret is in the answer and nowhere else. */
  createToken(req: TokenRequest, opts: CallOptions = {}): Promise<NewToken> {
    return this.#json("POST", "/v1/tokens", { body: req, signal: opts.signal });
  }

  /** tokens lists the server's tokens, without their secrets. */
  async tokens(opts: CallOptions = {}): Promise<TokenInfo[]> {
    const out = await this.#json<{ items: TokenInfo[] | null }>("GET", "/v1/tokens", { signal: opts.signal });
    return out.items ?? [];
  }

  /** revokeToken revokes the token named name: every server refuses it from then on. */
  async revokeToken(name: string, opts: CallOptions = {}): Promise<void> {
    await this.#do("DELETE", `/v1/tokens/${enc(name)}`, { signal: opts.signal });
  }

  // ---- the wire -------------------------------------------------------

  #headers(): Record<string, string> {
    const h: Record<string, string> = {};
    if (this.#token) {
      h["Authorization"] = `Bearer ${this.#token}`;
    }
    return h;
  }

  async #json<T>(method: string, path: string, o: Request_): Promise<T> {
    return parseJSON<T>(await this.#do(method, path, o), `${method} ${path}`);
  }

  /**
   * #do sends a request and answers its body; a request that got no
   * answer, or the answer UNAVAILABLE or ABORTED, is sent again a few times
   * with backoff, with the same idempotency key (commands) or as it is. A
   * change sent without a key (createToken, revokeToken) is not sent again
   * when no answer came: it may have been done, and a second try would
   * answer ALREADY_EXISTS or NOT_FOUND for a success.
   */
  async #do(method: string, path: string, o: Request_): Promise<string> {
    const body = o.body === undefined ? undefined : JSON.stringify(o.body);
    let backoff = minBackoff;
    for (let i = 1; ; i++) {
      try {
        return await this.#once(method, path, o.key, body, o.signal);
      } catch (err) {
        if (o.signal?.aborted) {
          throw o.signal.reason;
        }
        if (i >= this.#attempts || !retryable(err)) {
          throw err;
        }
        if (unanswered.has(err as object) && method !== "GET" && !o.key) {
          throw err; // it may have been done: only a read or a keyed command goes again
        }
      }
      await sleep(backoff, o.signal);
      backoff = Math.min(2 * backoff, maxBackoff);
    }
  }

  /** #once sends a request once and answers its body, or throws the answer's error. */
  async #once(method: string, path: string, key: string | undefined, body: string | undefined, signal: AbortSignal | undefined): Promise<string> {
    const headers = this.#headers();
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
    }
    if (key) {
      headers["Idempotency-Key"] = key;
    }
    const what = `${method} ${path}`;
    let resp: Response;
    let text: string;
    try {
      resp = await this.#fetch(this.baseUrl + path, { method, headers, body, signal });
      text = await resp.text();
    } catch (err) {
      if (signal?.aborted) {
        throw signal.reason;
      }
      throw transportError(what, err);
    }
    if (resp.status >= 300) {
      throw answerError(what, resp.status, resp.statusText, text);
    }
    return text;
  }
}

/** What #do needs of a request. */
interface Request_ {
  body?: unknown;
  key?: string;
  signal?: AbortSignal | undefined;
}

/** commandKey is the command's key, or a fresh one its retries reuse. */
function commandKey(opts: CommandOptions): string {
  return opts.idempotencyKey || uuidv7();
}

/** waitQuery is the query of a command: `?wait=true[&timeout=…ms]` with `wait`, else none. */
function waitQuery(opts: CommandOptions): string {
  if (!opts.wait) {
    return "";
  }
  if (opts.waitTimeout !== undefined && opts.waitTimeout > 0) {
    return `?wait=true&timeout=${Math.min(Math.ceil(opts.waitTimeout), maxPoll)}ms`;
  }
  return "?wait=true";
}

/** enc escapes one path segment. */
function enc(s: string): string {
  return encodeURIComponent(s);
}

function parseJSON<T>(text: string, what: string): T {
  try {
    return JSON.parse(text) as T;
  } catch (err) {
    throw torporError(Codes.Internal, `${what}: decode answer: ${String(err)}`, 0, err);
  }
}

/**
 * transportError is the error of a call that got no answer because of err:
 * UNAVAILABLE (a retry may reach the server), err its cause.
 */
function transportError(what: string, err: unknown): TorporError {
  const msg = err instanceof Error ? err.message : String(err);
  const e = torporError(Codes.Unavailable, `${what}: ${msg}`, 0, err);
  unanswered.add(e);
  return e;
}

/** The errors of calls that got no answer (transportError's): the server may have done them. */
const unanswered = new WeakSet<object>();

/** sleep waits ms, or rejects with the signal's reason once it aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) {
      reject(signal.reason);
      return;
    }
    const onAbort = () => {
      clearTimeout(t);
      reject(signal?.reason);
    };
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * linked is a signal that aborts when parent does, or after ms (0: never);
 * dispose lets go of the timer and the listener.
 */
function linked(parent: AbortSignal | undefined, ms: number): { signal: AbortSignal; dispose(): void } {
  const ctl = new AbortController();
  const onAbort = () => ctl.abort(parent?.reason);
  if (parent?.aborted) {
    ctl.abort(parent.reason);
  } else {
    parent?.addEventListener("abort", onAbort, { once: true });
  }
  const t = ms > 0 ? setTimeout(() => ctl.abort(torporError(Codes.Unavailable, `no answer within ${ms}ms`)), ms) : undefined;
  return {
    signal: ctl.signal,
    dispose() {
      if (t !== undefined) {
        clearTimeout(t);
      }
      parent?.removeEventListener("abort", onAbort);
      ctl.abort();
    },
  };
}
