"""All of the service's auth: optional API keys on the API, and the admin token on /admin/*.

API keys: `Authorization: Bearer <key>` on every route but the probes, /metrics and the docs.

Keys come from TANDEM_API_KEYS (comma-separated) and/or TANDEM_API_KEYS_FILE (one per line,
`#` comments), which open everything, and TANDEM_KEYS_FILE, whose keys are scoped (service.http.keyfile,
service.http.keyring): the middleware leaves the matched key's scope in the request's state for the routes
(`service.http.keyring.key_of`); none set means the API is open. A variable that is set but holds no key (`""`,
`","`: what an unset `${VAR}` in a compose file becomes) refuses to start: it fails closed, never open.

Auth is a middleware rather than a route dependency so that it runs before the body is read and
so that a route added later is protected unless it is exempted here on purpose. /admin/* is
exempt: it has its own token (TANDEM_ADMIN_TOKEN), checked by `require_admin`, a dependency of the admin
router. Without that token the admin routes answer 403 (admin disabled): never open by default.

A presented key is compared with every configured key via `hmac.compare_digest` over
sha256 digests (service.http.keyring.Keyring.match): equal lengths, no early exit, so timing reveals neither
which key nor how much of one matched.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from pathlib import Path

from fastapi import HTTPException, Request
from starlette.types import ASGIApp, Receive, Scope, Send

from models.errors import InputError
from service.http.errors import error_response
from service.http.keyfile import KEY_CHARS
from service.http.keyring import KEY_STATE, KeySource
from service.redact import printable
from service.settings import ServiceSettings

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})
OPEN_PREFIXES = ("/admin/",)  # TANDEM_ADMIN_TOKEN guards these
# The search page and its files: it asks for a key itself and sends it with each search (service.http.routes.page).
PAGE_PATHS = frozenset({"/"})
PAGE_PREFIXES = ("/ui/",)
CHALLENGE = {"WWW-Authenticate": 'Bearer realm="tandem"'}


def _digest(key: str | bytes) -> bytes:
    return hashlib.sha256(key.encode() if isinstance(key, str) else key).digest()


class ApiKeys:
    """The configured keys, kept only as sha256 digests."""

    def __init__(self, keys: list[str]) -> None:
        bad = [i for i, key in enumerate(keys, 1) if not KEY_CHARS.match(key)]
        if bad:
            raise InputError(f"API key #{bad[0]} has spaces, control or non-ASCII characters (or is over 512)")
        self._digests = [_digest(key) for key in dict.fromkeys(keys)]

    def __len__(self) -> int:
        return len(self._digests)

    @property
    def digests(self) -> list[bytes]:
        return list(self._digests)

    @classmethod
    def load(cls, inline: str | None, file: Path | None) -> ApiKeys:
        """Keys from the comma-separated env value and the file; a file that is given must exist and hold a key."""
        keys = [k.strip() for k in (inline or "").split(",") if k.strip()]
        if inline is not None and not keys:
            raise InputError("TANDEM_API_KEYS is set but holds no key (refusing to serve without auth); "
                             "unset it to serve an open API, or give at least one key")
        if file is not None:
            try:
                lines = Path(file).read_text().splitlines()
            except (OSError, UnicodeDecodeError) as exc:
                raise InputError(f"TANDEM_API_KEYS_FILE: cannot read {file}: {exc}") from exc
            from_file = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
            if not from_file:
                raise InputError(f"TANDEM_API_KEYS_FILE: {file} holds no keys (refusing to serve without auth)")
            keys += from_file
        return cls(keys)


def bearer_token(authorization: bytes | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header (scheme case-insensitive), or None."""
    if authorization is None:
        return None
    scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path in PAGE_PATHS or path.startswith(OPEN_PREFIXES + PAGE_PREFIXES)


class WarningLimiter:
    """At most `burst` warnings per `window_s`; the first one after a quiet spell says how many were dropped.
    A client hammering with bad keys must not flood the logs (disk, log shipping, the operator's attention)."""

    def __init__(self, burst: int = 10, window_s: float = 60.0) -> None:
        self.burst, self.window_s = burst, window_s
        self._window_start = -window_s
        self._logged = self._suppressed = 0

    def allow(self) -> tuple[bool, int]:
        """(log this one?, how many were suppressed before it)."""
        now = time.monotonic()
        if now - self._window_start >= self.window_s:
            self._window_start, self._logged = now, 0
        if self._logged >= self.burst:
            self._suppressed += 1
            return False, 0
        self._logged += 1
        suppressed, self._suppressed = self._suppressed, 0
        return True, suppressed


class ApiKeyMiddleware:
    """401 (with a Bearer challenge) without a key, 403 with a wrong one; CORS preflights pass to CORS outside."""

    def __init__(self, app: ASGIApp, keys: KeySource) -> None:
        self.app = app
        self.keys = keys
        self.warnings = WarningLimiter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or is_open(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        token = bearer_token(headers.get(b"authorization"))
        key = self.keys.current.match(token) if token is not None else None
        if token is None:
            response = error_response(401, "unauthorized", "an API key is required: Authorization: Bearer <key>",
                                      headers=CHALLENGE)
        elif key is None:
            allowed, suppressed = self.warnings.allow()
            if allowed:
                dropped = f" ({suppressed} more such warnings suppressed)" if suppressed else ""
                log.warning("rejected an invalid API key for %s %s%s", printable(scope["method"]),
                            printable(scope["path"][:256]), dropped)
            response = error_response(403, "forbidden", "the API key is not valid")
        else:
            scope.setdefault("state", {})[KEY_STATE] = key  # the routes read it: key_of(request)
            await self.app(scope, receive, send)
            return
        await response(scope, receive, send)


def require_admin(request: Request) -> None:
    """401 without a bearer token, 403 with a wrong one or when admin is disabled."""
    settings: ServiceSettings = request.app.state.settings
    if settings.admin_token is None:
        raise HTTPException(403, "admin routes are disabled: start the service with --admin-token or "
                                 "TANDEM_ADMIN_TOKEN to enable them")
    header = request.headers.get("authorization", "")
    scheme, _, given = header.partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise HTTPException(401, "admin token required: send 'Authorization: Bearer <token>'",
                            headers={"WWW-Authenticate": "Bearer"})
    # Digests have equal lengths, so the comparison's timing says nothing about the token's length either.
    expected = hashlib.sha256(settings.admin_token.get_secret_value().encode()).digest()
    if not hmac.compare_digest(hashlib.sha256(given.strip().encode()).digest(), expected):
        raise HTTPException(403, "invalid admin token")
