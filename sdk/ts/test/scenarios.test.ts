// The scenario runner: every scenario of sdk/scenarios/scenarios.json (the
// list the Go, TypeScript and Python SDKs each run; format in
// sdk/scenarios/README.md) through this SDK against a real torpor serve,
// one test per scenario. The expectations are the file's, never this SDK's
// output.

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import test from "node:test";

import { Client, TorporError } from "../src/index.js";
import type { CreateRequest, HistoryEvent, View } from "../src/index.js";
import { run, serverTest, tokens, url } from "./env.js";

interface Step {
  call: string;
  token?: string;
  sandbox?: string;
  id?: string;
  body?: Record<string, unknown>;
  key?: string;
  phase?: string;
  after?: string;
  query?: { phase?: string; label?: string };
  as?: string;
  expect?: Record<string, unknown>;
  expect_same?: string;
  generation_above?: string;
  expect_error?: string;
  expect_types?: string[];
  expect_count?: Record<string, number>;
  expect_ids?: string[];
  timeout_seconds?: number;
  wait?: boolean;
}

interface Scenario {
  name: string;
  steps: Step[];
}

/** The step fields of the format (README): a field not listed fails the step, never passes unread. */
const fields = new Set([
  "call",
  "token",
  "sandbox",
  "id",
  "body",
  "key",
  "phase",
  "after",
  "query",
  "as",
  "expect",
  "expect_same",
  "generation_above",
  "expect_error",
  "expect_types",
  "expect_count",
  "expect_ids",
  "timeout_seconds",
  "wait",
]);

const path = process.env["TORPOR_SCENARIOS"] || fileURLToPath(new URL("../../../scenarios/scenarios.json", import.meta.url));

let scenarios: Scenario[] = [];
let loadError: unknown;
try {
  const file = JSON.parse(readFileSync(path, "utf8")) as { version: number; scenarios: Scenario[] };
  if (file.version !== 1) {
    throw new Error(`version ${file.version}: this runner reads version 1`);
  }
  scenarios = file.scenarios;
  if (!Array.isArray(scenarios) || scenarios.length === 0) {
    throw new Error("no scenarios");
  }
} catch (err) {
  loadError = err;
}

if (loadError !== undefined) {
  void test(`the scenario list ${path}`, () => {
    throw loadError;
  });
}

for (const sc of scenarios) {
  serverTest(`scenario: ${sc.name}`, () => runScenario(sc), 120_000);
}

/** sub replaces {run} in every string of x. */
function sub<T>(x: T, id: string): T {
  if (typeof x === "string") {
    return x.replaceAll("{run}", id) as T;
  }
  if (Array.isArray(x)) {
    return x.map((y) => sub(y, id)) as T;
  }
  if (x !== null && typeof x === "object") {
    return Object.fromEntries(Object.entries(x).map(([k, v]) => [k, sub(v, id)])) as T;
  }
  return x;
}

/** forged is a well-formed torpor_<name>_<secret> token the server never made: a real name, a random secret. */
function forged(): string {
  const b = new Uint8Array(32);
  globalThis.crypto.getRandomValues(b);
  const secret = btoa(String.fromCharCode(...b)).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
  return `torpor_${tokens.write.slice("torpor_".length, -44)}_${secret}`;
}

function clientFor(token: string | undefined): Client {
  switch (token ?? "write") {
    case "write":
      return new Client(url, { token: tokens.write });
    case "read":
      return new Client(url, { token: tokens.read });
    case "admin":
      return new Client(url, { token: tokens.admin });
    case "none":
      return new Client(url);
    case "forged":
      return new Client(url, { token: forged() });
    default:
      throw new Error(`token ${token}: want write, read, admin, none or forged`);
  }
}

/**
 * holds asserts that got holds want: every key of an object present and
 * holding its value by the same rule; arrays and scalars exactly.
 */
function holds(got: unknown, want: unknown, at: string): void {
  if (want !== null && typeof want === "object" && !Array.isArray(want)) {
    assert.ok(got !== null && typeof got === "object" && !Array.isArray(got), `${at}: ${JSON.stringify(got)} is not an object`);
    for (const [k, v] of Object.entries(want)) {
      assert.ok(Object.prototype.hasOwnProperty.call(got, k), `${at}.${k}: missing from ${JSON.stringify(got)}`);
      holds((got as Record<string, unknown>)[k], v, `${at}.${k}`);
    }
    return;
  }
  assert.deepEqual(got, want, `${at}: ${JSON.stringify(got)}, want ${JSON.stringify(want)}`);
}

/** watchFor collects the views of sandbox id after seq until one is in phase, and answers that one. */
async function watchFor(c: Client, id: string, after: number, phase: string, ms: number): Promise<View> {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(new Error(`watch: no view of ${id} in ${phase} within ${ms}ms`)), ms);
  let prev = after;
  try {
    for await (const v of c.watch({ after, signal: ctl.signal })) {
      if (v.id !== id) {
        continue;
      }
      assert.ok(v.seq > after, `watch: a view at seq ${v.seq}, not above after (${after})`);
      assert.ok(v.seq > prev, `watch: a view at seq ${v.seq} after one at ${prev}: a view twice, or back`);
      prev = v.seq;
      if (v.phase === phase) {
        return v;
      }
    }
  } finally {
    clearTimeout(timer);
  }
  throw new Error("watch: the stream ended");
}

async function runScenario(sc: Scenario): Promise<void> {
  const id = run();
  const saved = new Map<string, View>();
  const savedView = (name: string, where: string): View => {
    const v = saved.get(name);
    assert.ok(v, `${where}: nothing saved as ${JSON.stringify(name)}`);
    return v;
  };
  for (const [i, raw] of sc.steps.entries()) {
    const where = `step ${i + 1} (${raw.call})`;
    for (const k of Object.keys(raw)) {
      assert.ok(fields.has(k), `${where}: field ${k} is not in the format (sdk/scenarios/README.md)`);
    }
    const step: Step = { ...raw };
    for (const k of ["body", "id", "key", "query", "expect"] as const) {
      if (step[k] !== undefined) {
        (step as unknown as Record<string, unknown>)[k] = sub(step[k], id);
      }
    }
    const c = clientFor(step.token);
    const ref = (): string => {
      if (step.sandbox !== undefined) {
        return savedView(step.sandbox, where).id;
      }
      assert.ok(step.id !== undefined, `${where}: neither sandbox nor id`);
      return step.id;
    };
    const key = {
      ...(step.key !== undefined ? { idempotencyKey: `${id}-${step.key}` } : {}),
      // A command with wait answers its outcome (one round trip); timeout_seconds is then its wait's.
      ...(step.wait ? { wait: true, ...(step.timeout_seconds !== undefined ? { waitTimeout: step.timeout_seconds * 1000 } : {}) } : {}),
    };
    const ms = (step.timeout_seconds ?? 20) * 1000;
    const after = step.after !== undefined ? savedView(step.after, where).seq : 0;
    let answer: unknown;
    let failure: unknown;
    try {
      switch (step.call) {
        case "create":
          answer = await c.create((step.body ?? {}) as CreateRequest, key);
          break;
        case "get":
          answer = await c.get(ref());
          break;
        case "list": {
          // A list reads the KV view, which lags the log (CONTRACT §6): a
          // sandbox just created may not be in it yet. So a list whose
          // expect_ids do not hold is asked again until they do, within the
          // step's bound; one that never holds still fails.
          const want = (step.expect_ids ?? []).map((n) => savedView(n, where).id).sort();
          const until = Date.now() + ms;
          for (;;) {
            const items: View[] = [];
            for await (const v of c.listAll({ ...(step.query ?? {}) })) {
              items.push(v);
            }
            answer = items;
            const got = items.map((v) => v.id).sort();
            if (step.expect_ids === undefined || JSON.stringify(got) === JSON.stringify(want) || Date.now() > until) {
              break;
            }
            await new Promise((resolve) => setTimeout(resolve, 50));
          }
          break;
        }
        case "start":
        case "stop":
        case "suspend":
        case "delete":
          answer = await c[step.call](ref(), key);
          break;
        case "resume": {
          const body = step.body ?? {};
          for (const k of Object.keys(body)) {
            assert.ok(k === "restart_if_restore_fails" || k === "node", `${where}: resume takes no ${k}`);
          }
          answer = await c.resume(ref(), {
            ...key,
            restartIfRestoreFails: body["restart_if_restore_fails"] === true,
            ...(typeof body["node"] === "string" ? { node: body["node"] } : {}),
          });
          break;
        }
        case "wait":
          assert.ok(step.phase, `${where}: no phase`);
          answer = await c.wait(ref(), step.phase, { timeout: ms, after });
          break;
        case "watch":
          assert.ok(step.phase, `${where}: no phase`);
          answer = await watchFor(c, ref(), after, step.phase, ms);
          break;
        case "history":
          answer = await c.history(ref());
          break;
        default:
          assert.fail(`${where}: call ${step.call} is not in the format`);
      }
    } catch (err) {
      if (err instanceof assert.AssertionError) {
        throw err;
      }
      failure = err;
    }
    if (step.expect_error !== undefined) {
      assert.ok(failure !== undefined, `${where}: answered ${JSON.stringify(answer)}, want ${step.expect_error}`);
      assert.ok(failure instanceof TorporError, `${where}: ${String(failure)} is not a TorporError`);
      assert.equal(failure.code, step.expect_error, `${where}: ${failure.message}`);
      if (step.expect !== undefined) {
        holds(failure.view, step.expect, where); // the view a timed-out wait answered beside its error
      }
      continue;
    }
    if (failure !== undefined) {
      throw new Error(`${where}: ${String(failure)}`, { cause: failure });
    }
    if (step.expect !== undefined) {
      holds(answer, step.expect, where);
    }
    if (step.expect_same !== undefined) {
      const want = savedView(step.expect_same, where);
      const got = answer as View;
      assert.deepEqual({ id: got.id, seq: got.seq }, { id: want.id, seq: want.seq }, `${where}: not the same view as ${step.expect_same}`);
    }
    if (step.generation_above !== undefined) {
      const want = savedView(step.generation_above, where);
      assert.ok((answer as View).generation > want.generation, `${where}: generation ${(answer as View).generation}, want above ${want.generation}`);
    }
    if (step.expect_types !== undefined || step.expect_count !== undefined) {
      assert.equal(step.call, "history", `${where}: expect_types and expect_count are of history`);
      const types = (answer as HistoryEvent[]).map((e) => e.type);
      let at = 0;
      for (const t of step.expect_types ?? []) {
        const j = types.indexOf(t, at);
        assert.ok(j >= 0, `${where}: ${t} not in order in ${types.join(" ")}`);
        at = j + 1;
      }
      for (const [t, n] of Object.entries(step.expect_count ?? {})) {
        assert.equal(types.filter((x) => x === t).length, n, `${where}: ${t} in ${types.join(" ")}`);
      }
    }
    if (step.expect_ids !== undefined) {
      assert.equal(step.call, "list", `${where}: expect_ids is of list`);
      const got = (answer as View[]).map((v) => v.id).sort();
      const want = step.expect_ids.map((n) => savedView(n, where).id).sort();
      assert.deepEqual(got, want, `${where}: the list's sandboxes`);
    }
    if (step.as !== undefined) {
      saved.set(step.as, answer as View);
    }
  }
}
