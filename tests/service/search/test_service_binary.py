"""A binary bundle served end to end: Hamming candidates rescored with int8 vectors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from indexer.build import BuildRequest, build
from models.bundle.version import Bundle
from models.encoders.student import StudentEncoder
from models.search import dense_hits
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.corpus import DOCS, PROBES
from tests.fixtures.server import LiveServer, serve_app


def _bundle(tiny_corpus: Path, out: Path, quantization: str) -> Path:
    if not out.exists():
        build(BuildRequest(corpus=tiny_corpus, out=out, dim=256, quantization=quantization))
    return out


@pytest.fixture(scope="module")
def float_256(tiny_bundle: Path, tiny_corpus: Path, bundles_dir: Path) -> Path:
    # tiny_bundle has cached the teacher's vectors, so these builds do not encode again.
    return _bundle(tiny_corpus, bundles_dir / "tiny-256-float", "float")


@pytest.fixture(scope="module")
def binary_server(tiny_bundle: Path, tiny_corpus: Path, tiny_student: Path, bundles_dir: Path) -> Iterator[LiveServer]:
    binary = _bundle(tiny_corpus, bundles_dir / "tiny-256-binary", "binary")
    with serve_app(create_app(ServiceSettings(index=binary, student=tiny_student, binary_oversample=4))) as server:
        yield server


@pytest.mark.parametrize(("query", "doc_id"), sorted(PROBES.items()))
def test_probe_finds_its_document_first(binary_server: LiveServer, query: str, doc_id: str) -> None:
    response = binary_server.client.post("/search", json={"query": query, "top_k": 5})
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["index"]["quantization"], body["index"]["dim"]) == ("binary", 256)
    assert body["results"][0]["id"] == doc_id


def test_scores_are_rescored_cosines(binary_server: LiveServer, float_256: Path, tiny_student: Path) -> None:
    """top_k × oversample covers the whole tiny corpus, so the answer is the exact int8 ranking."""
    query = "hormone that controls blood sugar"
    served = binary_server.client.post("/search", json={"query": query, "top_k": 5}).json()["results"]
    exact = Bundle(float_256)
    try:
        hits = dense_hits(exact, StudentEncoder(tiny_student).encode([query]), len(DOCS))[0]
    finally:
        exact.close()
    float_scores = {hit.doc.id: hit.score for hit in hits}
    assert served[0]["id"] == hits[0].doc.id
    for hit in served:
        assert hit["score"] == pytest.approx(float_scores[hit["id"]], abs=0.03)
