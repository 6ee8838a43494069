"""Pure ASGI middleware: request context (id, access log, metrics, last-resort 500) and the body size limit.

Pure ASGI rather than BaseHTTPMiddleware: bodies stream through untouched (nothing is
buffered) and the request id contextvar is set in the same task that runs the route.
"""

from __future__ import annotations

import logging
import os
import time

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.datastructures import MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.core.fields import manifest_fields
from service.http.auth import ApiKeyMiddleware, ApiKeys
from service.http.errors import error_response
from service.http.keyring import KeySource
from service.metrics import Metrics
from service.redact import printable
from service.runtime.logs import new_request_id, request_id_var, valid_request_id
from service.settings import ServiceSettings

log = logging.getLogger(__name__)
access_log = logging.getLogger("tandem.access")

REQUEST_ID_HEADER = "X-Request-ID"
PROCESS_HEADER = "X-Tandem-Process"  # with --processes N: the pid that answered, as its log lines name it
QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})  # probes and scrapes log at DEBUG
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # others count as "other"
_MAX_LOGGED_PATH = 256


def header(scope: Scope, name: bytes) -> str | None:
    """The first value of header `name` (lower-case bytes) in an ASGI scope, decoded as latin-1; None if absent."""
    for key, value in scope["headers"]:
        if key == name:
            return str(value.decode("latin-1"))
    return None


class RequestContextMiddleware:
    """Outermost of ours: tags the request with an id, times it, counts it, logs it, and turns an
    exception that escaped everything else into the generic JSON 500 (with the id, without a trace)."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI, metrics: Metrics, name_process: bool = False) -> None:
        self.app = app
        self.fastapi_app = fastapi_app
        self.metrics = metrics
        self.process = str(os.getpid()) if name_process else None
        self._paths: frozenset[str] | None = None

    def _route(self, scope: Scope) -> str:
        """The route template, never the raw path (bounded label cardinality, whatever clients send)."""
        route = scope.get("route")
        if route is not None and isinstance(getattr(route, "path", None), str):
            return str(route.path)
        if self._paths is None:  # requests refused before routing (401, 413) still count under their route
            paths = (getattr(r, "path", None) for r in self.fastapi_app.routes)
            self._paths = frozenset(p for p in paths if isinstance(p, str))
        return scope["path"] if scope["path"] in self._paths else "unmatched"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = valid_request_id(header(scope, b"x-request-id")) or new_request_id()
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status, responded = 500, False

        async def send_with_id(message: Message) -> None:
            nonlocal status, responded
            if message["type"] == "http.response.start":
                responded, status = True, message["status"]
                headers = MutableHeaders(scope=message)
                headers[REQUEST_ID_HEADER] = request_id
                if self.process is not None:
                    headers[PROCESS_HEADER] = self.process
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error on %s %s", scope["method"], scope["path"][:_MAX_LOGGED_PATH])
            if responded:
                raise  # part of the response is out: let the server drop the connection
            await error_response(500, "internal", "internal server error")(scope, receive, send_with_id)
        finally:
            self._record(scope, status, time.perf_counter() - started)
            request_id_var.reset(token)

    def _record(self, scope: Scope, status: int, seconds: float) -> None:
        route = self._route(scope)
        method = scope["method"] if scope["method"] in _METHODS else "other"
        self.metrics.observe_request(route, method, status)
        if route == "/search":
            self.metrics.observe_stage("total", seconds)
        path = printable(scope["path"][:_MAX_LOGGED_PATH])  # no control characters: one request, one line
        level = logging.DEBUG if path in QUIET_PATHS and status < 400 else logging.INFO
        if access_log.isEnabledFor(level):  # the record as `access_log.log` makes it, less the caller's frame lookup
            access_log.handle(access_log.makeRecord(
                access_log.name, level, __file__, 0, "%s %s %d", (scope["method"], path, status), None, extra={
                    "method": scope["method"], "path": path, "status": status, "duration_ms": round(seconds * 1e3, 3),
                }))


class _BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    """413 for a body over `max_bytes`: at once from Content-Length, or as soon as a streamed (chunked)
    body crosses the limit; nothing is buffered here, the app reads the body as usual."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self) -> JSONResponse:
        return error_response(413, "body_too_large",
                              f"the request body is over {self.max_bytes} bytes (TANDEM_MAX_BODY_BYTES)")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = header(scope, b"content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await error_response(400, "bad_request", "invalid Content-Length header")(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                await self._too_large()(scope, receive, send)
                return
        received, exceeded, responded = 0, False, False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    exceeded = True
                    raise _BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal responded
            if exceeded:
                return  # whatever the app makes of the aborted read (FastAPI: a 400) is replaced by the 413
            responded = responded or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not exceeded:
                raise
        if exceeded and not responded:
            await self._too_large()(scope, receive, send)


def install_middleware(app: FastAPI, settings: ServiceSettings, metrics: Metrics) -> bool:
    """Outermost first: request context → CORS (when configured) → body limit → API keys (when configured).
    Returns whether API keys are required, which the OpenAPI document declares (service.http.openapi)."""
    secret = settings.api_keys.get_secret_value() if settings.api_keys is not None else None
    legacy = ApiKeys.load(secret, settings.api_keys_file)
    specs = {spec.name: spec for spec in settings.collection_specs()}
    keys = KeySource(legacy.digests, settings.keys_file, list(specs), lambda name: manifest_fields(specs[name].index),
                     settings.watch_interval_s)  # a bad key file raises here: the service refuses to start
    required = bool(len(legacy)) or settings.keys_file is not None
    app.state.api_keys_required = required  # the search page asks for a key when set
    app.state.keys = keys  # the lifespan starts and stops its watch
    if required:
        app.add_middleware(ApiKeyMiddleware, keys=keys)
    log.info("API keys: %s", f"{len(keys.current)} configured" if required else "none, the API is open")
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    origins = [o.strip() for o in (settings.cors_origins or "").split(",") if o.strip()]
    if origins:
        app.add_middleware(
            CORSMiddleware, allow_origins=origins, allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type", REQUEST_ID_HEADER],
            expose_headers=[REQUEST_ID_HEADER, PROCESS_HEADER, "Retry-After"], max_age=600,
        )
    app.add_middleware(RequestContextMiddleware, fastapi_app=app, metrics=metrics, name_process=settings.processes > 1)
    return required
