"""The watch stream (GET /v1/watch): server-sent events read by hand."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Generator, Iterable, Iterator
from typing import TYPE_CHECKING

from ._errors import TorporError, answer_error, retryable
from ._model import View

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["Watch", "parse_events"]

_MIN_BACKOFF = 0.05
_MAX_BACKOFF = 2.0


def parse_events(lines: Iterable[bytes]) -> Iterator[tuple[str, str]]:
    """The events of a server-sent event stream read line by line (the
    subset torpor sends: id, data, comments), as (id, data), until the lines
    end. An event without data is none; a field it does not know is passed
    over; an event cut off by the end is not sent."""
    event_id, data, has = "", [], False
    for raw in lines:
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line == "":
            if has:
                yield event_id, "\n".join(data)
            event_id, data, has = "", [], False
            continue
        if line.startswith(":"):
            continue  # a comment: a keep-alive
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "id":
            event_id = value
        elif name == "data":
            data.append(value)
            has = True


class Watch:
    """An iterator of view changes (Client.watch): resumes a dropped stream
    with Last-Event-ID and delivers no view twice. close() ends it, from any
    thread; so does leaving a with block, or its timeout."""

    #: The seq of the last event received: where a new watch would resume.
    last_seq: int
    #: How many times the stream was (re)connected.
    connects: int

    def __init__(self, client: Client, after: int = 0, timeout: float | None = None) -> None:
        self._client = client
        self._after = after
        self.last_seq = after
        self.connects = 0
        self._seen: dict[str, int] = {}
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._closed = False
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._gen = self._run()

    def __iter__(self) -> Watch:
        return self

    def __next__(self) -> View:
        return next(self._gen)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Ends the watch: its connection is closed, its iteration stops."""
        self._closed = True
        with self._lock:
            sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        try:
            self._gen.close()
        except ValueError:
            pass  # iterated in another thread now: the shutdown ends it

    def _left(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def _over(self) -> bool:
        left = self._left()
        return self._closed or (left is not None and left <= 0)

    def _run(self) -> Generator[View, None, None]:
        backoff = _MIN_BACKOFF
        while not self._over():
            delivered = False
            for v in self._stream():
                delivered = True
                yield v
            if self._over():
                return
            if delivered:
                backoff = _MIN_BACKOFF  # it was up: reconnect soon
            left = self._left()
            time.sleep(backoff if left is None else max(0.0, min(backoff, left)))
            backoff = min(2 * backoff, _MAX_BACKOFF)

    def _stream(self) -> Generator[View, None, None]:
        """One connection's views, until it drops (it returns) or the server
        answers what a retry cannot change (raised)."""
        c = self._client
        conn = c._connect(self._left())
        try:
            extra = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
            if self.last_seq > 0:
                extra["Last-Event-ID"] = str(self.last_seq)
            self.connects += 1
            try:
                conn.request("GET", c._url("/v1/watch", None), headers=c._headers(None, None, extra))
                with self._lock:
                    self._sock = conn.sock
                if self._closed:
                    return
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException):
                return
            if resp.status >= 300:
                err = answer_error(resp.status, resp.reason, resp.read(1 << 20), "GET /v1/watch")
                if retryable(err):
                    return
                raise err
            for event_id, data in parse_events(self._lines(resp)):
                try:
                    v = View.from_json(json.loads(data))
                except ValueError as e:
                    raise TorporError("INTERNAL", resp.status, f"GET /v1/watch: decode view: {e}") from e
                self.last_seq = int(event_id) if event_id.isdigit() else max(self.last_seq, v.seq)
                if v.seq > self._after and v.seq > self._seen.get(v.id, 0):
                    self._seen[v.id] = v.seq
                    yield v
        finally:
            with self._lock:
                self._sock = None
            conn.close()

    def _lines(self, resp: http.client.HTTPResponse) -> Iterator[bytes]:
        """The lines of the stream until it drops, is closed or the watch's
        time is up."""
        while not self._over():
            with self._lock:
                sock = self._sock
            if sock is not None:
                sock.settimeout(self._left())
            try:
                line = resp.readline()
            except (OSError, ValueError, http.client.HTTPException):
                return
            if not line:
                return
            yield line
