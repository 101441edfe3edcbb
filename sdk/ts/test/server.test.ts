// The SDK against a real torpor serve (started by sdk/ts's Go test): every
// verb, the typed errors, retries under one key, and a watch resumed after
// a drop. What is expected comes from the contract (CONTRACT §1, §2, §5,
// §6), not from the SDK.

import assert from "node:assert/strict";
import { createServer } from "node:net";
import type { AddressInfo } from "node:net";

import { Codes, Phases, TorporError, isCode } from "../src/index.js";
import type { FetchLike, ReplayProgress, View } from "../src/index.js";
import { client, deadlineSeconds, run, serverTest, tokens } from "./env.js";

/** rejectsWith asserts p rejects with a TorporError of code. */
async function rejectsWith(p: Promise<unknown>, code: string, what: string): Promise<TorporError> {
  const err = await p.then(
    (v) => assert.fail(`${what}: answered ${JSON.stringify(v)}, want ${code}`),
    (e: unknown) => e,
  );
  assert.ok(err instanceof TorporError, `${what}: ${String(err)} is not a TorporError`);
  assert.equal(err.code, code, `${what}: ${err.message}`);
  assert.ok(isCode(err, code));
  return err;
}

const wait = { timeout: 20_000 };

serverTest("every verb of the HTTP API", async () => {
  const c = client("write");
  const r = run();
  const name = `ts-${r}-verbs`;
  const created = await c.create({ name, driver: "sim", labels: { run: r } });
  assert.equal(created.phase, "provisioning");
  assert.equal(created.name, name);
  assert.equal(created.driver, "sim");
  assert.deepEqual(created.labels, { run: r });
  assert.match(created.id, /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-/, "ids are uuid v7");

  const ready = await c.wait(created.id, "ready", wait);
  assert.equal(ready.phase, "ready");
  assert.ok(ready.seq > created.seq);
  const byName = await c.get(name);
  assert.equal(byName.id, created.id);
  const then = await c.get(created.id, { at: created.seq });
  assert.equal(then.phase, "provisioning", "get at the create's seq folds the log up to it");
  // A touch records activity, once per the server's window (README "Activity").
  const touched = await c.touch(created.id);
  assert.ok(touched.last_active_at && touched.seq > ready.seq, `touch: ${JSON.stringify(touched)}`);
  const touchedAgain = await c.touch(created.id);
  assert.equal(touchedAgain.seq, touched.seq, "a touch within the window records nothing more");
  assert.equal(touchedAgain.last_active_at, touched.last_active_at);
  await rejectsWith(c.touch("01900000-0000-7000-8000-000000000000"), Codes.NotFound, "touch of an unknown id");

  const page = await c.list({ label: `run=${r}` });
  assert.deepEqual(
    page.items.map((v) => v.id),
    [created.id],
  );
  assert.ok(!page.next, "one page");
  // Paged: a second sandbox, pages of one, every one of them once.
  const second = await c.create({ driver: "sim", labels: { run: r } });
  await c.wait(second.id, "ready", wait); // lists read the view, which lags the log
  const first = await c.list({ label: `run=${r}`, limit: 1 });
  assert.deepEqual(first.items.map((v) => v.id), [created.id], "creation order");
  assert.ok(first.next, "a next page");
  const all: string[] = [];
  for await (const v of c.listAll({ label: `run=${r}`, limit: 1 })) {
    all.push(v.id);
  }
  assert.deepEqual(all, [created.id, second.id]);
  await c.delete(second.id);
  const none = await c.list({ label: `run=${r}`, phase: "suspended" });
  assert.deepEqual(none.items, []);

  const suspending = await c.suspend(created.id);
  assert.ok(["suspending", "suspended"].includes(suspending.phase), suspending.phase);
  const suspended = await c.wait(created.id, "suspended", { ...wait, after: ready.seq });
  // The fields the contract adds to restore come through as they are.
  assert.deepEqual({ held: suspended.restore.held, consumed: suspended.restore.consumed }, { held: true, consumed: false });
  assert.ok(suspended.restore.restore_ref, "restore.restore_ref of a held state");
  const resumed = await c.resume(created.id, { restartIfRestoreFails: true });
  assert.equal(resumed.phase, "starting");
  const again = await c.wait(created.id, "ready", { ...wait, after: suspended.seq });
  assert.equal(again.last_outcome, "restored");
  assert.ok(again.generation > ready.generation, "a resume mints a new generation");

  await c.stop(created.id);
  const stopped = await c.wait(created.id, "stopped", wait);
  await c.start(created.id);
  const started = await c.wait(created.id, "ready", { ...wait, after: stopped.seq });
  assert.ok(started.generation > again.generation);

  const history = await c.history(created.id);
  const types = history.map((e) => e.type);
  for (const t of ["sandbox.created", "sandbox.suspend_requested", "sandbox.suspended", "sandbox.resume_requested", "sandbox.resumed", "sandbox.stop_requested", "sandbox.stopped", "sandbox.start_requested"]) {
    assert.ok(types.includes(t), `history has ${t}: ${types.join(" ")}`);
  }
  for (const e of history) {
    assert.ok(e.seq > 0 && typeof e.time === "string" && e.actor !== "", JSON.stringify(e));
  }
  const created0 = history.find((e) => e.type === "sandbox.created")!;
  // The actor is the token's name (README Security): torpor_<name>_<43 characters of secret>.
  assert.equal(created0.actor, `token:${tokens.write.slice("torpor_".length, -44)}`, "the actor is the token");
  const later = await c.history(created.id, { after: suspended.seq });
  assert.ok(later.length > 0 && later.every((e) => e.seq > suspended.seq));

  const phases = await c.phases();
  for (const p of Phases) {
    assert.equal(typeof phases[p], "number", `phases counts ${p}`);
  }
  assert.ok((phases["ready"] ?? 0) >= 1);
  const drivers = await c.drivers();
  const sim = drivers.find((d) => d.name === "sim");
  assert.ok(sim, `drivers: ${JSON.stringify(drivers)}`);
  assert.equal(sim.capabilities.suspend, true);
  const server = await c.server();
  assert.equal(server.deadline_seconds, deadlineSeconds);
  assert.equal(server.read_from, "kv");
  assert.equal(typeof server.node, "string");
  assert.equal(typeof (await c.logs(created.id, { tail: 10 })), "string");
  assert.ok((await client("admin").logSandboxes()).includes(created.id));

  const deleting = await c.delete(created.id);
  assert.ok(["deleting", "deleted"].includes(deleting.phase));
  await c.wait(created.id, "deleted", wait);
  await c.wait(second.id, "deleted", wait);
  const gone = await c.list({ label: `run=${r}`, phase: "deleted" });
  assert.deepEqual(gone.items.map((v) => v.id).sort(), [created.id, second.id].sort());
});

serverTest("the server's refusals come back as typed errors with the contract's codes", async () => {
  const c = client("write");
  const s = await c.create({ driver: "sim" });
  await c.wait(s.id, "ready", wait);
  // CONTRACT §1: resume on ready with no retained state is a wrong phase.
  await rejectsWith(c.resume(s.id), Codes.FailedPrecondition, "resume on ready");
  await rejectsWith(c.get("01900000-0000-7000-8000-000000000000"), Codes.NotFound, "get of an unknown id");
  await rejectsWith(c.get(`no-such-${run()}`), Codes.NotFound, "get of an unknown name");
  await rejectsWith(c.suspend("01900000-0000-7000-8000-000000000000"), Codes.NotFound, "suspend of an unknown id");
  // Commands take ids (CONTRACT §5: /v1/sandboxes/{id}/suspend); a name there is not one.
  await rejectsWith(c.suspend(`no-such-${run()}`), Codes.InvalidArgument, "suspend of a name");
  // Scopes (README Security): a read token may not command; no token is unauthenticated.
  const denied = await rejectsWith(client("read").create({ driver: "sim" }), Codes.PermissionDenied, "create with a read token");
  assert.equal(denied.status, 403);
  await rejectsWith(client("read").stop(s.id), Codes.PermissionDenied, "stop with a read token");
  const anon = await rejectsWith(client("none").get(s.id), Codes.Unauthenticated, "get with no token");
  assert.equal(anon.status, 401);
  await rejectsWith(client("write").createToken({ name: `ts-${run()}`, scopes: ["read"] }), Codes.PermissionDenied, "a token made with a write token");
  // CONTRACT §2: unknown JSON fields, bodies over 256 KiB and malformed JSON are INVALID_ARGUMENT.
  const bogus = { driver: "sim", bogus: true } as unknown as Parameters<typeof c.create>[0];
  const bad = await rejectsWith(c.create(bogus), Codes.InvalidArgument, "create with an unknown field");
  assert.equal(bad.status, 400);
  await rejectsWith(c.create({ driver: "sim", labels: { big: "x".repeat(300 << 10) } }), Codes.InvalidArgument, "a body over 256 KiB");
  const garble: FetchLike = (input, init) => fetch(input, { ...init, body: '{"driver": "sim",' });
  await rejectsWith(client("write", garble).create({ driver: "sim" }), Codes.InvalidArgument, "malformed JSON");
  await rejectsWith(c.list({ limit: 5000 }), Codes.InvalidArgument, "a limit over 1000");
  // wait: past its timeout DEADLINE_EXCEEDED; a sandbox that ends elsewhere for good FAILED_PRECONDITION.
  await rejectsWith(c.wait(s.id, "suspended", { timeout: 300 }), Codes.DeadlineExceeded, "a wait past its timeout");
  await c.delete(s.id);
  await c.wait(s.id, "deleted", wait);
  await rejectsWith(c.wait(s.id, "ready", wait), Codes.FailedPrecondition, "a wait on a deleted sandbox");
  // Nothing of the refused commands was appended.
  const types = (await c.history(s.id)).map((e) => e.type);
  assert.ok(!types.includes("sandbox.resume_requested") && !types.includes("sandbox.stop_requested"), types.join(" "));
});

/**
 * dropFirst is a fetch that, for the first request whose method and path
 * match, lets the server handle it and read its whole answer, then throws
 * as a lost connection would: the client never sees that answer.
 */
function dropFirst(method: string, path: RegExp): { fetch: FetchLike; dropped: { key: string; body: string }[]; keys: string[] } {
  const dropped: { key: string; body: string }[] = [];
  const keys: string[] = [];
  const f: FetchLike = async (input, init) => {
    const resp = await fetch(input, init);
    const headers = init.headers as Record<string, string>;
    if (init.method === method && path.test(new URL(input).pathname)) {
      keys.push(headers["Idempotency-Key"] ?? "");
      if (dropped.length === 0) {
        dropped.push({ key: headers["Idempotency-Key"] ?? "", body: await resp.text() });
        throw new TypeError("fetch failed: the connection dropped after the server answered");
      }
    }
    return resp;
  };
  return { fetch: f, dropped, keys };
}

serverTest("a command whose answer was lost is retried under its key: done once, answered the same", async () => {
  const r = run();
  const drop = dropFirst("POST", /^\/v1\/sandboxes$/);
  const s = await client("write", drop.fetch).create({ driver: "sim", labels: { run: r } });
  assert.equal(drop.dropped.length, 1);
  assert.equal(drop.keys.length, 2, "sent twice");
  assert.equal(drop.keys[1], drop.keys[0], "under the same key");
  const lost = JSON.parse(drop.dropped[0]!.body) as View;
  assert.equal(s.id, lost.id, "the retry answers the sandbox the lost answer named");
  const c = client("write");
  await c.wait(s.id, "ready", wait); // lists read the view, which lags the log
  assert.equal((await c.list({ label: `run=${r}` })).items.length, 1, "one sandbox made");
  const sus = dropFirst("POST", /\/suspend$/);
  const v = await client("write", sus.fetch).suspend(s.id);
  assert.equal(sus.keys.length, 2);
  assert.equal(sus.keys[1], sus.keys[0]);
  const first = JSON.parse(sus.dropped[0]!.body) as View;
  assert.equal(v.id, first.id);
  assert.equal(v.seq, first.seq, "the same view: the second try appended nothing");
  await c.wait(s.id, "suspended", wait);
  const types = (await c.history(s.id)).map((e) => e.type);
  assert.equal(types.filter((t) => t === "sandbox.created").length, 1, types.join(" "));
  assert.equal(types.filter((t) => t === "sandbox.suspend_requested").length, 1, types.join(" "));
});

/**
 * cutWatch is a fetch whose first /v1/watch stream breaks right after its
 * first event (the real connection is cancelled): it records the
 * Last-Event-ID each watch request carried, and the id of the event the
 * first one passed.
 */
function cutWatch(): { fetch: FetchLike; lastIds: (string | undefined)[]; passed: string[] } {
  const lastIds: (string | undefined)[] = [];
  const passed: string[] = [];
  const f: FetchLike = async (input, init) => {
    const resp = await fetch(input, init);
    if (new URL(input).pathname !== "/v1/watch") {
      return resp;
    }
    lastIds.push((init.headers as Record<string, string>)["Last-Event-ID"]);
    if (lastIds.length > 1 || resp.body === null) {
      return resp;
    }
    const reader = resp.body.getReader();
    const dec = new TextDecoder();
    const enc = new TextEncoder();
    let text = "";
    const body = new ReadableStream<Uint8Array>({
      async pull(c) {
        for (;;) {
          const end = text.indexOf("\n\n");
          if (end >= 0) {
            const ev = text.slice(0, end + 2);
            passed.push(/^id: ?(.*)$/m.exec(ev)?.[1] ?? "");
            c.enqueue(enc.encode(ev));
            void reader.cancel();
            c.error(new TypeError("terminated: the connection dropped"));
            return;
          }
          const { done, value } = await reader.read();
          if (done) {
            c.close();
            return;
          }
          text += dec.decode(value, { stream: true });
        }
      },
    });
    return new Response(body, { status: resp.status, headers: resp.headers });
  };
  return { fetch: f, lastIds, passed };
}

serverTest("a watch whose stream drops resumes after the last seq, no view twice", async () => {
  const c = client("write");
  const s = await c.create({ driver: "sim" });
  const ready = await c.wait(s.id, "ready", wait);
  const cut = cutWatch();
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(new Error("the watch did not see the sandbox ready again within 20s")), 20_000);
  const got: View[] = [];
  const all: string[] = [];
  try {
    const watch = client("read", cut.fetch).watch({ after: ready.seq, signal: ctl.signal });
    let suspended = false;
    // Commands go once the watch is connected: the first view it takes is
    // this sandbox's or another's, and the cut comes after it.
    const started = c.suspend(s.id);
    for await (const v of watch) {
      all.push(`${v.id}@${v.seq}`);
      if (v.id !== s.id) {
        continue;
      }
      got.push(v);
      if (v.phase === "suspended" && !suspended) {
        suspended = true;
        await c.resume(s.id);
      }
      if (suspended && v.phase === "ready") {
        break;
      }
    }
    await started;
  } finally {
    clearTimeout(timer);
  }
  assert.ok(cut.lastIds.length >= 2, `reconnected: ${cut.lastIds.length} connections`);
  assert.equal(cut.lastIds[0], String(ready.seq), "the first connection asks after `after`");
  assert.equal(cut.lastIds[1], cut.passed[0], "the second asks after the last event the first received");
  assert.equal(new Set(all).size, all.length, `no view twice: ${all.join(" ")}`);
  for (let i = 0; i < got.length; i++) {
    assert.ok(got[i]!.seq > (i === 0 ? ready.seq : got[i - 1]!.seq), `seqs rise: ${got.map((v) => v.seq).join(" ")}`);
  }
  const phases = got.map((v) => v.phase);
  assert.ok(phases.includes("suspended"), phases.join(" "));
  assert.equal(got.at(-1)!.phase, "ready");
  assert.equal(got.at(-1)!.last_outcome, "restored");
});

serverTest("tokens: made, listed without their secret, revoked and refused", async () => {
  const admin = client("admin");
  const name = `ts-${run()}`;
  const t = await admin.createToken({ name, scopes: ["read"] });
  assert.equal(t.name, name);
  assert.match(t.token, new RegExp(`^torpor_${name}_`));
  const list = await admin.tokens();
  const info = list.find((x) => x.name === name);
  assert.ok(info, "listed");
  assert.deepEqual(info.scopes, ["read"]);
  assert.ok(!JSON.stringify(list).includes(t.token), "no secret in the list");
  const reader = client("none").withToken(t.token);
  assert.equal(typeof (await reader.phases())["ready"], "number");
  await admin.revokeToken(name);
  // Refused everywhere within a round trip of the bus (README Security):
  // the instance's cache may yet take the token's creation from its watch
  // of the bucket, before the deletion.
  const until = Date.now() + 5000;
  let answered: unknown;
  for (;;) {
    answered = await reader.phases().catch((e: unknown) => e);
    if (isCode(answered, Codes.Unauthenticated) || Date.now() > until) {
      break;
    }
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  await rejectsWith(Promise.reject(answered), Codes.Unauthenticated, "a revoked token");
  await rejectsWith(admin.revokeToken(name + "-none"), Codes.NotFound, "revoke of an unknown token");
  assert.notEqual(tokens.admin, "");
});

serverTest("forwards: opened to a port the sandbox answers on, then closed", async () => {
  const echo = createServer((sock) => {
    sock.on("data", (d) => sock.write(d));
    sock.on("error", () => undefined);
  });
  await new Promise<void>((resolve) => echo.listen(0, "127.0.0.1", resolve));
  try {
    const port = (echo.address() as AddressInfo).port;
    const c = client("write");
    const s = await c.create({ driver: "sim", driver_options: { ports: `8000=127.0.0.1:${port}` } });
    await c.wait(s.id, "ready", wait);
    const f = await c.openForward(s.id, { listen: "127.0.0.1:0", port: 8000 });
    assert.equal(f.port, 8000);
    assert.match(f.address, /^127\.0\.0\.1:\d+$/);
    // In the log at once (the view, which lags it, follows).
    const opened = (await c.history(s.id)).filter((e) => e.type === "sandbox.forward_opened");
    assert.equal(opened.length, 1);
    assert.equal((opened[0]!.data as { forward_id?: string }).forward_id, f.id, JSON.stringify(opened[0]!.data));
    await rejectsWith(c.openForward(s.id, { port: 9000 }), Codes.FailedPrecondition, "a port not mapped");
    await rejectsWith(c.openForward(s.id, { listen: "0.0.0.0:0", port: 8000 }), Codes.PermissionDenied, "off loopback with a write token");
    const closed = await c.closeForward(s.id, f.id);
    assert.equal(closed.forwards, undefined, "omitted when none");
    await rejectsWith(c.closeForward(s.id, "no-such-forward"), Codes.NotFound, "an unknown forward");
  } finally {
    echo.close();
  }
});

serverTest("replay rebuilds the KV view (admin) and reports its progress to done", async () => {
  const lines: ReplayProgress[] = [];
  for await (const p of client("admin").replay({ view: "kv" })) {
    lines.push(p);
  }
  assert.ok(lines.length >= 1);
  const done = lines.at(-1)!;
  assert.equal(done.phase, "done", JSON.stringify(lines));
  assert.equal(done.view, "kv");
  assert.ok((done.seq ?? 0) > 0, JSON.stringify(done));
  const it = client("write").replay({ view: "kv" });
  await rejectsWith(it.next(), Codes.PermissionDenied, "replay with a write token");
  await rejectsWith(client("admin").replay({ view: "nope" }).next(), Codes.InvalidArgument, "replay of an unknown view");
});

serverTest("whoami names the token a client sends and its scopes", async () => {
  // A token's name is in its secret: torpor_<name>_<43 characters>.
  const nameOf = (secret: string) => secret.slice("torpor_".length, -44);
  const cases: [keyof typeof tokens, string[]][] = [
    ["read", ["read"]],
    ["write", ["read", "write"]],
    ["admin", ["admin"]],
  ];
  for (const [scope, scopes] of cases) {
    const me = await client(scope).whoami();
    assert.deepEqual(me, { name: nameOf(tokens[scope]), scopes }, `whoami as the ${scope} token`);
  }
  await rejectsWith(client("none").whoami(), Codes.Unauthenticated, "whoami without a token");
});
