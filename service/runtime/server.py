"""The uvicorn server configuration: timeouts and a connection limit, so slow clients cannot hold it.

uvicorn bounds the idle time between requests (keep-alive) but not the time a client may take to
send a request's headers or body: a client trickling one byte a second holds a connection, and its
memory, forever. `GuardedProtocol` arms a deadline for the headers (from the first byte, or the
connection) and another for the body; a client that misses one is disconnected. `limit_concurrency`
caps connections and tasks; beyond it uvicorn answers 503 at once instead of accepting more work.

On shutdown (SIGTERM, or `kill -HUP` replacing the workers of `--processes N` one by one) uvicorn closes at once
every connection with no request in flight. A connection the worker has just accepted may already hold a
request that the event loop has not read yet, and closing it with unread data resets it: the client gets
"connection reset" for a request it sent to a listening port. `GuardedProtocol` gives such connections
`TANDEM_SHUTDOWN_GRACE_S` to send a request, and answers it with `Connection: close`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.settings import ServiceSettings

log = logging.getLogger(__name__)


class GuardedConfig(uvicorn.Config):
    """uvicorn's Config plus the two read deadlines and the shutdown grace: a module-level class, so the config
    (and the protocol class it names) pickles into the worker processes of `--processes N` unchanged."""

    def __init__(self, app: Any, *, header_timeout_s: float, body_timeout_s: float, shutdown_grace_s: float,
                 **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_timeout_s, self.body_timeout_s = header_timeout_s, body_timeout_s
        self.shutdown_grace_s = shutdown_grace_s


class GuardedProtocol(HttpToolsProtocol):
    """httptools' protocol plus a deadline on reading a request's headers, then one on its body, and a grace for a
    request that arrives as the server shuts down (all from GuardedConfig)."""

    _deadline: asyncio.TimerHandle | None = None
    _reading = False  # a request's headers have begun to arrive
    _draining = False  # the server is shutting down: the next request is the connection's last

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, what: str) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if what == "shutdown":
            log.debug("closing a connection that sent no request within the shutdown grace")
        else:
            log.info("closing a connection that did not send its request %s in time", what)
        self.transport.close()

    def _config(self) -> GuardedConfig:
        config = self.config
        assert isinstance(config, GuardedConfig), "GuardedProtocol needs a GuardedConfig (service.runtime.server)"
        return config

    def _timeouts(self) -> tuple[float, float]:
        config = self._config()
        return config.header_timeout_s, config.body_timeout_s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self._timeouts()[0], "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._reading = True
        self._arm(self._timeouts()[0], "headers")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._reading = False
        if self._draining and self.cycle is not None:
            self.cycle.keep_alive = False
        self._arm(self._timeouts()[1], "body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def shutdown(self) -> None:
        """uvicorn's, except that a connection with no request in flight is not closed at once: it may hold a
        request not read yet, so it gets the shutdown grace (within its header deadline) to send one, which is
        answered and then closes the connection. uvicorn waits for the connection as for any other."""
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            super().shutdown()  # a request in flight: answered, then the connection closes
            return
        self._draining = True
        if not self._reading:  # one whose headers are arriving keeps its header deadline
            grace = self._config().shutdown_grace_s
            if self._deadline is None or self._deadline.when() > self.loop.time() + grace:
                self._arm(grace, "shutdown")


def server_config(app: Any, settings: ServiceSettings, **overrides: Any) -> GuardedConfig:
    """uvicorn's Config for `app` with the settings' timeouts and connection limit (tests use it too); with
    `--processes N` the same config (limit_concurrency included) is pickled into every worker process."""
    values: dict[str, Any] = {
        "host": settings.host, "port": settings.port, "log_level": settings.log_level, "log_config": None,
        "access_log": False, "timeout_keep_alive": settings.keep_alive_s,
        "limit_concurrency": settings.max_connections,
        "http": GuardedProtocol,
        **overrides,
    }
    return GuardedConfig(app, header_timeout_s=settings.header_timeout_s, body_timeout_s=settings.body_timeout_s,
                         shutdown_grace_s=settings.shutdown_grace_s, **values)
