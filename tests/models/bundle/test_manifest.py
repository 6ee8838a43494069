"""models.bundle.manifest: where a manifest's files may be, the segments a manifest without any stands for, each
segment's own files, and the summary the service reports (the names refused everywhere: test_names.py)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from models.bundle.manifest import BundleManifest, CorpusInfo, EmbeddingSource, LexicalInfo, SegmentInfo
from models.bundle.vectors.index_spec import Quantization
from models.contract import TeacherRef

FILES = {"index.faiss": "a", "lexical/terms.bin": "b", "payload/0.year.npy": "c", "tombstones/s2.npy": "d",
         "segments/s2/index.faiss": "e", "segments/s2/lexical/terms.bin": "f"}


def _manifest(**changes: Any) -> BundleManifest:
    return BundleManifest(teacher=TeacherRef(name="t", fingerprint="f" * 64, dim=768), dim=256,
                          quantization=Quantization.INT8, count=5, version="v1",
                          corpus=CorpusInfo(path="corpus.jsonl", sha256="0" * 64, count=5),
                          embeddings=EmbeddingSource(kind="encoded", store_key="k1"), **{"files": FILES, **changes})


def test_a_manifest_without_segments_is_one_segment_of_the_whole_bundle() -> None:
    manifest = _manifest()
    (only,) = manifest.parts
    assert (only.name, only.path, only.count, only.deleted) == ("v1", ".", 5, 0)
    assert only.embeddings is not None and only.embeddings.store_key == "k1"
    assert manifest.deleted == 0 and manifest.payload_fields == []


def test_each_segment_has_its_own_files() -> None:
    manifest = _manifest(segments=[SegmentInfo(name="v1", count=3),
                                   SegmentInfo(name="s2", path="segments/s2", count=2, deleted=1,
                                               tombstones="tombstones/s2.npy")])
    assert manifest.deleted == 1 and [s.live for s in manifest.parts] == [3, 1]
    assert sorted(manifest.segment_files(manifest.parts[0])) == ["index.faiss", "lexical/terms.bin",
                                                                  "payload/0.year.npy"]
    assert sorted(manifest.segment_files(manifest.parts[1])) == ["segments/s2/index.faiss",
                                                                  "segments/s2/lexical/terms.bin"]


@pytest.mark.parametrize("name", ["../x", "/etc/passwd", "a/b", "lexical/../x", "segments/s2", "segments/s2/a/b/c",
                                  "tombstones/a/b", "a\\b", "..x", ""])
def test_a_file_name_outside_the_known_places_is_refused(name: str) -> None:
    with pytest.raises(ValidationError, match="every name must be a plain file name in the bundle directory"):
        _manifest(files={name: "0"})


def test_the_summary_names_the_modes_a_bundle_serves() -> None:
    dense = _manifest().summary()
    assert (dense["quantization"], dense["index"], dense["count"], dense["modes"]) == ("int8", "flat", 5, ["dense"])
    hybrid = _manifest(lexical=LexicalInfo(engine="postings")).summary()
    assert hybrid["modes"] == ["dense", "lexical", "hybrid"]
