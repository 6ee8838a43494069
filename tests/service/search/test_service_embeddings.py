"""POST /v1/embeddings over a real server: the official `openai` SDK gets the student's own vectors,
in the teacher's space, truncated and renormalized on request, under /search's limits."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import TYPE_CHECKING

import faiss
import numpy as np
import pytest

from indexer.build import BuildRequest, build
from models.bundle.storage.docstore import DOCSTORE_FILE, DocStore
from models.contract import truncate
from models.encoders.student import StudentEncoder
from service.http.app import create_app
from service.settings import ServiceSettings
from tests.fixtures.corpus import PROBES
from tests.fixtures.server import LiveServer, serve_app
from tests.fixtures.tiny_service import MINI_DIM

if TYPE_CHECKING:
    import openai

TEXTS = sorted(PROBES)


@pytest.fixture(scope="module")
def student(tiny_student: Path) -> StudentEncoder:
    return StudentEncoder(tiny_student, "int8")  # what the server runs by default


def _alone(student: StudentEncoder, texts: list[str]) -> np.ndarray:
    # One text per ONNX call, as the server encodes them (TANDEM_BATCH_MAX_QUERIES=1): int8 scales per call.
    return np.concatenate([student.encode([text]) for text in texts])


def _sdk(server: LiveServer, api_key: str = "unused") -> openai.OpenAI:
    """The official SDK, imported by the tests that use it: not by every xdist worker's collection."""
    import openai

    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=api_key, max_retries=0)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.mark.parametrize("encoding_format", [None, "float", "base64"])
def test_openai_sdk_gets_the_students_vectors(live_server: LiveServer, student: StudentEncoder,
                                              encoding_format: str | None) -> None:
    # None: the SDK's default, which asks for base64 and decodes it itself.
    extra = {} if encoding_format is None else {"encoding_format": encoding_format}
    response = _sdk(live_server).embeddings.create(input=TEXTS, model="tandem-student", **extra)
    if encoding_format == "base64":  # asked explicitly, the SDK hands the string over as it came
        got = np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in response.data])
    else:
        got = np.array([d.embedding for d in response.data], dtype=np.float32)
    assert [d.index for d in response.data] == list(range(len(TEXTS)))
    assert got.shape == (len(TEXTS), student.dim)
    assert _cosines(got, _alone(student, TEXTS)).min() >= 0.9999
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-4)
    assert response.model == "tandem-student"
    tokens = sum(sum(e.attention_mask) for e in student.tokenizer.encode_batch(TEXTS))
    assert response.usage.prompt_tokens == tokens == response.usage.total_tokens


@pytest.mark.parametrize("dimensions", [64, 256, 768])
def test_dimensions_truncate_and_renormalize(live_server: LiveServer, student: StudentEncoder,
                                             dimensions: int) -> None:
    response = _sdk(live_server).embeddings.create(input=TEXTS[0], model="x", dimensions=dimensions)
    got = np.array([response.data[0].embedding], dtype=np.float32)
    expected = truncate(_alone(student, TEXTS[:1]), dimensions)
    assert got.shape == (1, dimensions)
    assert _cosines(got, expected).min() >= 0.9999
    assert abs(float(np.linalg.norm(got)) - 1.0) < 1e-4


def test_query_vectors_find_the_teachers_documents(live_server: LiveServer, tiny_bundle: Path) -> None:
    """What an application with its own vector database does: cosine against the teacher's document vectors
    (here read back from the float bundle's flat index, in its docstore's row order)."""
    index = faiss.read_index(str(tiny_bundle / "index.faiss"))
    documents = index.reconstruct_n(0, index.ntotal)
    ids = DocStore(tiny_bundle / DOCSTORE_FILE).ids()
    response = live_server.client.post("/v1/embeddings", json={"input": TEXTS})
    queries = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
    best = np.argmax(queries @ documents.T, axis=1)
    assert [ids[row] for row in best] == [PROBES[text] for text in TEXTS]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["tides", "  "]}, "input"),
        ({"input": [1, 2, 3]}, "input"),
        ({"input": "x" * 2049}, "input"),
        ({"input": ["tides"] * 65}, "input"),
        ({"model": "x"}, "input"),
        ({"input": "tides", "dimensions": 0}, "dimensions"),
        ({"input": "tides", "dimensions": 769}, "dimensions"),
        ({"input": "tides", "dimensions": "64"}, "dimensions"),
        ({"input": "tides", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "tides", "temperature": 1}, "temperature"),
    ],
)
def test_bad_requests_are_422_naming_the_field(live_server: LiveServer, body: dict[str, object], field: str) -> None:
    response = live_server.client.post("/v1/embeddings", json=body)
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["error"] == "invalid_request"
    assert any(d["field"].startswith(field) for d in error["details"]), error


def test_embeddings_are_counted_in_metrics(live_server: LiveServer) -> None:
    assert live_server.client.post("/v1/embeddings", json={"input": "tides"}).status_code == 200
    metrics = live_server.client.get("/metrics").text
    assert 'tandem_http_requests_total{method="POST",route="/v1/embeddings",status="200"}' in metrics


def test_api_keys_guard_embeddings(mini_bundle: Path, mini_student: Path) -> None:
    """Mechanics: the tiny models serve (tests/fixtures/tiny_service.py)."""
    settings = ServiceSettings(index=mini_bundle, student=mini_student, api_keys="k-embed")
    with serve_app(create_app(settings)) as server:
        refused = server.client.post("/v1/embeddings", json={"input": "tides"})
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized"
        import openai

        with pytest.raises(openai.PermissionDeniedError):
            _sdk(server, api_key="wrong").embeddings.create(input="tides", model="x")
        response = _sdk(server, api_key="k-embed").embeddings.create(input="tides", model="x")
        assert len(response.data[0].embedding) == MINI_DIM


@pytest.mark.slow
def test_rotated_bundle_still_answers_in_the_teachers_space(mini_bundle: Path, mini_teacher: Path,
                                                             mini_student: Path, tiny_corpus: Path,
                                                             tmp_path: Path) -> None:
    """A PCA-rotated bundle rotates inside its index only: applications store unrotated teacher vectors.

    Mechanics, so on the tiny models (tests/fixtures/tiny_service.py): the bundle is built from the teacher vectors
    mini_bundle's build cached."""
    rotated = tmp_path / "rotated"
    build(BuildRequest(corpus=tiny_corpus, out=rotated, dim=MINI_DIM, quantization="int8", rotation="pca",
                       teacher=mini_teacher))
    with serve_app(create_app(ServiceSettings(index=rotated, student=mini_student))) as server:
        response = server.client.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "float"})
        assert server.client.post("/search", json={"query": TEXTS[0], "top_k": 1}).status_code == 200
    got = np.array([d["embedding"] for d in response.json()["data"]], dtype=np.float32)
    student = StudentEncoder(mini_student, "int8")  # what the server runs by default
    assert got.shape == (len(TEXTS), MINI_DIM) == (len(TEXTS), student.dim)
    assert _cosines(got, _alone(student, TEXTS)).min() >= 0.9999
