"""The asyncio client: the same calls as `Client`, awaited."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

import httpx

from tandem_client import _core
from tandem_client.models import (
    BatchSearchResult,
    CollectionInfo,
    CollectionList,
    Embeddings,
    Fusion,
    Health,
    HitField,
    Mode,
    Readiness,
    SearchResult,
)
from tandem_client.retry import Attempts, RetryPolicy


class AsyncClient:
    """A tandem server over one pooled httpx.AsyncClient; close it (or use `async with`) when done."""

    def __init__(self, base_url: str = _core.DEFAULT_URL, *, api_key: str | None = None,
                 timeout: float | httpx.Timeout = 10.0, retry: RetryPolicy | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.retry = retry or RetryPolicy()
        self._timeout = _core.timeout_of(timeout)
        self._http = httpx.AsyncClient(base_url=base_url, headers=_core.headers(api_key), timeout=self._timeout,
                                       transport=transport)

    async def search(self, query: str, top_k: int | None = None, *, mode: Mode | None = None,
                     filter: Mapping[str, Any] | None = None, offset: int | None = None,
                     min_score: float | None = None, fields: Sequence[HitField] | None = None,
                     fusion: Fusion | None = None, alpha: float | None = None,
                     collection: str | None = None) -> SearchResult:
        """`Client.search`, awaited; every option left None is the server's default."""
        options = _core.SearchOptions(top_k=top_k, mode=mode, filter=filter, offset=offset, min_score=min_score,
                                      fields=fields, fusion=fusion, alpha=alpha)
        response = await self._call("POST", _core.search_path(collection), _core.search_body(query, options))
        return _core.parse(response, SearchResult)

    async def search_batch(self, queries: Sequence[str], top_k: int | None = None, *, mode: Mode | None = None,
                           filter: Mapping[str, Any] | None = None, offset: int | None = None,
                           min_score: float | None = None, fields: Sequence[HitField] | None = None,
                           fusion: Fusion | None = None, alpha: float | None = None,
                           collection: str | None = None) -> BatchSearchResult:
        """`Client.search_batch`, awaited: one result list per query, in order."""
        if isinstance(queries, str):
            raise TypeError("search_batch takes a list of queries; use search() for one")
        options = _core.SearchOptions(top_k=top_k, mode=mode, filter=filter, offset=offset, min_score=min_score,
                                      fields=fields, fusion=fusion, alpha=alpha)
        response = await self._call("POST", _core.search_path(collection), _core.search_body(queries, options))
        return _core.parse(response, BatchSearchResult)

    async def embed(self, texts: Sequence[str], dimensions: int | None = None) -> Embeddings:
        if isinstance(texts, str):
            texts = [texts]
        response = await self._call("POST", "/v1/embeddings", _core.embeddings_body(texts, dimensions))
        return _core.parse_embeddings(response)

    async def collections(self) -> list[CollectionInfo]:
        """`Client.collections`, awaited: the collections the client's key may see."""
        return _core.parse(await self._call("GET", "/collections"), CollectionList).collections

    async def healthz(self) -> Health:
        return _core.parse(await self._call("GET", "/healthz", retry=False), Health)

    async def readyz(self) -> Readiness:
        response = await self._call("GET", "/readyz", retry=False, accept=frozenset({503}))
        return _core.parse(response, Readiness)

    async def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *, retry: bool = True,
                    accept: frozenset[int] = frozenset()) -> httpx.Response:
        attempts = Attempts(self.retry)
        while True:
            attempts.count += 1
            try:
                response = await self._http.request(method, path, json=body,
                                                    timeout=attempts.timeout(self._timeout))
            except httpx.HTTPError as exc:
                await asyncio.sleep(_core.wait_after_exception(attempts, exc, retry))
                continue
            if response.is_success or response.status_code in accept:
                return response
            await asyncio.sleep(_core.wait_after_response(attempts, response, retry))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()
