"""The dependencies the routes declare, read from app.state where create_app and its lifespan put them.

They are `async def`: FastAPI runs a plain `def` dependency on its thread pool, three hand-offs to a thread and
back per search for what is one attribute read (docs/decisions.md#async-dependencies).

Auth is not here: API keys are a middleware and the admin token a guard, both in service.http.auth; the
reloader, which only the admin routes use, is declared there (service.http.routes.admin).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.core.loader import SearcherLoader
from service.http.errors import NoDefaultCollection
from service.metrics import Metrics
from service.settings import ServiceSettings


async def get_settings(request: Request) -> ServiceSettings:
    settings: ServiceSettings = request.app.state.settings
    return settings


async def get_loader(request: Request) -> SearcherLoader:
    """The default collection's loader (service.core.collections): a 404 when several are served, none 'default'."""
    loader: SearcherLoader | None = request.app.state.loader
    if loader is None:
        raise NoDefaultCollection()
    return loader


async def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]
LoaderDep = Annotated[SearcherLoader, Depends(get_loader)]
MetricsDep = Annotated[Metrics, Depends(get_metrics)]
