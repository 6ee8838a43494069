"""The blocking client."""

from __future__ import annotations

import time
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


class Client:
    """A tandem server over one pooled httpx connection; thread-safe, close it (or use `with`) when done.

    timeout: seconds per attempt (or an httpx.Timeout), never beyond what is left of `retry.budget_s`.
    """

    def __init__(self, base_url: str = _core.DEFAULT_URL, *, api_key: str | None = None,
                 timeout: float | httpx.Timeout = 10.0, retry: RetryPolicy | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.retry = retry or RetryPolicy()
        self._timeout = _core.timeout_of(timeout)
        self._http = httpx.Client(base_url=base_url, headers=_core.headers(api_key), timeout=self._timeout,
                                  transport=transport)

    def search(self, query: str, top_k: int | None = None, *, mode: Mode | None = None,
               filter: Mapping[str, Any] | None = None, offset: int | None = None, min_score: float | None = None,
               fields: Sequence[HitField] | None = None, fusion: Fusion | None = None,
               alpha: float | None = None, collection: str | None = None) -> SearchResult:
        """The `top_k` best documents for one query. Every option left None is the server's default:

        mode: dense (student vectors), lexical (BM25) or hybrid (both, fused by `fusion`, rrf or convex,
        `alpha` the dense weight of convex); filter: a metadata filter such as
        `{"and": [{"field": "year", "gte": 2018}, {"field": "lang", "in": ["en", "de"]}]}`; offset: hits
        skipped (pagination); min_score: hits scoring below it dropped; fields: what each hit carries
        (e.g. `["id", "score"]`, or `"metadata"` added); collection: the collection searched (POST
        /collections/{name}/search), None the server's default (POST /search). A value the server refuses raises
        ApiError (422) with its message; a collection not served, or one the key may not see, ApiError 404.
        """
        options = _core.SearchOptions(top_k=top_k, mode=mode, filter=filter, offset=offset, min_score=min_score,
                                      fields=fields, fusion=fusion, alpha=alpha)
        response = self._call("POST", _core.search_path(collection), _core.search_body(query, options))
        return _core.parse(response, SearchResult)

    def search_batch(self, queries: Sequence[str], top_k: int | None = None, *, mode: Mode | None = None,
                     filter: Mapping[str, Any] | None = None, offset: int | None = None,
                     min_score: float | None = None, fields: Sequence[HitField] | None = None,
                     fusion: Fusion | None = None, alpha: float | None = None,
                     collection: str | None = None) -> BatchSearchResult:
        """One result list per query, in order, from one request; the options of `search` apply to each."""
        if isinstance(queries, str):
            raise TypeError("search_batch takes a list of queries; use search() for one")
        options = _core.SearchOptions(top_k=top_k, mode=mode, filter=filter, offset=offset, min_score=min_score,
                                      fields=fields, fusion=fusion, alpha=alpha)
        response = self._call("POST", _core.search_path(collection), _core.search_body(queries, options))
        return _core.parse(response, BatchSearchResult)

    def embed(self, texts: Sequence[str], dimensions: int | None = None) -> Embeddings:
        """Query vectors in the teacher's space (for a vector database holding the teacher's document vectors)."""
        if isinstance(texts, str):
            texts = [texts]
        return _core.parse_embeddings(self._call("POST", "/v1/embeddings", _core.embeddings_body(texts, dimensions)))

    def collections(self) -> list[CollectionInfo]:
        """The collections the client's key may see (GET /collections), loaded or not, in the server's order."""
        return _core.parse(self._call("GET", "/collections"), CollectionList).collections

    def healthz(self) -> Health:
        return _core.parse(self._call("GET", "/healthz", retry=False), Health)

    def readyz(self) -> Readiness:
        """Loading and failed are answers here, not errors (the server says them with a 503)."""
        return _core.parse(self._call("GET", "/readyz", retry=False, accept=frozenset({503})), Readiness)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *, retry: bool = True,
              accept: frozenset[int] = frozenset()) -> httpx.Response:
        attempts = Attempts(self.retry)
        while True:
            attempts.count += 1
            try:
                response = self._http.request(method, path, json=body, timeout=attempts.timeout(self._timeout))
            except httpx.HTTPError as exc:
                time.sleep(_core.wait_after_exception(attempts, exc, retry))
                continue
            if response.is_success or response.status_code in accept:
                return response
            time.sleep(_core.wait_after_response(attempts, response, retry))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
