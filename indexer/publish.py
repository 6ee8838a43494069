"""Where a bundle goes: a plain directory (`--out`) or a new version under a root (`--root`).

Either way the bundle is staged beside its final name and renamed into place (models.bundle.staging).
A root's `CURRENT` pointer moves only after the new version is complete on disk, then old
versions beyond `--keep` are pruned (never the current one), so a crash at any point leaves
the service a complete bundle to follow. Placing, pointing and pruning hold the root's writer
lock (indexer.rootlock), so `index current --set` or another build cannot interleave with them, and a version is
placed only while CURRENT still names the version it did when publishing began: a writer never undoes another's.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from indexer.pause import pause
from indexer.rootlock import check_base, current_name, root_lock
from models.bundle.staging import check_target, staged
from models.bundle.versions import check_version_name, list_versions, new_version_name, prune_versions, set_current
from models.errors import InputError, TandemError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Target:
    """Exactly one of `out` (a bundle directory) or `root` (a versioned bundle root)."""

    out: Path | None = None
    root: Path | None = None
    version: str | None = None
    keep: int | None = None
    force: bool = False

    def check(self) -> None:
        """Fail before any expensive work when publishing could not succeed."""
        if (self.out is None) == (self.root is None):
            raise InputError("give exactly one of --out DIR (a bundle directory) or --root DIR (versions + CURRENT)")
        if self.out is not None:
            if self.version is not None or self.keep is not None:
                raise InputError("--version and --keep apply to --root, not --out")
            check_target(Path(self.out), self.force)
            return
        assert self.root is not None
        if self.root.exists() and not self.root.is_dir():
            raise InputError(f"{self.root} exists and is not a directory")
        if self.keep is not None and self.keep < 0:
            raise InputError(f"--keep must be 0 or more, got {self.keep}")
        if self.version is not None:
            try:
                check_version_name(self.version)
            except TandemError as exc:
                raise InputError(str(exc)) from None
            if (self.root / self.version).exists():
                raise InputError(f"{self.root / self.version} already exists; versions are never overwritten")

    def describe(self, version: str | None) -> str:
        return str(self.out) if self.out is not None else f"{self.root}/{version} (CURRENT)"


@contextlib.contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """`docker stop` sends SIGTERM: raise SystemExit instead, so the staging directory is removed."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def publish(target: Target, what: str = "build") -> Iterator[tuple[Path, str | None]]:
    """Yield (staging directory, version name or None); on success publish it, on failure remove it.

    Into a root, the version is placed only if CURRENT still names what it named when `publish` began (under the
    root's lock: indexer.rootlock.check_base); else StaleBase, naming both, and nothing is published. `what` names
    the writer in that error."""
    target.check()
    if target.out is not None:
        with _sigterm_as_exit(), staged(Path(target.out), target.force) as staging:
            yield staging, None
        return
    assert target.root is not None
    root = Path(target.root)
    version = target.version or new_version_name()
    root.mkdir(parents=True, exist_ok=True)
    base = current_name(root)

    @contextlib.contextmanager
    def checked() -> Iterator[None]:  # the root's writer lock, then CURRENT still names the base
        with root_lock(root):
            check_base(root, base, what)
            yield

    def point_and_prune() -> None:  # under the root's writer lock, right after the version is placed
        set_current(root, version)
        log.info("%s/CURRENT → %s", root, version)
        if target.keep is not None:
            removed = prune_versions(root, target.keep)
            if removed:
                log.info("pruned %d old version(s): %s", len(removed), ", ".join(removed))

    with _sigterm_as_exit(), staged(root / version, force=False, lock=checked, after=point_and_prune) as staging:
        yield staging, version
        pause("publish")  # test-only; a no-op unless TANDEM_TEST_PAUSE_FIFO is set (indexer.pause)
    log.debug("versions under %s: %s", root, list_versions(root))
