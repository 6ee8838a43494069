"""What Client and AsyncClient share: request bodies, the retry decision, and reading answers."""

from __future__ import annotations

import base64
import logging
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Any, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from tandem_client.errors import ApiError, ClientError, TransportError
from tandem_client.models import Embeddings, Fusion, HitField, Mode
from tandem_client.retry import RETRY_STATUSES, Attempts, retry_after_s

log = logging.getLogger("tandem_client")

DEFAULT_URL = "http://127.0.0.1:8000"
REQUEST_ID_HEADER = "X-Request-ID"
M = TypeVar("M", bound=BaseModel)


def _version() -> str:
    try:
        return metadata.version("tandem-client")
    except metadata.PackageNotFoundError:
        return "0"


def headers(api_key: str | None) -> dict[str, str]:
    out = {"User-Agent": f"tandem-client/{_version()}", "Accept": "application/json"}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def timeout_of(timeout: float | httpx.Timeout | None) -> httpx.Timeout:
    return timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)


@dataclass(frozen=True, kw_only=True)
class SearchOptions:
    """The request options of `search` and `search_batch` beyond the queries; None is the server's default,
    and is not sent, so a client works with a server that predates an option it leaves alone."""

    top_k: int | None = None
    mode: Mode | None = None
    filter: Mapping[str, Any] | None = None
    offset: int | None = None
    min_score: float | None = None
    fields: Sequence[HitField] | None = None
    fusion: Fusion | None = None
    alpha: float | None = None


def search_body(queries: str | Sequence[str], options: SearchOptions) -> dict[str, Any]:
    """The JSON body of POST /search. Values are not checked here: the server's 422 says what is wrong."""
    if isinstance(queries, str):
        body: dict[str, Any] = {"query": queries}
    else:
        body = {"queries": list(queries)}
    for name, value in asdict(options).items():
        if value is not None:
            body[name] = list(value) if name == "fields" else dict(value) if name == "filter" else value
    return body


def search_path(collection: str | None) -> str:
    """POST /search (the server's default collection) or POST /collections/{name}/search, the name escaped."""
    return "/search" if collection is None else f"/collections/{quote(collection, safe='')}/search"


def embeddings_body(texts: Sequence[str], dimensions: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"input": list(texts), "encoding_format": "base64"}
    if dimensions is not None:
        body["dimensions"] = dimensions
    return body


def api_error(response: httpx.Response, attempts: int) -> ApiError:
    """The server's JSON error body (`error`, `message`) with its request id; a non-JSON answer (a proxy's
    page) keeps its status and the start of its text."""
    code, message = "http_error", response.text[:500] or response.reason_phrase
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        code = str(body.get("error", code))
        message = str(body.get("message", message))
    return ApiError(response.status_code, code, message, response.headers.get(REQUEST_ID_HEADER), attempts,
                    retry_after_s(response))


def wait_after_response(attempts: Attempts, response: httpx.Response, retry: bool) -> float:
    """The wait before retrying a retryable refusal, or raise its ApiError (not retryable, or out of budget)."""
    error = api_error(response, attempts.count)
    wait = attempts.next_wait(error.retry_after) if retry and response.status_code in RETRY_STATUSES else None
    if wait is None:
        raise error
    log.info("tandem answered %d %s (request %s); retrying in %.2f s (Retry-After %s), attempt %d",
             error.status, error.code, error.request_id, wait, error.retry_after, attempts.count + 1)
    return wait


def wait_after_exception(attempts: Attempts, exc: httpx.HTTPError, retry: bool) -> float:
    """Only a failed connection is retried (the request never reached the server); a timeout is not."""
    wait = attempts.next_wait(None) if retry and isinstance(exc, httpx.ConnectError) else None
    if wait is None:
        raise TransportError(f"{type(exc).__name__}: {exc}", attempts.count) from exc
    log.info("could not connect to tandem (%s); retrying in %.2f s, attempt %d", exc, wait, attempts.count + 1)
    return wait


def parse(response: httpx.Response, model: type[M]) -> M:
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        raise ClientError(f"unexpected answer from {response.request.url.path}: {exc}") from exc


def parse_embeddings(response: httpx.Response) -> Embeddings:
    """Decode the base64 float32 vectors with the standard library (no numpy in the client)."""
    try:
        body = response.json()
        vectors = []
        for item in sorted(body["data"], key=lambda d: d["index"]):
            values = array("f")
            values.frombytes(base64.b64decode(item["embedding"]))
            if sys.byteorder == "big":
                values.byteswap()  # the wire format is little-endian
            vectors.append(values.tolist())
        return Embeddings(vectors=vectors, model=body["model"], prompt_tokens=body["usage"]["prompt_tokens"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ClientError(f"unexpected answer from /v1/embeddings: {exc}") from exc
