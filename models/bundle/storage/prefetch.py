"""Ask the kernel to read a loaded version's memory-mapped files into its page cache, in the background.

Why: a binary search rescores its candidates by random reads of `rescore.u8.npy` (7.7 GB at 10M documents) and an
IVF's filtered exact plan reads its codes by row; right after a load, or after other files pushed those pages out,
each read is a page fault that waits on the disk, and a query's few hundred of them cost more than its search.
`posix_fadvise(WILLNEED)` starts the reads at once and returns; the pages stay the kernel's to reclaim (they are
a cache, not the process's memory), so a corpus larger than RAM still serves, only more slowly.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def prefetch(paths: Sequence[Path]) -> None:
    """Start reading `paths` into the page cache in a daemon thread (a no-op where the OS has no fadvise)."""
    if not hasattr(os, "posix_fadvise") or not paths:
        return
    threading.Thread(target=_advise, args=(list(paths),), name="tandem-prefetch", daemon=True).start()


def _advise(paths: list[Path]) -> None:
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:  # the version may have been pruned meanwhile: nothing to warm
            log.debug("prefetch %s: %s", path, exc)
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
        except OSError as exc:
            log.debug("prefetch %s: %s", path, exc)
        finally:
            os.close(fd)
