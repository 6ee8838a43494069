"""The FastAPI application factory; the lifespan owns the background load of bundle and student."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata

from fastapi import FastAPI

from service.collections_reload import CollectionsConfigReloader
from service.core.collections import CollectionSet
from service.core.fields import manifest_fields
from service.core.processes import ProcessGroup
from service.http.exception_handlers import install_error_handlers
from service.http.keyring import KeySource
from service.http.middleware import install_middleware
from service.http.openapi import install_openapi
from service.http.routes import admin, embeddings, health, index, metrics, search
from service.http.routes import collections as collection_routes
from service.http.routes.page import install_page
from service.metrics import Metrics
from service.settings import ServiceSettings


def _keys_follow(keys: KeySource, collections: CollectionSet) -> None:
    """After a --config reload: the key file's filters checked against the collections served now."""
    specs = {spec.name: spec for spec in collections.specs()}
    keys.collections_changed(list(specs), lambda name: manifest_fields(specs[name].index))


def create_app(settings: ServiceSettings, group: ProcessGroup | None = None) -> FastAPI:
    """A fresh app per call (no module-level singletons), so tests and servers can run several; `group` when
    this is one of the processes of `--processes N` (service.runtime.workers), sharing reloads with the others."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Each collection's loader (tokenize and rescore timers wired) and reloader, built before the initial loads
        # start: a reloader reads its bundle root's CURRENT pointer first. With --processes N each collection
        # follows its group's changes, and a worker started late loads what its last admin change serves.
        collections = CollectionSet(settings, app.state.metrics, group)
        app.state.collections = collections
        default = collections.default_collection()  # what /search, /index, /readyz and /admin/* act on
        app.state.loader = default.loader if default is not None else None
        app.state.reloader = default.reloader if default is not None else None
        collections.start()  # /healthz answers at once; /readyz turns 200 when loading is done
        app.state.keys.start()  # the key file's watch, and SIGHUP
        config = CollectionsConfigReloader(settings.collections_config, collections, settings.watch_interval_s,
                                           settings.config_collections,
                                           on_change=lambda: _keys_follow(app.state.keys, collections)) \
            if settings.collections_config is not None else None
        app.state.collections_config = config
        if config is not None:
            config.start()  # --config re-read on SIGHUP and change: collections added and removed
            if group is not None:
                # a worker of --processes N (SIGHUP to the supervisor replaces each one) serves the file as it is
                # now, which may differ from the one `tandem serve` read at startup
                config.reload("process start")
        index_gauges = asyncio.create_task(metrics.track_initial_load(app.state.metrics, default.loader)) \
            if default is not None else None
        try:
            if group is not None and collections.others_serve():
                # A worker replacing another (`kill -HUP`, a crash) shares the port with workers that can search:
                # it starts taking connections only once it can too, instead of answering 503 while it loads.
                # uvicorn's supervisor retires the worker it replaces only then.
                await asyncio.to_thread(collections.wait)
            yield
        finally:
            if index_gauges is not None:
                index_gauges.cancel()
            if config is not None:
                config.stop()
            app.state.keys.stop()
            collections.close()

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
    app.include_router(collection_routes.router)
    app.include_router(admin.router)
    app.include_router(embeddings.router)
    install_page(app)
    return app
