"""The SDK against canned answers (no torpor server needed): decoding of
what a newer server may send, errors, retries and the wait loop."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import unittest
import uuid

from support import Canned, Reply, error_reply, json_reply

import torpor

VIEW = {
    "id": "01900000-0000-7000-8000-000000000001", "name": "a", "phase": "ready", "generation": 2,
    "driver": "sim", "node": "local", "labels": {"k": "v"}, "restore": {"held": False, "consumed": True},
    "last_outcome": "restored", "exit_code": None, "reason": "", "updated_at": "2026-01-02T03:04:05.123456789Z", "seq": 7,
}


def view(**kw: object) -> dict[str, object]:
    v = dict(VIEW)
    v.update(kw)
    return v


class Served(unittest.TestCase):
    """A test with a canned server answering through self.answer."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        raise NotImplementedError

    def setUp(self) -> None:
        self.srv = Canned(lambda *a: self.answer(*a))
        self.addCleanup(self.srv.close)
        self.client = torpor.Client(self.srv.url, token="torpor_t_secret", timeout=5)


class Idle(Served):
    """Create's idle policy goes in the body as the server reads it; the
    view's comes back as an IdlePolicy, None when the view has none."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        sent = json.loads(body or b"{}")
        return json_reply(201, view(idle={"after": sent["idle"]["after"], "action": "suspend", "fallback": "stop"}))

    def test_create(self) -> None:
        v = self.client.create(idle=torpor.IdlePolicy(after="15m", fallback="stop"))
        self.assertEqual(v.idle, torpor.IdlePolicy(after="15m", action="suspend", fallback="stop"))
        self.assertIsNone(torpor.View.from_json(view()).idle)
        self.assertEqual(torpor.IdlePolicy(after="15m").to_json(), {"after": "15m"})


class UnknownPhase(Served):
    """A phase this SDK does not know ("hibernating") comes back as a plain
    str wherever a phase is, never an error (CONTRACT §1)."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        hib = view(phase="hibernating", brand_new_field={"x": 1})
        if path.split("?")[0] == "/v1/sandboxes":
            return json_reply(200, {"items": [hib, view()], "next": "", "total": 2})
        if path.endswith("/events"):
            return json_reply(200, {"items": [{"seq": 9, "type": "sandbox.hibernated", "phase": "hibernating", "data": {"z": 1}}]})
        if path == "/v1/phases":
            return json_reply(200, {"ready": 1, "hibernating": 3})
        if path == "/v1/watch":
            return 200, "text/event-stream", f"id: 7\ndata: {json.dumps(hib)}\n\n".encode()
        return json_reply(200, hib)

    def test_get(self) -> None:
        v = self.client.get("a")
        self.assertEqual(v.phase, "hibernating")
        self.assertIs(type(v.phase), str)
        self.assertNotIsInstance(v.phase, torpor.Phase)
        self.assertEqual(v.raw["brand_new_field"], {"x": 1})
        self.assertEqual((v.id, v.seq, v.generation, v.restore.consumed), (VIEW["id"], 7, 2, True))

    def test_list_history_phases_watch(self) -> None:
        page = self.client.list()
        self.assertEqual([v.phase for v in page.items], ["hibernating", torpor.Phase.READY])
        self.assertIs(page.items[1].phase, torpor.Phase.READY)
        self.assertEqual(page.total, 2)
        (e,) = self.client.history(str(VIEW["id"]))
        self.assertEqual((e.type, e.phase, e.data), ("sandbox.hibernated", "hibernating", {"z": 1}))
        self.assertEqual(self.client.phases(), {"ready": 1, "hibernating": 3})
        with self.client.watch(timeout=1) as w:
            got = next(w)
        self.assertEqual(got.phase, "hibernating")

    def test_match_with_default(self) -> None:
        # What user code does: match the known ones, a default for the rest.
        def kind(p: torpor.Phase | str) -> str:
            match p:
                case torpor.Phase.READY:
                    return "up"
                case torpor.Phase.SUSPENDED:
                    return "asleep"
                case _:
                    return "other"
        self.assertEqual([kind(self.client.get("a").phase), kind(torpor.parse_phase("ready"))], ["other", "up"])


class Errors(Served):
    """An error answer is the exception class of its code; a code unknown is
    a TorporError with that code."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        code = path.rsplit("/", 1)[1]
        if code == "TEAPOT":
            return error_reply(418, "TEAPOT", "short and stout")
        if code == "bare502":
            return 502, "text/plain", b"bad gateway"
        return error_reply(torpor_status[code], code, "canned " + code)

    def test_each_code(self) -> None:
        for code, cls in torpor.ERRORS.items():
            if code in ("UNAVAILABLE", "ABORTED"):
                continue  # retried: Retries has them
            with self.subTest(code=code):
                with self.assertRaises(cls) as cm:
                    self.client.get(code)
                e = cm.exception
                self.assertEqual((e.code, e.status, e.message), (code, torpor_status[code], "canned " + code))
                self.assertIsInstance(e, torpor.TorporError)

    def test_unknown_code(self) -> None:
        with self.assertRaises(torpor.TorporError) as cm:
            self.client.get("TEAPOT")
        self.assertIs(type(cm.exception), torpor.TorporError)
        self.assertEqual((cm.exception.code, cm.exception.status), ("TEAPOT", 418))

    def test_no_body(self) -> None:
        with self.assertRaises(torpor.Unavailable):
            self.client.get("bare502")
        self.assertEqual(len(self.srv.requests), torpor.ATTEMPTS)


torpor_status = {
    "INVALID_ARGUMENT": 400, "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
    "FAILED_PRECONDITION": 409, "ABORTED": 409, "ALREADY_EXISTS": 409, "RESOURCE_EXHAUSTED": 429,
    "UNIMPLEMENTED": 501, "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504, "INTERNAL": 500,
}


class Retries(Served):
    """A command answered UNAVAILABLE or ABORTED is sent again under the same
    idempotency key, a bounded number of times; other errors are not."""

    script: list[Reply]

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def keys(self) -> list[str]:
        return [h.get("idempotency-key", "") for _, _, h, _ in self.srv.requests]

    def test_same_key(self) -> None:
        self.script = [error_reply(503, "UNAVAILABLE"), error_reply(409, "ABORTED"), json_reply(202, view(phase="suspending"))]
        v = self.client.suspend(str(VIEW["id"]))
        self.assertEqual(v.phase, torpor.Phase.SUSPENDING)
        keys = self.keys()
        self.assertEqual(len(keys), 3)
        self.assertEqual(len(set(keys)), 1, keys)
        self.assertEqual(uuid.UUID(keys[0]).version, 7)

    def test_given_key(self) -> None:
        self.script = [error_reply(503, "UNAVAILABLE"), json_reply(201, view())]
        self.client.create(driver="sim", key="my-key")
        self.assertEqual(self.keys(), ["my-key", "my-key"])

    def test_bounded(self) -> None:
        self.script = [error_reply(503, "UNAVAILABLE")]
        with self.assertRaises(torpor.Unavailable):
            self.client.stop(str(VIEW["id"]))
        self.assertEqual(len(self.srv.requests), torpor.ATTEMPTS)

    def test_not_retried(self) -> None:
        self.script = [error_reply(409, "FAILED_PRECONDITION"), json_reply(202, view())]
        with self.assertRaises(torpor.FailedPrecondition):
            self.client.resume(str(VIEW["id"]))
        self.assertEqual(len(self.srv.requests), 1)

    def test_fresh_key_per_command(self) -> None:
        self.script = [json_reply(202, view())]
        self.client.start(str(VIEW["id"]))
        self.client.start(str(VIEW["id"]))
        keys = self.keys()
        self.assertEqual(len(keys), 2)
        self.assertNotEqual(keys[0], keys[1])

    def test_no_answer(self) -> None:
        # Nothing listens: no answer at all, retried, then Unavailable.
        c = torpor.Client("http://127.0.0.1:1", timeout=1)
        t0 = time.monotonic()
        with self.assertRaises(torpor.Unavailable) as cm:
            c.delete(str(VIEW["id"]))
        self.assertIsNone(cm.exception.status)
        self.assertGreater(time.monotonic() - t0, 0.05 * (2 ** (torpor.ATTEMPTS - 1) - 1) * 0.9, "no backoff between tries")


class NoAnswer(Served):
    """A request the server may have done but whose answer was lost is sent
    again when it is a read or a keyed command, never when it is a change
    without a key (a token made twice would be ALREADY_EXISTS)."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply | None:
        if len(self.srv.requests) == 1:
            return None
        if path == "/v1/tokens":
            return json_reply(201, {"name": "t", "scopes": ["read"], "token": "torpor_t_x"})
        return json_reply(200 if method == "GET" else 202, view())

    def test_keyed_command(self) -> None:
        self.client.suspend(str(VIEW["id"]))
        keys = [h.get("idempotency-key") for _, _, h, _ in self.srv.requests]
        self.assertEqual(len(keys), 2)
        self.assertEqual(keys[0], keys[1])

    def test_read(self) -> None:
        self.assertEqual(self.client.get("a").seq, 7)
        self.assertEqual(len(self.srv.requests), 2)

    def test_unkeyed_change(self) -> None:
        with self.assertRaises(torpor.Unavailable) as cm:
            self.client.create_token("t", ["read"])
        self.assertIsNone(cm.exception.status)
        self.assertEqual(len(self.srv.requests), 1)


class Wait(Served):
    """wait asks the long poll again when one poll ends (504) before its own
    deadline, and ends with DeadlineExceeded at it."""

    polls = 0

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        self.polls += 1
        if self.polls <= 2 or "never" in path:
            return error_reply(504, "DEADLINE_EXCEEDED", "did not reach ready")
        return json_reply(200, view())

    def test_reasks(self) -> None:
        v = self.client.wait(str(VIEW["id"]), torpor.Phase.READY, timeout=10, after=3)
        self.assertEqual(v.phase, torpor.Phase.READY)
        self.assertEqual(self.polls, 3)
        _, path, headers, _ = self.srv.requests[0]
        self.assertIn("phase=ready", path)
        self.assertIn("after=3", path)
        self.assertEqual(headers.get("authorization"), "Bearer torpor_t_secret")

    def test_deadline(self) -> None:
        t0 = time.monotonic()
        with self.assertRaises(torpor.DeadlineExceeded):
            self.client.wait("never", "ready", timeout=0.5)
        self.assertLess(time.monotonic() - t0, 5)


class CommandWait(Served):
    """A command with wait=True asks for its outcome in the same request
    (?wait=true, timeout= with wait_timeout); one without asks for none; a
    timed-out wait is DeadlineExceeded carrying the view, not sent again."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        if "/suspend" in path:
            return json_reply(504, {"error": {"code": "DEADLINE_EXCEEDED", "message": "no outcome"}, "view": view(phase="suspending", seq=9)})
        return json_reply(200, view(phase="stopped", seq=8))

    def test_query_and_timeout(self) -> None:
        v = self.client.stop("x", wait=True)
        self.assertEqual(v.phase, torpor.Phase.STOPPED)
        self.client.delete("x", wait=True, wait_timeout=1.5)
        self.client.create(wait=True, wait_timeout=1200)
        self.client.start("x")
        paths = [(m, p) for m, p, _, _ in self.srv.requests]
        self.assertEqual(paths, [("POST", "/v1/sandboxes/x/stop?wait=true"), ("DELETE", "/v1/sandboxes/x?wait=true&timeout=1500ms"),
                                 ("POST", "/v1/sandboxes?wait=true&timeout=600000ms"), ("POST", "/v1/sandboxes/x/start")])
        with self.assertRaises(torpor.DeadlineExceeded) as cm:
            self.client.suspend("x", wait=True, wait_timeout=0.3)
        self.assertIsInstance(cm.exception.view, torpor.View)
        self.assertEqual((cm.exception.view.phase, cm.exception.view.seq), (torpor.Phase.SUSPENDING, 9))
        self.assertEqual(len(self.srv.requests), 5)


class WatchStream(Served):
    """The watch parses the stream by hand: ids, multi-line data, comments;
    it passes over a view no newer than one delivered of its sandbox."""

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        a1, a2, b1 = view(seq=10), view(seq=12, phase="suspending"), view(id="b", seq=11)
        data2 = json.dumps(a2, indent=1).replace("\n", "\ndata: ")
        stream = (f": hello\n\nid: 10\ndata: {json.dumps(a1)}\n\nid: 11\r\ndata: {json.dumps(b1)}\r\n\r\n"
                  f"id: 10\ndata: {json.dumps(a1)}\n\nid: 12\ndata: {data2}\n\nid: 13\ndata: {{\"id\":\"a\"")
        return 200, "text/event-stream", stream.encode()

    def test_stream(self) -> None:
        with self.client.watch(after=5, timeout=1) as w:
            got = [(v.id, v.seq) for v in w]
        self.assertEqual(got, [(VIEW["id"], 10), ("b", 11), (VIEW["id"], 12)])
        # Reconnected after the stream ended, from the last event's id.
        self.assertGreaterEqual(len(self.srv.requests), 2)
        self.assertEqual(self.srv.requests[0][2].get("last-event-id"), "5")
        self.assertEqual(self.srv.requests[1][2].get("last-event-id"), "12")
        self.assertEqual(self.srv.requests[1][2].get("authorization"), "Bearer torpor_t_secret")
        self.assertNotIn("torpor_t_secret", self.srv.requests[1][1])

    def test_close_from_another_thread(self) -> None:
        slow = Canned(lambda *a: (time.sleep(0.2), (200, "text/event-stream", b": nothing\n\n"))[1])
        self.addCleanup(slow.close)
        w = torpor.Client(slow.url).watch()
        threading.Timer(0.5, w.close).start()
        t0 = time.monotonic()
        self.assertEqual(list(w), [])
        self.assertLess(time.monotonic() - t0, 5)


class ReplayStream(Served):
    """replay yields the progress lines as they come and raises a failed
    line as its code's exception; an answer that ends before done is
    Unavailable. It is sent once, with the body as given."""

    lines: list[dict[str, object]] = []

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Reply:
        return 200, "application/x-ndjson", b"".join(json.dumps(x).encode() + b"\n" for x in self.lines)

    def test_failed(self) -> None:
        self.lines = [{"view": "kv", "phase": "fold", "done": 3, "total": 9},
                      {"view": "kv", "phase": "failed", "done": 3, "total": 9,
                       "error": {"code": "FAILED_PRECONDITION", "message": "the log moved"}}]
        got = []
        with self.assertRaises(torpor.FailedPrecondition) as cm:
            for p in self.client.replay("kv", until="2026-01-02T03:04:05Z"):
                got.append((p.phase, p.done, p.total))
        self.assertEqual(got, [("fold", 3, 9)])
        self.assertEqual(cm.exception.message, "the log moved")
        self.assertEqual([(m, p, json.loads(b)) for m, p, _, b in self.srv.requests],
                         [("POST", "/v1/replay", {"view": "kv", "until": "2026-01-02T03:04:05Z"})])

    def test_cut(self) -> None:
        self.lines = [{"view": "sql", "phase": "write", "done": 1, "total": 2}]
        it = self.client.replay("sql")
        self.assertEqual(next(it).phase, "write")
        with self.assertRaises(torpor.Unavailable):
            next(it)
        self.assertEqual(len(self.srv.requests), 1)

    def test_done(self) -> None:
        self.lines = [{"view": "kv", "phase": "swap", "done": 5, "total": 5},
                      {"view": "kv", "phase": "done", "done": 5, "total": 5, "seq": 5, "target": "b", "events": 5, "elapsed_ms": 12},
                      {"view": "kv", "phase": "after done", "done": 0, "total": 0}]
        got = list(self.client.replay("kv", until=5))
        self.assertEqual([(p.phase, p.seq, p.target, p.events, p.elapsed_ms) for p in got], [("swap", 0, "", 0, 0), ("done", 5, "b", 5, 12)])
        self.assertEqual(json.loads(self.srv.requests[0][3]), {"view": "kv", "until": 5})


class TLS(unittest.TestCase):
    """An https server is verified: with ssl_context trusting its
    certificate the client talks to it, with the system's roots it is
    refused by the client's own verification."""

    def test_verified(self) -> None:
        openssl = shutil.which("openssl")
        if openssl is None:
            msg = "SKIPPING: openssl is missing (it makes the test's certificate)"
            if os.environ.get("CI") == "true":
                self.fail(msg)
            self.skipTest(msg)
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d)
        cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
        subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                       check=True, capture_output=True)
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.load_cert_chain(cert, key)
        srv = Canned(lambda *a: json_reply(200, view()), tls=server)
        self.addCleanup(srv.close)
        self.assertTrue(srv.url.startswith("https://"))
        c = torpor.Client(srv.url, "torpor_t_secret", timeout=5, ssl_context=ssl.create_default_context(cafile=cert))
        self.assertEqual(c.get("a").seq, 7)
        self.assertEqual(c.with_token("torpor_u_secret").get("a").seq, 7)
        self.assertEqual(srv.requests[-1][2].get("authorization"), "Bearer torpor_u_secret")
        with self.assertRaises(torpor.Unavailable) as cm:
            torpor.Client(srv.url, timeout=5).get("a")
        self.assertIn("CERTIFICATE_VERIFY_FAILED", cm.exception.message)


class Unit(unittest.TestCase):
    def test_uuid7(self) -> None:
        a, b = torpor.uuid7(), torpor.uuid7()
        self.assertEqual((a.version, a.variant), (7, uuid.RFC_4122))
        self.assertNotEqual(a, b)
        ms = a.int >> 80
        self.assertLess(abs(ms - time.time() * 1000), 5000)

    def test_parse_phase(self) -> None:
        self.assertIs(torpor.parse_phase("suspended"), torpor.Phase.SUSPENDED)
        self.assertEqual(torpor.parse_phase("hibernating"), "hibernating")
        self.assertEqual(torpor.Phase.READY, "ready")
        self.assertEqual(str(torpor.Phase.READY), "ready")

    def test_parse_events(self) -> None:
        lines = [b"id: 1\n", b"data: a\n", b"data: b\n", b"\n", b": c\n", b"retry: 5\n", b"data:x\n", b"\n", b"id: 3\n", b"\n"]
        self.assertEqual(list(torpor.parse_events(lines)), [("1", "a\nb"), ("", "x")])


if __name__ == "__main__":
    unittest.main()
