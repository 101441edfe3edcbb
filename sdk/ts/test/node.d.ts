// The few Node APIs the tests use, declared here: the package's one
// dependency is typescript (no @types/node).

declare module "node:test" {
  interface TestContext {
    name: string;
    diagnostic(message: string): void;
    after(fn: () => unknown): void;
  }
  interface TestOptions {
    skip?: boolean | string;
    timeout?: number;
    concurrency?: number | boolean;
  }
  type TestFn = (t: TestContext) => unknown;
  function test(name: string, fn: TestFn): Promise<void>;
  function test(name: string, options: TestOptions, fn: TestFn): Promise<void>;
  export default test;
  export { test };
}

declare module "node:assert/strict" {
  function assert(value: unknown, message?: string): asserts value;
  namespace assert {
    class AssertionError extends Error {}
    function ok(value: unknown, message?: string): asserts value;
    function equal<T>(actual: unknown, expected: T, message?: string): asserts actual is T;
    function notEqual(actual: unknown, expected: unknown, message?: string): void;
    function deepEqual<T>(actual: unknown, expected: T, message?: string): asserts actual is T;
    function match(value: string, re: RegExp, message?: string): void;
    function fail(message?: string): never;
    function rejects(p: Promise<unknown> | (() => Promise<unknown>), expected?: unknown, message?: string): Promise<void>;
  }
  export default assert;
}

declare module "node:fs" {
  export function readFileSync(path: string | URL, encoding: "utf8"): string;
  export function writeFileSync(path: string | URL, data: string): void;
  export function existsSync(path: string | URL): boolean;
  export function mkdtempSync(prefix: string): string;
  export function rmSync(path: string, options?: { recursive?: boolean; force?: boolean }): void;
}

declare module "node:path" {
  export function join(...parts: string[]): string;
  export function resolve(...parts: string[]): string;
}

declare module "node:net" {
  interface AddressInfo {
    address: string;
    port: number;
  }
  interface Socket {
    write(data: string | Uint8Array): boolean;
    end(data?: string): void;
    on(event: "data", fn: (chunk: Uint8Array) => void): this;
    on(event: "error" | "close" | "end", fn: (...args: unknown[]) => void): this;
    setEncoding(enc: "utf8"): this;
    destroy(): void;
  }
  interface Server {
    listen(port: number, host: string, cb?: () => void): this;
    address(): AddressInfo | string | null;
    close(cb?: () => void): this;
  }
  export function createServer(onConnection: (s: Socket) => void): Server;
  export function connect(port: number, host: string, cb?: () => void): Socket;
}

declare module "node:os" {
  export function tmpdir(): string;
}

declare module "node:url" {
  export function fileURLToPath(url: string | URL): string;
}

declare const process: {
  env: Record<string, string | undefined>;
  argv: string[];
  exitCode: number | undefined;
  cwd(): string;
};
