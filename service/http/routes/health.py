"""Liveness (the process answers) and readiness (bundle and student are loaded)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from service.core.loader import LoadState
from service.http.schemas.common import Liveness, Readiness
from service.http.scoping import may_name_collections

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Liveness)
def healthz() -> Liveness:
    return Liveness()


@router.get("/readyz", response_model=Readiness, response_model_exclude_none=True,
            responses={503: {"model": Readiness, "description": "Still loading, or loading failed."}})
def readyz(request: Request) -> Readiness | JSONResponse:
    """Ready once every collection has loaded or failed and one at least serves; a failed one is named in `error`
    while the others serve (with one collection: ready, loading or failed as it is). Named only to a request that
    may learn the collections' names (service.http.scoping.may_name_collections); to any other, `error` says how
    many failed, and with one collection its error (which names none)."""
    states = [(c.name, *c.loader.state) for c in request.app.state.collections]
    failed = [f"collection {name!r}: {error}" if len(states) > 1 else error
              for name, state, error in states if state is LoadState.FAILED]
    if any(state is LoadState.LOADING for _, state, _ in states):
        status = LoadState.LOADING
    else:
        status = LoadState.FAILED if len(failed) == len(states) else LoadState.READY
    error = "; ".join(e or "" for e in failed) or None
    if failed and len(states) > 1 and not may_name_collections(request, request.app.state.settings):
        error = (f"{len(failed)} of {len(states)} collections failed to load (which, and why: /readyz with "
                 "TANDEM_METRICS_TOKEN, or GET /collections with a key that sees them)")
    readiness = Readiness(status=status.value, error=error)
    if status is LoadState.READY:
        return readiness
    return JSONResponse(readiness.model_dump(exclude_none=True), status_code=503)
