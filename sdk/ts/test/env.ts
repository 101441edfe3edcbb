// The server the tests run against, from the environment that sdk/ts's Go
// test (services/node/servetest) sets: TORPOR_URL and a token of each scope.

import test from "node:test";
import { Client } from "../src/index.js";
import type { FetchLike } from "../src/index.js";

export const url = process.env["TORPOR_URL"] ?? "";
export const tokens = {
  write: process.env["TORPOR_WRITE_TOKEN"] ?? "",
  read: process.env["TORPOR_READ_TOKEN"] ?? "",
  admin: process.env["TORPOR_ADMIN_TOKEN"] ?? "",
};
export const deadlineSeconds = Number(process.env["TORPOR_DEADLINE_SECONDS"] ?? "0");

/**
 * Without a server the tests against one are skipped (npm test by hand),
 * and fail under CI=true: `go test ./sdk/ts` starts one.
 */
const skip = url === "" && process.env["CI"] !== "true" ? "no TORPOR_URL: go test ./sdk/ts runs these against a real torpor serve" : false;

/** serverTest is a test against the server, bounded by timeout ms. */
export function serverTest(name: string, fn: () => Promise<void>, timeout = 60_000): void {
  void test(name, { skip, timeout }, async () => {
    if (url === "") {
      throw new Error("TORPOR_URL is not set (CI=true): the tests against a server cannot run");
    }
    await fn();
  });
}

/** client is a client of the server with the token of scope ("none": no token). */
export function client(scope: keyof typeof tokens | "none" = "write", fetch?: FetchLike): Client {
  return new Client(url, { ...(scope === "none" ? {} : { token: tokens[scope] }), ...(fetch ? { fetch } : {}) });
}

/** run is a fresh lower-case id, so that names and labels of one run never meet another's. */
export function run(): string {
  const b = new Uint8Array(4);
  globalThis.crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
}
