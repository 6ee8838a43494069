"""One loaded teacher per process, shared by whatever encodes with it next.

Why: loading the teacher costs seconds and its weights (about 0.4 GB in fp32 for all-mpnet-base-v2). A process that
runs an index build, the build's agreement sample and a distillation (`tandem demo serve`), or a follower's steps
(each encodes its new documents, then its sample's queries), would otherwise load it once per stage. The cache
holds one teacher, keyed by everything that changes its vectors (model directory, device, precision) and by its
batching; asking for another evicts it, so a process never holds two. Callers that want its memory back (before a
large index is mapped, before training) call `release_teacher`. torch is imported only when a teacher is loaded.
"""

from __future__ import annotations

import functools
import gc
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from models.encoders.heap import return_freed_heap

if TYPE_CHECKING:
    from models.encoders.teacher import TeacherEncoder

log = logging.getLogger(__name__)


def shared_teacher(path: str | Path, device: str | None = None, precision: str = "fp32",
                   batch_tokens: int | None = None) -> TeacherEncoder:
    """The teacher at `path` on `device` (None: CUDA when torch sees it, else the CPU) in `precision`, loaded by
    the first call with these settings and kept for the next."""
    from models.encoders.teacher import pick_device  # torch, only when a teacher is wanted

    return _load(str(Path(path).resolve()), str(pick_device(device)), precision, batch_tokens)


@functools.lru_cache(maxsize=1)
def _load(path: str, device: str, precision: str, batch_tokens: int | None) -> TeacherEncoder:
    from models.encoders.teacher import TeacherEncoder

    return TeacherEncoder(Path(path), device=device, precision=precision, batch_tokens=batch_tokens)


def release_teacher() -> None:
    """Let the kept teacher go and hand its memory back to the OS (a no-op when none is kept)."""
    if _load.cache_info().currsize:
        log.info("releasing the shared teacher")
    _load.cache_clear()
    gc.collect()
    return_freed_heap()


def teacher_loads() -> functools._CacheInfo:
    """The cache's counters: misses are loads, hits are loads saved (tests count them)."""
    return _load.cache_info()
