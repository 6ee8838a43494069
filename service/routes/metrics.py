"""GET /metrics: the app's Prometheus registry (service.metrics) in the text format."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from service.deps import MetricsDep
from service.loader import SearcherLoader

router = APIRouter(tags=["observability"])


@router.get("/metrics", include_in_schema=False)
def metrics_endpoint(request: Request, metrics: MetricsDep) -> Response:
    """Prometheus text format; open like the probes (restrict it at the network if needed). Scraped before the
    lifespan has made a loader (no searcher yet), it still answers."""
    loader: SearcherLoader | None = getattr(request.app.state, "loader", None)
    if loader is not None:
        metrics.sync_initial_load(loader)
    return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
