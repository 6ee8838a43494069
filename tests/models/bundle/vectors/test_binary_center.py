"""Binary codes centered on the corpus mean: balanced sign bits, better Hamming ranking, saved and loaded."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.bundle.vectors.index_spec import Quantization
from models.bundle.vectors.quantize import binary_encode
from models.bundle.vectors.space import CENTER_FILE, SPIN_FILE, Space, spin_matrix
from models.search import VectorIndex


def _corpus(n: int = 3000, dim: int = 128, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Unit vectors sharing a strong common direction (as embedding corpora do), and queries like them."""
    rng = np.random.default_rng(seed)
    mean = np.zeros(dim, dtype=np.float32)
    mean[:4] = 2.0
    x = rng.standard_normal((n + 50, dim)).astype(np.float32) + mean
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x[:n], x[n:]


def _recall_at_10(index: VectorIndex, docs: np.ndarray, queries: np.ndarray) -> float:
    truth = np.argsort(-(queries @ docs.T), axis=1)[:, :10]
    _, rows = index.hamming(queries, 10)
    return float(np.mean([len(set(r) & set(t)) / 10 for r, t in zip(rows, truth, strict=True)]))


def test_centered_bits_are_balanced_and_rank_better() -> None:
    docs, queries = _corpus()
    plain = VectorIndex.build(docs, 128, Quantization.BINARY)
    centered = VectorIndex.build(docs, 128, Quantization.BINARY, center=True)
    assert plain.space.center is None and centered.space.center is not None
    np.testing.assert_allclose(centered.space.center, docs.mean(axis=0), atol=1e-5)
    ones_plain = np.unpackbits(binary_encode(docs), axis=1)[:, :4].mean()
    ones_centered = np.unpackbits(binary_encode(docs - centered.space.center), axis=1)[:, :4].mean()
    assert ones_plain > 0.95  # the shared direction fixes the leading bits
    assert 0.4 < ones_centered < 0.6
    assert _recall_at_10(centered, docs, queries) > _recall_at_10(plain, docs, queries)


def test_center_is_saved_and_applied_to_queries_after_loading(tmp_path: Path) -> None:
    docs, queries = _corpus(n=500)
    built = VectorIndex.build(docs, 128, Quantization.BINARY, center=True, spin=True)
    names = built.save(tmp_path)
    assert CENTER_FILE in names and SPIN_FILE in names
    from models.bundle.vectors.index import RESCORE_FILE

    assert RESCORE_FILE in names
    loaded = VectorIndex.load(tmp_path, 128, Quantization.BINARY, space=Space.read(
        tmp_path, dim=128, quantization=Quantization.BINARY, centered=True, spun=True))
    assert loaded.space.center is not None and loaded.space.spin is not None
    for a, b in zip(built.search(queries, 10), loaded.search(queries, 10), strict=True):
        np.testing.assert_array_equal(a, b)


def test_streamed_build_writes_the_center_of_all_chunks(tmp_path: Path) -> None:
    """The streaming writer takes the mean over every chunk, and its codes equal the in-memory build's."""
    from indexer.writer import write_vectors
    from models.bundle.vectors.index_spec import IndexSpec
    from models.bundle.vectors.rotation import Rotation

    docs, _ = _corpus(n=700)
    full = np.concatenate([docs, np.zeros((700, 640), dtype=np.float32)], axis=1)  # 768-d, like a teacher's
    names = write_vectors(tmp_path, 700, lambda: [full[:300], full[300:]], dim=128, quantization=Quantization.BINARY,
                          rotation=Rotation.NONE, index=IndexSpec(), center=True)
    assert CENTER_FILE in names
    loaded = VectorIndex.load(tmp_path, 128, Quantization.BINARY, space=Space.read(
        tmp_path, dim=128, quantization=Quantization.BINARY, centered=True))
    built = VectorIndex.build(full, 128, Quantization.BINARY, center=True)
    assert loaded.space.center is not None and built.space.center is not None
    np.testing.assert_allclose(loaded.space.center, built.space.center, atol=1e-6)


def test_spin_evens_out_uneven_variance() -> None:
    """PCA leaves most variance in the leading axes; after a spin, every bit carries about the same share, and
    Hamming ranking of noisy queries (a student's, against a teacher's documents) holds up better."""
    rng = np.random.default_rng(1)
    scales = np.geomspace(1.0, 0.01, 128).astype(np.float32)  # PCA-like: sorted, fast-decaying variance
    docs = rng.standard_normal((3000, 128)).astype(np.float32) * scales
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = docs[:200] + 0.05 * rng.standard_normal((200, 128)).astype(np.float32)  # small, even errors
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    spin = spin_matrix(128)
    np.testing.assert_allclose(spin @ spin.T, np.eye(128), atol=1e-5)
    np.testing.assert_array_equal(spin, spin_matrix(128))  # the same matrix for the same seed
    centered = VectorIndex.build(docs, 128, Quantization.BINARY, center=True)
    spun = VectorIndex.build(docs, 128, Quantization.BINARY, center=True, spin=True)
    assert _recall_at_10(spun, docs, queries) > _recall_at_10(centered, docs, queries)
