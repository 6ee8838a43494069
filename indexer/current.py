"""`tandem index current`: which version a root serves, and moving CURRENT for rollbacks.

A version is verified (checksums, counts) before CURRENT points at it, so a rollback never
switches the service to a damaged bundle.
"""

from __future__ import annotations

import logging
from pathlib import Path

from indexer.rootlock import root_lock
from indexer.verify import verify_one
from models.bundle.version import read_bundle_manifest
from models.bundle.versions import is_bundle_root, list_versions, read_current, set_current
from models.errors import InputError, TandemError

log = logging.getLogger(__name__)


def _root(root: Path) -> Path:
    if not is_bundle_root(root):
        raise InputError(f"{root} is not a bundle root (no CURRENT file); publish with `tandem index build --root`")
    return Path(root)


def switch_current(root: Path, version: str) -> None:
    """Point ROOT/CURRENT at an existing version (rollback or roll forward); services watching the root follow it."""
    root = _root(root)
    with root_lock(root):  # a concurrent build's prune must not delete the version CURRENT moves to
        if version not in list_versions(root):
            raise InputError(f"{root} has no version {version!r}; versions: "
                             f"{', '.join(list_versions(root)) or 'none'}")
        verify_one(root / version)
        previous = read_current(root).name
        set_current(root, version)
    log.info("%s/CURRENT: %s → %s", root, previous, version)


def describe_versions(root: Path, path_only: bool = False) -> list[str]:
    """One line per version, oldest first, `*` marking CURRENT; or just the current bundle's path."""
    root = _root(root)
    current = read_current(root)
    if path_only:
        return [str(current)]
    lines = []
    for name in list_versions(root):
        try:
            m = read_bundle_manifest(root / name)
            info = f"{m.count} docs, {m.dim}-d {m.quantization.value}, built {m.build_time}"
            if m.base is not None:
                info += f", from {m.base.version} (+{m.base.added} ~{m.base.replaced} -{m.base.deleted})"
        except TandemError as exc:
            info = f"unreadable: {exc}"
        lines.append(f"{'*' if name == current.name else ' '} {name}  {info}")
    return lines
