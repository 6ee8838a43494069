"""models.bundle.legacy: which versions were built before segments, and how they are read as before."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.bundle.legacy import has_payload_index, open_lexical, segment_payload, takes_segments, whole_bm25s
from models.bundle.lexical.postings import Bm25sIndex, PostingsIndex
from models.bundle.version import read_bundle_manifest
from tests.indexer.versions.test_segments import _as_built_before_segments

pytestmark = pytest.mark.slow


def test_a_fresh_build_takes_segments_and_one_built_before_them_does_not(tiny_bundle: Path, tmp_path: Path) -> None:
    fresh = read_bundle_manifest(tiny_bundle)
    old_dir = _as_built_before_segments(tiny_bundle, tmp_path / "old")
    old = read_bundle_manifest(old_dir)
    assert takes_segments(fresh) and not takes_segments(old)
    dense_only = old.model_copy(update={"lexical": None})
    assert not takes_segments(dense_only)  # older still: no lexical index at all
    # read as before: bm25s's index serves the whole version; today's postings never do
    [old_part], [fresh_part] = old.parts, fresh.parts
    legacy, postings = open_lexical(old_dir, old_part), open_lexical(tiny_bundle, fresh_part)
    assert isinstance(legacy, Bm25sIndex) and isinstance(postings, PostingsIndex)
    assert whole_bm25s([legacy]) is legacy and whole_bm25s([postings]) is None
    assert open_lexical(old_dir, dense_only.parts[0]) is None


def test_the_first_segment_of_a_bundle_built_before_segments_holds_the_manifests_payload(tiny_bundle: Path) -> None:
    manifest = read_bundle_manifest(tiny_bundle)
    [first] = manifest.parts
    assert manifest.segments is None and segment_payload(manifest, first) == manifest.payload
    assert not has_payload_index(None)
