"""The HTTP API end to end: real uvicorn, real FAISS bundle, real ONNX student, driven by httpx. Relevance on the real
models (live_server); the shapes, bounds and errors on the tiny ones (mini_server, tests/fixtures/tiny_service.py)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from models.bundle.version import read_bundle_manifest
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.server import LiveServer, local_client


@pytest.mark.parametrize(("query", "doc_id"), sorted(PROBES.items()))
def test_probe_finds_its_document_first(live_server: LiveServer, query: str, doc_id: str) -> None:
    response = live_server.client.post("/search", json={"query": query, "top_k": 5})
    assert response.status_code == 200, response.text
    assert response.json()["results"][0]["id"] == doc_id


def test_response_shape(mini_server: LiveServer, mini_bundle: Path) -> None:
    response = mini_server.client.post("/search", json={"query": "volcanic eruption", "top_k": 3})
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"results", "index", "timing_ms"}
    results = body["results"]
    assert len(results) == 3
    docs = {doc_id: (title, text) for doc_id, title, text in DOCS}
    for hit in results:
        assert set(hit) == {"id", "score", "title", "text"}
        assert (hit["title"], hit["text"]) == docs[hit["id"]]
        assert -1.0001 <= hit["score"] <= 1.0001
    scores = [hit["score"] for hit in results]
    assert scores == sorted(scores, reverse=True)
    assert body["index"] == {**read_bundle_manifest(mini_bundle).summary(), "version": mini_bundle.name}
    assert set(body["timing_ms"]) == {"queue", "encode", "search", "lexical", "filter"}
    assert all(isinstance(v, float) and v >= 0 for v in body["timing_ms"].values())


def test_default_top_k(mini_server: LiveServer) -> None:
    response = mini_server.client.post("/search", json={"query": "coffee"})
    assert response.status_code == 200
    assert len(response.json()["results"]) == 10


def test_top_k_beyond_corpus_returns_every_document_once(mini_server: LiveServer) -> None:
    response = mini_server.client.post("/search", json={"query": "science", "top_k": 1000})
    assert response.status_code == 200
    ids = [hit["id"] for hit in response.json()["results"]]
    assert sorted(ids) == sorted(doc_id for doc_id, _, _ in DOCS)


def test_same_answer_under_concurrent_requests(mini_server: LiveServer) -> None:
    def ask(query: str) -> list[str]:
        with local_client(mini_server.url, timeout=30.0) as client:
            response = client.post("/search", json={"query": query, "top_k": 5})
            assert response.status_code == 200
            return [hit["id"] for hit in response.json()["results"]]

    queries = list(PROBES) * 4
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, queries))
    expected = {query: ask(query) for query in PROBES}
    assert answers == [expected[query] for query in queries]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": ""}, "query"),
        ({"query": "   \n\t "}, "query"),
        ({"query": "tides", "top_k": 0}, "top_k"),
        ({"query": "tides", "top_k": 1001}, "top_k"),
        ({"query": "x" * 2049}, "query"),
        ({"top_k": 3}, "query"),
        ({"query": 42}, "query"),
        ({"query": ["tides"]}, "query"),
        ({"query": "tides", "top_k": "5"}, "top_k"),
        ({"query": "tides", "top_k": 2.5}, "top_k"),
        ({"query": "tides", "k": 5}, "k"),
        ({"queries": []}, "queries"),
        ({"queries": ["tides", " "]}, "queries.1"),
        ({"queries": ["tides"] * 65}, "queries"),
        ({"queries": ["tides", "x" * 2049]}, "queries.1"),
        ({"query": "tides", "queries": ["moon"]}, "queries"),
    ],
    ids=["empty", "whitespace", "top_k-0", "top_k-1001", "too-long", "missing-query", "query-int", "query-list",
         "top_k-str", "top_k-float", "unknown-field", "batch-empty", "batch-blank", "batch-too-many",
         "batch-too-long", "query-and-queries"],
)
def test_bad_request_is_422_naming_the_field(mini_server: LiveServer, body: dict[str, object], field: str) -> None:
    response = mini_server.client.post("/search", json=body)
    assert response.status_code == 422
    error = response.json()
    assert error["error"] == "invalid_request"
    assert [d["field"] for d in error["details"]] == [field]
    assert error["message"].startswith(f"{field}: ")
    assert "x" * 100 not in response.text  # the input is not echoed back


def test_batch_returns_one_list_per_query_in_order(live_server: LiveServer) -> None:
    queries = sorted(PROBES)
    response = live_server.client.post("/search", json={"queries": queries, "top_k": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    assert set(body) == {"results", "index", "timing_ms"}
    assert [len(hits) for hits in body["results"]] == [2] * len(queries)
    assert [hits[0]["id"] for hits in body["results"]] == [PROBES[q] for q in queries]


def test_a_batch_answers_each_query_as_it_would_be_answered_alone(mini_server: LiveServer) -> None:
    """The int8 student quantizes activations per ONNX call, so each query of a batch gets its own call."""
    queries = sorted(PROBES)
    batch = mini_server.client.post("/search", json={"queries": queries, "top_k": 3}).json()["results"]
    alone = [mini_server.client.post("/search", json={"query": q, "top_k": 3}).json()["results"] for q in queries]
    assert [[(h["id"], h["score"]) for h in hits] for hits in batch] == [
        [(h["id"], h["score"]) for h in hits] for hits in alone
    ]


def test_too_long_query_message_names_the_limit(mini_server: LiveServer) -> None:
    response = mini_server.client.post("/search", json={"query": "x" * 2049})
    assert "at most 2048" in response.json()["message"]


@pytest.mark.parametrize("content", [b"{not json", b"", b"[1, 2]"])
def test_malformed_body_is_422(mini_server: LiveServer, content: bytes) -> None:
    response = mini_server.client.post("/search", content=content, headers={"content-type": "application/json"})
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"


def test_health_and_readiness(mini_server: LiveServer) -> None:
    assert mini_server.client.get("/healthz").json() == {"status": "ok"}
    ready = mini_server.client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready"}


def test_unknown_route_and_method_are_json_errors(mini_server: LiveServer) -> None:
    missing = mini_server.client.get("/nope")
    assert missing.status_code == 404
    assert missing.json()["error"] == "not_found"
    wrong_method = mini_server.client.get("/search")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"] == "method_not_allowed"
    assert "POST" in wrong_method.headers["allow"]


def test_openapi_and_docs_are_served(mini_server: LiveServer) -> None:
    spec = mini_server.client.get("/openapi.json").json()
    assert {"/search", "/readyz", "/healthz"} <= set(spec["paths"])
    assert mini_server.client.get("/docs").status_code == 200


def test_answers_match_the_response_models_whichever_thread_serializes_them(mini_server: LiveServer) -> None:
    """Answers are serialized by orjson from plain dicts, on the event loop when small and on a worker thread when
    over INLINE_RENDER_HITS hits: both must be what the OpenAPI document's models say, and agree."""
    from service.http.routes.search import INLINE_RENDER_HITS
    from service.http.schemas.search import BatchSearchResponse, SearchResponse

    queries = sorted(PROBES) * 2
    assert len(queries) * len(DOCS) > INLINE_RENDER_HITS  # the batch below takes the worker thread
    fields = ["id", "score", "title", "text", "metadata"]
    batch = mini_server.client.post("/search", json={"queries": queries, "top_k": len(DOCS), "fields": fields})
    assert batch.status_code == 200, batch.text
    parsed = BatchSearchResponse.model_validate_json(batch.content, strict=True)
    for query, hits in zip(queries, parsed.results, strict=True):
        alone = mini_server.client.post("/search", json={"query": query, "top_k": len(DOCS), "fields": fields})
        assert alone.status_code == 200, alone.text
        assert SearchResponse.model_validate_json(alone.content, strict=True).results == hits
