"""Index types (flat, hnsw, ivf) × quantizations with real FAISS: recall against exact search,
bundles that build, verify and load, refused combinations, manifests, and updates that keep the type."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.versions.update import UpdateRequest, update
from models.bundle.manifest import BundleManifest
from models.bundle.vectors.index_spec import IndexSpec, IndexType, Quantization, resolve_spec
from models.bundle.version import Bundle, read_bundle_manifest, verify_bundle
from models.errors import ContractMismatch
from models.search import VectorIndex, dense_hits
from tests.fixtures.corpus import DOCS
from tests.indexer.test_agreement_check import in_process_cli

# No agreement samples: nothing here reads one, and each build and update would encode its queries and search for
# them (samples: tests/indexer/test_agreement_check.py).
pytestmark = pytest.mark.usefixtures("no_agreement_sample")
VALID = [("flat", "float"), ("flat", "int8"), ("flat", "binary"), ("hnsw", "float"), ("hnsw", "int8"),
         ("hnsw", "binary"), ("ivf", "binary")]
# recall@10 against exact float search on the clustered vectors below (measured: 1.0 / 0.99 / ~0.87)
FLOOR = {"float": 0.95, "int8": 0.9, "binary": 0.75}


@pytest.fixture(scope="module")
def clustered() -> tuple[np.ndarray, np.ndarray]:
    """3,000 unit vectors in 40 clusters and 200 queries near some of them: closer to embeddings than noise."""
    rng = np.random.default_rng(0)
    centers = rng.standard_normal((40, 768)).astype(np.float32) / np.sqrt(768)
    docs = centers[rng.integers(0, 40, 3000)] + 0.04 * rng.standard_normal((3000, 768)).astype(np.float32)
    docs /= np.linalg.norm(docs, axis=1, keepdims=True)
    queries = docs[rng.choice(3000, 200, replace=False)] + 0.02 * rng.standard_normal((200, 768)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    return docs, queries


def _recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)]))


@pytest.mark.parametrize(("kind", "quantization"), VALID)
def test_recall_against_exact_search(
    clustered: tuple[np.ndarray, np.ndarray], tmp_path: Path, kind: str, quantization: str
) -> None:
    docs, queries = clustered
    q = Quantization(quantization)
    _, truth = VectorIndex.build(docs, 768, Quantization.FLOAT).search(queries, 10)
    spec = resolve_spec(kind, q, len(docs))
    VectorIndex.build(docs, 768, q, spec).save(tmp_path)
    loaded = VectorIndex.load(tmp_path, 768, q, spec)
    _, rows = loaded.search(queries, 10)
    assert _recall(rows, truth) >= FLOOR[quantization]
    assert loaded.count == len(docs)
    if q is Quantization.BINARY:  # the rescoring stage stays on disk, paged in on demand
        assert isinstance(loaded.rescore_codes, np.memmap)


def test_search_parameters_come_from_the_manifest(clustered: tuple[np.ndarray, np.ndarray], tmp_path: Path) -> None:
    docs = clustered[0][:500]
    hnsw, ivf = tmp_path / "hnsw", tmp_path / "ivf"
    hnsw.mkdir()
    ivf.mkdir()
    VectorIndex.build(docs, 256, Quantization.FLOAT, resolve_spec("hnsw", Quantization.FLOAT, 500)).save(hnsw)
    VectorIndex.build(docs, 256, Quantization.BINARY, resolve_spec("ivf", Quantization.BINARY, 500)).save(ivf)
    h = VectorIndex.load(hnsw, 256, Quantization.FLOAT, IndexSpec(type=IndexType.HNSW, hnsw_m=32, ef_search=7))
    assert h.index.hnsw.efSearch == 7  # type: ignore[union-attr]
    i = VectorIndex.load(ivf, 256, Quantization.BINARY, IndexSpec(type=IndexType.IVF, ivf_nlist=12, ivf_nprobe=5))
    assert i.index.nprobe == 5  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="holds a hnsw index"):
        VectorIndex.load(hnsw, 256, Quantization.FLOAT)


def test_cli_refuses_with_exit_code_2(tandem_home: Path, tiny_corpus: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Through tandem.cli.main in this process (its exit code and error line), not a `python -m tandem` process: the
    refusal comes before any encoding, and the entry point itself is started by every served test (tests/fixtures)."""
    args = ["index", "build", "--corpus", str(tiny_corpus), "--out", str(tmp_path / "b"), "--index", "ivf"]
    code, _, err = in_process_cli(capsys, *args)
    assert code == 2
    assert "--index ivf does not support --quantization float" in err and "Traceback" not in err
    assert not (tmp_path / "b").exists()


def test_manifest_round_trip_and_old_manifests(tiny_bundle: Path) -> None:
    manifest = read_bundle_manifest(tiny_bundle)
    spec = IndexSpec(type=IndexType.HNSW, hnsw_m=16, ef_construction=40, ef_search=32)
    with_spec = manifest.model_copy(update={"index": spec})
    assert BundleManifest.model_validate_json(with_spec.model_dump_json(exclude_none=True)).index == spec
    old = manifest.model_dump(mode="json", exclude_none=True)
    old.pop("index")  # written before index types existed
    assert BundleManifest.model_validate(old).index == IndexSpec()
    with pytest.raises(ValueError, match="extra"):
        BundleManifest.model_validate({**old, "index": {"type": "hnsw", "efSearch": 3}})


@pytest.mark.parametrize(("kind", "quantization"), [v for v in VALID if v[0] != "flat"])
def test_bundles_of_each_type_verify_load_and_find(
    tiny_home: Path, tiny_teacher_bundle: Path, tiny_corpus: Path, tmp_path: Path, kind: str, quantization: str
) -> None:
    """On the tiny teacher (tests/fixtures/tiny_home.py), truncated to 64 of its 128 dims."""
    out = tmp_path / f"tiny-64-{quantization}-{kind}"
    manifest = build(BuildRequest(corpus=tiny_corpus, out=out, dim=64, quantization=quantization, index=kind))
    assert manifest.index.type.value == kind
    assert verify_bundle(out) == manifest
    bundle = Bundle(out)
    queries = Bundle(tiny_teacher_bundle).segments[0].vectors.index.reconstruct_n(0, len(DOCS))  # the documents' own
    hits = dense_hits(bundle, queries, k=3)
    assert sum(h[0].row == i for i, h in enumerate(hits)) >= len(DOCS) - 1
    assert bundle.manifest.summary()["index"] == kind


@pytest.mark.slow  # the build resolves the teacher model first
def test_broken_type_is_refused_at_load(tiny_home: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "tiny-mislabelled"
    build(BuildRequest(corpus=tiny_corpus, out=out, dim=64, quantization="float", index="hnsw"))
    manifest = read_bundle_manifest(out).model_copy(update={"index": IndexSpec()})
    (out / "manifest.json").write_text(manifest.model_dump_json(exclude_none=True))
    with pytest.raises(ContractMismatch, match="holds a hnsw index"):
        Bundle(out)


def test_update_keeps_the_index_type(tiny_home: Path, tiny_corpus: Path, tmp_path: Path) -> None:
    base = tmp_path / "base"
    spec = build(BuildRequest(corpus=tiny_corpus, out=base, dim=64, quantization="int8", index="hnsw",
                              hnsw_m=8, ef_search=20)).index
    assert (spec.hnsw_m, spec.ef_search) == (8, 20)
    (tmp_path / "gone.txt").write_text(f"{DOCS[0][0]}\n")
    manifest = update(UpdateRequest(delete_ids=tmp_path / "gone.txt", base=base, out=tmp_path / "next"))
    assert manifest.index == spec and manifest.count == len(DOCS) - 1
    assert Bundle(tmp_path / "next").segments[0].vectors.index.hnsw.efSearch == 20  # type: ignore[union-attr]


def test_an_update_of_an_ivf_bundle_keeps_its_cells_and_adds_an_exact_segment(tiny_home: Path, tiny_corpus: Path,
                                                                              tmp_path: Path) -> None:
    """Fewer documents than IVF cells left is no longer a problem: the cells stay the first segment's, the
    deleted rows are tombstones, and the new segment (small) is searched exactly."""
    base = tmp_path / "base"
    build(BuildRequest(corpus=tiny_corpus, out=base, dim=64, quantization="binary", index="ivf", ivf_nlist=len(DOCS)))
    changes = tmp_path / "changes.jsonl"
    changes.write_text(json.dumps({"_id": DOCS[0][0], "delete": True}) + "\n"
                       + json.dumps({"_id": "kites", "text": "Wind lifts the kite."}) + "\n")
    manifest = update(UpdateRequest(changes=changes, base=base, out=tmp_path / "next"))
    assert [s.index.type.value for s in manifest.parts] == ["ivf", "flat"]
    assert manifest.parts[0].index.ivf_nlist == len(DOCS) and manifest.count == len(DOCS)
    bundle = Bundle(tmp_path / "next")
    try:
        assert DOCS[0][0] not in bundle.ids() and bundle.ids()[-1] == "kites"
    finally:
        bundle.close()
