"""The uvicorn server configuration: timeouts and a connection limit, so slow clients cannot hold it.

uvicorn bounds the idle time between requests (keep-alive) but not the time a client may take to
send a request's headers or body: a client trickling one byte a second holds a connection, and its
memory, forever. `_GuardedProtocol` arms a deadline for the headers (from the first byte, or the
connection) and another for the body; a client that misses one is disconnected. `limit_concurrency`
caps connections and tasks; beyond it uvicorn answers 503 at once instead of accepting more work.
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
    """uvicorn's Config plus the two read deadlines: a module-level class, so the config (and the protocol
    class it names) pickles into the worker processes of `--processes N` unchanged."""

    def __init__(self, app: Any, *, header_timeout_s: float, body_timeout_s: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.header_timeout_s, self.body_timeout_s = header_timeout_s, body_timeout_s


class GuardedProtocol(HttpToolsProtocol):
    """httptools' protocol plus a deadline on reading a request's headers, then one on its body (from GuardedConfig)."""

    _deadline: asyncio.TimerHandle | None = None

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self, what: str) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            log.info("closing a connection that did not send its request %s in time", what)
            self.transport.close()

    def _timeouts(self) -> tuple[float, float]:
        config = self.config
        assert isinstance(config, GuardedConfig), "GuardedProtocol needs a GuardedConfig (service.server)"
        return config.header_timeout_s, config.body_timeout_s

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self._timeouts()[0], "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self._timeouts()[0], "headers")

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self._timeouts()[1], "body")

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()


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
                         **values)
