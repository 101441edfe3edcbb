"""The scenarios every SDK runs (sdk/scenarios/scenarios.json; the format
is its README's), through this SDK, against a real torpor serve. The
expectations are the file's, written from the contract."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import unittest
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from support import ROOT, Env, server_env

import torpor

BOUND = 20.0  # seconds: every wait and watch unless timeout_seconds

# The fields of a step (the README's table): a field this runner does not
# know would be a check it skips, so it fails the scenario instead.
FIELDS = {"call", "token", "sandbox", "id", "body", "key", "phase", "after", "query", "as", "expect", "expect_same",
          "generation_above", "expect_error", "expect_types", "expect_count", "expect_ids", "timeout_seconds", "wait"}
CALLS = {"create", "get", "list", "start", "stop", "suspend", "resume", "delete", "wait", "watch", "history"}


def scenarios_path() -> Path:
    return Path(os.environ.get("TORPOR_SCENARIOS") or ROOT / ".." / "scenarios" / "scenarios.json")


def fill(v: Any, run: str) -> Any:
    """v with {run} replaced in every string."""
    if isinstance(v, str):
        return v.replace("{run}", run)
    if isinstance(v, dict):
        return {k: fill(x, run) for k, x in v.items()}
    if isinstance(v, list):
        return [fill(x, run) for x in v]
    return v


def holds(got: Any, want: Any, where: str) -> list[str]:
    """What of want got does not hold: every key of an object present and
    equal by this rule (objects and dataclasses alike), the rest exactly."""
    if isinstance(want, dict):
        out = []
        for k, w in want.items():
            if dataclasses.is_dataclass(got):
                if not hasattr(got, k):
                    out.append(f"{where}.{k}: missing from {type(got).__name__}")
                    continue
                g = getattr(got, k)
            elif isinstance(got, dict):
                if k not in got:
                    out.append(f"{where}.{k}: missing")
                    continue
                g = got[k]
            else:
                out.append(f"{where}: {got!r} is no object")
                continue
            out += holds(g, w, f"{where}.{k}")
        return out
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return [f"{where}: {got!r}, want {want!r}"]
        return [m for i, (g, w) in enumerate(zip(got, want)) for m in holds(g, w, f"{where}[{i}]")]
    if got != want or type(want) is bool and type(got) is not bool:
        return [f"{where}: {got!r}, want {want!r}"]
    return []


class Runner:
    """Runs one scenario's steps; a step that does not do what it says fails
    the test case at once."""

    def __init__(self, case: unittest.TestCase, env: Env) -> None:
        self.case = case
        self.env = env
        self.run = uuid.uuid4().hex[:8]
        self.saved: dict[str, torpor.View] = {}
        w = env.write
        head, _, secret = w.rpartition("_")
        forged = head + "_" + ("A" if secret[:1] != "A" else "B") + secret[1:]
        self.clients = {
            "write": torpor.Client(env.url, env.write), "read": torpor.Client(env.url, env.read),
            "admin": torpor.Client(env.url, env.admin), "none": torpor.Client(env.url), "forged": torpor.Client(env.url, forged),
        }

    def saved_view(self, name: str, i: int) -> torpor.View:
        if name not in self.saved:
            self.case.fail(f"step {i}: nothing saved as {name!r}")
        return self.saved[name]

    def step(self, i: int, st: dict[str, Any]) -> None:
        self.case.assertEqual(sorted(set(st) - FIELDS), [], f"step {i}: fields this runner does not know")
        self.case.assertIn(st.get("call"), CALLS, f"step {i}: a call this runner does not know")
        # README: in body, id, key and query; the file also puts it in an
        # expect (a name), so every string of the step gets it.
        st = fill(st, self.run)
        c = self.clients[st.get("token", "write")]
        call = st["call"]
        ref = st["id"] if "id" in st else self.saved_view(st["sandbox"], i).id if "sandbox" in st else ""
        key = f"{self.run}-{st['key']}" if "key" in st else None
        bound = float(st.get("timeout_seconds", BOUND))
        after = self.saved_view(st["after"], i).seq if "after" in st else 0
        what = f"step {i} ({call} {json.dumps(st)})"
        try:
            got = self.do(c, call, ref, st, key, after, bound, what)
        except torpor.TorporError as e:
            if "expect_error" not in st:
                self.case.fail(f"{what}: {type(e).__name__} {e}")
            want = st["expect_error"]
            self.case.assertEqual(e.code, want, f"{what}: {e}")
            self.case.assertIsInstance(e, torpor.ERRORS[want], f"{what}: {type(e).__name__}, want {torpor.ERRORS[want].__name__}")
            if "expect" in st:  # the view a timed-out wait answered beside its error
                self.case.assertIsInstance(e.view, torpor.View, f"{what}: no view with the error")
                self.case.assertEqual(holds(e.view, st["expect"], "view"), [], f"{what}: got {e.view}")
            return
        if "expect_error" in st:
            self.case.fail(f"{what}: answered {got!r}, want {st['expect_error']}")
        if isinstance(got, torpor.View):
            self.check_view(got, st, i, what)
        if "expect_types" in st:
            types = [e.type for e in got]
            it = iter(types)
            missing = [t for t in st["expect_types"] if t not in it]  # a subsequence, in order
            self.case.assertEqual(missing, [], f"{what}: history {types}")
        if "expect_count" in st:
            counts = Counter(e.type for e in got)
            self.case.assertEqual({t: counts[t] for t in st["expect_count"]}, st["expect_count"], f"{what}: history {[e.type for e in got]}")
        if "expect_ids" in st:
            want_ids = sorted(self.saved_view(n, i).id for n in st["expect_ids"])
            self.case.assertEqual(sorted(v.id for v in got), want_ids, what)

    def check_view(self, v: torpor.View, st: dict[str, Any], i: int, what: str) -> None:
        if "expect" in st:
            self.case.assertEqual(holds(v, st["expect"], "view"), [], f"{what}: got {v}")
        if "expect_same" in st:
            same = self.saved_view(st["expect_same"], i)
            self.case.assertEqual((v.id, v.seq), (same.id, same.seq), f"{what}: not the view saved as {st['expect_same']}")
        if "generation_above" in st:
            self.case.assertGreater(v.generation, self.saved_view(st["generation_above"], i).generation, what)
        if "as" in st:
            self.saved[st["as"]] = v

    def do(self, c: torpor.Client, call: str, ref: str, st: dict[str, Any], key: str | None, after: int, bound: float, what: str) -> Any:
        body = st.get("body") or {}
        # A command with wait answers its outcome (one round trip); timeout_seconds is then its wait's.
        w: dict[str, Any] = {"wait": True, "wait_timeout": st.get("timeout_seconds")} if st.get("wait") else {}
        if call == "create":
            return c.create(key=key, **body, **w)
        if call == "get":
            return c.get(ref)
        if call in ("start", "stop", "suspend", "delete"):
            return getattr(c, call)(ref, key=key, **w)
        if call == "resume":
            return c.resume(ref, key=key, **body, **w)
        if call == "wait":
            return c.wait(ref, st["phase"], timeout=bound, after=after)
        if call == "history":
            return c.history(ref)
        if call == "list":
            q = st.get("query") or {}
            return list(c.list_all(q.get("phase"), q.get("label")))
        if call == "watch":
            return self.watch(c, ref, st["phase"], after, bound, what)
        self.case.fail(f"{what}: unknown call {call!r}")

    def watch(self, c: torpor.Client, ref: str, phase: str, after: int, bound: float, what: str) -> torpor.View:
        last = after
        with c.watch(after=after, timeout=bound) as w:
            for v in w:
                if v.id != ref:
                    continue
                self.case.assertGreater(v.seq, last, f"{what}: a view twice, or out of order")
                last = v.seq
                if v.phase == phase:
                    return v
        self.case.fail(f"{what}: no view in {phase} within {bound}s (last seq {last})")


class Scenarios(unittest.TestCase):
    def test_scenarios(self) -> None:
        env = server_env()
        doc = json.loads(scenarios_path().read_text())
        self.assertEqual(doc.get("version"), 1)
        self.assertEqual(sorted(doc), ["scenarios", "version"])
        self.assertTrue(doc["scenarios"])
        for sc in doc["scenarios"]:
            self.assertEqual(sorted(sc), ["name", "steps"], sc.get("name"))
            with self.subTest(scenario=sc["name"]):
                r = Runner(self, env)
                t0 = time.monotonic()
                for i, st in enumerate(sc["steps"]):
                    r.step(i, st)
                print(f"\n  scenario ok in {time.monotonic() - t0:.2f}s: {sc['name']}", end="")


if __name__ == "__main__":
    unittest.main()
