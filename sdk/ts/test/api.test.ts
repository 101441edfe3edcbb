// The exported API only grows: every line of api.txt (the committed
// listing) is still produced from the compiled declarations, and every
// line produced is in api.txt (a new one is added with `npm run api`, in
// the change that adds it). As sdk/go/api_test.go does for Go.

import test from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

import { exportedAPI, readListing } from "./api.js";

void test("the exported API only grows (api.txt)", () => {
  const got = exportedAPI(fileURLToPath(new URL("../src/index.d.ts", import.meta.url)));
  const want = readListing(readFileSync(new URL("../../api.txt", import.meta.url), "utf8"));
  const gone = want.filter((l) => !got.includes(l));
  const added = got.filter((l) => !want.includes(l));
  assert.deepEqual(gone, [], "the SDK's API only grows: removed or changed since api.txt");
  assert.deepEqual(added, [], "exported API not in api.txt: run npm run api (and commit api.txt with it)");
});

void test("the listing shows each export, member and union member as a line of its own", () => {
  const dir = mkdtempSync(join(tmpdir(), "torpor-api-"));
  try {
    const file = join(dir, "index.d.ts");
    writeFileSync(
      file,
      `/** A class. */
export declare class T extends Error {
  #private;
  readonly a: number;
  private b;
  constructor(x: string);
  m(y?: number): Promise<string>;
}
export interface I { x: string; y?: number }
export type U = "a" | "b" | (string & {});
export type A = Record<string, number>;
export declare const K: { readonly One: "ONE" };
export declare const L: readonly ["p", "q"];
export declare const V: number;
export declare function f(a: string, b?: number): boolean;
declare function hidden(): void;
export { T as Renamed };
`,
    );
    assert.deepEqual(exportedAPI(file), [
      "class Renamed extends Error",
      "class T extends Error",
      "const K object",
      "const L [] \"p\"",
      "const L [] \"q\"",
      "const L tuple",
      "const V: number",
      "function f(a: string, b?: number): boolean",
      "interface I",
      "member I: x: string",
      "member I: y?: number",
      "member K: readonly One: \"ONE\"",
      "member Renamed: constructor(x: string)",
      "member Renamed: m(y?: number): Promise<string>",
      "member Renamed: readonly a: number",
      "member T: constructor(x: string)",
      "member T: m(y?: number): Promise<string>",
      "member T: readonly a: number",
      "type A = Record<string, number>",
      "type U union",
      "type U | \"a\"",
      "type U | \"b\"",
      "type U | (string & {})",
    ]);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
