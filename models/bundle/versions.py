"""Versioned bundles under one root, and the `CURRENT` pointer that the service follows.

Layout: `ROOT/<version>/` holds complete bundles (each published atomically by the indexer)
and `ROOT/CURRENT` is a one-line text file naming the version in service. The pointer is
replaced by rename, so a reader sees the old name or the new one, never a torn write; a
plain file (not a symlink) survives copies, archives and read-only volume mounts alike.
"""

from __future__ import annotations

import os
import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path

from models.atomic import read_pointer, write_pointer
from models.bundle.manifest import BUNDLE_MANIFEST
from models.errors import ContractMismatch
from models.paths import is_plain_name

POINTER = "CURRENT"


def is_bundle_root(path: Path) -> bool:
    return (Path(path) / POINTER).is_file()


def new_version_name() -> str:
    """Sortable by creation time, unique across concurrent builds."""
    return f"v{datetime.now(UTC):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def check_version_name(name: str) -> str:
    if not is_plain_name(name):
        raise ContractMismatch(f"invalid bundle version name {name!r}: use letters, digits, '.', '_' and '-'")
    return name


def read_current(root: Path) -> Path:
    """The bundle directory that `root/CURRENT` names."""
    pointer = Path(root) / POINTER
    name = read_pointer(pointer, "current-version")
    bundle = Path(root) / check_version_name(name)
    if not (bundle / BUNDLE_MANIFEST).is_file():
        raise ContractMismatch(f"{pointer} names {name!r}, but {bundle} is not a bundle")
    return bundle


def resolve_bundle(path: Path) -> Path:
    """A bundle directory as given, or the current version when `path` is a bundle root."""
    return read_current(path) if is_bundle_root(path) else Path(path)


def set_current(root: Path, version: str) -> None:
    """Point `root/CURRENT` at `version` atomically (write a temporary file, fsync, rename)."""
    root = Path(root)
    if not (root / check_version_name(version) / BUNDLE_MANIFEST).is_file():
        raise ContractMismatch(f"{root / version} is not a bundle; refusing to point {root / POINTER} at it")
    write_pointer(root / POINTER, version)


def list_versions(root: Path) -> list[str]:
    """Published versions under `root`, oldest first (staging directories start with a dot)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir()
        if p.is_dir() and is_plain_name(p.name) and (p / BUNDLE_MANIFEST).is_file()
    )


def prune_versions(root: Path, keep: int) -> list[str]:
    """Delete all but the `keep` newest versions, never the current one; returns the names removed."""
    current = read_current(root).name if is_bundle_root(root) else None
    old = [v for v in list_versions(root) if v != current]
    doomed = old[: max(len(old) - keep, 0)]
    for name in doomed:  # renamed out of sight first, so a kill mid-delete leaves no half-deleted version
        trash = Path(root) / f".{name}.pruned-{uuid.uuid4().hex[:8]}"
        os.replace(Path(root) / name, trash)
        shutil.rmtree(trash, ignore_errors=True)
    return doomed
