// The phases of a sandbox (CONTRACT §1). The set is open: a server newer
// than this SDK may answer a phase not listed here, which comes through as
// its string; treat it as "other", never as an error.

/** The phases this SDK knows, in the contract's order. */
export const Phases = [
  "provisioning",
  "ready",
  "stopping",
  "stopped",
  "starting",
  "suspending",
  "suspended",
  "deleting",
  "deleted",
  "error",
] as const;

/** A phase this SDK knows. */
export type KnownPhase = (typeof Phases)[number];

/**
 * A sandbox's phase: one of the known ones, or any other string (a phase
 * added after this SDK). A `switch` over the known ones with a `default`
 * compiles and handles the rest.
 */
export type Phase =
  | "provisioning"
  | "ready"
  | "stopping"
  | "stopped"
  | "starting"
  | "suspending"
  | "suspended"
  | "deleting"
  | "deleted"
  | "error"
  | (string & {});

/** isKnownPhase reports whether p is one of the phases this SDK knows. */
export function isKnownPhase(p: string): p is KnownPhase {
  return (Phases as readonly string[]).includes(p);
}

/** The transient phases: each has a deadline (serve --deadline). */
export const TransientPhases: readonly KnownPhase[] = ["provisioning", "stopping", "starting", "suspending", "deleting"];

/** isTransient reports whether p is a transient phase (one with a deadline). */
export function isTransient(p: Phase): boolean {
  return (TransientPhases as readonly string[]).includes(p);
}

/** isTerminal reports whether p is a terminal phase: error or deleted. */
export function isTerminal(p: Phase): boolean {
  return p === "error" || p === "deleted";
}
