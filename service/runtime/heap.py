"""Keep CPython's full garbage collections off what a server process imported before it serves.

Why: a full collection walks every container the collector tracks, and a server process holds about 93,000
of them once FastAPI, pydantic, onnxruntime, FAISS and bm25s are imported: 20–40 ms per full collection,
the whole process stopped meanwhile. Under load one such pause queued enough requests for the
admission to refuse some with 429 (docs/decisions.md#freeze-the-start-up-heap). Those objects live as
long as the process, so they are moved to the collector's permanent generation (`gc.freeze`, meant for
exactly this) once, after the imports and before the first bundle loads: a bundle is loaded later and stays
collectable, since a retired version's searcher and its batcher refer to each other and only a collection
frees them.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger(__name__)


def freeze_startup_heap() -> None:
    """Collect the start-up garbage, then freeze what is left: call it once per server process, before loading."""
    # The student's runtime is imported where a session is made (models.encoders.student: a forkserver that
    # preloads the service must not import it, service.runtime.workers); here, so it is frozen with the rest.
    import onnxruntime  # noqa: F401

    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.debug("froze %d objects for the garbage collector in %.0f ms", gc.get_freeze_count(),
              (time.perf_counter() - started) * 1e3)
