"""PCA rotation: inner products kept at full width, variance moved into the dims truncation keeps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from models.bundle.vectors.rotation import ROTATION_FILE, Rotation, fit_pca_rotation
from models.bundle.version import Bundle, verify_bundle
from models.contract import l2_normalize, truncate
from models.encoders.student import StudentEncoder
from models.errors import InputError
from models.search import dense_hits, rotate
from tests.fixtures.corpus import PROBES


def _skewed(n: int, dim: int = 64, seed: int = 0) -> np.ndarray:
    """Unit vectors whose variance lives in the *last* dims: the worst case for plain truncation."""
    rng = np.random.default_rng(seed)
    scales = np.linspace(0.05, 1.0, dim)
    return l2_normalize(rng.normal(size=(n, dim)) * scales)


def test_rotation_is_orthogonal_and_keeps_full_width_scores() -> None:
    docs, queries = _skewed(500), _skewed(20, seed=1)
    matrix = fit_pca_rotation(docs)
    assert np.allclose(matrix.T @ matrix, np.eye(64), atol=1e-5)
    assert np.allclose(rotate(queries, matrix) @ rotate(docs, matrix).T, queries @ docs.T, atol=1e-5)
    assert rotate(queries, None) is queries


def test_rotation_puts_the_variance_first_and_truncation_keeps_more() -> None:
    docs, queries = _skewed(2000), _skewed(50, seed=1)
    rotated = rotate(docs, fit_pca_rotation(docs))
    variances = rotated.var(axis=0)
    assert variances[:16].sum() > docs.var(axis=0)[:16].sum() * 3
    exact = np.argsort(-(queries @ docs.T), axis=1)[:, :10]

    def overlap(d: np.ndarray, q: np.ndarray) -> float:
        top = np.argsort(-(truncate(q, 16) @ truncate(d, 16).T), axis=1)[:, :10]
        return float(np.mean([len(set(a) & set(b)) for a, b in zip(top, exact, strict=True)]) / 10)

    matrix = fit_pca_rotation(docs)
    assert overlap(rotate(docs, matrix), rotate(queries, matrix)) > overlap(docs, queries) + 0.1


@pytest.mark.slow
@pytest.mark.usefixtures("no_agreement_sample")  # each build would load the real teacher for a sample asserted nowhere
def test_rotated_bundle_records_applies_and_verifies_it(
    tiny_corpus: Path, tiny_bundle: Path, tiny_student: Path, tmp_path: Path
) -> None:
    out = tmp_path / "pca-128-int8"
    manifest = build(BuildRequest(corpus=tiny_corpus, out=out, dim=128, quantization="int8", rotation="pca"))
    assert manifest.rotation is Rotation.PCA and ROTATION_FILE in manifest.files
    assert manifest.summary()["rotation"] == "pca"
    verify_bundle(out)
    queries = StudentEncoder(tiny_student).encode(list(PROBES))
    hits = dense_hits(Bundle(out), queries, k=1)  # the search rotates the queries by the bundle's matrix
    assert {q: h[0].doc.id for q, h in zip(PROBES, hits, strict=True)} == PROBES
    full = tmp_path / "pca-768-float"
    build(BuildRequest(corpus=tiny_corpus, out=full, rotation="pca"))
    rotated, plain = dense_hits(Bundle(full), queries, k=5), dense_hits(Bundle(tiny_bundle), queries, k=5)
    for a, b in zip(rotated, plain, strict=True):  # at full width a rotation changes no score
        assert [h.doc.id for h in a] == [h.doc.id for h in b]
        assert np.allclose([h.score for h in a], [h.score for h in b], atol=1e-5)


def test_unknown_rotation_is_refused(tiny_corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="unknown rotation 'svd'"):
        build(BuildRequest(corpus=tiny_corpus, out=tmp_path / "b", rotation="svd"))
