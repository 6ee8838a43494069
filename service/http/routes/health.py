"""Liveness (the process answers) and readiness (bundle and student are loaded)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.core.loader import LoadState
from service.http.deps import LoaderDep
from service.http.schemas.common import Liveness, Readiness

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Liveness)
def healthz() -> Liveness:
    return Liveness()


@router.get("/readyz", response_model=Readiness, response_model_exclude_none=True,
            responses={503: {"model": Readiness, "description": "Still loading, or loading failed."}})
def readyz(loader: LoaderDep) -> Readiness | JSONResponse:
    state, error = loader.state
    readiness = Readiness(status=state.value, error=error)
    if state is LoadState.READY:
        return readiness
    return JSONResponse(readiness.model_dump(exclude_none=True), status_code=503)
