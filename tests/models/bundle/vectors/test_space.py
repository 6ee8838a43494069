"""A version's space (models.bundle.vectors.space): fitted, written and read back whole, checked on read, applied to
queries as to documents, and read once per version however many segments share it."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.versions.changes import Changes
from indexer.versions.segments import apply_changes, link_version
from indexer.writer import write_version_manifest
from models.bundle.manifest import EmbeddingSource, SegmentInfo
from models.bundle.vectors.index_spec import Quantization
from models.bundle.vectors.quantize import binary_encode
from models.bundle.vectors.rotation import ROTATION_FILE, Rotation
from models.bundle.vectors.space import (
    CALIBRATION_FILE,
    CENTER_FILE,
    SPACE_FILES,
    SPIN_FILE,
    Space,
    rotate,
    row_exact_product,
    spin_matrix,
)
from models.bundle.version import Bundle, read_bundle_manifest
from models.contract import truncate
from models.corpus import Document
from models.errors import ContractMismatch

DIM = 64


def _unit(n: int, width: int = 768, seed: int = 0) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, width)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# Every file this process opens, while a test listens: Python's audit hook sees the real open() numpy's load makes.
_opened: list[str] | None = None


def _audit(event: str, args: tuple[object, ...]) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], str | Path):
        _opened.append(str(args[0]))


sys.addaudithook(_audit)


@contextmanager
def _opens() -> Iterator[list[str]]:
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


def test_a_fitted_space_is_written_and_read_back_whole(tmp_path: Path) -> None:
    x = _unit(300)
    space = Space.fit(300, lambda: [x[:100], x[100:]], dim=DIM, quantization=Quantization.BINARY,
                      rotation=Rotation.PCA, center=True, spin=True)
    names = space.save(tmp_path)
    assert sorted(names) == sorted(SPACE_FILES)
    read = Space.read(tmp_path, dim=DIM, quantization=Quantization.BINARY, rotation_width=768, centered=True, spun=True)
    for got, want in ((read.rotation, space.rotation), (read.center, space.center), (read.spin, space.spin)):
        assert got is not None and want is not None and got.dtype == np.float32
        np.testing.assert_array_equal(got, want)
    assert read.calibration is not None and space.calibration is not None
    np.testing.assert_array_equal(read.calibration.to_array(), space.calibration.to_array())
    # streamed in chunks, it is the space of the whole: the mean of every row, rotated and truncated
    assert space.center is not None
    np.testing.assert_allclose(space.center, space.project(x, DIM).mean(axis=0), atol=1e-6)


def test_a_float_space_without_rotation_has_no_files(tmp_path: Path) -> None:
    space = Space.fit(10, lambda: [_unit(10)], dim=DIM, quantization=Quantization.FLOAT)
    assert space == Space() and space.save(tmp_path) == [] and not list(tmp_path.iterdir())


@pytest.mark.parametrize(("name", "array"), [(CENTER_FILE, np.zeros(DIM + 1)), (SPIN_FILE, np.eye(DIM)[:, :-1]),
                                             (ROTATION_FILE, np.eye(767)), (CALIBRATION_FILE, np.zeros((2, 8)))])
def test_a_space_file_of_the_wrong_shape_is_refused_by_name(tmp_path: Path, name: str, array: np.ndarray) -> None:
    Space.fit(50, lambda: [_unit(50)], dim=DIM, quantization=Quantization.BINARY, rotation=Rotation.PCA,
              center=True, spin=True).save(tmp_path)
    np.save(tmp_path / name, array.astype(np.float32))
    with pytest.raises(ValueError, match=name):
        Space.read(tmp_path, dim=DIM, quantization=Quantization.BINARY, rotation_width=768, centered=True, spun=True)


def test_queries_go_through_the_transforms_documents_did() -> None:
    x, q = _unit(200), _unit(5, seed=1)
    space = Space.fit(200, lambda: [x], dim=DIM, quantization=Quantization.BINARY, rotation=Rotation.PCA,
                      center=True, spin=True)
    assert space.rotation is not None and space.center is not None and space.spin is not None
    np.testing.assert_allclose(space.rotate(q) @ space.rotate(x).T, q @ x.T, atol=1e-5)  # orthogonal: scores kept
    projected = space.project(q, DIM)
    assert projected.flags.c_contiguous and projected.dtype == np.float32
    np.testing.assert_array_equal(projected, truncate(rotate(q, space.rotation), DIM))
    np.testing.assert_array_equal(space.sign_codes(projected),
                                  binary_encode(row_exact_product(projected - space.center, space.spin)))
    assert Space().rotate(q) is q and rotate(q, None) is q  # no rotation: the very array, no copy


def _docs(prefix: str, n: int) -> list[Document]:
    return [Document(id=f"{prefix}{i}", title="", text=f"word{i} text", metadata=json.dumps({"i": i}))
            for i in range(n)]


def _three_segments(root: Path) -> Path:
    """A binary PCA version (every space file: rotation, calibration, center, spin) and two updates: a version of
    three segments."""
    docs = _docs("a", 40)
    (root / "corpus.jsonl").write_text("".join(json.dumps({"_id": d.id, "text": d.text}) + "\n" for d in docs))
    np.save(root / "e.npy", _unit(40))
    (root / "ids.json").write_text(json.dumps([d.id for d in docs]))
    previous = root / "v1"
    build(BuildRequest(corpus=root / "corpus.jsonl", out=previous, embeddings=root / "e.npy", ids=root / "ids.json",
                       store=root / "store", dim=DIM, quantization="binary", rotation="pca"))
    for seed, name in enumerate(("v2", "v3"), start=2):
        manifest = read_bundle_manifest(previous)
        staging = root / name
        staging.mkdir()
        link_version(previous, manifest, staging)

        def given(fresh: list[Document], reused: list[Document], rows: list[tuple[SegmentInfo, int]],
                  seed: int = seed) -> tuple[np.ndarray, EmbeddingSource, int]:
            return _unit(len(fresh) + len(reused), seed=seed), EmbeddingSource(kind="imported"), 0

        applied = apply_changes(staging, manifest, Changes(upserts=_docs(name, 5), deletes={}), name=name,
                                space=Space.of(previous, manifest), vectors=given)
        write_version_manifest(staging, applied.manifest.model_copy(update={"version": name}))
        previous = staging
    return previous


@pytest.mark.usefixtures("tandem_home", "no_agreement_sample")  # synthetic vectors: no sample to draw
def test_a_version_reads_its_space_once_however_many_segments_share_it(tmp_path: Path) -> None:
    version = _three_segments(tmp_path)
    manifest = read_bundle_manifest(version)
    assert len(manifest.parts) == 3 and sorted(Space.files(manifest)) == sorted(SPACE_FILES)
    with _opens() as opened:
        bundle = Bundle(version)
    try:
        read = sorted(Path(p).name for p in opened if Path(p).name in SPACE_FILES)
        assert read == sorted(SPACE_FILES), read  # each file once, not once per segment
        assert all(segment.vectors.space is bundle.space for segment in bundle.segments)
        with _opens() as opened:  # a reload to a version of the same segments shares them, and reads the space once
            again = Bundle(version, reuse=bundle)
        assert again.reused == 3
        assert sorted(Path(p).name for p in opened if Path(p).name in SPACE_FILES) == sorted(SPACE_FILES)
        again.close()
    finally:
        bundle.close()


@pytest.mark.usefixtures("tandem_home", "no_agreement_sample")  # synthetic vectors: no sample to draw
def test_a_bundle_with_a_bad_space_file_fails_to_load_naming_it(tmp_path: Path) -> None:
    from models.hashing import sha256_file

    version = _three_segments(tmp_path)
    np.save(version / SPIN_FILE, np.eye(DIM - 1, dtype=np.float32))
    manifest = json.loads((version / "manifest.json").read_text())
    manifest["files"][SPIN_FILE] = sha256_file(version / SPIN_FILE)
    (version / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ContractMismatch, match=f"unreadable space files: {SPIN_FILE} has shape"):
        Bundle(version)


def test_a_rows_rotation_and_codes_are_the_same_alone_or_among_others() -> None:
    """BLAS's float32 kernels differ by shape (gemv for one row, gemm tiles for several), enough to move an int8 code
    or a sign: a compaction, which quantizes its segments' rows together again, must get the codes each row had."""
    rng = np.random.default_rng(0)
    rotation = np.linalg.qr(rng.standard_normal((96, 96)))[0].astype(np.float32)
    rows = rng.standard_normal((37, 96)).astype(np.float16).astype(np.float32)
    space = Space(rotation=rotation, spin=spin_matrix(32))
    together = space.rotate(rows)
    assert together.dtype == np.float32
    alone = np.concatenate([space.rotate(rows[i : i + 1]) for i in range(len(rows))])
    assert np.array_equal(together, alone)
    assert np.array_equal(row_exact_product(rows, rotation), together)
    codes = space.sign_codes(together[:, :32])
    assert np.array_equal(codes, np.concatenate([space.sign_codes(together[i : i + 1, :32]) for i in range(len(rows))]))
