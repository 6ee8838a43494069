"""The streaming build: bundles equal to the in-memory path, imports at scale, exports, duplicate ids on disk."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from indexer.build import BuildRequest, build
from indexer.export import export
from indexer.options import ExportFormat
from models.bundle.manifest import BundleManifest
from models.bundle.vectors.index import RESCORE_FILE
from models.bundle.vectors.index_spec import Quantization, resolve_spec
from models.bundle.vectors.rotation import ROTATION_FILE, fit_pca_rotation
from models.bundle.vectors.space import CALIBRATION_FILE
from models.bundle.version import Bundle
from models.embeddings.store import EmbeddingStore
from models.errors import InputError
from models.search import VectorIndex, rotate

pytestmark = pytest.mark.usefixtures("no_agreement_sample")  # synthetic vectors: tests/fixtures/tiny_home.py

N = 1500


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], np.ndarray]:
    """A corpus of N short documents and unit vectors with a shared mean, as real embeddings have."""
    rng = np.random.default_rng(7)
    vecs = rng.standard_normal((N, 768)).astype(np.float32) + 0.5 * rng.standard_normal(768).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    directory = tmp_path_factory.mktemp("synthetic")
    ids = [f"doc-{i}" for i in range(N)]
    with (directory / "corpus.jsonl").open("w") as fh:
        for i, doc_id in enumerate(ids):
            fh.write(json.dumps({"_id": doc_id, "title": f"Title {i}", "text": f"text number {i} " * 3}) + "\n")
    return directory / "corpus.jsonl", ids, vecs


def _import(corpus: Path, embeddings: Path, out: Path, store: Path, ids: Path | None = None,
            **options: object) -> BundleManifest:
    return build(BuildRequest(corpus=corpus, out=out, embeddings=embeddings, ids=ids, store=store, shard_size=128,
                              **options))  # type: ignore[arg-type]


def _import_npy(synthetic: tuple[Path, list[str], np.ndarray], directory: Path, **options: object) -> BundleManifest:
    """Save the synthetic vectors as one .npy with its ids, and build `directory`/b from them."""
    corpus, ids, vecs = synthetic
    np.save(directory / "e.npy", vecs)
    (directory / "ids.json").write_text(json.dumps(ids))
    return _import(corpus, directory / "e.npy", directory / "b", directory / "store", directory / "ids.json",
                   **options)


@pytest.mark.parametrize(("quantization", "rotation", "index"), [
    ("float", "none", "flat"), ("int8", "pca", "flat"), ("binary", "pca", "flat"), ("binary", "none", "ivf"),
    ("int8", "none", "hnsw"),
])
def test_streamed_bundle_equals_the_in_memory_build(
    tandem_home: Path, synthetic: tuple[Path, list[str], np.ndarray], tmp_path: Path,
    quantization: str, rotation: str, index: str,
) -> None:
    _, ids, _ = synthetic
    m = _import_npy(synthetic, tmp_path, dim=256, quantization=quantization, rotation=rotation, index=index)
    stored = EmbeddingStore(tmp_path / "store").load(m.embeddings.store_key or "")  # float16-rounded, as built
    assert stored is not None and len(list((tmp_path / "store" / (m.embeddings.store_key or "")).glob("*.npy"))) == 1
    reference = stored
    if rotation == "pca":
        got = np.load(tmp_path / "b" / ROTATION_FILE)
        want = fit_pca_rotation(stored)
        assert np.allclose(np.abs((got * want).sum(axis=0))[:256], 1.0, atol=1e-4)  # same axes, up to sign
        reference = rotate(stored, got)
    q = Quantization(quantization)
    binary = q is Quantization.BINARY  # binary codes are centered and spun by default, in both paths
    memory = VectorIndex.build(reference, 256, q, resolve_spec(index, q, N), center=binary, spin=binary)
    bundle = Bundle(tmp_path / "b")
    exact = rotation == "none"  # rotating chunk by chunk may round the last float bit differently
    if q is not Quantization.FLOAT:
        assert memory.space.calibration is not None
        got_cal, want_cal = np.load(tmp_path / "b" / CALIBRATION_FILE), memory.space.calibration.to_array()
        assert np.array_equal(got_cal, want_cal) if exact else np.allclose(got_cal, want_cal, rtol=0, atol=1e-6)
    if q is Quantization.BINARY:
        saved = io.BytesIO()
        np.save(saved, memory.rescore_codes)
        written = (tmp_path / "b" / RESCORE_FILE).read_bytes()
        assert len(written) == len(saved.getvalue()) and written[:128] == saved.getvalue()[:128]  # np.save's header
        codes = np.frombuffer(written[128:], np.uint8).astype(int) - np.frombuffer(saved.getvalue()[128:], np.uint8)
        assert np.abs(codes).max() <= (0 if exact else 1)
    queries = reference[:20] + 0.05
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    want_rows = memory.search(queries, 10)[1]
    got_rows = bundle.segments[0].vectors.search(queries, 10)[1]
    if index == "flat" and not binary:
        assert np.array_equal(got_rows, want_rows)
    else:  # approximate indexes, and sign bits of a mean summed in another order, may differ in a neighbour
        assert np.array_equal(got_rows[:, 0], want_rows[:, 0])
    assert bundle.ids() == ids


def test_duplicate_id_names_both_lines_and_publishes_nothing(tandem_home: Path, tmp_path: Path) -> None:
    corpus = tmp_path / "dup.jsonl"
    lines = [{"_id": f"d{i}", "text": f"text {i}"} for i in range(12_000)]  # past one docstore chunk
    lines.insert(11_000, {"_id": "d3", "text": "again"})
    corpus.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    with pytest.raises(InputError, match=r"dup\.jsonl:11001: duplicate id 'd3' \(first seen on line 4\)"):
        build(BuildRequest(corpus=corpus, out=tmp_path / "out", store=tmp_path / "store"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dup.jsonl"]  # no bundle, no staging left


def test_npy_shard_directory_and_parquet_imports_give_the_same_bundle(
    tandem_home: Path, synthetic: tuple[Path, list[str], np.ndarray], tmp_path: Path
) -> None:
    corpus, ids, vecs = synthetic
    single = _import_npy(synthetic, tmp_path)

    shards = tmp_path / "shards"
    shards.mkdir()
    order = np.random.default_rng(1).permutation(N)  # shards written by a job elsewhere, in its own order
    for part, rows in enumerate(np.array_split(order, 4)):
        np.save(shards / f"part-{part:03d}.npy", vecs[rows].astype(np.float16))
    (tmp_path / "shard-ids.json").write_text(json.dumps([ids[r] for r in order]))
    sharded = _import(corpus, shards, tmp_path / "sharded", tmp_path / "s2", tmp_path / "shard-ids.json")

    parquet = tmp_path / "parquet"
    parquet.mkdir()
    for part, rows in enumerate(np.array_split(order, 3)):
        flat = pa.array(vecs[rows].ravel(), type=pa.float32())
        pq.write_table(pa.table({"doc": [ids[r] for r in rows], "emb": pa.FixedSizeListArray.from_arrays(flat, 768)}),
                       parquet / f"part-{part}.parquet", row_group_size=100)
    from_parquet = _import(corpus, parquet, tmp_path / "c", tmp_path / "s3", id_column="doc", vector_column="emb")

    reference = Bundle(tmp_path / "b").segments[0].vectors.index.reconstruct_n(0, N)
    for name, manifest in (("sharded", sharded), ("c", from_parquet)):
        assert manifest.embeddings.kind == "imported"
        assert np.array_equal(Bundle(tmp_path / name).segments[0].vectors.index.reconstruct_n(0, N), reference), name
    assert single.embeddings.store_key == sharded.embeddings.store_key == from_parquet.embeddings.store_key


def test_parquet_import_errors_name_the_file_and_row(
    tandem_home: Path, synthetic: tuple[Path, list[str], np.ndarray], tmp_path: Path
) -> None:
    corpus, ids, vecs = synthetic
    path = tmp_path / "v.parquet"

    def attempt(table: pa.Table, **options: object) -> BundleManifest:
        pq.write_table(table, path)
        return _import(corpus, path, tmp_path / "out", tmp_path / "store", **options)

    flat = pa.array(vecs[:, :384].ravel(), type=pa.float32())
    with pytest.raises(InputError, match=r"v\.parquet: row 0 has a 384-d vector, expected 768"):
        attempt(pa.table({"id": ids, "vector": pa.FixedSizeListArray.from_arrays(flat, 384)}))
    good = pa.FixedSizeListArray.from_arrays(pa.array(vecs.ravel(), type=pa.float32()), 768)
    with pytest.raises(InputError, match=r"no column 'vector' .*--vector-column"):
        attempt(pa.table({"id": ids, "embedding": good}))
    with pytest.raises(InputError, match="no embedding"):
        attempt(pa.table({"id": ids[:-1], "vector": good[:-1]}))
    with pytest.raises(InputError, match=r"duplicate id 'doc-0'"):
        attempt(pa.table({"id": [*ids[:-1], "doc-0"], "vector": good}))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("fmt", list(ExportFormat))
def test_export_round_trips_into_an_import(
    tandem_home: Path, synthetic: tuple[Path, list[str], np.ndarray], tmp_path: Path, fmt: ExportFormat
) -> None:
    corpus, ids, vecs = synthetic
    _import_npy(synthetic, tmp_path, quantization="binary", dim=256)
    out = tmp_path / f"export.{fmt.value}"
    assert export(tmp_path / "b", out, fmt, EmbeddingStore(tmp_path / "store")) == N
    if fmt is ExportFormat.PARQUET:
        table = pq.read_table(out)
        rows = {"id": table["id"].to_pylist(), "title": table["title"].to_pylist()}
        exported = np.asarray(table["vector"].combine_chunks().flatten().to_numpy()).reshape(N, 768)
    else:
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        rows = {"id": [r["id"] for r in lines], "title": [r["title"] for r in lines]}
        exported = np.asarray([r["vector"] for r in lines], dtype=np.float32)
    assert rows["id"] == ids and rows["title"][5] == "Title 5"
    assert np.abs(exported - vecs).max() < 1e-3  # the teacher's full vectors (float16 in the store)
    if fmt is ExportFormat.PARQUET:  # what another store loads, tandem loads back
        again = _import(corpus, out, tmp_path / "again", tmp_path / "store2")
        assert again.embeddings.kind == "imported"


def test_export_refuses_a_bundle_whose_vectors_are_gone(
    tandem_home: Path, synthetic: tuple[Path, list[str], np.ndarray], tmp_path: Path
) -> None:
    _import_npy(synthetic, tmp_path, quantization="int8", dim=256)
    with pytest.raises(InputError, match="not in the embedding store"):
        export(tmp_path / "b", tmp_path / "x.parquet", ExportFormat.PARQUET, EmbeddingStore(tmp_path / "elsewhere"))
    assert not (tmp_path / "x.parquet").exists()
