"""The load generator's HTTP/1.1 client: keep-alive connections as asyncio protocols, answers parsed by httptools.

Why not aiohttp: a generator that shares the cores with the server it measures must cost as little as it can,
or it measures itself. aiohttp spent 0.34-0.45 ms of CPU per request against `tandem serve` at 200-250 rps
(on uvloop; about 10% of what the server spent), for a session, a connector, a response object, header
multidicts and a stream reader per request. Here a request is its bytes, written whole, and an answer is
parsed in C (httptools, which uvicorn also uses) straight into an `Answer`
(docs/decisions.md#the-load-generator). It speaks just what a load test needs: one request in flight per
connection, bodies with a Content-Length or chunked, and a connection reused while the server keeps it alive.

A server closes an idle keep-alive connection when its keep-alive ends or it shuts down (a worker replaced by
`kill -HUP` closes its idle connections after `TANDEM_SHUTDOWN_GRACE_S`), and a request written as that close is
on its way meets a reset or an end of stream with no byte of answer: the keep-alive race every HTTP/1.1 client
has (RFC 9112, section 9.3.1). The server read none of it, so a `Request` marked `replayable` is sent again, on
another connection, as browsers and Go's net/http do; `Answer.replays` counts it. A server that died with the
request read looks the same to the client, which is why only a request with no effect to repeat (a search) may be
marked so. A failure on a new connection, or once some of the answer came, is never retried.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any, cast
from urllib.parse import urlsplit

import httptools


@dataclass(frozen=True)
class Answer:
    """An HTTP answer, read whole: what a load test records and what its callbacks see. Header names are
    lower-case."""

    status: int
    headers: Mapping[str, str]
    body: bytes
    replays: int = 0  # sent again this many times after a reused connection closed before any of its answer

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Request:
    """One request, as a `Send` builds it: the path carries its query string."""

    method: str
    path: str
    body: bytes = b""
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()  # more header lines, e.g. ("Authorization", "Bearer KEY")
    replayable: bool = False  # safe to send twice: sent again after the keep-alive race (see the module's doc)


class ServerDisconnected(ConnectionError):
    """The server closed the connection before the whole answer came."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection with at most one request in flight; httptools calls the `on_*` methods."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._waiter: asyncio.Future[Answer] | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._headers: dict[str, str] = {}
        self._body: list[bytes] = []
        self.answered = 0  # answers read whole: a connection with one is a reused keep-alive connection
        self.heard = False  # some byte of the answer in flight came

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(ServerDisconnected(str(exc) if exc else "the server closed the connection"))

    def data_received(self, data: bytes) -> None:
        if self._parser is None:
            self._close(ServerDisconnected("the server sent bytes no request asked for"))
            return
        self.heard = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._close(ServerDisconnected(f"unreadable answer: {exc}"))

    def send(self, head: bytes, body: bytes, waiter: asyncio.Future[Answer]) -> None:
        assert self.transport is not None and self._waiter is None
        self._waiter, self._headers, self._body, self.heard = waiter, {}, [], False
        self._parser = httptools.HttpResponseParser(self)
        self.transport.write(head + body)

    def abort(self, exc: BaseException) -> None:
        """Give up on the request in flight (its deadline passed): the connection cannot be reused."""
        self._close(exc)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_body(self, body: bytes) -> None:
        self._body.append(body)

    def on_message_complete(self) -> None:
        parser, waiter = self._parser, self._waiter
        assert parser is not None
        self._parser = self._waiter = None
        self.answered += 1
        if not parser.should_keep_alive():
            self._close(None)
        if waiter is not None and not waiter.done():
            waiter.set_result(Answer(parser.get_status_code(), self._headers, b"".join(self._body)))

    def _fail(self, exc: BaseException) -> None:
        waiter, self._waiter, self._parser = self._waiter, None, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _close(self, exc: BaseException | None) -> None:
        self.closed = True
        if exc is not None:
            self._fail(exc)
        if self.transport is not None:
            self.transport.abort()


class ConnectionPool:
    """Keep-alive connections to one `http://host:port` server, opened on demand up to `max_connections`; past
    that, a request waits for a connection to come free (as aiohttp's connector does)."""

    def __init__(self, url: str, timeout_s: float, max_connections: int = 1000) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or parts.hostname is None:
            raise ValueError(f"{url!r}: the load client speaks plain http://host:port")
        self.host, self.port = parts.hostname, parts.port or 80
        netloc = parts.netloc.encode("ascii")
        self._prefix = parts.path.rstrip("/")
        self._host_header = b"Host: " + netloc + b"\r\n"
        self.timeout_s, self.max_connections = timeout_s, max_connections
        self._idle: deque[_Connection] = deque()
        self._open = 0
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def __aenter__(self) -> ConnectionPool:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        while self._idle:
            connection = self._idle.popleft()
            if connection.transport is not None:
                connection.transport.close()

    def _head(self, request: Request) -> bytes:
        lines = [f"{request.method} {self._prefix}{request.path} HTTP/1.1\r\n".encode("latin-1"), self._host_header]
        if request.body or request.method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Type: {request.content_type}\r\nContent-Length: {len(request.body)}\r\n"
                         .encode("latin-1"))
        lines.extend(f"{name}: {value}\r\n".encode("latin-1") for name, value in request.headers)
        lines.append(b"\r\n")
        return b"".join(lines)

    def _idle_connection(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()  # the most recently used: the least likely to have timed out
            if not connection.closed:
                return connection
            self._open -= 1
        return None

    async def _acquire(self) -> _Connection:
        while (connection := self._idle_connection()) is None:
            if self._open < self.max_connections:
                self._open += 1
                try:
                    _, protocol = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
                except BaseException:
                    self._open -= 1
                    self._wake()
                    raise
                return protocol
            waiter = asyncio.get_running_loop().create_future()
            self._waiting.append(waiter)
            await waiter
        return connection

    def _release(self, connection: _Connection) -> None:
        if connection.closed:
            self._open -= 1
        else:
            self._idle.append(connection)
        self._wake()

    def _wake(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    async def request(self, request: Request) -> Answer:
        """The answer, read whole; TimeoutError after timeout_s (connecting and a replay included),
        ServerDisconnected or OSError when the connection fails (for a `replayable` request: unless it was the
        keep-alive race, which sends it again)."""
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        replays = 0
        while True:
            connection = self._idle_connection()  # the usual case, without a task for the deadline
            if connection is None:
                remaining = deadline - asyncio.get_running_loop().time()
                connection = await asyncio.wait_for(self._acquire(), max(remaining, 0.0))
            try:
                answer = await self._exchange(connection, request, deadline)
            except ServerDisconnected:
                if not (request.replayable and connection.answered and not connection.heard):
                    raise
                replays += 1  # the keep-alive race: the server closed this idle connection and read none of it
                continue
            return replace(answer, replays=replays) if replays else answer

    async def _exchange(self, connection: _Connection, request: Request, deadline: float) -> Answer:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Answer] = loop.create_future()
        timer = loop.call_at(deadline, connection.abort, TimeoutError())
        try:
            connection.send(self._head(request), request.body, waiter)
            return await waiter
        finally:
            timer.cancel()
            if not waiter.done() or waiter.cancelled():  # the caller gave up: an answer may still come
                connection.abort(ServerDisconnected("the request was cancelled"))
            self._release(connection)
