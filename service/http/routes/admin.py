"""Admin routes: hot reload, rollback and reload status, behind the admin token (service.http.auth.require_admin).

Without TANDEM_ADMIN_TOKEN the routes answer 403 (admin disabled): never open by default.
POST /admin/reload waits for the outcome (up to TANDEM_RELOAD_WAIT_S), because an operator or a
deploy script wants "did it take?" in one call; past the wait it answers 202 and the outcome shows
up in GET /admin/status. Validation runs on the reload thread, so the event loop only awaits.

With `--processes N` the process that takes the call validates and swaps first, then logs the change for
the others (service.core.processes); the call answers once every process has applied it, listing each one's
version in `processes` (409 if one refused it, 202 if one has not got there within the same wait).

These act on the default collection; /admin/collections/{name}/reload and /rollback act on any one, each through
its own Reloader (service.core.collections), so a reload or rollback of one never touches another. The admin token
sees every collection: it is the operator's, not a tenant's.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Request
from fastapi.responses import JSONResponse

from service.core.loader import LoadState, NotReady
from service.core.outcomes import AdminStatus, CollectionsStatus, ReloadOutcome
from service.core.processes import ProcessGroup
from service.core.reload import BadReloadRequest, ForbiddenReload, Reloader
from service.http.auth import require_admin
from service.http.deps import LoaderDep, SettingsDep
from service.http.errors import CollectionNotFound, NoDefaultCollection, error_response
from service.http.schemas.admin import ReloadPending, ReloadRequest
from service.http.schemas.common import ErrorBody


async def get_reloader(request: Request) -> Reloader:
    """The default collection's reloader; /admin/collections/{name}/* (service.http.routes.admin_collections)
    reload the others."""
    reloader: Reloader | None = request.app.state.reloader
    if reloader is None:
        raise NoDefaultCollection()
    return reloader


ReloaderDep = Annotated[Reloader, Depends(get_reloader)]

router = APIRouter(
    prefix="/admin", tags=["admin"], dependencies=[Depends(require_admin)],
    responses={401: {"model": ErrorBody, "description": "No bearer token."},
               403: {"model": ErrorBody, "description": "Wrong token, or admin disabled (no TANDEM_ADMIN_TOKEN)."}},
)


_GROUP_POLL_S = 0.05


async def outcome(future: Future[ReloadOutcome], wait_s: float, reloader: Reloader) -> ReloadOutcome | JSONResponse:
    deadline = time.monotonic() + wait_s
    try:
        # shield: a timeout here must not cancel a reload that is queued or running.
        result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), wait_s)
    except TimeoutError:
        pending = ReloadPending(message=f"still running after {wait_s:g} s; GET /admin/status shows the outcome")
        return JSONResponse(pending.model_dump(), status_code=202)
    if result.outcome == "rejected":
        serving = f" (still serving {result.current.version})" if result.current is not None else ""
        return error_response(409, f"{result.action}_rejected", f"{result.error}{serving}")
    if reloader.group is not None and result.sequence is not None:
        return await _reach_all(reloader.group, result, deadline)
    return result


async def _reach_all(group: ProcessGroup, result: ReloadOutcome, deadline: float) -> ReloadOutcome | JSONResponse:
    """Wait until every process has applied change `result.sequence` (or a later one); then all serve its version
    unless one refused it."""
    sequence = result.sequence
    assert sequence is not None and result.current is not None
    while True:
        processes = group.processes()
        behind = [p.pid for p in processes if p.applied < sequence]
        if not behind or time.monotonic() >= deadline:
            break
        await asyncio.sleep(_GROUP_POLL_S)
    if behind:
        pending = ReloadPending(message=f"{result.action} done here; processes {behind} have not applied it yet; "
                                "GET /admin/status shows every process's version")
        return JSONResponse(pending.model_dump(), status_code=202)
    wanted = os.path.realpath(result.current.path)
    refused = [p for p in processes
               if p.applied == sequence and (p.path is None or os.path.realpath(p.path) != wanted)]
    if refused:
        serving = ", ".join(f"{p.pid}: {p.version}" for p in refused)
        return error_response(409, f"{result.action}_incomplete", f"{result.action} to {result.current.version} "
                              f"done here, refused by other processes (still serving {serving}); their logs say why")
    return result.model_copy(update={"processes": processes})


def _ready(loader: LoaderDep) -> None:
    """Reloads wait for the initial load (503 until then); after a failed start they may fix it."""
    state, error = loader.state
    if state is LoadState.LOADING:
        raise NotReady(state, error)


OUTCOMES: dict[int | str, dict[str, Any]] = {
    202: {"model": ReloadPending, "description": "Still validating after TANDEM_RELOAD_WAIT_S."},
    409: {"model": ErrorBody, "description": "Refused (checksum, teacher mismatch, unreadable files, nothing "
                                             "to roll back to); the version in service keeps serving."},
    503: {"model": ErrorBody, "description": "The initial load is still running."},
}


@router.post("/reload", response_model=ReloadOutcome,
             responses={**OUTCOMES, 422: {"model": ErrorBody, "description": "No bundle named."},
                        403: {"model": ErrorBody, "description": "Wrong token, admin disabled, or a path outside "
                              "the bundle root and TANDEM_BUNDLE_DIRS."}})
async def reload(
    reloader: ReloaderDep, loader: LoaderDep, settings: SettingsDep,
    body: Annotated[ReloadRequest | None, Body()] = None,
) -> ReloadOutcome | JSONResponse:
    """Validate a bundle in the background and swap it in atomically; in-flight requests finish on the old one."""
    _ready(loader)
    return await _reload(reloader, body, settings.reload_wait_s)


async def _reload(reloader: Reloader, body: ReloadRequest | None, wait_s: float) -> ReloadOutcome | JSONResponse:
    """Queue the reload the body asks of `reloader` and wait for its outcome; a bad request answers at once."""
    path = Path(body.path) if body is not None and body.path is not None else None
    try:
        future = reloader.reload(path)
    except BadReloadRequest as exc:
        return error_response(422, "invalid_request", str(exc))
    except ForbiddenReload as exc:
        return error_response(403, "forbidden", str(exc))
    except RuntimeError:  # the reload thread is shut down
        return error_response(503, "shutting_down", "the service is shutting down")
    return await outcome(future, wait_s, reloader)


@router.post("/rollback", response_model=ReloadOutcome, responses=OUTCOMES)
async def rollback(reloader: ReloaderDep, loader: LoaderDep, settings: SettingsDep) -> ReloadOutcome | JSONResponse:
    """Swap the previous version (kept loaded) back in; the version rolled back from is dropped."""
    _ready(loader)
    return await outcome(reloader.rollback(), settings.reload_wait_s, reloader)


@router.get("/status", response_model=AdminStatus)
def status(reloader: ReloaderDep, request: Request) -> AdminStatus:
    """The version in service, the versions kept for rollback and the last reload's outcome; with several
    collections, each one's too."""
    collections = request.app.state.collections
    if len(collections) < 2:
        return reloader.status()
    return reloader.status().model_copy(update={"collections": {c.name: c.reloader.status() for c in collections}})


# --- each collection (service.core.collections): its own status, reload and rollback -----------------------

_COLLECTION_OUTCOMES = {**OUTCOMES, 404: {"model": ErrorBody, "description": "No such collection."}}


def _reloader(http: Request, name: str) -> Reloader:
    """Collection `name`'s reloader (service.core.collections.Collection), once its initial load has ended."""
    collection = http.app.state.collections.get(name)
    if collection is None:
        raise CollectionNotFound(name)
    _ready(collection.loader)  # reloads wait for the initial load; after a failed one they may fix it
    reloader: Reloader = collection.reloader
    return reloader


@router.get("/collections", response_model=CollectionsStatus)
def statuses(http: Request) -> CollectionsStatus:
    """Every collection's version in service, kept versions and last reload."""
    return CollectionsStatus(collections={c.name: c.reloader.status() for c in http.app.state.collections})


@router.post("/collections/{name}/reload", response_model=ReloadOutcome, responses=_COLLECTION_OUTCOMES)
async def reload_collection(name: str, http: Request, settings: SettingsDep,
                            body: Annotated[ReloadRequest | None, Body()] = None) -> ReloadOutcome | JSONResponse:
    """Validate a bundle for collection `name` and swap it in; the other collections keep serving as they are."""
    return await _reload(_reloader(http, name), body, settings.reload_wait_s)


@router.post("/collections/{name}/rollback", response_model=ReloadOutcome, responses=_COLLECTION_OUTCOMES)
async def rollback_collection(name: str, http: Request, settings: SettingsDep) -> ReloadOutcome | JSONResponse:
    """Swap collection `name`'s previous version back in."""
    reloader = _reloader(http, name)
    return await outcome(reloader.rollback(), settings.reload_wait_s, reloader)
