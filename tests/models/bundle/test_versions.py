"""models.bundle.versions: the CURRENT pointer names a published version, names are checked before they become
paths, and pruning keeps the newest versions and never the current one."""

from __future__ import annotations

from pathlib import Path

import pytest

from models.bundle.manifest import BUNDLE_MANIFEST
from models.bundle.versions import (
    POINTER,
    check_version_name,
    is_bundle_root,
    list_versions,
    new_version_name,
    prune_versions,
    read_current,
    resolve_bundle,
    set_current,
)
from models.errors import ContractMismatch


def _version(root: Path, name: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / BUNDLE_MANIFEST).write_text("{}")
    return root / name


def test_current_points_at_a_version_and_resolves(tmp_path: Path) -> None:
    v1, v2 = _version(tmp_path, "v1"), _version(tmp_path, "v2")
    (tmp_path / ".v3.staging-x").mkdir()
    assert not is_bundle_root(tmp_path) and resolve_bundle(v1) == v1
    set_current(tmp_path, "v1")
    assert is_bundle_root(tmp_path) and read_current(tmp_path) == v1
    set_current(tmp_path, "v2")
    assert (tmp_path / POINTER).read_text() == "v2\n" and resolve_bundle(tmp_path) == v2
    assert list_versions(tmp_path) == ["v1", "v2"] and list_versions(tmp_path / "none") == []


def test_a_pointer_at_no_bundle_or_a_bad_name_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ContractMismatch, match="is not a bundle; refusing to point"):
        set_current(tmp_path, "empty")
    with pytest.raises(ContractMismatch, match=r"invalid bundle version name '\.\./x'"):
        set_current(tmp_path, "../x")
    with pytest.raises(ContractMismatch, match="cannot read the current-version pointer"):
        read_current(tmp_path)
    (tmp_path / POINTER).write_text("gone\n")
    with pytest.raises(ContractMismatch, match=r"names 'gone', but .* is not a bundle"):
        read_current(tmp_path)
    (tmp_path / POINTER).write_bytes(b"\xff\xfe")
    with pytest.raises(ContractMismatch, match="not UTF-8 text"):
        read_current(tmp_path)


def test_new_names_are_plain_and_unique() -> None:
    names = {new_version_name() for _ in range(20)}
    assert len(names) == 20 and all(check_version_name(n) == n for n in names)


def test_prune_keeps_the_newest_and_the_current(tmp_path: Path) -> None:
    for name in ("v1", "v2", "v3", "v4"):
        _version(tmp_path, name)
    set_current(tmp_path, "v1")
    assert prune_versions(tmp_path, keep=1) == ["v2", "v3"]
    assert list_versions(tmp_path) == ["v1", "v4"] and read_current(tmp_path).name == "v1"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
