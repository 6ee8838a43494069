"""Names read from a manifest or a store are checked before they become paths (issue 42, item 7): segment names
and paths, tombstone files and embedding-store keys like version names; a directory symlink inside a version is
refused by the loader, by verification and by a writer hard-linking the version."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pydantic import ValidationError

from indexer.versions.segments import link_version
from models.bundle.manifest import EmbeddingSource, SegmentInfo
from models.bundle.version import Bundle, read_bundle_manifest, verify_bundle
from models.bundle.versions import check_version_name
from models.embeddings.store import EmbeddingStore
from models.errors import ContractMismatch
from models.paths import is_plain_name

BAD = ["..", ".", "../x", "a/b", "/abs", ".hidden", "-opt", "v1\n", "", "a\\b", "a\0b"]


@pytest.mark.parametrize("name", BAD)
def test_a_name_that_is_not_one_plain_entry_is_refused_everywhere(name: str, tmp_path: Path) -> None:
    assert not is_plain_name(name)
    with pytest.raises(ContractMismatch):
        check_version_name(name)
    with pytest.raises(ValidationError, match="segment name"):
        SegmentInfo(name=name, count=1)
    with pytest.raises(ValidationError, match="segment path"):
        SegmentInfo(name="s1", path=f"segments/{name}", count=1)
    with pytest.raises(ValidationError, match="tombstones"):
        SegmentInfo(name="s1", count=1, tombstones=f"tombstones/{name}.npy" if name else "tombstones/.npy")
    with pytest.raises(ValidationError, match="embedding-store key"):
        EmbeddingSource(kind="encoded", store_key=name)
    with pytest.raises(ContractMismatch, match="embedding-store key"):
        EmbeddingStore(tmp_path).entry(name)


def test_plain_names_pass() -> None:
    segment = SegmentInfo(name="v20261126T101500-3fa2c1-001", path="segments/v20261126T101500-3fa2c1-001", count=1,
                          tombstones="tombstones/v20261126T101500-3fa2c1-001.npy")
    assert segment.path.endswith(segment.name)
    assert SegmentInfo(name="base", path=".", count=1).path == "."
    assert EmbeddingSource(kind="encoded", store_key="0123abcd" * 4).store_key == "0123abcd" * 4
    for path in ("segments/a/b", "elsewhere/x", "segments/..", "segments"):
        with pytest.raises(ValidationError):
            SegmentInfo(name="x", path=path, count=1)
    for name in ("tombstones/x.txt", "x.npy", "tombstones/../x.npy", "tombstones/a/b.npy"):
        with pytest.raises(ValidationError):
            SegmentInfo(name="x", count=1, tombstones=name)


@pytest.mark.slow
def test_a_directory_symlink_inside_a_version_is_refused(tiny_bundle: Path, tmp_path: Path) -> None:
    version = tmp_path / "v1"
    shutil.copytree(tiny_bundle, version)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(version / "lexical", elsewhere)  # the very same files, reached through a link out of the version
    (version / "lexical").symlink_to(elsewhere, target_is_directory=True)
    for load in (Bundle, verify_bundle):
        with pytest.raises(ContractMismatch, match=r"lexical/ is a symbolic link"):
            load(version)
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(ContractMismatch, match=r"lexical/ is a symbolic link"):
        link_version(version, read_bundle_manifest(version), staging)
    assert not any(staging.iterdir())
