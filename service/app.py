"""The FastAPI application factory; the lifespan owns the background load of bundle and student."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata

from fastapi import FastAPI

from service.engine import SearcherLoader
from service.errors import install_error_handlers
from service.routes import health, search
from service.settings import ServiceSettings


def create_app(settings: ServiceSettings) -> FastAPI:
    """A fresh app per call (no module-level singletons), so tests and servers can run several."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loader = SearcherLoader(settings)
        app.state.loader = loader
        loader.start()  # /healthz answers at once; /readyz turns 200 when loading is done
        try:
            yield
        finally:
            loader.close()

    app = FastAPI(
        title="tandem",
        version=metadata.version("tandem"),
        description="Asymmetric retrieval: documents embedded by a large teacher, queries by a distilled student.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(search.router)
    return app
