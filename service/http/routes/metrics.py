"""GET /metrics: the app's Prometheus registry (service.metrics) in the text format, and the gauges it reads from
the loader (the index in service, the queue depth)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.core.collections import Collection
from service.core.loader import LoadState, NotReady, SearcherLoader
from service.http.deps import MetricsDep
from service.http.scoping import may_name_collections
from service.metrics import Metrics

router = APIRouter(tags=["observability"])


@router.get("/metrics", include_in_schema=False)
def metrics_endpoint(request: Request, metrics: MetricsDep) -> Response:
    """Prometheus text format; open like the probes (restrict it at the network if needed). Scraped before the
    lifespan has made a loader (no searcher yet), it still answers. The per-collection series carry the
    collection's name only for a scrape that may learn it (service.http.scoping.may_name_collections); for any
    other they are aggregated over the collections (service.metrics.Metrics.render)."""
    loader: SearcherLoader | None = getattr(request.app.state, "loader", None)
    if loader is not None:
        sync_initial_load(metrics, loader)
    sync_collections(metrics, getattr(request.app.state, "collections", None) or ())
    names = may_name_collections(request, request.app.state.settings)
    return Response(metrics.render(names=names), media_type=CONTENT_TYPE_LATEST)


def sync_collections(metrics: Metrics, collections: Iterable[Collection]) -> None:
    """Each collection's readiness and documents, read from its loader at scrape time (a reload, a rollback or a
    failed load shows at the next scrape, with no callback to keep in step)."""
    for collection in collections:
        try:
            count = collection.loader.searcher().bundle.manifest.count
        except NotReady:
            metrics.collection_ready.labels(collection.name).set(0)
            continue
        metrics.collection_ready.labels(collection.name).set(1)
        metrics.collection_documents.labels(collection.name).set(count)


async def track_initial_load(metrics: Metrics, loader: SearcherLoader, poll_s: float = 0.05) -> None:
    """Set the index gauges once the loader (started just before) is ready; hot reloads call set_index.

    The loader has no completion callback, so this polls while it loads (then ends); a scrape in
    between calls `sync_initial_load` itself, so /metrics never lags behind /readyz.
    """
    metrics.load_started = time.perf_counter()
    while loader.state[0] is LoadState.LOADING:
        await asyncio.sleep(poll_s)
    sync_initial_load(metrics, loader)


def sync_initial_load(metrics: Metrics, loader: SearcherLoader) -> None:
    """Set the index gauges from the first searcher, unless they are set already (by this or a reload)."""
    if metrics.index_set or metrics.load_started is None or loader.state[0] is not LoadState.READY:
        return
    try:
        searcher = loader.searcher()
    except NotReady:
        return
    bundle = searcher.bundle
    metrics.set_index(bundle.directory.name, bundle.manifest.count, time.perf_counter() - metrics.load_started)


def queue_depth_of(app: FastAPI) -> Callable[[], float]:
    """Read at scrape time from whichever searcher is in service (0 while none is)."""

    def depth() -> float:
        loader: SearcherLoader | None = getattr(app.state, "loader", None)
        if loader is None:
            return 0.0
        try:
            return float(loader.searcher().pending)
        except NotReady:
            return 0.0

    return depth
