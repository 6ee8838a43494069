"""An import is stored as one file: shared with the store by a hard link when it already is that file (float16, rows
in corpus order), else scattered straight into the entry; either way the bundle is the same."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest

from indexer.build import BuildRequest, build
from indexer.export import export
from indexer.intake.imported import CHUNK_ROWS
from indexer.options import ExportFormat
from indexer.versions.compact import compact
from indexer.versions.merge_policy import MergePolicy
from indexer.versions.request import UpdateRequest, VersionRequest
from indexer.versions.update import update
from models.bundle.manifest import BundleManifest
from models.bundle.version import Bundle
from models.embeddings.store import EmbeddingStore
from models.errors import ContractMismatch
from tests.fixtures.tiny_home import TINY_DIM

# Synthetic vectors in the tiny teacher's width (tests/fixtures/tiny_home.py): how an import is stored (a hard link
# or a scatter, by rows) is the same at any width, and at 128 dims each of these builds, exports and parses moves
# a sixth of the bytes the real teacher's 768 would. No agreement sample: the texts mean nothing to a teacher.
pytestmark = pytest.mark.usefixtures("tiny_home", "no_agreement_sample")

N = CHUNK_ROWS + 808  # two import chunks: the first may be in corpus order and the second not


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], np.ndarray]:
    rng = np.random.default_rng(3)
    vecs = rng.standard_normal((N, TINY_DIM)).astype(np.float32) + 0.5 * rng.standard_normal(TINY_DIM).astype(
        np.float32)
    vecs = (vecs / np.linalg.norm(vecs, axis=1, keepdims=True)).astype(np.float16)
    directory = tmp_path_factory.mktemp("sharing")
    ids = [f"doc-{i}" for i in range(N)]
    with (directory / "corpus.jsonl").open("w") as fh:
        for i, doc_id in enumerate(ids):
            fh.write(json.dumps({"_id": doc_id, "text": f"text number {i}"}) + "\n")
    return directory / "corpus.jsonl", ids, vecs


def _build(corpus: tuple[Path, list[str], np.ndarray], work: Path, order: np.ndarray,
           **options: object) -> tuple[BundleManifest, Path]:
    """Import the vectors as one float16 .npy with its rows (and ids) in `order`; the import file is returned."""
    path, ids, vecs = corpus
    work.mkdir(parents=True, exist_ok=True)
    np.save(work / "e.npy", vecs[order])
    (work / "ids.json").write_text(json.dumps([ids[i] for i in order]))
    manifest = build(BuildRequest(corpus=path, embeddings=work / "e.npy", ids=work / "ids.json", store=work / "store",
                                  dim=64, quantization="int8", index="flat", **options))  # type: ignore[arg-type]
    return manifest, work / "e.npy"


def _entry(work: Path, manifest: BundleManifest) -> Path:
    return work / "store" / (manifest.embeddings.store_key or "")


def _hits(bundle_dir: Path, queries: np.ndarray) -> np.ndarray:
    bundle = Bundle(bundle_dir)
    try:
        return bundle.segments[0].vectors.search(queries, 10)[1]
    finally:
        bundle.close()


def _data_files(work: Path, entry: Path) -> list[str]:
    """Every file in the store but the entry's bookkeeping: temporaries would show here."""
    return sorted(p.name for p in (work / "store").rglob("*") if p.is_file() and p.name not in
                  {".lock", "meta.json", "shards.jsonl"})


def test_an_in_order_import_is_shared_by_a_hard_link_and_builds_the_shuffled_bundle(
        corpus: tuple[Path, list[str], np.ndarray], tmp_path: Path) -> None:
    _, ids, vecs = corpus
    linked, imported = _build(corpus, tmp_path / "a", np.arange(N), out=tmp_path / "a" / "b")
    entry = _entry(tmp_path / "a", linked)
    assert (entry / "shard-00000.npy").stat().st_ino == imported.stat().st_ino  # no copy at all
    assert _data_files(tmp_path / "a", entry) == ["shard-00000.npy"]
    assert [r.event for r in EmbeddingStore(tmp_path / "a" / "store").shard_log(entry.name)] == ["linked"]

    order = np.random.default_rng(5).permutation(N)
    shuffled, other = _build(corpus, tmp_path / "s", order, out=tmp_path / "s" / "b")
    entry_s = _entry(tmp_path / "s", shuffled)
    assert (entry_s / "shard-00000.npy").stat().st_ino != other.stat().st_ino
    assert _data_files(tmp_path / "s", entry_s) == ["shard-00000.npy"]  # one file, no scratch left
    a = EmbeddingStore(tmp_path / "a" / "store").load(entry.name)
    s = EmbeddingStore(tmp_path / "s" / "store").load(entry_s.name)
    assert a is not None and s is not None and np.array_equal(a, s) and np.array_equal(a, vecs.astype(np.float32))
    queries = vecs[:20].astype(np.float32)
    assert np.array_equal(_hits(tmp_path / "a" / "b", queries), _hits(tmp_path / "s" / "b", queries))
    assert Bundle(tmp_path / "a" / "b").ids() == ids


def test_an_import_leaving_corpus_order_after_its_first_chunk_keeps_that_chunk(
        corpus: tuple[Path, list[str], np.ndarray], tmp_path: Path) -> None:
    _, _, vecs = corpus
    order = np.r_[np.arange(CHUNK_ROWS), CHUNK_ROWS + np.random.default_rng(9).permutation(N - CHUNK_ROWS)]
    manifest, imported = _build(corpus, tmp_path, order, out=tmp_path / "b")
    entry = _entry(tmp_path, manifest)
    assert (entry / "shard-00000.npy").stat().st_ino != imported.stat().st_ino
    loaded = EmbeddingStore(tmp_path / "store").load(entry.name)
    assert loaded is not None and np.array_equal(loaded, vecs.astype(np.float32))
    assert _data_files(tmp_path, entry) == ["shard-00000.npy"]


def test_a_refused_link_copies_the_import(corpus: tuple[Path, list[str], np.ndarray],
                                          tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def other_filesystem(src: object, dst: object, **_: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", other_filesystem)  # as an import on another filesystem would be refused
    _, _, vecs = corpus
    manifest, imported = _build(corpus, tmp_path, np.arange(N), out=tmp_path / "b")
    entry = _entry(tmp_path, manifest)
    assert (entry / "shard-00000.npy").stat().st_ino != imported.stat().st_ino
    assert [r.event for r in EmbeddingStore(tmp_path / "store").shard_log(entry.name)] == ["stored"]
    imported.unlink()  # the store's copy is its own
    loaded = EmbeddingStore(tmp_path / "store").load(entry.name)
    assert loaded is not None and np.array_equal(loaded, vecs.astype(np.float32))


def test_an_import_rewritten_in_place_is_refused_not_served(
        corpus: tuple[Path, list[str], np.ndarray], tmp_path: Path) -> None:
    _, _, vecs = corpus
    manifest, imported = _build(corpus, tmp_path, np.arange(N), out=tmp_path / "b")
    store, key = EmbeddingStore(tmp_path / "store"), manifest.embeddings.store_key or ""
    np.save(imported, vecs[::-1])  # the same inode, truncated and written again
    for read in (lambda: store.load(key), lambda: next(store.iter_chunks(key)), lambda: store.take(key, np.r_[1])):
        with pytest.raises(ContractMismatch, match=rf"{key}/shard-00000\.npy, shared by a hard link with the "
                                                    rf"import .*e\.npy: changed since it was stored"):
            read()
    with pytest.raises(ContractMismatch, match="changed since it was stored"):
        export(tmp_path / "b", tmp_path / "x.jsonl", ExportFormat.JSONL, store)
    assert not (tmp_path / "x.jsonl").exists()


def test_deleting_the_import_after_a_shared_build_is_safe(
        corpus: tuple[Path, list[str], np.ndarray], tmp_path: Path) -> None:
    _, ids, vecs = corpus
    manifest, imported = _build(corpus, tmp_path, np.arange(N), root=tmp_path / "root", version="v1")
    imported.unlink()
    store = EmbeddingStore(tmp_path / "store")
    assert np.array_equal(store.take(manifest.embeddings.store_key or "", np.r_[N - 1, 0, 5]),
                          vecs[[N - 1, 0, 5]].astype(np.float32))
    (tmp_path / "gone.txt").write_text("doc-3\ndoc-8999\n")
    update(UpdateRequest(delete_ids=tmp_path / "gone.txt", root=tmp_path / "root", version="v2",
                         store=tmp_path / "store"))
    compact(VersionRequest(root=tmp_path / "root", version="v3", store=tmp_path / "store"), MergePolicy(full=True))
    out = tmp_path / "export.jsonl"
    assert export(tmp_path / "root" / "v3", out, ExportFormat.JSONL, store) == N - 2
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    keep = [i for i in range(N) if ids[i] not in {"doc-3", "doc-8999"}]
    assert [r["id"] for r in lines] == [ids[i] for i in keep]
    assert np.array_equal(np.asarray([r["vector"] for r in lines], dtype=np.float32), vecs[keep].astype(np.float32))
