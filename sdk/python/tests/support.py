"""What the tests share: the SDK on sys.path, the server under test from the
environment, a canned server, and a proxy that drops answers."""

from __future__ import annotations

import http.client
import http.server
import json
import os
import socket
import ssl
import sys
import threading
import unittest
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import torpor  # noqa: E402


class Env:
    """The server the suites run against (services/node/servetest's Env)."""

    def __init__(self) -> None:
        self.url = os.environ["TORPOR_URL"]
        self.write = os.environ["TORPOR_WRITE_TOKEN"]
        self.read = os.environ["TORPOR_READ_TOKEN"]
        self.admin = os.environ["TORPOR_ADMIN_TOKEN"]

    def client(self, who: str = "write", url: str | None = None) -> torpor.Client:
        token = {"write": self.write, "read": self.read, "admin": self.admin, "none": None}[who]
        return torpor.Client(url or self.url, token=token)


def server_env(case: unittest.TestCase | None = None) -> Env:
    """The server under test; with none (TORPOR_URL unset) a loud skip, or
    a failure under CI=true."""
    if os.environ.get("TORPOR_URL"):
        return Env()
    msg = "no server: TORPOR_URL unset (sdk/python/python_test.go runs these against a real torpor serve)"
    if os.environ.get("CI") == "true":
        raise AssertionError(msg + ", and CI=true")
    print(f"\n*** SKIPPING: {msg} ***", file=sys.stderr)
    raise unittest.SkipTest("SKIPPING: " + msg)


class _Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that left: nothing to report


# A canned server: answers each request from a function of it.

Reply = tuple[int, str, bytes]  # status, content type, body


class Canned:
    """A local HTTP server whose answers a test writes: answer(method, path,
    headers, body) -> (status, content type, body), or None for no answer
    (the connection ends). It records each request."""

    def __init__(self, answer: Callable[[str, str, dict[str, str], bytes], Reply | None], tls: ssl.SSLContext | None = None) -> None:
        self.requests: list[tuple[str, str, dict[str, str], bytes]] = []
        canned = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _do(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                hdrs = {k.lower(): v for k, v in self.headers.items()}
                canned.requests.append((self.command, self.path, hdrs, body))
                reply = answer(self.command, self.path, hdrs, body)
                if reply is None:  # no answer: the connection just ends
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                status, ctype, data = reply
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _do

        self.httpd = _Quiet(("127.0.0.1", 0), H)
        scheme = "http"
        if tls is not None:
            self.httpd.socket = tls.wrap_socket(self.httpd.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def json_reply(status: int, v: Any) -> Reply:
    return status, "application/json", json.dumps(v).encode()


def error_reply(status: int, code: str, message: str = "canned") -> Reply:
    return json_reply(status, {"error": {"code": code, "message": message}})


# A proxy in front of the real server.


class Proxy:
    """A proxy to the server at upstream. drop(method, path) says whether to
    throw away an answer after the server gave it (the client then sees the
    connection close with no answer); dropped keeps those answers. A watch
    stream is cut after cut_watch_after events of its first connection;
    with replay, the next connection first sends again the last event sent
    before the cut (a duplicate the client must pass over)."""

    def __init__(self, upstream: str, drop: Callable[[str, str], bool] | None = None,
                 cut_watch_after: int = 0, replay: bool = False) -> None:
        u = upstream.split("://", 1)[1]
        host, port = u.rsplit(":", 1)
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.dropped: list[bytes] = []
        self._lock = threading.Lock()
        self._watches = 0
        self._last_event: bytes = b""
        proxy = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def _do(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else None
                hdrs = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection", "content-length")}
                with proxy._lock:
                    proxy.requests.append((self.command, self.path, {k.lower(): v for k, v in hdrs.items()}))
                up = http.client.HTTPConnection(host, int(port), timeout=120)
                up.request(self.command, self.path, body=body, headers=hdrs)
                resp = up.getresponse()
                if resp.getheader("Content-Type", "").startswith("text/event-stream"):
                    self._stream(up, resp)
                    return
                data = resp.read()
                up.close()
                if drop is not None and drop(self.command, self.path):
                    with proxy._lock:
                        proxy.dropped.append(data)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.getheader("Content-Type", ""))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, up: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
                with proxy._lock:
                    proxy._watches += 1
                    first = proxy._watches == 1
                    again = proxy._last_event
                self.close_connection = True
                self.send_response(resp.status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                sent, event = 0, b""
                try:
                    if not first and replay and again:
                        self.wfile.write(again)
                        self.wfile.flush()
                    while True:
                        line = resp.readline()
                        if not line:
                            return
                        self.wfile.write(line)
                        event += line
                        if line.strip() == b"":
                            self.wfile.flush()
                            sent += 1
                            with proxy._lock:
                                proxy._last_event = event
                            event = b""
                            if first and cut_watch_after and sent >= cut_watch_after:
                                self.connection.shutdown(socket.SHUT_RDWR)
                                return
                except OSError:
                    return
                finally:
                    up.close()

            do_GET = do_POST = do_DELETE = _do

        self.httpd = _Quiet(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def seen(self, method: str, path_part: str) -> list[dict[str, str]]:
        """The headers of the requests of method whose path has path_part."""
        with self._lock:
            return [h for m, p, h in self.requests if m == method and path_part in p]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
