"""`tandem index current`: which version a root serves, and moving CURRENT for rollbacks.

A version is verified (checksums, counts) before CURRENT points at it, so a rollback never
switches the service to a damaged bundle.
"""

from __future__ import annotations

import logging
from pathlib import Path

from indexer.pause import pause
from indexer.rootlock import check_base, current_name, root_lock
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
    """Point ROOT/CURRENT at an existing version (rollback or roll forward); services watching the root follow it.

    The version is verified (every byte) without the root's lock, so writers are not held up meanwhile; then, under
    the lock, CURRENT must still name the version it named when this began, and the version must be the one
    verified (not pruned meanwhile): else StaleBase (or InputError), naming them, and CURRENT stays."""
    root = _root(root)
    previous = current_name(root)
    _check_exists(root, version)
    verified = (root / version).stat().st_ino
    verify_one(root / version)
    pause("current --set")  # test-only; a no-op unless TANDEM_TEST_PAUSE_FIFO is set (indexer.pause)
    with root_lock(root):
        check_base(root, previous, f"`index current --set {version}`")
        _check_exists(root, version)
        if (root / version).stat().st_ino != verified:
            raise InputError(f"{root / version} was pruned and published again while it was verified; run "
                             "`tandem index current --set` again")
        set_current(root, version)
    log.info("%s/CURRENT: %s → %s", root, previous, version)


def _check_exists(root: Path, version: str) -> None:
    if version not in list_versions(root):
        raise InputError(f"{root} has no version {version!r}; versions: {', '.join(list_versions(root)) or 'none'}")


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
