"""A Python client for a tandem server: `Client` (blocking) and `AsyncClient`, over httpx.

It needs only httpx and pydantic (the base install of `tandem`), never numpy, FAISS, onnxruntime
or torch, so an application can talk to tandem without the service's dependencies:

    from tandem.client import Client

    with Client("http://127.0.0.1:8000", api_key="...") as tandem:
        result = tandem.search("how do tides work", top_k=5)
        print(result.index.version, result.results[0].title, result.timing_ms.encode)
        recent = tandem.search("tides", mode="hybrid", filter={"field": "year", "gte": 2018},
                               fields=["id", "score", "metadata"])  # options left None: the server's default
        print([(hit.id, hit.metadata) for hit in recent.results])
        names = [c.name for c in tandem.collections()]  # the collections the key may see
        docs = tandem.search("tides", collection="docs")  # POST /collections/docs/search

Requests that meet a 429 or 503 are retried after the server's Retry-After, as long as the
client's total time budget allows; every other failure raises `ApiError` with the server's
message and request id.
"""

from tandem.client.aio import AsyncClient
from tandem.client.errors import ApiError, ClientError, TransportError
from tandem.client.models import (
    BatchSearchResult,
    CollectionInfo,
    Embeddings,
    Fusion,
    Health,
    Hit,
    HitField,
    IndexInfo,
    Mode,
    Readiness,
    SearchResult,
    Timing,
)
from tandem.client.retry import RetryPolicy
from tandem.client.sync import Client

__all__ = [
    "ApiError",
    "AsyncClient",
    "BatchSearchResult",
    "Client",
    "ClientError",
    "CollectionInfo",
    "Embeddings",
    "Fusion",
    "Health",
    "Hit",
    "HitField",
    "IndexInfo",
    "Mode",
    "Readiness",
    "RetryPolicy",
    "SearchResult",
    "Timing",
    "TransportError",
]
