"""The SDK against a real torpor serve (TORPOR_URL and the tokens of
services/node/servetest): every verb, the typed errors the server answers, the
retries under one key through a proxy that drops answers, and a watch
resumed after a drop. Expectations come from CONTRACT §1–§6."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import unittest
import uuid
from collections import Counter

from support import Env, Proxy, server_env

import torpor

WAIT = 20.0  # seconds: every wait is bounded


def run_id() -> str:
    return uuid.uuid4().hex[:8]


class Server(unittest.TestCase):
    env: Env
    c: torpor.Client

    @classmethod
    def setUpClass(cls) -> None:
        cls.env = server_env()
        cls.c = cls.env.client("write")

    def ready(self, **kw: object) -> torpor.View:
        v = self.c.create(driver="sim", **kw)  # type: ignore[arg-type]
        return self.c.wait(v.id, torpor.Phase.READY, timeout=WAIT)


class Verbs(Server):
    def test_lifecycle(self) -> None:
        run = run_id()
        name = f"py-{run}"
        v = self.c.create(name, driver="sim", labels={"run": run}, driver_options={"latency": "0s"})
        self.assertEqual((v.name, v.phase, v.driver, v.labels), (name, torpor.Phase.PROVISIONING, "sim", {"run": run}))
        uuid.UUID(v.id)
        r = self.c.wait(v.id, torpor.Phase.READY, timeout=WAIT)
        self.assertGreater(r.seq, v.seq)
        self.assertEqual(self.c.get(name).id, v.id)  # by name
        self.assertEqual(self.c.get(v.id, at=v.seq).phase, torpor.Phase.PROVISIONING)  # the past
        self.assertEqual(self.c.get(v.id, at=r.updated_at).seq, r.seq)
        # A touch records activity, once per the server's window (README "Activity").
        t = self.c.touch(v.id)
        self.assertGreater(t.seq, r.seq)
        self.assertNotEqual(t.last_active_at, "")
        again = self.c.touch(v.id)
        self.assertEqual((again.seq, again.last_active_at), (t.seq, t.last_active_at))
        with self.assertRaises(torpor.NotFound):
            self.c.touch("01900000-0000-7000-8000-000000000000")

        s = self.c.suspend(v.id)
        self.assertEqual(s.phase, torpor.Phase.SUSPENDING)
        s = self.c.wait(v.id, "suspended", timeout=WAIT, after=s.seq)
        self.assertEqual((s.restore.held, s.restore.consumed), (True, False))
        s = self.c.resume(v.id, restart_if_restore_fails=True)
        self.assertEqual(s.phase, torpor.Phase.STARTING)
        s = self.c.wait(v.id, torpor.Phase.READY, timeout=WAIT, after=s.seq)
        self.assertEqual(s.last_outcome, "restored")
        self.assertGreater(s.generation, r.generation)
        s = self.c.stop(v.id)
        self.assertEqual(s.phase, torpor.Phase.STOPPING)
        self.c.wait(v.id, torpor.Phase.STOPPED, timeout=WAIT)
        self.assertEqual(self.c.start(v.id).phase, torpor.Phase.STARTING)
        self.c.wait(v.id, torpor.Phase.READY, timeout=WAIT)

        page = self.c.list(label=f"run={run}")
        self.assertEqual([x.id for x in page.items], [v.id])
        self.assertEqual(page.next, "")
        self.assertEqual([x.id for x in self.c.list(torpor.Phase.READY, f"run={run}", limit=5).items], [v.id])
        self.assertEqual(self.c.list(torpor.Phase.SUSPENDED, f"run={run}").items, [])
        self.assertEqual([x.id for x in self.c.list_all(label=f"run={run}", page_size=1)], [v.id])

        hist = self.c.history(v.id)
        types = [e.type for e in hist]
        for t in ["sandbox.created", "sandbox.suspend_requested", "sandbox.suspended", "sandbox.resume_requested",
                  "sandbox.resumed", "sandbox.stop_requested", "sandbox.stopped", "sandbox.start_requested"]:
            self.assertIn(t, types)
        self.assertEqual([e.seq for e in hist], sorted(e.seq for e in hist))
        self.assertTrue(all(e.actor.startswith("token:") for e in hist if e.type.endswith("_requested")))
        self.assertEqual([e.seq for e in self.c.history(v.id, after=hist[-2].seq)], [hist[-1].seq])

        d = self.c.delete(v.id)
        self.assertEqual(d.phase, torpor.Phase.DELETING)
        self.assertEqual(self.c.wait(v.id, torpor.Phase.DELETED, timeout=WAIT).phase, torpor.Phase.DELETED)

    def test_reads(self) -> None:
        v = self.ready()
        counts = self.c.phases()
        self.assertEqual(set(counts), set(torpor.Phase))  # every phase, all known here
        self.assertGreaterEqual(counts[torpor.Phase.READY], 1)
        drivers = {d.name: d for d in self.c.drivers()}
        self.assertIn("sim", drivers)
        self.assertTrue(drivers["sim"].capabilities.suspend)
        info = self.c.server()
        if "TORPOR_DEADLINE_SECONDS" in os.environ:  # servetest's serve --deadline
            self.assertEqual(info.deadline_seconds, float(os.environ["TORPOR_DEADLINE_SECONDS"]))
        self.assertGreater(info.deadline_seconds, 0)
        self.assertIn(info.read_from, ("kv", "sql"))
        self.assertIsInstance(self.c.logs(v.id, tail=10), str)

    def test_tokens(self) -> None:
        admin = self.env.client("admin")
        name = f"py-{run_id()}"
        t = admin.create_token(name, [torpor.Scope.READ], expires="1h")
        self.assertTrue(t.token.startswith(f"torpor_{name}_"))
        self.assertEqual((t.name, t.scopes), (name, ["read"]))
        self.assertIsNotNone(t.expires_at)
        listed = {x.name: x for x in admin.tokens()}
        self.assertEqual(listed[name].scopes, ["read"])
        self.assertNotIn(t.token, repr(listed[name].raw))
        mine = torpor.Client(self.env.url, t.token)
        mine.phases()
        with self.assertRaises(torpor.PermissionDenied):
            mine.create(driver="sim")
        admin.revoke_token(name)
        with self.assertRaises(torpor.Unauthenticated):
            mine.phases()
        with self.assertRaises(torpor.NotFound):
            admin.revoke_token(name + "-none")
        admin.create_token(name + "x", ["read"])
        with self.assertRaises(torpor.AlreadyExists):
            admin.create_token(name + "x", ["read"])
        admin.revoke_token(name + "x")

    def test_forward(self) -> None:
        # A port "in the sandbox": the sim driver dials where ports= says.
        ln = socket.create_server(("127.0.0.1", 0))
        self.addCleanup(ln.close)
        port = ln.getsockname()[1]

        def echo() -> None:
            while True:  # the server dials once to see that the port answers
                try:
                    conn, _ = ln.accept()
                except OSError:
                    return
                with conn:
                    conn.settimeout(WAIT)
                    try:
                        conn.sendall(b"hello " + conn.recv(100))
                    except OSError:
                        pass

        threading.Thread(target=echo, daemon=True).start()
        v = self.ready(driver_options={"ports": f"8000=127.0.0.1:{port}"})
        f = self.c.open_forward(v.id, 8000)
        self.assertEqual((f.port, f.listen), (8000, "127.0.0.1:0"))
        # forward_opened moves no phase, but the view's seq (reads lag: wait).
        w = self.c.wait(v.id, torpor.Phase.READY, timeout=WAIT, after=v.seq)
        self.assertEqual([(x.id, x.address, x.port) for x in w.forwards], [(f.id, f.address, 8000)])
        host, p = f.address.rsplit(":", 1)
        with socket.create_connection((host, int(p)), timeout=WAIT) as s:
            s.sendall(b"py")
            self.assertEqual(s.recv(100), b"hello py")
        after = self.c.close_forward(v.id, f.id)
        self.assertEqual(after.forwards, [])
        with self.assertRaises(torpor.NotFound):
            self.c.close_forward(v.id, "no-such-forward")
        with self.assertRaises(torpor.FailedPrecondition):  # nothing mapped on 9
            self.c.open_forward(v.id, 9)

    def test_raw_request(self) -> None:
        self.assertEqual(self.c.request("GET", "/healthz"), {"status": "ok"})


class TypedErrors(Server):
    """What the server refuses comes as the exception class of its code."""

    def test_wrong_phase(self) -> None:
        v = self.ready()
        with self.assertRaises(torpor.FailedPrecondition) as cm:
            self.c.resume(v.id)
        self.assertEqual((cm.exception.code, cm.exception.status), ("FAILED_PRECONDITION", 409))
        self.assertEqual(self.c.get(v.id).seq, v.seq)  # moved nothing

    def test_unknown(self) -> None:
        for call in (lambda: self.c.get("01900000-0000-7000-8000-000000000000"),
                     lambda: self.c.get(f"no-such-{run_id()}"),
                     lambda: self.c.stop("01900000-0000-7000-8000-000000000000"),
                     lambda: self.c.history("01900000-0000-7000-8000-000000000000"),
                     lambda: self.c.wait("01900000-0000-7000-8000-000000000000", "ready", timeout=5),
                     lambda: self.c.request("GET", "/v1/no-such-route")):
            with self.assertRaises(torpor.NotFound) as cm:
                call()
            self.assertEqual(cm.exception.status, 404)

    def test_scopes(self) -> None:
        with self.assertRaises(torpor.PermissionDenied) as cm:
            self.env.client("read").create(driver="sim")
        self.assertEqual(cm.exception.status, 403)
        with self.assertRaises(torpor.PermissionDenied):
            self.c.create_token(f"py-{run_id()}", ["read"])  # write is not admin
        with self.assertRaises(torpor.Unauthenticated) as cm2:
            self.env.client("none").phases()
        self.assertEqual(cm2.exception.status, 401)
        with self.assertRaises(torpor.Unauthenticated):
            torpor.Client(self.env.url, self.env.write[:-4] + "AAAA").phases()

    def test_bad_bodies(self) -> None:
        with self.assertRaises(torpor.InvalidArgument):
            self.c.create(driver="sim", labels={"big": "x" * (300 << 10)})  # over 256 KiB
        with self.assertRaises(torpor.InvalidArgument):
            self.c.request("POST", "/v1/sandboxes", body={"driver": "sim", "no_such_field": 1})
        with self.assertRaises(torpor.InvalidArgument):
            self.c.request("POST", "/v1/sandboxes", body=b"{not json")
        with self.assertRaises(torpor.InvalidArgument):
            self.c.create(driver="sim", driver_options={"suspend": "sometimes"})
        with self.assertRaises(torpor.InvalidArgument):
            self.c.list(phase="hibernating")

    def test_already_exists(self) -> None:
        name = f"py-{run_id()}"
        self.c.create(name, driver="sim")
        with self.assertRaises(torpor.AlreadyExists):
            self.c.create(name, driver="sim")

    def test_wait_ends_elsewhere(self) -> None:
        v = self.ready()
        self.c.delete(v.id)
        with self.assertRaises(torpor.FailedPrecondition):
            self.c.wait(v.id, torpor.Phase.SUSPENDED, timeout=WAIT, after=v.seq)

    def test_wait_deadline(self) -> None:
        v = self.ready()
        t0 = time.monotonic()
        with self.assertRaises(torpor.DeadlineExceeded):
            self.c.wait(v.id, torpor.Phase.STOPPED, timeout=1.5)
        self.assertLess(time.monotonic() - t0, 10)


class Retried(Server):
    """A command whose answer was lost after the server did it is sent again
    under the same key: the same answer, one command in the log (CONTRACT
    §1 invariant 4)."""

    def test_create(self) -> None:
        run = run_id()
        proxy = Proxy(self.env.url, drop=lambda m, p: m == "POST" and p == "/v1/sandboxes" and not proxy.dropped)
        self.addCleanup(proxy.close)
        c = torpor.Client(proxy.url, self.env.write)
        v = c.create(driver="sim", labels={"run": run})
        sent = proxy.seen("POST", "/v1/sandboxes")
        self.assertEqual(len(sent), 2)
        self.assertEqual(len(proxy.dropped), 1)
        self.assertTrue(sent[0]["idempotency-key"])
        self.assertEqual(sent[0]["idempotency-key"], sent[1]["idempotency-key"])
        first = torpor.View.from_json(json.loads(proxy.dropped[0]))
        self.assertEqual((v.id, v.seq), (first.id, first.seq))
        self.assertEqual([x.id for x in self.c.list_all(label=f"run={run}")], [v.id])
        self.assertEqual(Counter(e.type for e in self.c.history(v.id))["sandbox.created"], 1)

    def test_suspend(self) -> None:
        v = self.ready()
        proxy = Proxy(self.env.url, drop=lambda m, p: m == "POST" and p.endswith("/suspend") and not proxy.dropped)
        self.addCleanup(proxy.close)
        c = torpor.Client(proxy.url, self.env.write)
        s = c.suspend(v.id)
        sent = proxy.seen("POST", "/suspend")
        self.assertEqual(len(sent), 2)
        self.assertEqual(sent[0]["idempotency-key"], sent[1]["idempotency-key"])
        first = torpor.View.from_json(json.loads(proxy.dropped[0]))
        self.assertEqual((s.id, s.seq, s.phase), (first.id, first.seq, first.phase))
        self.c.wait(v.id, torpor.Phase.SUSPENDED, timeout=WAIT)
        counts = Counter(e.type for e in self.c.history(v.id))
        self.assertEqual((counts["sandbox.suspend_requested"], counts["sandbox.suspended"]), (1, 1))


class WatchResume(Server):
    """A watch whose stream drops resumes from the last event's seq
    (Last-Event-ID, in a header) and delivers no view twice."""

    def test_resume_after_drop(self) -> None:
        v = self.ready()
        s = self.c.suspend(v.id)
        s = self.c.wait(v.id, torpor.Phase.SUSPENDED, timeout=WAIT, after=s.seq)
        # The first connection sends the one view changed after v.seq (the
        # suspended one), then the proxy cuts it; the resume comes after,
        # so its views can only come through the second connection, which
        # the proxy starts with the suspended view again (a duplicate).
        proxy = Proxy(self.env.url, cut_watch_after=1, replay=True)
        self.addCleanup(proxy.close)
        c = torpor.Client(proxy.url, self.env.write)
        got: list[torpor.View] = []
        with c.watch(after=v.seq, timeout=WAIT) as w:
            for x in w:
                if x.id != v.id:
                    continue
                got.append(x)
                if x.phase == torpor.Phase.SUSPENDED:
                    self.c.resume(v.id)
                if x.phase == torpor.Phase.READY:
                    break
        self.assertEqual((got[0].phase, got[0].seq), (torpor.Phase.SUSPENDED, s.seq))
        self.assertEqual(got[-1].phase, torpor.Phase.READY, [(x.phase, x.seq) for x in got])
        self.assertEqual(got[-1].last_outcome, "restored")
        seqs = [x.seq for x in got]
        self.assertEqual(seqs, sorted(set(seqs)), "a view twice or out of order")
        watches = proxy.seen("GET", "/v1/watch")
        self.assertGreaterEqual(len(watches), 2, "the stream was never cut")
        self.assertEqual(watches[0].get("last-event-id"), str(v.seq))
        self.assertEqual(watches[1].get("last-event-id"), str(s.seq))
        for h in watches:
            self.assertEqual(h.get("authorization"), "Bearer " + self.env.write)
        self.assertEqual([p for m, p, _ in proxy.requests if m == "GET" and "watch" in p], ["/v1/watch"] * len(watches))

    def test_scope(self) -> None:
        with self.assertRaises(torpor.Unauthenticated):
            next(self.env.client("none").watch(timeout=5))


class Whoami(Server):
    """whoami names the token a client sends and its scopes (servetest's
    tokens: servetest-read with read, servetest-write with read and write,
    the admin token with admin; a token's name is in its secret)."""

    def test_whoami(self) -> None:
        for who, scopes in (("read", ["read"]), ("write", ["read", "write"]), ("admin", ["admin"])):
            secret = {"read": self.env.read, "write": self.env.write, "admin": self.env.admin}[who]
            me = self.env.client(who).whoami()
            self.assertEqual((me.name, me.scopes), (secret[len("torpor_"):-44], scopes), who)
        with self.assertRaises(torpor.Unauthenticated):
            self.env.client("none").whoami()


class LogSandboxes(Server):
    """log_sandboxes lists the sandboxes of the log, a deleted one too."""

    def test_log_sandboxes(self) -> None:
        v = self.ready()
        self.c.delete(v.id)
        self.c.wait(v.id, torpor.Phase.DELETED, timeout=WAIT)
        ids = self.env.client("read").log_sandboxes()
        self.assertIn(v.id, ids)
        self.assertTrue(all(isinstance(i, str) for i in ids))
        with self.assertRaises(torpor.Unauthenticated):
            self.env.client("none").log_sandboxes()


class Replay(Server):
    """replay rebuilds the KV view (admin) and yields its progress to done;
    with until, a copy as of that seq."""

    def test_replay(self) -> None:
        admin = self.env.client("admin")
        self.ready()
        lines = list(admin.replay("kv"))
        self.assertGreaterEqual(len(lines), 1)
        done = lines[-1]
        self.assertEqual((done.phase, done.view), ("done", "kv"), lines)
        self.assertGreater(done.seq, 1)
        self.assertNotEqual(done.target, "")
        self.assertTrue(all(p.view == "kv" and p.phase != "done" for p in lines[:-1]), lines)
        copy = list(admin.replay("kv", until=1))[-1]
        self.assertEqual((copy.phase, copy.seq), ("done", 1), copy)
        self.assertNotEqual(copy.target, done.target, "a copy is never swapped in")

    def test_refused(self) -> None:
        with self.assertRaises(torpor.PermissionDenied) as cm:
            next(self.c.replay("kv"))  # write is not admin
        self.assertEqual(cm.exception.status, 403)
        admin = self.env.client("admin")
        with self.assertRaises(torpor.InvalidArgument):
            next(admin.replay("nope"))
        with self.assertRaises(torpor.InvalidArgument):
            next(admin.replay("kv", until=0))  # the log starts at 1


if __name__ == "__main__":
    unittest.main()
