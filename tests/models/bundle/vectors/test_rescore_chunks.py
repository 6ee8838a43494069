"""Stored vectors are scored a chunk at a time (VectorIndex.scores): the answer is the one a single array gives, bit
for bit (same rows, same order, same float32 scores), the memory one chunk's, counted, and the search's check runs
between chunks. Real FAISS indexes built in memory, no model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from models.bundle.vectors.index import CHUNK_ALIGN, RESCORE_CHUNK_BYTES, VectorIndex, chunk_rows
from models.bundle.vectors.index_spec import Quantization
from models.errors import DeadlineExceeded

ROWS, DIM = 6000, 256


@pytest.fixture(autouse=True)
def one_blas_thread() -> object:
    """As the service searches (search_threads 1): with more, OpenBLAS splits even one array by its length."""
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    x = np.random.default_rng(7).standard_normal((ROWS, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module", params=[Quantization.BINARY, Quantization.INT8, Quantization.FLOAT])
def index(request: pytest.FixtureRequest, vectors: np.ndarray) -> VectorIndex:
    return VectorIndex.build(vectors, DIM, request.param)


def _queries(vectors: np.ndarray) -> np.ndarray:
    noise = np.random.default_rng(8).standard_normal((6, DIM)).astype(np.float32) * 0.3
    q = vectors[:6] + noise
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def _whole(index: VectorIndex, query: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Today's scoring before chunks: every row decoded in one array."""
    return index.reconstruct(rows) @ query


def test_the_default_chunk_is_bounded_in_bytes(index: VectorIndex) -> None:
    assert index.chunk_rows == chunk_rows(DIM) == 4096 and index.chunk_rows * 4 * DIM <= RESCORE_CHUNK_BYTES
    assert [chunk_rows(d) for d in (64, 768, 1024, 4096)] == [16_384, 1024, 1024, 1024]  # whole CHUNK_ALIGN rows


@pytest.mark.parametrize("chunk", [CHUNK_ALIGN, 2 * CHUNK_ALIGN, 3 * CHUNK_ALIGN, ROWS])
def test_chunked_scores_equal_one_array(index: VectorIndex, vectors: np.ndarray, chunk: int) -> None:
    rows = np.sort(np.random.default_rng(chunk).choice(ROWS, size=5000, replace=False))
    query = _queries(vectors)[0]
    index.chunk_rows = chunk
    try:
        assert np.array_equal(index.scores(query, rows), _whole(index, query, rows))
    finally:
        index.chunk_rows = chunk_rows(DIM)


@pytest.mark.parametrize(("k", "oversample"), [(10, 4), (100, 16), (300, 10), (1000, 5)])
def test_chunked_search_and_exact_answer_as_unchunked(index: VectorIndex, vectors: np.ndarray, k: int,
                                                      oversample: int) -> None:
    queries = index.space.rotate(_queries(vectors))
    allowed = np.arange(0, ROWS, 2, dtype=np.int64)  # 3,000 rows: the exact pass scores all of them (not binary)
    answers = []
    for chunk in (ROWS * 64, CHUNK_ALIGN, 2 * CHUNK_ALIGN):  # the first: one chunk, as before chunks
        index.chunk_rows = chunk
        searched = index.search(queries, k, oversample)
        exact = [index.exact(queries[i : i + 1], k, allowed, oversample) for i in range(len(queries))]
        answers.append((searched, exact))
    index.chunk_rows = chunk_rows(DIM)
    (s0, r0), exact0 = answers[0]
    for (s, r), exact in answers[1:]:
        assert s.dtype == np.float32 and np.array_equal(r, r0) and np.array_equal(s, s0)
        for (es, er), (es0, er0) in zip(exact, exact0, strict=True):
            assert np.array_equal(er, er0) and np.array_equal(es, es0)


def test_rescoring_is_counted_in_chunks_and_checked_between_them(vectors: np.ndarray) -> None:
    index = VectorIndex.build(vectors, DIM, Quantization.BINARY)
    query = index.space.rotate(_queries(vectors)[:1])
    pool = index.rescore_rows(50, 16)
    assert pool == 800 == index.rescore_pool(50, 16)
    index.chunk_rows = 64
    calls: list[int] = []
    index.search(query, 50, 16, check=lambda: calls.append(index.scored.chunks))
    assert index.scored.rows == pool and index.scored.largest == 64
    assert index.scored.chunks == math.ceil(pool / 64) and len(calls) == index.scored.chunks - 1  # between chunks

    before = index.scored.chunks

    def expired() -> None:
        if index.scored.chunks - before >= 3:
            raise DeadlineExceeded("past")

    with pytest.raises(DeadlineExceeded):
        index.search(query, 50, 16, check=expired)
    assert index.scored.chunks - before == 3  # stopped after its third chunk, not at the end of its pool
    assert index.rescore_rows(10_000, 16) == ROWS  # never more than the index holds
    assert VectorIndex.build(vectors, DIM, Quantization.FLOAT).rescore_rows(50, 16) == 0
