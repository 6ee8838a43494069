"""A Python client for a tandem server: `Client` (blocking) and `AsyncClient`, over httpx.

Its distribution, `tandem-client`, is this one package and needs only httpx and pydantic: never numpy,
FAISS, onnxruntime or torch, nor the server's top-level packages (`models`, `service`, ...), so an application
can talk to tandem without the service's dependencies and without their names colliding with its own:

    from tandem_client import Client

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

from tandem_client.aio import AsyncClient
from tandem_client.errors import ApiError, ClientError, TransportError
from tandem_client.models import (
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
from tandem_client.retry import RetryPolicy
from tandem_client.sync import Client

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
