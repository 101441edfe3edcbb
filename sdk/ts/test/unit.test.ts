// Tests of the SDK alone, with a fake fetch: what a server answers is
// written here, from the contract (CONTRACT §2, §5, §6), not from the SDK.

import test from "node:test";
import assert from "node:assert/strict";

import { Client, Codes, FailedPreconditionError, TorporError, codeOf, isCode, uuidv7 } from "../src/index.js";
import type { FetchLike, Phase, View } from "../src/index.js";
import { readEvents } from "../src/sse.js";

/** A request the fake fetch saw. */
interface Seen {
  method: string;
  url: string;
  headers: Record<string, string>;
  body: string | undefined;
}

/** fake is a fetch that answers each request with answer(request, n) (n counts from 1). */
function fake(answer: (r: Seen, n: number) => Response | Promise<Response>): { fetch: FetchLike; seen: Seen[] } {
  const seen: Seen[] = [];
  const f: FetchLike = async (input, init) => {
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries((init.headers ?? {}) as Record<string, string>)) {
      headers[k.toLowerCase()] = v;
    }
    const r = { method: init.method ?? "GET", url: input, headers, body: init.body as string | undefined };
    seen.push(r);
    return answer(r, seen.length);
  };
  return { fetch: f, seen };
}

function json(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/json" } });
}

function view(over: Partial<View> = {}): View {
  return {
    id: "0193c7a0-0000-7000-8000-000000000001",
    name: "sbx-000000000001",
    phase: "ready",
    generation: 1,
    driver: "sim",
    node: "local",
    labels: null,
    restore: { held: false, consumed: false },
    last_outcome: "",
    exit_code: null,
    reason: "",
    updated_at: "2026-12-06T11:00:00Z",
    seq: 7,
    ...over,
  };
}

// describe is what a user's code does with a phase: a switch over the known
// ones with a default. It must compile with Phase open, and take any string.
function describe(p: Phase): string {
  switch (p) {
    case "ready":
      return "up";
    case "suspended":
      return "frozen";
    default:
      return `other:${p}`;
  }
}

test("a phase this SDK does not know comes through as its string", async () => {
  const { fetch } = fake(() => json(200, { ...view(), phase: "hibernating", warmth: "tepid" }));
  const c = new Client("http://torpor.test", { token: "t", fetch });
  const v = await c.get("x");
  assert.equal(v.phase, "hibernating");
  assert.equal(describe(v.phase), "other:hibernating");
  assert.equal(describe("ready"), "up");
  // An unknown field passes through too.
  assert.equal((v as unknown as Record<string, unknown>)["warmth"], "tepid");
  const page = await new Client("http://torpor.test", {
    fetch: fake(() => json(200, { items: [{ ...view(), phase: "hibernating" }], next: "" })).fetch,
  }).list();
  assert.equal(page.items[0]?.phase, "hibernating");
});

test("uuidv7: version 7, variant 10, the time in its first 48 bits, distinct", () => {
  const t = Date.UTC(2026, 11, 6, 11, 0, 0);
  const a = uuidv7(t);
  assert.match(a, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.equal(parseInt(a.replace(/-/g, "").slice(0, 12), 16), t);
  const seen = new Set<string>();
  for (let i = 0; i < 1000; i++) {
    seen.add(uuidv7(t));
  }
  assert.equal(seen.size, 1000);
  assert.ok(uuidv7(t + 1) > uuidv7(t), "keys sort by time");
});

test("an error answer is a TorporError with the body's code, message and status", async () => {
  const cases: { status: number; body: string; code: string; message?: string }[] = [
    {
      status: 409,
      body: JSON.stringify({ error: { code: "FAILED_PRECONDITION", message: "sandbox x is stopped; resume needs suspended" } }),
      code: "FAILED_PRECONDITION",
      message: "sandbox x is stopped; resume needs suspended",
    },
    { status: 404, body: JSON.stringify({ error: { code: "NOT_FOUND", message: "no sandbox x" } }), code: "NOT_FOUND" },
    { status: 418, body: JSON.stringify({ error: { code: "TEAPOT", message: "a newer code" } }), code: "TEAPOT" },
    // No contract body (a proxy's page): the status decides.
    { status: 401, body: "<html>no</html>", code: "UNAUTHENTICATED" },
    { status: 403, body: "", code: "PERMISSION_DENIED" },
    { status: 504, body: "gateway timeout", code: "DEADLINE_EXCEEDED" },
    { status: 409, body: "", code: "INTERNAL" },
  ];
  for (const tc of cases) {
    const { fetch } = fake(() => new Response(tc.body, { status: tc.status }));
    const c = new Client("http://torpor.test", { fetch, attempts: 1 });
    const err = await c.get("x").then(
      () => assert.fail("no error"),
      (e: unknown) => e,
    );
    assert.ok(err instanceof TorporError, `${tc.status} ${tc.body}: ${String(err)}`);
    assert.equal(err.code, tc.code);
    assert.equal(err.status, tc.status);
    assert.equal(codeOf(err), tc.code);
    assert.ok(isCode(err, tc.code));
    if (tc.message !== undefined) {
      assert.equal(err.message, tc.message);
    }
  }
  const { fetch } = fake(() => json(409, { error: { code: "FAILED_PRECONDITION", message: "m" } }));
  const err = await new Client("http://torpor.test", { fetch }).suspend("x").catch((e: unknown) => e);
  assert.ok(err instanceof FailedPreconditionError, "the code's class");
  assert.equal((err as Error).name, "FailedPreconditionError");
});

test("a command is retried under the same key on no answer, UNAVAILABLE and ABORTED, and not on others", async () => {
  const answers = [
    () => Promise.reject(new TypeError("fetch failed")),
    () => json(503, { error: { code: "UNAVAILABLE", message: "the bus is down" } }),
    () => json(409, { error: { code: "ABORTED", message: "concurrent change" } }),
    () => json(202, view({ phase: "suspending", seq: 9 })),
  ];
  const { fetch, seen } = fake((_, n) => answers[n - 1]!());
  const c = new Client("http://torpor.test", { token: "tok", fetch });
  const v = await c.suspend("x");
  assert.equal(v.phase, "suspending");
  assert.equal(seen.length, 4);
  const key = seen[0]!.headers["idempotency-key"];
  assert.match(key ?? "", /^[0-9a-f]{8}-[0-9a-f]{4}-7/);
  for (const r of seen) {
    assert.equal(r.headers["idempotency-key"], key, "every try under the first key");
    assert.equal(r.headers["authorization"], "Bearer tok");
    assert.equal(r.method, "POST");
    assert.equal(r.url, "http://torpor.test/v1/sandboxes/x/suspend");
  }
  // A second command gets a key of its own.
  const two = fake(() => json(202, view()));
  const c2 = new Client("http://torpor.test", { fetch: two.fetch });
  await c2.stop("x");
  await c2.stop("x");
  assert.notEqual(two.seen[0]!.headers["idempotency-key"], two.seen[1]!.headers["idempotency-key"]);
  // A given key is sent as it is.
  await c2.create({ driver: "sim" }, { idempotencyKey: "mine" });
  assert.equal(two.seen[2]!.headers["idempotency-key"], "mine");
  assert.equal(two.seen[2]!.headers["content-type"], "application/json");
  assert.deepEqual(JSON.parse(two.seen[2]!.body!), { driver: "sim" });

  // FAILED_PRECONDITION is the answer: not retried.
  const once = fake(() => json(409, { error: { code: "FAILED_PRECONDITION", message: "m" } }));
  await assert.rejects(new Client("http://torpor.test", { fetch: once.fetch }).resume("x"), (e: unknown) => isCode(e, Codes.FailedPrecondition));
  assert.equal(once.seen.length, 1);

  // Bounded: attempts tries, then the last error.
  const down = fake(() => Promise.reject(new TypeError("fetch failed")));
  await assert.rejects(new Client("http://torpor.test", { fetch: down.fetch, attempts: 3 }).start("x"), (e: unknown) => isCode(e, Codes.Unavailable));
  assert.equal(down.seen.length, 3);
});

test("resume sends its options; list its query; get its at; the token only in the header", async () => {
  const { fetch, seen } = fake((r) => (r.url.includes("/v1/sandboxes?") || r.url.endsWith("/v1/sandboxes") ? json(200, { items: [], next: "", total: 0 }) : json(202, view())));
  const c = new Client("torpor.test/", { token: "secret", fetch });
  await c.resume("s 1", { restartIfRestoreFails: true, node: "n2" });
  assert.equal(seen[0]!.url, "http://torpor.test/v1/sandboxes/s%201/resume");
  assert.deepEqual(JSON.parse(seen[0]!.body!), { restart_if_restore_fails: true, node: "n2" });
  await c.resume("s");
  assert.deepEqual(JSON.parse(seen[1]!.body!), {});
  const page = await c.list({ phase: "ready", label: "a=b", limit: 10, cursor: "c", name: "n", driver: "sim", node: "local", sort: "name" });
  assert.equal(page.total, 0);
  const u = new URL(seen[2]!.url);
  assert.deepEqual(Object.fromEntries(u.searchParams), { phase: "ready", label: "a=b", limit: "10", cursor: "c", name: "n", driver: "sim", node: "local", sort: "name" });
  await c.list();
  assert.equal(seen[3]!.url, "http://torpor.test/v1/sandboxes");
  await c.get("s", { at: 42 });
  assert.equal(seen[4]!.url, "http://torpor.test/v1/sandboxes/s?at=42");
  await c.get("s", { at: new Date(Date.UTC(2026, 0, 2, 3, 4, 5)) });
  assert.equal(new URL(seen[5]!.url).searchParams.get("at"), "2026-01-02T03:04:05.000Z");
  for (const r of seen) {
    assert.ok(!r.url.includes("secret"), `token in a URL: ${r.url}`);
    assert.equal(r.headers["authorization"], "Bearer secret");
  }
});

test("wait asks again when one poll ends (504) and gives up at its own deadline", async () => {
  let n = 0;
  const { fetch, seen } = fake(() => {
    n++;
    if (n < 3) {
      return json(504, { error: { code: "DEADLINE_EXCEEDED", message: "not yet" } });
    }
    return json(200, view({ phase: "suspended", seq: 12 }));
  });
  const c = new Client("http://torpor.test", { fetch });
  // No timeout: each poll is the server's longest (10m), and a 504 is one poll over.
  const v = await c.wait("x", "suspended", { after: 9 });
  assert.equal(v.seq, 12);
  assert.equal(seen.length, 3);
  const q = new URL(seen[0]!.url).searchParams;
  assert.equal(q.get("phase"), "suspended");
  assert.equal(q.get("after"), "9");
  assert.equal(q.get("timeout"), "600000ms");

  // With a timeout: the poll is what is left of it, and the server's 504 then ends the wait.
  const short = fake(() => json(504, { error: { code: "DEADLINE_EXCEEDED", message: "sandbox x did not reach ready (it is starting)" } }));
  const err = await new Client("http://torpor.test", { fetch: short.fetch }).wait("x", "ready", { timeout: 2000 }).catch((e: unknown) => e);
  assert.ok(isCode(err, Codes.DeadlineExceeded), String(err));
  assert.equal(short.seen.length, 1);
  const t = Number(new URL(short.seen[0]!.url).searchParams.get("timeout")!.replace("ms", ""));
  assert.ok(t > 1000 && t <= 2000, `poll ${t}ms`);

  // A dropped connection is asked again; FAILED_PRECONDITION (it ended elsewhere) is not.
  const drops = fake((_, k) => (k === 1 ? Promise.reject(new TypeError("socket hang up")) : json(409, { error: { code: "FAILED_PRECONDITION", message: "deleted" } })));
  await assert.rejects(new Client("http://torpor.test", { fetch: drops.fetch }).wait("x", "ready", { timeout: 5000 }), (e: unknown) => isCode(e, Codes.FailedPrecondition));
  assert.equal(drops.seen.length, 2);
});

/** sse is a response streaming chunks, then ending (or breaking, when broken). */
function sse(chunks: string[], broken: boolean): Response {
  const enc = new TextEncoder();
  return new Response(
    new ReadableStream<Uint8Array>({
      // One chunk a read, so that a break comes after what was sent
      // (an error in start would drop what is queued).
      pull(c) {
        const ch = chunks.shift();
        if (ch !== undefined) {
          c.enqueue(enc.encode(ch));
        } else if (broken) {
          c.error(new TypeError("terminated"));
        } else {
          c.close();
        }
      },
    }),
    { status: 200, headers: { "Content-Type": "text/event-stream" } },
  );
}

function ev(v: View): string {
  return `id: ${v.seq}\ndata: ${JSON.stringify(v)}\n\n`;
}

test("watch resumes after a drop with Last-Event-ID and never gives a view twice", async () => {
  const a = "0193c7a0-0000-7000-8000-00000000000a";
  const b = "0193c7a0-0000-7000-8000-00000000000b";
  const { fetch, seen } = fake((_, n) => {
    switch (n) {
      case 1:
        // Two views, then the connection breaks.
        return sse([ev(view({ id: a, seq: 5 })), ev(view({ id: b, seq: 6 }))], true);
      case 2:
        // A server (or a proxy) that sends one again, and an older view of a.
        return sse([ev(view({ id: b, seq: 6 })), ev(view({ id: a, seq: 4 })), ev(view({ id: a, seq: 7, phase: "suspending" }))], false);
      default:
        return sse([ev(view({ id: a, seq: 8, phase: "suspended" }))], false);
    }
  });
  const c = new Client("http://torpor.test", { token: "tok", fetch });
  const got: string[] = [];
  const ctl = new AbortController();
  for await (const v of c.watch({ after: 3, signal: ctl.signal })) {
    got.push(`${v.id.slice(-1)}@${v.seq}`);
    if (v.phase === "suspended") {
      break;
    }
  }
  assert.deepEqual(got, ["a@5", "b@6", "a@7", "a@8"]);
  assert.equal(seen[0]!.headers["last-event-id"], "3", "the first asks after `after`");
  assert.equal(seen[1]!.headers["last-event-id"], "6", "a resume asks after the last event received");
  assert.equal(seen[2]!.headers["last-event-id"], "7");
  for (const r of seen) {
    assert.equal(r.headers["authorization"], "Bearer tok");
    assert.equal(r.url, "http://torpor.test/v1/watch");
  }
  // An answer no retry changes ends the watch.
  const denied = fake(() => json(403, { error: { code: "PERMISSION_DENIED", message: "write token" } }));
  const it = new Client("http://torpor.test", { fetch: denied.fetch }).watch();
  await assert.rejects(it.next(), (e: unknown) => isCode(e, Codes.PermissionDenied));
  // The signal ends it with its reason.
  const ctl2 = new AbortController();
  const hang: FetchLike = (_, init) =>
    new Promise<Response>((_, reject) => init.signal?.addEventListener("abort", () => reject(new TypeError("aborted"))));
  const p = new Client("http://torpor.test", { fetch: hang }).watch({ signal: ctl2.signal }).next();
  ctl2.abort(new Error("enough"));
  await assert.rejects(p, /enough/);
});

test("the event stream parser: chunks split anywhere, CRLF, several data lines, comments", async () => {
  const text = ": hello\r\nid: 1\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\nid: 2\ndata: two\n\n:keepalive\n\nid: 3\rdata: three\r\rdata: cut";
  for (const size of [1, 2, 3, 7, 1000]) {
    const chunks: string[] = [];
    for (let i = 0; i < text.length; i += size) {
      chunks.push(text.slice(i, i + size));
    }
    const got: string[] = [];
    for await (const e of readEvents(sse(chunks, false).body!)) {
      got.push(`${e.id}=${e.data}`);
    }
    assert.deepEqual(got, ['1={"a":\n1}', "2=two", "3=three"], `chunks of ${size}`);
  }
});

test("a call is sent 5 times at most by default; an aborted call rejects with its signal's reason, unsent again", async () => {
  const down = fake(() => Promise.reject(new TypeError("fetch failed")));
  const err = await new Client("http://torpor.test", { fetch: down.fetch }).get("x").catch((e: unknown) => e);
  assert.ok(isCode(err, Codes.Unavailable), String(err));
  assert.equal((err as TorporError).status, 0, "no answer: no status");
  assert.equal(down.seen.length, 5);

  const ctl = new AbortController();
  const hang: FetchLike = (_, init) =>
    new Promise<Response>((_, reject) => init.signal?.addEventListener("abort", () => reject(new DOMException("aborted", "AbortError"))));
  let sent = 0;
  const counting: FetchLike = (input, init) => {
    sent++;
    return hang(input, init);
  };
  const p = new Client("http://torpor.test", { fetch: counting }).suspend("x", { signal: ctl.signal });
  ctl.abort(new Error("caller gave up"));
  await assert.rejects(p, /caller gave up/);
  assert.equal(sent, 1, "an abort is no reason to retry");
});

test("a command with wait asks for its outcome in the same request, and a timeout carries the view", async () => {
  const { fetch, seen } = fake((r) => {
    if (r.url.includes("/suspend")) {
      return json(504, { error: { code: "DEADLINE_EXCEEDED", message: "no outcome in 300ms" }, view: view({ phase: "suspending", seq: 9 }) });
    }
    return json(200, view({ phase: "stopped", seq: 8 }));
  });
  const c = new Client("http://torpor.test", { fetch });
  const stopped = await c.stop("x", { wait: true });
  assert.equal(stopped.phase, "stopped");
  assert.equal(seen[0]?.url, "http://torpor.test/v1/sandboxes/x/stop?wait=true");
  await c.delete("x", { wait: true, waitTimeout: 1500 });
  assert.equal(seen[1]?.url, "http://torpor.test/v1/sandboxes/x?wait=true&timeout=1500ms");
  await c.create({}, { wait: true, waitTimeout: 20 * 60 * 1000 });
  assert.equal(seen[2]?.url, "http://torpor.test/v1/sandboxes?wait=true&timeout=600000ms");
  await c.start("x");
  assert.equal(seen[3]?.url, "http://torpor.test/v1/sandboxes/x/start");
  await assert.rejects(c.suspend("x", { wait: true, waitTimeout: 300 }), (err: unknown) => {
    assert.ok(err instanceof TorporError);
    assert.equal(err.code, Codes.DeadlineExceeded);
    assert.equal(err.view?.phase, "suspending");
    assert.equal(err.view?.seq, 9);
    return true;
  });
  assert.equal(seen.length, 5, "a timed-out wait is not sent again");
});

test("a change without an idempotency key (token create, revoke) is not sent again when no answer came; reads and keyed commands are", async () => {
  // No answer to the first request (the connection dropped after it was
  // sent: the server may have done it), then answers.
  const lost = (ok: (r: Seen) => Response) => fake((r, n) => (n === 1 ? Promise.reject(new TypeError("fetch failed")) : ok(r)));
  const made = lost(() => json(201, { name: "t", scopes: ["read"], created_at: "2026-12-06T11:00:00Z", token: "torpor_t_x" }));
  const err = await new Client("http://torpor.test", { fetch: made.fetch }).createToken({ name: "t", scopes: ["read"] }).catch((e: unknown) => e);
  assert.ok(isCode(err, Codes.Unavailable), String(err));
  assert.equal((err as TorporError).status, 0, "no answer: no status");
  assert.equal(made.seen.length, 1, "a token made twice would be ALREADY_EXISTS");
  const revoked = lost(() => new Response(null, { status: 204 }));
  await assert.rejects(new Client("http://torpor.test", { fetch: revoked.fetch }).revokeToken("t"), (e: unknown) => isCode(e, Codes.Unavailable));
  assert.equal(revoked.seen.length, 1, "a token revoked twice would be NOT_FOUND");

  const read = lost(() => json(200, view()));
  assert.equal((await new Client("http://torpor.test", { fetch: read.fetch }).get("x")).seq, 7);
  assert.equal(read.seen.length, 2);
  const keyed = lost(() => json(202, view({ phase: "suspending" })));
  await new Client("http://torpor.test", { fetch: keyed.fetch }).suspend("x");
  assert.equal(keyed.seen.length, 2);
  assert.equal(keyed.seen[1]!.headers["idempotency-key"], keyed.seen[0]!.headers["idempotency-key"]);

  // An answer of UNAVAILABLE (or ABORTED) is sent again, key or none: only
  // a missing answer stops an unkeyed change (the Python SDK's rule).
  const busy = fake((_, n) => (n === 1 ? json(503, { error: { code: "UNAVAILABLE", message: "the bus is down" } }) : new Response(null, { status: 204 })));
  await new Client("http://torpor.test", { fetch: busy.fetch }).revokeToken("t");
  assert.equal(busy.seen.length, 2);
});
