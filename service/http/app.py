"""The FastAPI application factory; the lifespan owns the background load of bundle and student."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata

from fastapi import FastAPI

from service.core.follow import ChangeFollower
from service.core.loader import SearcherLoader
from service.core.processes import ProcessGroup
from service.core.reload import Reloader
from service.http.exception_handlers import install_error_handlers
from service.http.middleware import install_middleware
from service.http.openapi import install_openapi
from service.http.routes import admin, embeddings, health, index, metrics, search
from service.http.routes.page import install_page
from service.metrics import Metrics
from service.settings import ServiceSettings


def create_app(settings: ServiceSettings, group: ProcessGroup | None = None) -> FastAPI:
    """A fresh app per call (no module-level singletons), so tests and servers can run several; `group` when
    this is one of the processes of `--processes N` (service.workers), sharing reloads with the others."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # tokenize and rescore timers; a worker started late loads what its group's last admin change serves
        loader = SearcherLoader(settings, observe=app.state.metrics.observe_stage,
                                initial=group.catch_up() if group is not None else None)
        app.state.loader = loader
        # Built before the initial load starts: it reads a bundle root's CURRENT pointer first.
        reloader = Reloader(settings, loader, metrics=app.state.metrics, group=group)
        app.state.reloader = reloader
        follower = ChangeFollower(group, reloader, loader) if group is not None else None
        loader.start()  # /healthz answers at once; /readyz turns 200 when loading is done
        reloader.start()  # the CURRENT-pointer watcher, when serving a bundle root
        if follower is not None:
            follower.start()  # the changes other processes of the group make
        index_gauges = asyncio.create_task(metrics.track_initial_load(app.state.metrics, loader))
        try:
            if group is not None and group.others_serve():
                # A worker replacing another (`kill -HUP`, a crash) shares the port with workers that can search:
                # it starts taking connections only once it can too, instead of answering 503 while it loads.
                # uvicorn's supervisor retires the worker it replaces only then.
                await asyncio.to_thread(loader.wait)
            yield
        finally:
            index_gauges.cancel()
            if follower is not None:
                follower.stop()
            if group is not None:
                group.leave()
            reloader.close()
            loader.close()

    app = FastAPI(
        title="tandem",
        version=metadata.version("tandem"),
        description="Asymmetric retrieval: documents embedded by a large teacher, queries by a distilled student.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = Metrics(queue_depth=metrics.queue_depth_of(app))
    install_error_handlers(app)
    keys_required = install_middleware(app, settings, app.state.metrics)
    install_openapi(app, settings, keys_required)  # declares what the middleware answers too
    app.include_router(health.router)
    app.include_router(metrics.router)
    app.include_router(search.router)
    app.include_router(index.router)
    app.include_router(admin.router)
    app.include_router(embeddings.router)
    install_page(app)
    return app
