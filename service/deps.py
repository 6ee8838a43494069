"""Dependencies the routes declare, read from app.state where create_app and its lifespan put them."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from service.engine import SearcherLoader
from service.settings import ServiceSettings


def get_settings(request: Request) -> ServiceSettings:
    settings: ServiceSettings = request.app.state.settings
    return settings


def get_loader(request: Request) -> SearcherLoader:
    loader: SearcherLoader = request.app.state.loader
    return loader


SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]
LoaderDep = Annotated[SearcherLoader, Depends(get_loader)]
