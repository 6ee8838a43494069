"""models.bundle.vectors.first_stage: each index type × quantization builds a FAISS first stage that finds a stored
vector as its own nearest neighbour, takes its search parameters from the spec, and refuses a spec of another type."""

from __future__ import annotations

import faiss
import numpy as np
import pytest

from models.bundle.vectors.first_stage import (
    apply_search_params,
    build_first_stage,
    first_stage_codes,
    hamming_top,
    stored_codes,
    train_step,
)
from models.bundle.vectors.index_spec import IndexSpec, IndexType, Quantization
from models.bundle.vectors.quantize import Int8Calibration

DIM = 64
SPECS = {
    IndexType.FLAT: IndexSpec(),
    IndexType.HNSW: IndexSpec(type=IndexType.HNSW, hnsw_m=8, ef_construction=40, ef_search=16),
    IndexType.IVF: IndexSpec(type=IndexType.IVF, ivf_nlist=2, ivf_nprobe=2),
}
COMBINATIONS = [(t, q) for t in (IndexType.FLAT, IndexType.HNSW) for q in Quantization] + [
    (IndexType.IVF, Quantization.BINARY)]


@pytest.fixture(scope="module")
def vectors() -> np.ndarray:
    x = np.random.default_rng(0).standard_normal((200, DIM)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.mark.parametrize(("kind", "quantization"), COMBINATIONS)
def test_each_first_stage_finds_a_stored_vector_first(vectors: np.ndarray, kind: IndexType,
                                                      quantization: Quantization) -> None:
    cal = Int8Calibration.fit(vectors) if quantization is Quantization.INT8 else None
    index = build_first_stage(vectors, quantization, SPECS[kind], cal)
    assert index.ntotal == len(vectors)
    _, rows = index.search(first_stage_codes(vectors[:5], quantization), 1)
    assert rows[:, 0].tolist() == [0, 1, 2, 3, 4]


def test_search_params_come_from_the_spec_and_another_type_is_refused(vectors: np.ndarray) -> None:
    hnsw = build_first_stage(vectors, Quantization.FLOAT, SPECS[IndexType.HNSW], None)
    assert faiss.downcast_index(hnsw).hnsw.efSearch == 16
    apply_search_params(hnsw, SPECS[IndexType.HNSW].model_copy(update={"ef_search": 5}))
    assert faiss.downcast_index(hnsw).hnsw.efSearch == 5
    with pytest.raises(ValueError, match=r"holds a hnsw index .* the manifest says flat"):
        apply_search_params(hnsw, SPECS[IndexType.FLAT])


def test_binary_codes_are_sign_bits_and_flat_ones_are_readable(vectors: np.ndarray) -> None:
    codes = first_stage_codes(vectors, Quantization.BINARY)
    assert codes.shape == (len(vectors), DIM // 8) and codes.dtype == np.uint8
    flat = build_first_stage(vectors, Quantization.BINARY, SPECS[IndexType.FLAT], None)
    assert np.array_equal(stored_codes(flat), codes)
    hnsw = build_first_stage(vectors, Quantization.BINARY, SPECS[IndexType.HNSW], None)
    assert np.array_equal(stored_codes(hnsw), codes)
    assert stored_codes(build_first_stage(vectors, Quantization.BINARY, SPECS[IndexType.IVF], None)) is None


def test_hamming_top_chunked_equals_one_pass(vectors: np.ndarray) -> None:
    codes = first_stage_codes(vectors, Quantization.BINARY)
    rows = np.arange(0, len(vectors), 2, dtype=np.int64)
    one_pass = hamming_top(codes, rows, codes[4:5], 5, chunk=len(rows))
    chunked = hamming_top(codes, rows, codes[4:5], 5, chunk=7)
    assert one_pass[0] == 4 and 4 in chunked
    distance = np.unpackbits(codes ^ codes[4], axis=1).sum(axis=1)
    assert sorted(distance[chunked].tolist()) == sorted(distance[one_pass].tolist())


def test_train_step_samples_a_bounded_number_per_cell() -> None:
    ivf = IndexSpec(type=IndexType.IVF, ivf_nlist=4)
    assert train_step(100, ivf) == 1 and train_step(2_560, ivf) == 10 and train_step(5, IndexSpec()) == 1
