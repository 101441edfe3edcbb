"""The client of one torpor server's HTTP API (CONTRACT §5)."""

from __future__ import annotations

import datetime
import http.client
import json
import math
import socket
import ssl
import time
import urllib.parse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ._errors import DeadlineExceeded, TorporError, Unavailable, answer_error, error_for, retryable
from ._model import Driver, Event, Forward, IdlePolicy, NewToken, Page, Phase, ReplayProgress, ServerInfo, TokenInfo, View, WhoAmI, parse_phase
from ._uuid import uuid7
from ._watch import Watch

__all__ = ["Client", "new_key", "ATTEMPTS"]

#: How many times a call is sent at most (the first and the retries).
ATTEMPTS = 5

# Backoff bounds of retries and reconnects, in seconds.
_MIN_BACKOFF = 0.05
_MAX_BACKOFF = 2.0
# A command's wait for its outcome (wait=True): the server's default and cap.
_DEFAULT_WAIT = 30.0
_MAX_POLL_MS = 10 * 60 * 1000

# The longest long poll of wait: the server takes up to 10m; shorter polls
# fare better behind proxies, and wait re-asks after each.
_MAX_POLL = 60.0


def new_key() -> str:
    """A fresh idempotency key: a uuid v7."""
    return str(uuid7())


class _NoAnswer(Exception):
    """A request that got no answer (refused, dropped, timed out): it may or
    may not have been done, so only a read or a keyed command is sent again."""

    def __init__(self, what: str, cause: BaseException) -> None:
        super().__init__(f"{what}: no answer: {cause!r}")
        self.timed_out = isinstance(cause, (TimeoutError, socket.timeout))

    def error(self) -> TorporError:
        if self.timed_out:
            return DeadlineExceeded("DEADLINE_EXCEEDED", None, str(self))
        return Unavailable("UNAVAILABLE", None, str(self))


class _Answer:
    """An HTTP answer, read whole."""

    def __init__(self, status: int, reason: str, headers: http.client.HTTPMessage, data: bytes) -> None:
        self.status, self.reason, self.headers, self.data = status, reason, headers, data


class Client:
    """The client of one torpor server's HTTP API.

    ``Client("http://127.0.0.1:8080", token=...)``: every request carries
    the token in its Authorization header (never in a URL). timeout bounds
    each request (seconds); wait and watch have their own. An https server
    is verified with ssl_context (None: the system's roots).

    Commands (create, start, stop, suspend, resume, delete, forwards) carry
    an idempotency key, a fresh uuid v7 unless ``key=`` is given, and are
    sent again under the same key when no answer came or the answer was
    UNAVAILABLE or ABORTED (with backoff, at most ATTEMPTS times): the
    server does each once. Errors are TorporError subclasses per contract
    code (``except torpor.FailedPrecondition``).

    A client holds no connection between calls and may be shared by
    threads. Sandboxes are named by id; get and logs also take a name.
    """

    #: The server's base URL, as given (http://127.0.0.1:8080).
    base_url: str
    #: The bearer token sent with every request (None: none).
    token: str | None
    #: How long one request may take, in seconds.
    timeout: float
    #: How an https server is verified (None: the system's roots); for a
    #: server whose certificate comes from a CA of your own (serve
    #: --tls-cert): ssl.create_default_context(cafile="ca.pem").
    ssl_context: ssl.SSLContext | None

    def __init__(self, base_url: str, token: str | None = None, timeout: float = 30.0, *, ssl_context: ssl.SSLContext | None = None) -> None:
        if "://" not in base_url:
            base_url = "http://" + base_url
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"torpor: base_url {base_url!r}: want http(s)://host:port")
        self.base_url: str = base_url.rstrip("/")
        self.token: str | None = token or None
        self.timeout: float = timeout
        self.ssl_context: ssl.SSLContext | None = ssl_context
        self._https = u.scheme == "https"
        self._host = u.hostname
        self._port = u.port or (443 if self._https else 80)
        self._prefix = u.path.rstrip("/")

    def with_token(self, token: str | None) -> Client:
        """A client like this one with another bearer token (None: none)."""
        return Client(self.base_url, token, self.timeout, ssl_context=self.ssl_context)

    def __repr__(self) -> str:
        return f"torpor.Client({self.base_url!r})"

    # The transport.

    def _connect(self, timeout: float | None) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self.ssl_context)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def _url(self, path: str, query: Mapping[str, Any] | None) -> str:
        url = self._prefix + path
        if query:
            q = {k: str(v) for k, v in query.items() if v is not None and v != ""}
            if q:
                url += "?" + urllib.parse.urlencode(q)
        return url

    def _headers(self, body: bytes | None, key: str | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": "torpor-python/0.1"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if body is not None:
            h["Content-Type"] = "application/json"
        if key:
            h["Idempotency-Key"] = key
        if extra:
            h.update(extra)
        return h

    def _once(self, method: str, url: str, body: bytes | None, key: str | None, timeout: float | None) -> _Answer:
        """Sends a request once and reads its answer; _NoAnswer if none came."""
        conn = self._connect(timeout)
        try:
            conn.request(method, url, body=body, headers=self._headers(body, key))
            resp = conn.getresponse()
            data = resp.read()
            return _Answer(resp.status, resp.reason, resp.headers, data)
        except (OSError, http.client.HTTPException) as e:
            raise _NoAnswer(f"{method} {self.base_url}{url}", e) from e
        finally:
            conn.close()

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        key: str | None = None,
        timeout: float | None = None,
    ) -> _Answer:
        """Sends a request, and sends it again (the same, under the same
        key) on no answer, UNAVAILABLE or ABORTED, backing off; raises the
        contract error of a failed answer. A change sent without a key
        (tokens, request() without key=) is not sent again on no answer:
        it may have been done."""
        url = self._url(path, query)
        data: bytes | None
        if body is None or isinstance(body, bytes):
            data = body
        else:
            data = json.dumps(body).encode()
        backoff = _MIN_BACKOFF
        for attempt in range(1, ATTEMPTS + 1):
            try:
                ans = self._once(method, url, data, key, timeout or self.timeout)
            except _NoAnswer as e:
                # It may have been done: a read or a keyed command is sent
                # again as it was; a change without a key (a token's) is not.
                if attempt == ATTEMPTS or (method != "GET" and not key):
                    raise e.error() from e
                err = Unavailable("UNAVAILABLE", None, str(e))
            else:
                if ans.status < 300:
                    return ans
                err = answer_error(ans.status, ans.reason, ans.data, f"{method} {path}")
                if isinstance(err.view, dict):
                    err.view = View.from_json(err.view)
            if attempt == ATTEMPTS or not retryable(err):
                raise err
            time.sleep(backoff)
            backoff = min(2 * backoff, _MAX_BACKOFF)
        raise AssertionError("unreachable")

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        ans = self._call(method, path, **kw)
        if not ans.data.strip():
            return None
        try:
            return json.loads(ans.data)
        except ValueError as e:
            raise TorporError("INTERNAL", ans.status, f"{method} {path}: decode answer: {e}") from e

    @staticmethod
    def _ref(ref: str) -> str:
        if not ref:
            raise ValueError("torpor: a sandbox id or name is needed")
        return urllib.parse.quote(ref, safe="")

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        key: str | None = None,
    ) -> Any:
        """Calls a route as it is (one this SDK does not wrap yet): body is
        sent as JSON (bytes as they are), the answer decoded from JSON, or
        as text when it is not JSON; errors and retries as every call."""
        ans = self._call(method, path, query=query, body=body, key=key)
        ctype = ans.headers.get("Content-Type", "")
        if ctype.startswith("application/json"):
            return json.loads(ans.data) if ans.data.strip() else None
        return ans.data.decode("utf-8", "replace")

    # Reads.

    def get(self, ref: str, at: int | str | datetime.datetime | None = None) -> View:
        """The view of a sandbox by id or name; at (a seq, an RFC 3339 time
        or a datetime) folds its log up to that point instead."""
        if isinstance(at, datetime.datetime):
            if at.tzinfo is None:
                at = at.replace(tzinfo=datetime.timezone.utc)
            at = at.isoformat()
        return View.from_json(self._json("GET", "/v1/sandboxes/" + self._ref(ref), query={"at": at}))

    def list(
        self,
        phase: Phase | str | None = None,
        label: str | None = None,
        limit: int | None = None,
        cursor: str | None = None,
        *,
        name: str | None = None,
        driver: str | None = None,
        node: str | None = None,
        sort: str | None = None,
    ) -> Page:
        """One page of sandboxes in creation order; phase, label ("k=v"),
        name, driver and node filter when set, sort orders where the server
        supports it; cursor is a former page's next."""
        q = {"phase": phase, "label": label, "limit": limit, "cursor": cursor, "name": name, "driver": driver, "node": node, "sort": sort}
        return Page.from_json(self._json("GET", "/v1/sandboxes", query=q))

    def list_all(
        self,
        phase: Phase | str | None = None,
        label: str | None = None,
        *,
        name: str | None = None,
        driver: str | None = None,
        node: str | None = None,
        sort: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[View]:
        """Every sandbox the filters match, page after page."""
        cursor: str | None = None
        while True:
            page = self.list(phase, label, page_size, cursor, name=name, driver=driver, node=node, sort=sort)
            yield from page.items
            if not page.next:
                return
            cursor = page.next

    def history(self, id: str, after: int = 0) -> list[Event]:
        """The audit history of a sandbox: its events after seq after."""
        out = self._json("GET", f"/v1/sandboxes/{self._ref(id)}/events", query={"after": after or None})
        items = out.get("items") if isinstance(out, dict) else None
        return [Event.from_json(e) for e in items] if isinstance(items, list) else []

    def phases(self) -> dict[Phase | str, int]:
        """The count of sandboxes in each phase (every phase is named)."""
        out = self._json("GET", "/v1/phases")
        if not isinstance(out, dict):
            return {}
        return {parse_phase(str(k)): int(v) for k, v in out.items() if isinstance(v, int)}

    def drivers(self) -> list[Driver]:
        """The server's drivers, each with its capabilities."""
        out = self._json("GET", "/v1/drivers")
        items = out.get("items") if isinstance(out, dict) else None
        return [Driver.from_json(d) for d in items] if isinstance(items, list) else []

    def logs(self, ref: str, tail: int = 100) -> str:
        """The last tail lines of a sandbox's workload output."""
        ans = self._call("GET", f"/v1/sandboxes/{self._ref(ref)}/logs", query={"tail": tail})
        return ans.data.decode("utf-8", "replace")

    def server(self) -> ServerInfo:
        """What the server is: its node, deadline and view (GET /v1/server)."""
        return ServerInfo.from_json(self._json("GET", "/v1/server"))

    def whoami(self) -> WhoAmI:
        """The name and scopes of the token this client sends (GET
        /v1/whoami)."""
        return WhoAmI.from_json(self._json("GET", "/v1/whoami"))

    def log_sandboxes(self) -> list[str]:
        """The id of every sandbox the server's log holds (GET
        /v1/log/sandboxes): read from the log, not from a view, deleted
        sandboxes too."""
        out = self._json("GET", "/v1/log/sandboxes")
        items = out.get("items") if isinstance(out, dict) else None
        return [str(i) for i in items] if isinstance(items, list) else []

    def replay(self, view: str, until: int | str | datetime.datetime | None = None, *, timeout: float | None = None) -> Iterator[ReplayProgress]:
        """Asks the server to rebuild a view ("kv" or "sql") from the log
        (POST /v1/replay, admin) and yields its progress as it streams, the
        last line's phase "done"; until (a seq, an RFC 3339 time or a
        datetime) builds a copy as of then, never swapped in. A refusal, or
        a "failed" line, is raised as its code's exception. The request goes
        out at the first next(), once: a rebuild has no idempotency key, so
        it is never sent again. Leaving the loop (closing the iterator) ends
        the request, which cancels the rebuild. timeout bounds each wait for
        a line (None: none, a rebuild may take long)."""
        body: dict[str, Any] = {"view": view}
        if isinstance(until, datetime.datetime):
            if until.tzinfo is None:
                until = until.replace(tzinfo=datetime.timezone.utc)
            until = until.isoformat()
        if until is not None:
            body["until"] = until
        path = "/v1/replay"
        url = self._url(path, None)
        data = json.dumps(body).encode()
        conn = self._connect(timeout)
        try:
            try:
                conn.request("POST", url, body=data, headers=self._headers(data, None))
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                raise _NoAnswer(f"POST {self.base_url}{url}", e).error() from e
            if resp.status >= 300:
                raise answer_error(resp.status, resp.reason, resp.read(), f"POST {path}")
            while True:
                try:
                    line = resp.readline()
                except (OSError, http.client.HTTPException) as e:
                    raise _NoAnswer(f"POST {self.base_url}{url}", e).error() from e
                if not line:
                    raise Unavailable("UNAVAILABLE", resp.status, f"POST {path}: the answer ended before the replay was done")
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except ValueError as e:
                    raise TorporError("INTERNAL", resp.status, f"POST {path}: decode answer: {e}") from e
                p = ReplayProgress.from_json(d)
                if p.phase == "failed":
                    why = p.raw.get("error")
                    why = why if isinstance(why, dict) else {}
                    raise error_for(str(why.get("code") or "INTERNAL"), resp.status, str(why.get("message") or "replay failed"))
                yield p
                if p.phase == "done":
                    return
        finally:
            conn.close()

    # Commands.

    def create(
        self,
        name: str | None = None,
        *,
        driver: str | None = None,
        driver_options: Mapping[str, str] | None = None,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        node: str | None = None,
        key: str | None = None,
        ttl: str | None = None,
        expires_at: str | None = None,
        on_expiry: str | None = None,
        retain_for: str | None = None,
        wake_on_traffic: bool = False,
        idle: IdlePolicy | None = None,
        ttl_pauses_while_suspended: bool = False,
        wait: bool = False,
        wait_timeout: float | None = None,
    ) -> View:
        """Creates a sandbox (provisioning; with wait=True, the view once it
        has settled: ready, or error). key is the idempotency key: a
        create sent again with it creates nothing more and answers the same
        sandbox; None makes a fresh one, which the retries reuse. ttl ("2h")
        or expires_at (RFC 3339), with on_expiry ("delete", "stop"), give it
        a time to live; retain_for how long a retained state is held.
        wake_on_traffic: a connection to one of its forwards while it is
        suspended resumes it. idle: its idle policy (the server's default
        when None). ttl_pauses_while_suspended: time spent suspended moves
        its expiry later (with ttl or expires_at)."""
        body: dict[str, Any] = {}
        for k, v in (("name", name), ("driver", driver), ("node", node), ("ttl", ttl), ("expires_at", expires_at),
                     ("on_expiry", on_expiry), ("retain_for", retain_for)):
            if v:
                body[k] = v
        for k, m in (("driver_options", driver_options), ("env", env), ("labels", labels)):
            if m:
                body[k] = dict(m)
        if command:
            body["command"] = list(command)
        if wake_on_traffic:
            body["wake_on_traffic"] = True
        if idle is not None:
            body["idle"] = idle.to_json()
        if ttl_pauses_while_suspended:
            body["ttl_pauses_while_suspended"] = True
        return self._command("POST", "/v1/sandboxes", body, key, wait, wait_timeout)

    def _command(self, method: str, path: str, body: Any, key: str | None, wait: bool, wait_timeout: float | None) -> View:
        """Sends a command; with wait, ?wait=true (one round trip: the view
        once its outcome is in it, DeadlineExceeded with .view at the
        timeout), the socket's timeout that of the wait and the client's."""
        if not wait:
            return View.from_json(self._json(method, path, body=body, key=key or new_key()))
        query: dict[str, Any] = {"wait": "true"}
        if wait_timeout is not None and wait_timeout > 0:
            query["timeout"] = f"{min(math.ceil(wait_timeout * 1000), _MAX_POLL_MS)}ms"
        sock = (wait_timeout if wait_timeout and wait_timeout > 0 else _DEFAULT_WAIT) + self.timeout
        return View.from_json(self._json(method, path, query=query, body=body, key=key or new_key(), timeout=sock))

    def _lifecycle(self, verb: str, id: str, body: Any, key: str | None, wait: bool = False, wait_timeout: float | None = None) -> View:
        return self._command("POST", f"/v1/sandboxes/{self._ref(id)}/{verb}", body, key, wait, wait_timeout)

    def start(self, id: str, *, key: str | None = None, wait: bool = False, wait_timeout: float | None = None) -> View:
        """Starts a stopped sandbox (cold), or a suspended one, discarding
        its retained state; on a ready one it does nothing more. wait=True
        answers the view once the command's outcome is in it, in the same
        request (wait_timeout seconds at most, the server's default 30 s;
        then DeadlineExceeded, whose .view is the sandbox as it is); so do
        every command's."""
        return self._lifecycle("start", id, None, key, wait, wait_timeout)

    def stop(self, id: str, *, key: str | None = None, wait: bool = False, wait_timeout: float | None = None) -> View:
        """Stops a ready sandbox; on a stopped one it does nothing more."""
        return self._lifecycle("stop", id, None, key, wait, wait_timeout)

    def suspend(self, id: str, *, key: str | None = None, wait: bool = False, wait_timeout: float | None = None) -> View:
        """Suspends a ready sandbox, keeping a retained state; a driver that
        cannot is Unimplemented."""
        return self._lifecycle("suspend", id, None, key, wait, wait_timeout)

    def resume(self, id: str, *, restart_if_restore_fails: bool = False, node: str | None = None, key: str | None = None,
               wait: bool = False, wait_timeout: float | None = None) -> View:
        """Resumes a suspended sandbox from its retained state: with
        restart_if_restore_fails a restore that fails after the state was
        consumed becomes a cold start; node resumes on another node, where
        the driver can move the state."""
        body: dict[str, Any] = {"restart_if_restore_fails": restart_if_restore_fails}
        if node:
            body["node"] = node
        return self._lifecycle("resume", id, body, key, wait, wait_timeout)

    def delete(self, id: str, *, key: str | None = None, wait: bool = False, wait_timeout: float | None = None) -> View:
        """Deletes a sandbox (deleting, then deleted)."""
        return self._command("DELETE", "/v1/sandboxes/" + self._ref(id), None, key, wait, wait_timeout)

    def touch(self, id: str, *, key: str | None = None) -> View:
        """Records activity of a sandbox (a sandbox.active, at most one per
        the server's activity window: a touch within it records nothing
        more) and answers its view, with last_active_at. A sandbox deleting,
        deleted or in error is FailedPrecondition."""
        return self._lifecycle("touch", id, None, key)

    def open_forward(self, id: str, port: int, listen: str = "127.0.0.1:0", *, key: str | None = None) -> Forward:
        """Opens a TCP forward from listen on torpor's host to port of the
        sandbox; the answer names the address bound."""
        body = {"listen": listen, "port": port}
        return Forward.from_json(self._json("POST", f"/v1/sandboxes/{self._ref(id)}/forwards", body=body, key=key or new_key()))

    def close_forward(self, id: str, forward_id: str, *, key: str | None = None) -> View:
        """Closes a forward; answers the sandbox's view."""
        path = f"/v1/sandboxes/{self._ref(id)}/forwards/{self._ref(forward_id)}"
        return View.from_json(self._json("DELETE", path, key=key or new_key()))

    # Wait and watch.

    def wait(self, id: str, phase: Phase | str, timeout: float | None = None, after: int = 0) -> View:
        """The view of a sandbox once it is in phase, at a seq above after
        (pass the seq a command answered, so that the view from before it
        does not count).

        It asks the server's long poll again after each poll's end (504)
        and after a dropped connection, until timeout (seconds; None: no
        end), then raises DeadlineExceeded. A sandbox that ends in another
        terminal phase is FailedPrecondition: it will never get there.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        path = f"/v1/sandboxes/{self._ref(id)}/wait"
        backoff = _MIN_BACKOFF
        last: TorporError | None = None
        while True:
            poll = _MAX_POLL
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    if isinstance(last, DeadlineExceeded):
                        raise last
                    raise DeadlineExceeded("DEADLINE_EXCEEDED", None, f"wait for {id} to be {phase}: not within {timeout}s" + (f" ({last.message})" if last else ""))
                poll = min(poll, left)
            ms = max(int(poll * 1000), 1)
            url = self._url(path, {"phase": str(phase), "timeout": f"{ms}ms", "after": after or None})
            try:
                ans = self._once("GET", url, None, None, poll + self.timeout)
            except _NoAnswer as e:
                last = Unavailable("UNAVAILABLE", None, str(e))
            else:
                if ans.status < 300:
                    return View.from_json(json.loads(ans.data))
                last = answer_error(ans.status, ans.reason, ans.data, f"GET {path}")
                if isinstance(last, DeadlineExceeded):
                    backoff = _MIN_BACKOFF
                    continue  # one poll is over; the deadline check above ends the wait
                if not retryable(last):
                    raise last
            pause = backoff if deadline is None else max(0.0, min(backoff, deadline - time.monotonic()))
            time.sleep(pause)
            backoff = min(2 * backoff, _MAX_BACKOFF)

    def watch(self, after: int = 0, *, timeout: float | None = None) -> Watch:
        """The view changes of every sandbox (GET /v1/watch, server-sent
        events), those with a seq above after (0: from every sandbox's
        current view on), as an iterator: ``for v in client.watch(): ...``.

        A dropped stream is resumed with Last-Event-ID (the seq of the last
        event received), and a view no newer than one already delivered of
        its sandbox is passed over: nothing is skipped, nothing comes twice.
        The iteration ends at close() (from any thread, or leaving a with
        block) or once timeout seconds have passed; an answer a retry cannot
        change (PermissionDenied, say) is raised.
        """
        return Watch(self, after, timeout)

    # Tokens (admin).

    def create_token(self, name: str, scopes: Sequence[str], expires: str | None = None) -> NewToken:
        """Makes a bearer token with scopes (read, write, admin); expires is
        a lifetime ("720h", "30d"). Its secret is in the answer only."""
        body: dict[str, Any] = {"name": name, "scopes": [str(s) for s in scopes]}
        if expires:
            body["expires"] = expires
        return NewToken.from_json(self._json("POST", "/v1/tokens", body=body))

    def tokens(self) -> list[TokenInfo]:
        """The server's tokens, without their secrets."""
        out = self._json("GET", "/v1/tokens")
        items = out.get("items") if isinstance(out, dict) else None
        return [TokenInfo.from_json(t) for t in items] if isinstance(items, list) else []

    def revoke_token(self, name: str) -> None:
        """Revokes the token named name: refused everywhere from then on."""
        self._call("DELETE", "/v1/tokens/" + self._ref(name))

